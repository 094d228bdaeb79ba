"""Coverage-guided fuzzing of the provider's request decoding (atheris): what cluster-autoscaler, or anyone who
reaches the port, sends as a request body for each method, and the nested protobufs the provider decodes itself.

A crash, an exception other than the provider's own answers (`ProviderError`, which become gRPC statuses), or an
allocation past libFuzzer's -malloc_limit_mb fails the run. `python -m tests.fuzz.run` drives it for a bounded time.
"""

from __future__ import annotations

import contextlib
import sys

import atheris  # type: ignore[import-untyped]

with atheris.instrument_imports(include=["provider", "proto", "admission"]):
    from google.protobuf import message

    from proto import externalgrpc_pb2 as pb
    from proto import k8s_node_pb2 as k8s
    from provider import errors
    from provider import service as svc

METHODS = [m for m in pb.DESCRIPTOR.services_by_name["CloudProvider"].methods]
DECODERS = [svc.lenient(getattr(pb, m.input_type.name)) for m in METHODS]


def nodes_of(request: message.Message) -> list[pb.ExternalGrpcNode]:
    """Every ExternalGrpcNode a request carries (NodeGroupForNode, PricingNodePrice, NodeGroupDeleteNodes...)."""
    found: list[pb.ExternalGrpcNode] = []
    for field, value in request.ListFields():
        if field.message_type is not None and field.message_type.name == "ExternalGrpcNode":
            found.extend(value if field.is_repeated else [value])
    return found


def one(data: bytes) -> None:
    if not data:
        return
    decoded = DECODERS[data[0] % len(DECODERS)](data[1:])
    if isinstance(decoded, svc.Undecodable):
        assert decoded.kind and isinstance(decoded.error, str)
        return
    svc._brief(decoded)  # what a failed call logs
    for node in nodes_of(decoded):
        svc.is_fake(node)
    if isinstance(decoded, pb.PricingPodPriceRequest | pb.PricingNodePriceRequest):
        with contextlib.suppress(errors.ProviderError):
            svc._hours(decoded.startTimestamp, decoded.endTimestamp, True, 3600.0, "fuzz")
    if isinstance(decoded, pb.PricingPodPriceRequest):
        pod = k8s.Pod()
        try:
            pod.ParseFromString(decoded.pod_bytes)
        except message.DecodeError:
            return
        _ = (pod.metadata.namespace, pod.metadata.name, pod.spec.nodeName)


def seeds() -> list[bytes]:
    """One valid request per method, as cluster-autoscaler would send it."""
    node = pb.ExternalGrpcNode(name="s1", providerID="homelab://ns/s1", labels={"a": "b"})
    out = []
    for i, method in enumerate(METHODS):
        kind = getattr(pb, method.input_type.name)
        fields = {f.name for f in kind.DESCRIPTOR.fields}
        msg = kind()
        if "id" in fields:
            msg.id = "g"
        if "node" in fields:
            msg.node.CopyFrom(node)
        if "delta" in fields:
            msg.delta = 1
        out.append(bytes([i]) + msg.SerializeToString())
    return out


def main() -> None:
    atheris.Setup(sys.argv, one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
