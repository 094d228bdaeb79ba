"""The project's stand-in for cluster-autoscaler, for where the real one cannot be built (the module proxy here
refuses it). It calls the provider as cluster-autoscaler 1.35 does and decides as it does, in the parts the story
exercises, each written after the real one's code and logs (docs/realcluster.md compares the two runs):

- every loop: Refresh, NodeGroups, NodeGroupForNode for every Node, and per group NodeGroupGetOptions (its
  scale-down-unneeded time), NodeGroupTargetSize and NodeGroupNodes (cluster-autoscaler caches the instances for
  up to 2 minutes; the stand-in reads them every loop);
- a scale-up request lives while the target is above the group's registered machines (clusterstate's
  `updateScaleRequests`), and is dropped as a success once it is not;
- an errored instance (`creating` with errorInfo) not seen in the previous loop, while its group's scale-up is in
  flight: a ScaleUpFailed event and a backoff of the group; then DeleteNodes on the errored instances (fake nodes,
  name = providerID = instance id);
- unschedulable Pods that fit a group's template node (NodeGroupTemplateNodeInfo): IncreaseSize on the group the
  priority expander prefers among those not backed off and below max, by as many machines as the Pods need beyond
  the ones already coming; a refused IncreaseSize backs the group off;
- a Node of a group with no Pod but DaemonSet and mirror Pods for the group's unneeded time, and no scale-up in
  the last `--scale-down-delay-after-add`: tainted ToBeDeletedByClusterAutoscaler, then DeleteNodes;
- the status ConfigMap `cluster-autoscaler-status`, in cluster-autoscaler's shape for what the story reads.

It authenticates with cluster-autoscaler's ServiceAccount token, so deploy/cluster-autoscaler's RBAC applies to it.

    python -m tests.realcluster.standin --kubeconfig K --provider 127.0.0.1:P --namespace NS [--priorities a,b]
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from proto import externalgrpc_pb2 as pb
from proto import externalgrpc_pb2_grpc as pb_grpc
from proto import k8s_node_pb2

log = logging.getLogger("standin")
DEADLINE = 10.0  # grpc_timeout of the harness's cloud-config
TO_BE_DELETED = "ToBeDeletedByClusterAutoscaler"
STATUS_CONFIGMAP = "cluster-autoscaler-status"
CREATING = pb.InstanceStatus.instanceCreating


# --- what cluster-autoscaler's simulation needs, as pure functions ----------------------------------------------
def cpu_millis(q: str) -> int:
    """A CPU quantity in millicores ("500m", "2", "1.5")."""
    return int(q[:-1]) if q.endswith("m") else int(float(q) * 1000)


_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def mem_bytes(q: str) -> int:
    for suffix in sorted(_UNITS, key=len, reverse=True):
        if q.endswith(suffix):
            return int(float(q[: -len(suffix)]) * _UNITS[suffix])
    return int(float(q))


@dataclass(frozen=True)
class NodeShape:
    """What a Pod's scheduling reads of a node: labels, taints, allocatable CPU and memory."""

    labels: Mapping[str, str]
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect)
    cpu_m: int
    mem: int


@dataclass(frozen=True)
class PodNeed:
    name: str
    node_selector: Mapping[str, str]
    tolerations: tuple[tuple[str, str, str, str], ...]  # (key, operator, value, effect)
    cpu_m: int
    mem: int


def tolerated(taint: tuple[str, str, str], tolerations: Iterable[tuple[str, str, str, str]]) -> bool:
    key, value, effect = taint
    for t_key, op, t_value, t_effect in tolerations:
        if t_effect and t_effect != effect:
            continue
        if op == "Exists" and (not t_key or t_key == key):
            return True
        if t_key == key and t_value == value:
            return True
    return False


def fits(pod: PodNeed, node: NodeShape) -> bool:
    """The scheduler's predicates the story relies on: node selector, taints, and room for the requests."""
    if any(node.labels.get(k) != v for k, v in pod.node_selector.items()):
        return False
    if any(e in ("NoSchedule", "NoExecute") and not tolerated((k, v, e), pod.tolerations) for k, v, e in node.taints):
        return False
    return pod.cpu_m <= node.cpu_m and pod.mem <= node.mem


def machines_for(pods: Sequence[PodNeed], node: NodeShape) -> int:
    """How many new nodes of this shape the Pods need, first-fit (the binpacking estimator's answer for one shape)."""
    bins: list[tuple[int, int]] = []
    for pod in pods:
        for i, (cpu, mem) in enumerate(bins):
            if pod.cpu_m <= cpu and pod.mem <= mem:
                bins[i] = (cpu - pod.cpu_m, mem - pod.mem)
                break
        else:
            bins.append((node.cpu_m - pod.cpu_m, node.mem - pod.mem))
    return len(bins)


def shape_of_template(node: k8s_node_pb2.Node) -> NodeShape:
    alloc = {k: q.string for k, q in node.status.allocatable.items()} or {
        k: q.string for k, q in node.status.capacity.items()
    }
    return NodeShape(
        labels=dict(node.metadata.labels),
        taints=tuple((t.key, t.value, t.effect) for t in node.spec.taints),
        cpu_m=cpu_millis(alloc.get("cpu", "0")),
        mem=mem_bytes(alloc.get("memory", "0")),
    )


def need_of(pod: Any) -> PodNeed:
    cpu = mem = 0
    for c in pod.spec.containers or []:
        req = (c.resources.requests if c.resources else None) or {}
        cpu += cpu_millis(req.get("cpu", "0"))
        mem += mem_bytes(req.get("memory", "0"))
    tolerations = tuple(
        (t.key or "", t.operator or "Equal", t.value or "", t.effect or "") for t in pod.spec.tolerations or []
    )
    return PodNeed(pod.metadata.name, dict(pod.spec.node_selector or {}), tolerations, cpu, mem)


def choose(candidates: Sequence[str], priorities: Sequence[str]) -> str | None:
    """The priority expander: the first group of the highest priority; unlisted groups come last, by name."""
    ranked = sorted(candidates, key=lambda g: (priorities.index(g) if g in priorities else len(priorities), g))
    return ranked[0] if ranked else None


# --- the loop -------------------------------------------------------------------------------------------------
@dataclass
class GroupView:
    id: str
    max_size: int
    unneeded_seconds: float = 600.0  # the group's scaleDownUnneededDuration (NodeGroupGetOptions)
    target: int = 0
    instances: list[Any] = field(default_factory=list)
    nodes: list[Any] = field(default_factory=list)  # registered Nodes of the group


@dataclass
class Standin:
    core: Any
    stub: Any
    namespace: str
    priorities: tuple[str, ...] = ()
    unneeded_seconds: float = 30.0
    delay_after_add: float = 20.0
    backoff_seconds: float = 120.0
    backoff_until: dict[str, float] = field(default_factory=dict)
    backoff_error: dict[str, tuple[str, str]] = field(default_factory=dict)
    scale_up_requests: dict[str, float] = field(default_factory=dict)
    last_scale_up: float = 0.0
    previous_errors: set[str] = field(default_factory=set)
    unneeded_since: dict[str, float] = field(default_factory=dict)
    groups: dict[str, GroupView] = field(default_factory=dict)

    def loop(self, now: float) -> None:
        self.stub.Refresh(pb.RefreshRequest(), timeout=DEADLINE)
        found = self.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=DEADLINE).nodeGroups
        self.groups = {g.id: GroupView(g.id, g.maxSize) for g in found}
        nodes = self.core.list_node().items
        for node in nodes:
            req = pb.NodeGroupForNodeRequest(
                node=pb.ExternalGrpcNode(
                    name=node.metadata.name,
                    providerID=node.spec.provider_id or "",
                    labels=node.metadata.labels or {},
                )
            )
            gid = self.stub.NodeGroupForNode(req, timeout=DEADLINE).nodeGroup.id
            if gid in self.groups:
                self.groups[gid].nodes.append(node)
        for g in self.groups.values():
            # The request carries the command line's defaults; the answer is the group's options over them.
            defaults = pb.NodeGroupAutoscalingOptions()
            defaults.scaleDownUnneededDuration.FromSeconds(int(self.unneeded_seconds))
            opts = self.stub.NodeGroupGetOptions(
                pb.NodeGroupAutoscalingOptionsRequest(id=g.id, defaults=defaults), timeout=DEADLINE
            ).nodeGroupAutoscalingOptions
            g.unneeded_seconds = opts.scaleDownUnneededDuration.ToTimedelta().total_seconds()
            g.target = self.stub.NodeGroupTargetSize(
                pb.NodeGroupTargetSizeRequest(id=g.id), timeout=DEADLINE
            ).targetSize
            g.instances = list(self.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=g.id), timeout=DEADLINE).instances)
        self.update_scale_requests()
        self.handle_instance_errors(now)
        pods = self.core.list_pod_for_all_namespaces().items
        self.scale_up(pods, now)
        self.scale_down(pods, now)
        self.write_status(now)

    def update_scale_requests(self) -> None:
        for gid in list(self.scale_up_requests):
            g = self.groups.get(gid)
            if g is None or g.target <= len(g.nodes):
                del self.scale_up_requests[gid]  # "finished successfully": nothing upcoming any more
                log.info("scale-up in %s finished", gid)

    def handle_instance_errors(self, now: float) -> None:
        current: set[str] = set()
        for g in self.groups.values():
            errored = [i for i in g.instances if i.status.instanceState == CREATING and i.status.errorInfo.errorCode]
            unseen = [i for i in errored if i.id not in self.previous_errors]
            current |= {i.id for i in errored}
            if unseen and g.id in self.scale_up_requests:
                err = unseen[0].status.errorInfo
                log.info("ScaleUpFailed: %d nodes to %s: %s (%s)", len(unseen), g.id, err.errorCode, err.errorMessage)
                self.back_off(g.id, now, err.errorCode, err.errorMessage)
            if errored:
                fakes = [pb.ExternalGrpcNode(name=i.id, providerID=i.id) for i in errored]
                self.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id=g.id, nodes=fakes), timeout=DEADLINE)
                log.info("deleted %d errored instances of %s", len(errored), g.id)
        self.previous_errors = current

    def back_off(self, gid: str, now: float, code: str, message: str) -> None:
        self.backoff_until[gid] = now + self.backoff_seconds
        self.backoff_error[gid] = (code, message)
        self.scale_up_requests.pop(gid, None)

    def template(self, gid: str) -> NodeShape | None:
        try:
            resp = self.stub.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=gid), timeout=DEADLINE)
        except grpc.RpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.info("No node info for: %s", gid)
                return None
            raise
        node = k8s_node_pb2.Node()
        node.ParseFromString(resp.nodeBytes)
        return shape_of_template(node)

    def scale_up(self, pods: list[Any], now: float) -> None:
        pending = [
            need_of(p)
            for p in pods
            if not p.spec.node_name
            and any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in p.status.conditions or [])
        ]
        if not pending:
            return
        upcoming = {g.id: max(0, g.target - len(g.nodes)) for g in self.groups.values()}
        options: dict[str, int] = {}
        for g in self.groups.values():
            if self.backoff_until.get(g.id, 0) > now or g.target >= g.max_size:
                continue
            shape = self.template(g.id)
            if shape is None:
                continue
            fitting = [p for p in pending if fits(p, shape)]
            if fitting:
                options[g.id] = machines_for(fitting, shape)
        if any(upcoming.get(gid, 0) >= need for gid, need in options.items()):
            return  # machines already coming cover the Pods
        best = choose(list(options), self.priorities)
        if best is None:
            return
        g = self.groups[best]
        delta = min(options[best] - upcoming.get(best, 0), g.max_size - g.target)
        if delta <= 0:
            return
        try:
            self.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=best, delta=delta), timeout=DEADLINE)
        except grpc.RpcError as err:
            log.info("FailedToScaleUpGroup %s: %s: %s", best, err.code().name, err.details())
            self.back_off(best, now, "cloudProviderError", str(err.details()))
            return
        log.info("scale-up: setting group %s size to %d", best, g.target + delta)
        self.scale_up_requests[best] = now
        self.last_scale_up = now

    def scale_down(self, pods: list[Any], now: float) -> None:
        busy = {
            p.spec.node_name
            for p in pods
            if p.spec.node_name
            and p.status.phase not in ("Succeeded", "Failed")
            and not any(ref.kind == "DaemonSet" for ref in p.metadata.owner_references or [])
            and "kubernetes.io/config.mirror" not in (p.metadata.annotations or {})
        }
        for g in self.groups.values():
            for node in g.nodes:
                name = node.metadata.name
                ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
                marked = any(t.key == TO_BE_DELETED for t in node.spec.taints or [])
                if name in busy or not ready or marked:
                    self.unneeded_since.pop(name, None)
                    continue
                since = self.unneeded_since.setdefault(name, now)
                if now - since < g.unneeded_seconds or now - self.last_scale_up < self.delay_after_add:
                    continue
                self.taint(name)
                target = pb.ExternalGrpcNode(name=name, providerID=node.spec.provider_id or "")
                req = pb.NodeGroupDeleteNodesRequest(id=g.id, nodes=[target])
                self.stub.NodeGroupDeleteNodes(req, timeout=DEADLINE)
                log.info("scale-down: removing empty node %s", name)
                self.unneeded_since.pop(name, None)

    def taint(self, name: str) -> None:
        """cluster-autoscaler's own way: read the Node and update it whole (its RBAC grants update, not patch)."""
        node = self.core.read_node(name)
        taints = list(node.spec.taints or [])
        taints.append(k8s.V1Taint(key=TO_BE_DELETED, value=str(int(time.time())), effect="NoSchedule"))
        node.spec.taints = taints
        self.core.replace_node(name, node)

    def write_status(self, now: float) -> None:
        groups = []
        for g in sorted(self.groups.values(), key=lambda g: g.id):
            ready = sum(
                any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or []) for n in g.nodes
            )
            backoff: dict[str, str] = {}
            if self.backoff_until.get(g.id, 0) > now:
                code, message = self.backoff_error[g.id]
                backoff = {"errorCode": code, "errorMessage": message}
            groups.append({
                "name": g.id,
                "health": {"cloudProviderTarget": g.target, "maxSize": g.max_size, "minSize": 0, "status": "Healthy",
                           "nodeCounts": {"registered": {"ready": ready, "total": len(g.nodes)}}},
                "scaleUp": {"backoffInfo": backoff,
                            "status": "Backoff" if backoff else ("InProgress" if g.id in self.scale_up_requests
                                                                 else "NoActivity")},
            })  # fmt: skip
        doc = {"autoscalerStatus": "Running", "nodeGroups": groups, "time": datetime.now(UTC).isoformat()}
        body = {"metadata": {"name": STATUS_CONFIGMAP, "namespace": self.namespace},
                "data": {"status": yaml.safe_dump(doc, sort_keys=False)}}  # fmt: skip
        try:
            current = self.core.read_namespaced_config_map(STATUS_CONFIGMAP, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self.core.create_namespaced_config_map(self.namespace, body)
            return
        current.data = body["data"]
        self.core.replace_namespaced_config_map(STATUS_CONFIGMAP, self.namespace, current)


def serve_health(port: int, alive: threading.Event) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/health-check" and alive.is_set()
            self.send_response(200 if ok else 503)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--provider", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--priorities", default="")
    p.add_argument("--status-port", type=int, required=True)
    p.add_argument("--scan-interval", type=float, default=10.0)
    p.add_argument("--scale-down-unneeded-time", type=float, default=600.0)
    p.add_argument("--scale-down-delay-after-add", type=float, default=20.0)
    p.add_argument("--backoff", type=float, default=300.0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api = k8s_config.new_client_from_config(config_file=args.kubeconfig)
    alive = threading.Event()
    serve_health(args.status_port, alive)
    with grpc.insecure_channel(args.provider) as channel:
        standin = Standin(
            core=k8s.CoreV1Api(api),
            stub=pb_grpc.CloudProviderStub(channel),
            namespace=args.namespace,
            priorities=tuple(x for x in args.priorities.split(",") if x),
            unneeded_seconds=args.scale_down_unneeded_time,
            delay_after_add=args.scale_down_delay_after_add,
            backoff_seconds=args.backoff,
        )
        alive.set()
        while True:
            started = time.monotonic()
            try:
                standin.loop(started)
            except (grpc.RpcError, ApiException, OSError) as exc:
                log.warning("loop failed: %s", exc)  # as cluster-autoscaler: the next loop starts over
            time.sleep(max(0.0, args.scan_interval - (time.monotonic() - started)))


if __name__ == "__main__":
    raise SystemExit(main())
