"""The CloudProvider servicer: every call of cluster-autoscaler's `externalgrpc` protocol.

Each method is wrapped by `_call`, which gives it a time budget well inside cluster-autoscaler's 5 s deadline,
turns every refusal into a status code with a message naming the group or node, turns anything unexpected
into INTERNAL (logged) instead of a dead stream, and records method, code and latency. The README of this
package has the table of codes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2, duration_pb2, message, timestamp_pb2
from temporalio.client import Client
from temporalio.runtime import Runtime

from api import contracts as c
from api.names import ERROR_CLASS_OTHER, LABEL_GROUP, label_value
from domain import claims
from proto import externalgrpc_pb2 as pb
from proto import externalgrpc_pb2_grpc as pb_grpc
from proto import k8s_node_pb2 as k8s
from provider import errors as e
from provider.catalog import Catalog, GroupInfo, SlotInfo
from provider.groups import GroupGateway
from provider.metrics import CallMetrics
from provider.settings import ProviderSettings
from provider.template import declared_template, node_bytes

log = logging.getLogger(__name__)

Req = TypeVar("Req", bound=message.Message)
Resp = TypeVar("Resp", bound=message.Message)
Handler = Callable[[Any, Req, grpc.aio.ServicerContext], Awaitable[Resp]]

# Kept back from the caller's own deadline, so our answer (even an error) reaches it before it gives up.
DEADLINE_MARGIN = 0.25
# cluster-autoscaler's own defaults (config/flags @1.35), for options neither the Group nor the request sets.
CA_DEFAULT_THRESHOLD = 0.5
CA_DEFAULT_GPU_THRESHOLD = 0.5
CA_DEFAULT_UNNEEDED = timedelta(minutes=10)
CA_DEFAULT_UNREADY = timedelta(minutes=20)

_STATES = {
    "creating": pb.InstanceStatus.instanceCreating,
    "running": pb.InstanceStatus.instanceRunning,
    "deleting": pb.InstanceStatus.instanceDeleting,
}


def _call(what: str) -> Callable[[Handler[Req, Resp]], Handler[Req, Resp]]:
    """Budget, error mapping, logging and metrics around one RPC; `what` names it in timeout messages."""

    def wrap(method: Handler[Req, Resp]) -> Handler[Req, Resp]:
        name = method.__name__

        @functools.wraps(method)
        async def run(self: CloudProvider, request: Req, context: grpc.aio.ServicerContext) -> Resp:
            started = time.monotonic()
            budget = self.budget(context)
            code, text = grpc.StatusCode.INTERNAL, f"{name} failed"
            try:
                if isinstance(request, Undecodable):
                    raise e.invalid(f"{name}: the request is not a valid {request.kind} message: {request.error}")
                async with asyncio.timeout(budget):
                    answer = await method(self, request, context)
                self.metrics.record(name, grpc.StatusCode.OK.name, time.monotonic() - started)
                return answer
            except e.ProviderError as err:
                code, text = err.code, err.message
            except Exception as err:
                unreachable = self.temporal_unreachable()
                if unreachable:  # not slow, not broken: down. cluster-autoscaler retries UNAVAILABLE
                    code, text = grpc.StatusCode.UNAVAILABLE, f"{name}: {unreachable}; nothing was changed"
                elif isinstance(err, TimeoutError):
                    code = grpc.StatusCode.DEADLINE_EXCEEDED
                    text = f"{name}: no answer within {budget:.2f} s while {what}; nothing further was attempted"
                else:
                    log.exception("%s failed on %s", name, _brief(request))
                    text = f"{name} failed unexpectedly; see the provider's log"
            loud = code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED)
            level = logging.ERROR if loud else logging.INFO
            log.log(level, "%s -> %s: %s", name, code.name, text)
            self.metrics.record(name, code.name, time.monotonic() - started)
            await context.abort(code, text)
            raise AssertionError("unreachable: context.abort raises")  # pragma: no cover

        return run

    return wrap


@dataclass(frozen=True)
class Undecodable:
    """A request body that is not the method's message: answered INVALID_ARGUMENT by `_call`, not UNKNOWN."""

    kind: str
    error: str


def lenient(kind: type[message.Message]) -> Callable[[bytes], message.Message | Undecodable]:
    """A request deserializer that never raises (grpc would answer UNKNOWN and log a traceback per call)."""

    def decode(data: bytes) -> message.Message | Undecodable:
        try:
            return kind.FromString(data)
        except Exception as err:
            return Undecodable(kind.DESCRIPTOR.name, str(err))

    return decode


def method_handlers(provider: CloudProvider) -> dict[str, grpc.RpcMethodHandler]:
    """Every method of the service, bound to `provider`, with lenient request decoding."""
    service = pb.DESCRIPTOR.services_by_name["CloudProvider"]
    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for method in service.methods:
        request = getattr(pb, method.input_type.name)
        response = getattr(pb, method.output_type.name)
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            getattr(provider, method.name),
            request_deserializer=lenient(request),
            response_serializer=response.SerializeToString,
        )
    return handlers


def _brief(request: message.Message) -> str:
    return str(request).replace("\n", " ")[:300]


def _hours(
    start: timestamp_pb2.Timestamp, end: timestamp_pb2.Timestamp, has_both: bool, default_seconds: float, subject: str
) -> float:
    """The priced period in hours: the request's window, or the configured default when it sends none."""
    if not has_both:
        return default_seconds / 3600.0
    seconds = (end.seconds - start.seconds) + (end.nanos - start.nanos) / 1e9
    if seconds < 0:
        raise e.invalid(f"{subject}: endTimestamp is before startTimestamp")
    return seconds / 3600.0


def _seconds(d: duration_pb2.Duration) -> float:
    return d.seconds + d.nanos / 1e9


def _duration(value: timedelta) -> duration_pb2.Duration:
    out = duration_pb2.Duration()
    out.FromTimedelta(value)
    return out


class CloudProvider(pb_grpc.CloudProviderServicer):
    """Translates cluster-autoscaler's calls into group workflow Queries/Updates and Kubernetes reads."""

    def __init__(
        self,
        settings: ProviderSettings,
        catalog: Catalog,
        groups: GroupGateway,
        metrics: CallMetrics | None = None,
        temporal_unreachable: Callable[[], str] = lambda: "",
    ) -> None:
        self.settings = settings
        self.catalog = catalog
        self.groups = groups
        self.metrics = metrics or CallMetrics()
        self.temporal_unreachable = temporal_unreachable  # "" while Temporal answers, else why it does not

    @classmethod
    def build(
        cls,
        settings: ProviderSettings,
        client: Client,
        kube: Any,
        *,
        namespaces: Sequence[str],
        task_queue: str = c.TASK_QUEUE,
        temporal_unreachable: Callable[[], str] = lambda: "",
    ) -> CloudProvider:
        """The provider of the Groups of `namespaces`, starting group workflows on `task_queue`."""
        catalog = Catalog(kube, namespaces, ttl=settings.catalog_ttl_seconds)
        runtime = client.service_client.config.runtime or Runtime.default()
        metrics = CallMetrics(meter=runtime.metric_meter)
        gateway = GroupGateway(client, task_queue, reuse_seconds=settings.catalog_ttl_seconds)
        return cls(settings, catalog, gateway, metrics, temporal_unreachable)

    def budget(self, context: grpc.aio.ServicerContext) -> float:
        """This call's time: the configured budget, shortened to fit the caller's own deadline."""
        budget = self.settings.rpc_timeout_seconds
        remaining = context.time_remaining()
        if remaining is not None:
            budget = min(budget, remaining - DEADLINE_MARGIN)
        return max(budget, 0.05)

    # --- lookups ------------------------------------------------------------------------------------------
    async def group(self, group_id: str) -> GroupInfo:
        if not group_id:
            raise e.invalid("node group id is empty")
        found = (await self.catalog.snapshot()).by_id(group_id)
        if found is None:
            raise e.not_found(
                f"node group {group_id!r} not found: no Group of that name in {', '.join(self.catalog.namespaces)}"
            )
        return found

    @staticmethod
    def ref(group: GroupInfo) -> c.GroupRef:
        return c.GroupRef(group.namespace, group.name)

    def node_group(self, group: GroupInfo) -> pb.NodeGroup:
        """min/max as cluster-autoscaler should plan with: never more machines than the group has slots."""
        max_size = min(group.spec.max_size, len(group.slots))
        min_size = min(group.spec.min_size, max_size)
        return pb.NodeGroup(
            id=group.id,
            minSize=min_size,
            maxSize=max_size,
            debug=(
                f"Group {group.namespace}/{group.name}: minSize {group.spec.min_size}, maxSize {group.spec.max_size}, "
                f"{len(group.slots)} slots"
            ),
        )

    async def slot_of_node(self, node: pb.ExternalGrpcNode) -> tuple[GroupInfo, SlotInfo] | None:
        labels = dict(node.labels)
        for group in (await self.catalog.snapshot()).groups:
            slot = group.slot_for(node.providerID, node.name, labels)
            if slot is not None:
                return group, slot
        return None

    # --- provider-wide calls ------------------------------------------------------------------------------
    @_call("listing Groups")
    async def NodeGroups(self, request: pb.NodeGroupsRequest, context: Any) -> pb.NodeGroupsResponse:
        snap = await self.catalog.snapshot()
        return pb.NodeGroupsResponse(nodeGroups=[self.node_group(g) for g in snap.groups])

    @_call("matching the node to a slot")
    async def NodeGroupForNode(self, request: pb.NodeGroupForNodeRequest, context: Any) -> pb.NodeGroupForNodeResponse:
        if not request.HasField("node"):
            raise e.invalid("NodeGroupForNode: the request has no node")
        node = request.node
        if not node.name and not node.providerID:
            raise e.invalid("NodeGroupForNode: the node has neither a name nor a providerID")
        if is_fake(node):
            # An instance that never registered: the group workflow owns its registration deadline and
            # cancels it itself; cluster-autoscaler still removes errored instances through DeleteNodes.
            return pb.NodeGroupForNodeResponse(nodeGroup=pb.NodeGroup(id=""))
        found = await self.slot_of_node(node)
        if found is None or await self.mid_boot(*found, context):
            return pb.NodeGroupForNodeResponse(nodeGroup=pb.NodeGroup(id=""))
        return pb.NodeGroupForNodeResponse(nodeGroup=self.node_group(found[0]))

    async def mid_boot(self, group: GroupInfo, slot: SlotInfo, context: grpc.aio.ServicerContext) -> bool:
        """Whether the slot's machine is mid-boot (its claim not ready yet): its Node is then no group's.

        cluster-autoscaler 1.35's externalgrpc provider has no field for MaxNodeStartupTime, so a group whose
        options it reads starts up in 0 s (kubernetes/autoscaler#10245): a Node registered but not yet Ready
        counts as unready at once, the scale-up that asked for it as done, and a Pod still waiting for that machine
        as needing another one (seen: a second machine booted for one Pod). Left out of the group until its claim
        is ready, the Node stays what its instance says (creating, upcoming), and the scale-up lasts until the
        machine is ready, as the group's maxNodeProvisionTime means. When the group workflow cannot be asked, the
        Node is the group's, as it was before."""
        budget = self.budget(context) / 2  # the other half answers from the catalog, as before
        try:
            async with asyncio.timeout(budget):
                instances = await self.groups.instances(self.ref(group), budget)
        except (e.ProviderError, TimeoutError) as err:
            why = err.message if isinstance(err, e.ProviderError) else f"no answer within {budget:.2f} s"
            log.info("NodeGroupForNode: whether slot %s is mid-boot is unknown (%s): its node counts as group %s's",
                     slot.name, why, group.name)  # fmt: skip
            return False
        return c.mid_boot(instances, slot.name)

    @_call("pricing the node")
    async def PricingNodePrice(self, request: pb.PricingNodePriceRequest, context: Any) -> pb.PricingNodePriceResponse:
        node = request.node
        subject = f"node {node.name or node.providerID or '(unnamed)'}"
        if not request.HasField("node") or not (node.name or node.providerID or node.labels):
            raise e.invalid("PricingNodePrice: the request has no node")
        hours = _hours(
            request.startTimestamp,
            request.endTimestamp,
            request.HasField("startTimestamp") and request.HasField("endTimestamp"),
            self.settings.pricing_window_seconds,
            subject,
        )
        found = await self.slot_of_node(node)
        if found is not None:
            slot = found[1]
            if slot.pricing is None:
                raise e.unimplemented(f"{subject}: slot {slot.name} has no pricing")
            return pb.PricingNodePriceResponse(price=slot.pricing.hourly_rate * hours)
        # A template node (scale from zero) names no machine: price the group's cheapest machine.
        group = await self._group_by_label(node)
        if group is None:
            raise e.not_found(f"{subject} is not a machine of any node group")
        rates = [s.pricing.hourly_rate for s in group.slots if s.pricing is not None]
        if not rates:
            raise e.unimplemented(f"{subject}: no slot of group {group.name} has pricing")
        return pb.PricingNodePriceResponse(price=min(rates) * hours)

    async def _group_by_label(self, node: pb.ExternalGrpcNode) -> GroupInfo | None:
        name = node.labels.get(LABEL_GROUP)
        if not name:
            return None
        matches = [g for g in (await self.catalog.snapshot()).groups if label_value(g.name) == name]
        return matches[0] if len(matches) == 1 else None

    @_call("pricing the pod")
    async def PricingPodPrice(self, request: pb.PricingPodPriceRequest, context: Any) -> pb.PricingPodPriceResponse:
        pod = k8s.Pod()
        try:
            pod.ParseFromString(request.pod_bytes)
        except message.DecodeError as err:
            raise e.invalid(f"PricingPodPrice: pod_bytes is not a protobuf v1.Pod: {err}") from err
        subject = f"pod {pod.metadata.namespace}/{pod.metadata.name}"
        hours = _hours(
            request.startTimestamp,
            request.endTimestamp,
            request.HasField("startTimestamp") and request.HasField("endTimestamp"),
            self.settings.pricing_window_seconds,
            subject,
        )
        slots = [s for g in (await self.catalog.snapshot()).groups for s in g.slots]
        if pod.spec.nodeName:
            for slot in slots:
                if pod.spec.nodeName in (slot.node_name, slot.name):
                    if slot.pricing is None or slot.pricing.pod_rate is None:
                        raise e.unimplemented(f"{subject}: slot {slot.name} has no podRate")
                    return pb.PricingPodPriceResponse(price=slot.pricing.pod_rate * hours)
        rates = [s.pricing.pod_rate for s in slots if s.pricing is not None and s.pricing.pod_rate is not None]
        if not rates:
            raise e.unimplemented(f"{subject}: no slot has a podRate")
        return pb.PricingPodPriceResponse(price=min(rates) * hours)

    @_call("answering the GPU label")
    async def GPULabel(self, request: pb.GPULabelRequest, context: Any) -> pb.GPULabelResponse:
        return pb.GPULabelResponse(label=self.settings.gpu_label)

    @_call("answering the GPU types")
    async def GetAvailableGPUTypes(
        self, request: pb.GetAvailableGPUTypesRequest, context: Any
    ) -> pb.GetAvailableGPUTypesResponse:
        return pb.GetAvailableGPUTypesResponse(gpuTypes={t: any_pb2.Any() for t in self.settings.gpu_types})

    @_call("cleaning up")
    async def Cleanup(self, request: pb.CleanupRequest, context: Any) -> pb.CleanupResponse:
        """Nothing to release: the provider holds no per-client resources; workflows outlive it by design."""
        return pb.CleanupResponse()

    @_call("refreshing")
    async def Refresh(self, request: pb.RefreshRequest, context: Any) -> pb.RefreshResponse:
        """A new autoscaler loop: the next reads list Groups and slots and ask the group workflows afresh. Never
        fails (that would stop cluster-autoscaler's whole loop)."""
        self.catalog.invalidate()
        self.groups.refresh()
        return pb.RefreshResponse()

    # --- one node group -----------------------------------------------------------------------------------
    @_call("asking the group workflow for its target size")
    async def NodeGroupTargetSize(
        self, request: pb.NodeGroupTargetSizeRequest, context: Any
    ) -> pb.NodeGroupTargetSizeResponse:
        group = await self.group(request.id)
        size = await self.groups.target_size(self.ref(group), self.budget(context))
        return pb.NodeGroupTargetSizeResponse(targetSize=size)

    @_call("waiting for the group workflow to take the increase")
    async def NodeGroupIncreaseSize(
        self, request: pb.NodeGroupIncreaseSizeRequest, context: Any
    ) -> pb.NodeGroupIncreaseSizeResponse:
        group = await self.group(request.id)
        if request.delta <= 0:
            raise e.invalid(f"group {group.name}: IncreaseSize delta must be positive, got {request.delta}")
        size = await self.groups.update(
            self.ref(group), c.GroupUpdate.INCREASE_SIZE, request.delta, self.budget(context)
        )
        log.info("group %s: increased by %d, target now %d", group.id, request.delta, size)
        return pb.NodeGroupIncreaseSizeResponse()

    @_call("waiting for the group workflow to take the deletion")
    async def NodeGroupDeleteNodes(
        self, request: pb.NodeGroupDeleteNodesRequest, context: Any
    ) -> pb.NodeGroupDeleteNodesResponse:
        group = await self.group(request.id)
        if not request.nodes:
            raise e.invalid(f"group {group.name}: DeleteNodes names no node")
        slots: list[SlotInfo] = []
        for i, node in enumerate(request.nodes):
            if not node.name and not node.providerID:
                raise e.invalid(f"group {group.name}: DeleteNodes node #{i} has neither a name nor a providerID")
            slot = group.slot_for(node.providerID, node.name, dict(node.labels))
            if slot is None:
                slot = await self._slot_by_instance(group, node)
            if slot is None:
                raise e.invalid(f"node {node.name or node.providerID} is not in node group {group.id}")
            if slot not in slots:
                slots.append(slot)
        # The group workflow marks live claims and forgets the errors of failed ones (so a failed instance that
        # cluster-autoscaler deleted is not listed again).
        size = await self.groups.update(
            self.ref(group), c.GroupUpdate.DELETE_NODES, [s.name for s in slots], self.budget(context)
        )
        log.info("group %s: deleting %s, target now %d", group.id, ", ".join(s.name for s in slots), size)
        return pb.NodeGroupDeleteNodesResponse()

    async def _slot_by_instance(self, group: GroupInfo, node: pb.ExternalGrpcNode) -> SlotInfo | None:
        """A node known by the id the group workflow reports (the kubelet's providerID, e.g. `k3s://name`)."""
        snap = await self.groups.snapshot(self.ref(group), self.settings.rpc_timeout_seconds)
        # The workflow reports the kubelet's own providerID once the Node has registered.
        for name, slot in (snap.get("slots") or {}).items():
            if slot.get("providerID") and slot.get("providerID") in (node.providerID, node.name):
                return next((s for s in group.slots if s.name == name), None)
        return None

    @_call("waiting for the group workflow to take the decrease")
    async def NodeGroupDecreaseTargetSize(
        self, request: pb.NodeGroupDecreaseTargetSizeRequest, context: Any
    ) -> pb.NodeGroupDecreaseTargetSizeResponse:
        group = await self.group(request.id)
        if request.delta >= 0:
            raise e.invalid(f"group {group.name}: DecreaseTargetSize delta must be negative, got {request.delta}")
        size = await self.groups.update(
            self.ref(group), c.GroupUpdate.DECREASE_TARGET_SIZE, request.delta, self.budget(context)
        )
        log.info("group %s: target decreased by %d, now %d", group.id, -request.delta, size)
        return pb.NodeGroupDecreaseTargetSizeResponse()

    @_call("asking the group workflow for its instances")
    async def NodeGroupNodes(self, request: pb.NodeGroupNodesRequest, context: Any) -> pb.NodeGroupNodesResponse:
        group = await self.group(request.id)
        found = await self.groups.instances(self.ref(group), self.budget(context))
        return pb.NodeGroupNodesResponse(instances=[instance_proto(i) for i in found])

    @_call("asking the group workflow for its template node")
    async def NodeGroupTemplateNodeInfo(
        self, request: pb.NodeGroupTemplateNodeInfoRequest, context: Any
    ) -> pb.NodeGroupTemplateNodeInfoResponse:
        group = await self.group(request.id)
        snap = await self.groups.snapshot(self.ref(group), self.budget(context))
        # A machine seen wins over what the Group declares (it is what the kubelet really reports).
        template = snap.get("template") or declared_template(group.spec)
        if not template:
            # No machine of the group has registered yet and the Group declares no capacity, so nothing is known
            # of it. UNIMPLEMENTED is the one code cluster-autoscaler reads as "no template" (any other aborts its
            # whole loop).
            raise e.unimplemented(
                f"group {group.name}: no template node yet: none of its machines has registered a Node "
                "(set spec.nodeCapacity to scale a new group up from zero)"
            )
        return pb.NodeGroupTemplateNodeInfoResponse(nodeBytes=node_bytes(group.name, template, group.spec))

    @_call("reading the Group's options")
    async def NodeGroupGetOptions(
        self, request: pb.NodeGroupAutoscalingOptionsRequest, context: Any
    ) -> pb.NodeGroupAutoscalingOptionsResponse:
        group = await self.group(request.id)
        return pb.NodeGroupAutoscalingOptionsResponse(
            nodeGroupAutoscalingOptions=merged_options(
                group, request.defaults if request.HasField("defaults") else None
            )
        )


def is_fake(node: pb.ExternalGrpcNode) -> bool:
    """cluster-autoscaler's stand-in for an instance without a Node: its name is the instance id.

    A Kubernetes node name is a DNS subdomain and never contains "://"; an instance id always does.
    """
    return "://" in node.name or node.annotations.get(FAKE_NODE_ANNOTATION) is not None


FAKE_NODE_ANNOTATION = "k8s.io/cluster-autoscaler/fake-node-reason"


def instance_proto(i: c.Instance) -> pb.Instance:
    status = pb.InstanceStatus(instanceState=_STATES.get(i.state, pb.InstanceStatus.unspecified))
    if i.error_code:
        status.errorInfo.CopyFrom(
            pb.InstanceErrorInfo(
                errorCode=i.error_code,
                errorMessage=i.error_message,
                instanceErrorClass=i.error_class or ERROR_CLASS_OTHER,
            )
        )
    return pb.Instance(id=i.id, status=status)


def merged_options(group: GroupInfo, defaults: pb.NodeGroupAutoscalingOptions | None) -> pb.NodeGroupAutoscalingOptions:
    """The Group's fields over the request's defaults over cluster-autoscaler's own; no duration is ever unset.

    An unset (or zero) duration makes cluster-autoscaler act at once (a node deleted the loop after it was
    asked for), so a zero default is treated as missing.
    """
    spec = group.spec
    d = defaults

    def pick_duration(own: timedelta | None, given: duration_pb2.Duration | None, fallback: timedelta) -> Any:
        if own is not None and own > timedelta(0):
            return _duration(own)
        if given is not None and _seconds(given) > 0:
            return given
        return _duration(fallback)

    return pb.NodeGroupAutoscalingOptions(
        scaleDownUtilizationThreshold=_first(
            spec.scale_down_utilization_threshold,
            d.scaleDownUtilizationThreshold if d else None,
            CA_DEFAULT_THRESHOLD,
        ),
        scaleDownGpuUtilizationThreshold=_first(
            spec.scale_down_gpu_utilization_threshold,
            d.scaleDownGpuUtilizationThreshold if d else None,
            CA_DEFAULT_GPU_THRESHOLD,
        ),
        zeroOrMaxNodeScaling=_first(spec.zero_or_max_node_scaling, d.zeroOrMaxNodeScaling if d else None, False),
        ignoreDaemonSetsUtilization=_first(
            spec.ignore_daemon_sets_utilization, d.ignoreDaemonSetsUtilization if d else None, False
        ),
        scaleDownUnneededDuration=pick_duration(
            spec.scale_down_unneeded_time,
            d.scaleDownUnneededDuration if d and d.HasField("scaleDownUnneededDuration") else None,
            CA_DEFAULT_UNNEEDED,
        ),
        scaleDownUnreadyDuration=pick_duration(
            spec.scale_down_unready_time,
            d.scaleDownUnreadyDuration if d and d.HasField("scaleDownUnreadyDuration") else None,
            CA_DEFAULT_UNREADY,
        ),
        # The number in force, not a default: a claim fails at requestedAt + max(boot budget, the group's
        # maxNodeProvisionTime), and cluster-autoscaler must not wait for it longer or shorter than that.
        MaxNodeProvisionDuration=_duration(claims.provision_time(spec.max_node_provision_time)),
    )


V = TypeVar("V")


def _first(*values: V | None) -> V:
    for v in values:
        if v is not None:
            return v
    raise ValueError("no value")  # the last argument is always a default
