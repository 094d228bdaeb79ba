"""`homelab-autoscaler autoscaler ...`: call the provider exactly as cluster-autoscaler would, to drive or debug
an install without grpcurl. Every call carries cluster-autoscaler's 5-second deadline.

The command line (`homelab_autoscaler.cli`) parses the arguments into a `Target` (where the provider is, how to
reach it) and a `Call` (which method, with what); `main` makes the call and prints what came back.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from api import names
from proto import externalgrpc_pb2 as pb
from proto import externalgrpc_pb2_grpc as pb_grpc
from proto import k8s_node_pb2

STATES = {0: "unspecified", 1: "running", 2: "creating", 3: "deleting"}


@dataclass(frozen=True)
class Target:
    """The provider to call and how: plaintext, or mTLS with a client certificate as cluster-autoscaler has."""

    provider_address: str = "127.0.0.1:8086"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    server_name: str | None = None
    timeout: float = 5.0


@dataclass(frozen=True)
class Call:
    """One method of the CloudProvider service and its arguments (those the method takes)."""

    method: str
    group: str = ""
    delta: int = 0
    nodes: tuple[str, ...] = ()
    node: str = ""
    provider_id: str = ""
    timeout: float = 5.0


def channel(target: Target) -> grpc.Channel:
    """Plaintext, or mTLS when a client certificate is given (cluster-autoscaler speaks nothing else)."""
    if target.tls_cert or target.tls_key or target.tls_ca:
        if not (target.tls_cert and target.tls_key and target.tls_ca):
            raise ValueError("--tls-cert, --tls-key and --tls-ca go together")
        creds = grpc.ssl_channel_credentials(
            root_certificates=target.tls_ca.read_bytes(),
            private_key=target.tls_key.read_bytes(),
            certificate_chain=target.tls_cert.read_bytes(),
        )
        options = [("grpc.ssl_target_name_override", target.server_name)] if target.server_name else []
        return grpc.secure_channel(target.provider_address, creds, options=options)
    return grpc.insecure_channel(target.provider_address)


def _node_groups(stub: Any, call: Call) -> str:
    resp = stub.NodeGroups(pb.NodeGroupsRequest(), timeout=call.timeout)
    rows: list[tuple[str, ...]] = [("ID", "MIN", "MAX")] + [
        (g.id, str(g.minSize), str(g.maxSize)) for g in resp.nodeGroups
    ]
    return _table(rows)


def _nodes(stub: Any, call: Call) -> str:
    resp = stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=call.group), timeout=call.timeout)
    rows: list[tuple[str, ...]] = [("INSTANCE", "STATE", "ERROR")]
    for inst in resp.instances:
        err = inst.status.errorInfo
        error = (
            f"{err.errorCode} ({names.error_class_words(err.instanceErrorClass)}): {err.errorMessage}"
            if err.errorCode
            else "-"
        )
        rows.append((inst.id, STATES.get(inst.status.instanceState, "?"), error))
    return _table(rows)


def _target(stub: Any, call: Call) -> str:
    return str(stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=call.group), timeout=call.timeout).targetSize)


def _changed(stub: Any, call: Call, what: str, change: Callable[[], Any]) -> str:
    """Make a size-changing call between two reads of the target: what was asked, and what the target is now."""
    before = _target(stub, call)
    change()
    return f"{call.group}: {what}; target now {_target(stub, call)} (was {before})"


def _increase(stub: Any, call: Call) -> str:
    request = pb.NodeGroupIncreaseSizeRequest(id=call.group, delta=call.delta)
    return _changed(
        stub, call, f"asked for {call.delta} more", lambda: stub.NodeGroupIncreaseSize(request, timeout=call.timeout)
    )


def _decrease(stub: Any, call: Call) -> str:
    """cluster-autoscaler sends a negative delta; a positive count given here is sent negated."""
    request = pb.NodeGroupDecreaseTargetSizeRequest(id=call.group, delta=-abs(call.delta))
    what = f"asked for {abs(call.delta)} fewer (pending machines only)"
    return _changed(stub, call, what, lambda: stub.NodeGroupDecreaseTargetSize(request, timeout=call.timeout))


def _delete(stub: Any, call: Call) -> str:
    nodes = [
        pb.ExternalGrpcNode(providerID=n, name=n.rsplit("/", 1)[-1]) if "://" in n else pb.ExternalGrpcNode(name=n)
        for n in call.nodes
    ]
    request = pb.NodeGroupDeleteNodesRequest(id=call.group, nodes=nodes)
    what = f"scaling down {', '.join(call.nodes)}"
    return _changed(stub, call, what, lambda: stub.NodeGroupDeleteNodes(request, timeout=call.timeout))


def _template(stub: Any, call: Call) -> str:
    resp = stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=call.group), timeout=call.timeout)
    node = k8s_node_pb2.Node()
    node.ParseFromString(resp.nodeBytes)
    return json.dumps(json_format.MessageToDict(node), indent=2, sort_keys=True)


def _options(stub: Any, call: Call) -> str:
    resp = stub.NodeGroupGetOptions(pb.NodeGroupAutoscalingOptionsRequest(id=call.group), timeout=call.timeout)
    return json.dumps(json_format.MessageToDict(resp.nodeGroupAutoscalingOptions), indent=2, sort_keys=True)


def _for_node(stub: Any, call: Call) -> str:
    node = pb.ExternalGrpcNode(name=call.node, providerID=call.provider_id or "")
    resp = stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=node), timeout=call.timeout)
    return resp.nodeGroup.id or "(not managed by homelab-autoscaler)"


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


COMMANDS: dict[str, tuple[str, Callable[[Any, Call], str]]] = {
    "node-groups": ("list the node groups (NodeGroups)", _node_groups),
    "nodes": ("a group's instances and their states (NodeGroupNodes)", _nodes),
    "target-size": ("a group's target size (NodeGroupTargetSize)", _target),
    "increase": ("ask for more machines (NodeGroupIncreaseSize)", _increase),
    "decrease": ("cancel pending machines (NodeGroupDecreaseTargetSize)", _decrease),
    "delete-nodes": ("scale down these nodes (NodeGroupDeleteNodes)", _delete),
    "template": ("the node cluster-autoscaler imagines for scale-from-zero (NodeGroupTemplateNodeInfo)", _template),
    "options": ("the group's autoscaling options (NodeGroupGetOptions)", _options),
    "for-node": ("which group a node belongs to (NodeGroupForNode)", _for_node),
}


# What gRPC says when nothing answered at the address (as opposed to the provider answering UNAVAILABLE itself).
_NO_CONNECTION = ("failed to connect", "errors resolving", "connection refused", "name resolution", "dns")


def refusal(target: Target, call: Call, err: grpc.RpcError) -> str:
    """One line for a failed call: the provider's own answer as it is, or, when nothing answered, where it was
    looked for and the flag that moves it (as `claims` says of Temporal)."""
    code, details = err.code(), str(err.details() or "")
    unreachable = code == grpc.StatusCode.UNAVAILABLE and any(m in details.lower() for m in _NO_CONNECTION)
    silent = code == grpc.StatusCode.DEADLINE_EXCEEDED and details.strip().lower() == "deadline exceeded"
    if unreachable or silent:
        reason = details.rsplit(": ", 1)[-1].strip(" []") if unreachable else f"no answer within {call.timeout:g} s"
        return (
            f"{call.method}: cannot reach the provider at {target.provider_address}: {reason}. Is it running "
            "(`make run` starts one)? --provider-address names another"
        )
    return f"{call.method}: {code.name}: {details}"


def main(target: Target, call: Call) -> int:
    """Make one call; a refused call prints one line (its gRPC code and message, or why nothing answered) and
    exits 1."""
    _, fn = COMMANDS[call.method]
    with channel(target) as ch:
        stub = pb_grpc.CloudProviderStub(ch)
        try:
            print(fn(stub, call))
        except grpc.RpcError as err:
            print(refusal(target, call, err), file=sys.stderr)
            return 1
    return 0
