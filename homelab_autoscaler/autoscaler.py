"""`homelab-autoscaler autoscaler ...`: call the provider exactly as cluster-autoscaler would, to drive or debug
an install without grpcurl. Every call carries cluster-autoscaler's 5-second deadline."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from proto import externalgrpc_pb2 as pb
from proto import externalgrpc_pb2_grpc as pb_grpc
from proto import k8s_node_pb2

STATES = {0: "unspecified", 1: "running", 2: "creating", 3: "deleting"}


def channel(args: argparse.Namespace) -> grpc.Channel:
    """Plaintext, or mTLS when a client certificate is given (cluster-autoscaler speaks nothing else)."""
    if args.tls_cert or args.tls_key or args.tls_ca:
        if not (args.tls_cert and args.tls_key and args.tls_ca):
            raise SystemExit("homelab-autoscaler autoscaler: --tls-cert, --tls-key and --tls-ca go together")
        creds = grpc.ssl_channel_credentials(
            root_certificates=Path(args.tls_ca).read_bytes(),
            private_key=Path(args.tls_key).read_bytes(),
            certificate_chain=Path(args.tls_cert).read_bytes(),
        )
        options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
        return grpc.secure_channel(args.provider_address, creds, options=options)
    return grpc.insecure_channel(args.provider_address)


def _node_groups(stub: Any, args: argparse.Namespace) -> str:
    resp = stub.NodeGroups(pb.NodeGroupsRequest(), timeout=args.timeout)
    rows: list[tuple[str, ...]] = [("ID", "MIN", "MAX")] + [
        (g.id, str(g.minSize), str(g.maxSize)) for g in resp.nodeGroups
    ]
    return _table(rows)


def _nodes(stub: Any, args: argparse.Namespace) -> str:
    resp = stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=args.group), timeout=args.timeout)
    rows: list[tuple[str, ...]] = [("INSTANCE", "STATE", "ERROR")]
    for inst in resp.instances:
        err = inst.status.errorInfo
        error = f"{err.errorCode} (class {err.instanceErrorClass}): {err.errorMessage}" if err.errorCode else "-"
        rows.append((inst.id, STATES.get(inst.status.instanceState, "?"), error))
    return _table(rows)


def _target(stub: Any, args: argparse.Namespace) -> str:
    return str(stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=args.group), timeout=args.timeout).targetSize)


def _increase(stub: Any, args: argparse.Namespace) -> str:
    stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=args.group, delta=args.delta), timeout=args.timeout)
    return _target(stub, args)


def _decrease(stub: Any, args: argparse.Namespace) -> str:
    """cluster-autoscaler sends a negative delta; a positive count given here is sent negated."""
    delta = -abs(args.delta)
    stub.NodeGroupDecreaseTargetSize(
        pb.NodeGroupDecreaseTargetSizeRequest(id=args.group, delta=delta), timeout=args.timeout
    )
    return _target(stub, args)


def _delete(stub: Any, args: argparse.Namespace) -> str:
    nodes = [
        pb.ExternalGrpcNode(providerID=n, name=n.rsplit("/", 1)[-1]) if "://" in n else pb.ExternalGrpcNode(name=n)
        for n in args.nodes
    ]
    stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id=args.group, nodes=nodes), timeout=args.timeout)
    return _target(stub, args)


def _template(stub: Any, args: argparse.Namespace) -> str:
    resp = stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=args.group), timeout=args.timeout)
    node = k8s_node_pb2.Node()
    node.ParseFromString(resp.nodeBytes)
    return json.dumps(json_format.MessageToDict(node), indent=2, sort_keys=True)


def _options(stub: Any, args: argparse.Namespace) -> str:
    resp = stub.NodeGroupGetOptions(pb.NodeGroupAutoscalingOptionsRequest(id=args.group), timeout=args.timeout)
    return json.dumps(json_format.MessageToDict(resp.nodeGroupAutoscalingOptions), indent=2, sort_keys=True)


def _for_node(stub: Any, args: argparse.Namespace) -> str:
    node = pb.ExternalGrpcNode(name=args.node, providerID=args.provider_id or "")
    resp = stub.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=node), timeout=args.timeout)
    return resp.nodeGroup.id or "(not managed by homelab-autoscaler)"


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


COMMANDS: dict[str, tuple[str, Callable[[Any, argparse.Namespace], str]]] = {
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--provider-address", default="127.0.0.1:8086", help="the provider's host:port")
    parser.add_argument("--tls-cert", help="client certificate (PEM) for mTLS")
    parser.add_argument("--tls-key", help="client key (PEM)")
    parser.add_argument("--tls-ca", help="CA (PEM) that signed the provider's certificate")
    parser.add_argument("--server-name", help="name to verify in the provider's certificate")
    parser.add_argument("--timeout", type=float, default=5.0, help="deadline of each call (cluster-autoscaler: 5 s)")
    sub = parser.add_subparsers(dest="call", required=True)
    for name, (what, _) in COMMANDS.items():
        p = sub.add_parser(name, help=what)
        if name not in ("node-groups", "for-node"):
            p.add_argument("group", help="node group id (the Group's name)")
        if name in ("increase", "decrease"):
            p.add_argument("delta", type=int, help="how many machines")
        if name == "delete-nodes":
            p.add_argument("nodes", nargs="+", help="node names or instance ids (homelab://namespace/slot)")
        if name == "for-node":
            p.add_argument("node", help="the Kubernetes node name")
            p.add_argument("--provider-id", help="the node's spec.providerID")


def main(args: argparse.Namespace) -> int:
    """Run one call; a refused call prints its gRPC code and message and exits 1."""
    _, fn = COMMANDS[args.call]
    with channel(args) as ch:
        stub = pb_grpc.CloudProviderStub(ch)
        try:
            print(fn(stub, args))
        except grpc.RpcError as err:
            print(f"{args.call}: {err.code().name}: {err.details()}", file=sys.stderr)
            return 1
    return 0
