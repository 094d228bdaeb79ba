"""The wire contract: committed generated modules are fresh, and every message cluster-autoscaler 1.35 uses has
exactly its package, names, numbers and types (a renumbered field would still compile and silently break)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from google.protobuf.descriptor import FieldDescriptor as F

from proto import externalgrpc_pb2 as pb
from proto import k8s_node_pb2 as k8s
from proto.generate import ROOT, SOURCES, generate, outputs

if TYPE_CHECKING:
    # The stubs type a message's descriptors as either implementation's: the pure-Python one or upb's.
    from google._upb._message import FieldDescriptor as UpbF

PACKAGE = "clusterautoscaler.cloudprovider.v1.externalgrpc"
STR, I32, I64, DBL, BOOL, BYTES, MSG, ENUM = (
    F.TYPE_STRING,
    F.TYPE_INT32,
    F.TYPE_INT64,
    F.TYPE_DOUBLE,
    F.TYPE_BOOL,
    F.TYPE_BYTES,
    F.TYPE_MESSAGE,
    F.TYPE_ENUM,
)
REP = "repeated"
MAP = "map"

# message -> {field: (number, type, message type or None, label)} as cluster-autoscaler 1.35 defines them.
CA_MESSAGES: dict[str, dict[str, tuple[int, int, str | None, str]]] = {
    "NodeGroup": {"id": (1, STR, None, ""), "minSize": (2, I32, None, ""), "maxSize": (3, I32, None, ""),
                  "debug": (4, STR, None, "")},
    "ExternalGrpcNode": {"providerID": (1, STR, None, ""), "name": (2, STR, None, ""),
                         "labels": (3, MSG, None, MAP), "annotations": (4, MSG, None, MAP)},
    "NodeGroupsRequest": {},
    "NodeGroupsResponse": {"nodeGroups": (1, MSG, "NodeGroup", REP)},
    "NodeGroupForNodeRequest": {"node": (1, MSG, "ExternalGrpcNode", "")},
    "NodeGroupForNodeResponse": {"nodeGroup": (1, MSG, "NodeGroup", "")},
    "PricingNodePriceRequest": {"node": (1, MSG, "ExternalGrpcNode", ""),
                                "startTimestamp": (4, MSG, "google.protobuf.Timestamp", ""),
                                "endTimestamp": (5, MSG, "google.protobuf.Timestamp", "")},
    "PricingNodePriceResponse": {"price": (1, DBL, None, "")},
    "PricingPodPriceRequest": {"pod_bytes": (4, BYTES, None, ""),
                               "startTimestamp": (5, MSG, "google.protobuf.Timestamp", ""),
                               "endTimestamp": (6, MSG, "google.protobuf.Timestamp", "")},
    "PricingPodPriceResponse": {"price": (1, DBL, None, "")},
    "GPULabelRequest": {},
    "GPULabelResponse": {"label": (1, STR, None, "")},
    "GetAvailableGPUTypesRequest": {},
    "GetAvailableGPUTypesResponse": {"gpuTypes": (1, MSG, None, MAP)},
    "CleanupRequest": {},
    "CleanupResponse": {},
    "RefreshRequest": {},
    "RefreshResponse": {},
    "NodeGroupTargetSizeRequest": {"id": (1, STR, None, "")},
    "NodeGroupTargetSizeResponse": {"targetSize": (1, I32, None, "")},
    "NodeGroupIncreaseSizeRequest": {"delta": (1, I32, None, ""), "id": (2, STR, None, "")},
    "NodeGroupIncreaseSizeResponse": {},
    "NodeGroupDeleteNodesRequest": {"nodes": (1, MSG, "ExternalGrpcNode", REP), "id": (2, STR, None, "")},
    "NodeGroupDeleteNodesResponse": {},
    "NodeGroupDecreaseTargetSizeRequest": {"delta": (1, I32, None, ""), "id": (2, STR, None, "")},
    "NodeGroupDecreaseTargetSizeResponse": {},
    "NodeGroupNodesRequest": {"id": (1, STR, None, "")},
    "NodeGroupNodesResponse": {"instances": (1, MSG, "Instance", REP)},
    "Instance": {"id": (1, STR, None, ""), "status": (2, MSG, "InstanceStatus", "")},
    "InstanceStatus": {"instanceState": (1, ENUM, "InstanceStatus.InstanceState", ""),
                       "errorInfo": (2, MSG, "InstanceErrorInfo", "")},
    "InstanceErrorInfo": {"errorCode": (1, STR, None, ""), "errorMessage": (2, STR, None, ""),
                          "instanceErrorClass": (3, I32, None, "")},
    "NodeGroupTemplateNodeInfoRequest": {"id": (1, STR, None, "")},
    "NodeGroupTemplateNodeInfoResponse": {"nodeBytes": (2, BYTES, None, "")},
    "NodeGroupAutoscalingOptions": {
        "scaleDownUtilizationThreshold": (1, DBL, None, ""),
        "scaleDownGpuUtilizationThreshold": (2, DBL, None, ""),
        "zeroOrMaxNodeScaling": (6, BOOL, None, ""),
        "ignoreDaemonSetsUtilization": (7, BOOL, None, ""),
        "scaleDownUnneededDuration": (8, MSG, "google.protobuf.Duration", ""),
        "scaleDownUnreadyDuration": (9, MSG, "google.protobuf.Duration", ""),
        "MaxNodeProvisionDuration": (10, MSG, "google.protobuf.Duration", ""),
    },
    "NodeGroupAutoscalingOptionsRequest": {"id": (1, STR, None, ""),
                                           "defaults": (2, MSG, "NodeGroupAutoscalingOptions", "")},
    "NodeGroupAutoscalingOptionsResponse": {
        "nodeGroupAutoscalingOptions": (1, MSG, "NodeGroupAutoscalingOptions", "")
    },
}  # fmt: skip

METHODS = {
    "NodeGroups": ("NodeGroupsRequest", "NodeGroupsResponse"),
    "NodeGroupForNode": ("NodeGroupForNodeRequest", "NodeGroupForNodeResponse"),
    "PricingNodePrice": ("PricingNodePriceRequest", "PricingNodePriceResponse"),
    "PricingPodPrice": ("PricingPodPriceRequest", "PricingPodPriceResponse"),
    "GPULabel": ("GPULabelRequest", "GPULabelResponse"),
    "GetAvailableGPUTypes": ("GetAvailableGPUTypesRequest", "GetAvailableGPUTypesResponse"),
    "Cleanup": ("CleanupRequest", "CleanupResponse"),
    "Refresh": ("RefreshRequest", "RefreshResponse"),
    "NodeGroupTargetSize": ("NodeGroupTargetSizeRequest", "NodeGroupTargetSizeResponse"),
    "NodeGroupIncreaseSize": ("NodeGroupIncreaseSizeRequest", "NodeGroupIncreaseSizeResponse"),
    "NodeGroupDeleteNodes": ("NodeGroupDeleteNodesRequest", "NodeGroupDeleteNodesResponse"),
    "NodeGroupDecreaseTargetSize": ("NodeGroupDecreaseTargetSizeRequest", "NodeGroupDecreaseTargetSizeResponse"),
    "NodeGroupNodes": ("NodeGroupNodesRequest", "NodeGroupNodesResponse"),
    "NodeGroupTemplateNodeInfo": ("NodeGroupTemplateNodeInfoRequest", "NodeGroupTemplateNodeInfoResponse"),
    "NodeGroupGetOptions": ("NodeGroupAutoscalingOptionsRequest", "NodeGroupAutoscalingOptionsResponse"),
}

# k8s.io/api core/v1 and apimachinery meta/v1 field numbers of the Node subset (see proto/k8s_node.proto).
K8S_FIELDS: dict[str, dict[str, int]] = {
    "Node": {"metadata": 1, "spec": 2, "status": 3},
    "ObjectMeta": {"name": 1, "generateName": 2, "namespace": 3, "selfLink": 4, "uid": 5, "resourceVersion": 6,
                   "generation": 7, "creationTimestamp": 8, "deletionTimestamp": 9,
                   "deletionGracePeriodSeconds": 10, "labels": 11, "annotations": 12, "finalizers": 14},
    "Time": {"seconds": 1, "nanos": 2},
    "Quantity": {"string": 1},
    "NodeSpec": {"podCIDR": 1, "externalID": 2, "providerID": 3, "unschedulable": 4, "taints": 5, "podCIDRs": 7},
    "Taint": {"key": 1, "value": 2, "effect": 3, "timeAdded": 4},
    "NodeStatus": {"capacity": 1, "allocatable": 2, "phase": 3, "conditions": 4, "addresses": 5, "nodeInfo": 7},
    "NodeCondition": {"type": 1, "status": 2, "lastHeartbeatTime": 3, "lastTransitionTime": 4, "reason": 5,
                      "message": 6},
    "NodeAddress": {"type": 1, "address": 2},
    "NodeSystemInfo": {"machineID": 1, "systemUUID": 2, "bootID": 3, "kernelVersion": 4, "osImage": 5,
                       "containerRuntimeVersion": 6, "kubeletVersion": 7, "kubeProxyVersion": 8,
                       "operatingSystem": 9, "architecture": 10},
    "Pod": {"metadata": 1, "spec": 2},
    "PodSpec": {"nodeSelector": 7, "nodeName": 10},
}  # fmt: skip


def test_generated_modules_are_fresh(tmp_path: Path) -> None:
    generate(tmp_path)
    stale = [
        name
        for source in SOURCES
        for name in outputs(source)
        if (tmp_path / "proto" / name).read_bytes() != (ROOT / "proto" / name).read_bytes()
    ]
    assert stale == [], f"stale generated modules {stale}: run `python -m proto.generate` and commit the result"


def test_package_and_service() -> None:
    assert pb.DESCRIPTOR.package == PACKAGE
    service = pb.DESCRIPTOR.services_by_name["CloudProvider"]
    assert service.full_name == f"{PACKAGE}.CloudProvider"
    got = {m.name: (m.input_type.name, m.output_type.name) for m in service.methods}
    assert got == METHODS
    assert all(not m.client_streaming and not m.server_streaming for m in service.methods)


def _label(field: F | UpbF) -> str:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        return MAP
    return REP if field.is_repeated else ""


@pytest.mark.parametrize("name", sorted(CA_MESSAGES))
def test_message_matches_cluster_autoscaler(name: str) -> None:
    desc = pb.DESCRIPTOR.message_types_by_name.get(name) or pb.InstanceStatus.DESCRIPTOR.nested_types_by_name[name]
    got = {}
    for f in desc.fields:
        ref = None
        if f.message_type is not None and not f.message_type.GetOptions().map_entry:
            ref = f.message_type.full_name.removeprefix(f"{PACKAGE}.")
        elif f.enum_type is not None:
            ref = f.enum_type.full_name.removeprefix(f"{PACKAGE}.")
        got[f.name] = (f.number, f.type, ref, _label(f))
    assert got == CA_MESSAGES[name]


def test_no_message_beyond_the_contract() -> None:
    assert set(pb.DESCRIPTOR.message_types_by_name) == set(CA_MESSAGES)


def test_instance_states_and_map_values() -> None:
    enum = pb.InstanceStatus.DESCRIPTOR.enum_types_by_name["InstanceState"]
    assert {v.name: v.number for v in enum.values} == {
        "unspecified": 0,
        "instanceRunning": 1,
        "instanceCreating": 2,
        "instanceDeleting": 3,
    }
    gpu = pb.GetAvailableGPUTypesResponse.DESCRIPTOR.fields_by_name["gpuTypes"].message_type
    assert gpu is not None
    value = gpu.fields_by_name["value"].message_type
    assert value is not None
    assert value.full_name == "google.protobuf.Any"


def test_known_bytes_on_the_wire() -> None:
    """Hand-encoded: tag = number << 3 | wire type. A number slip changes these bytes."""
    assert pb.NodeGroupIncreaseSizeRequest(delta=3, id="g").SerializeToString() == b"\x08\x03\x12\x01g"
    assert pb.NodeGroupTemplateNodeInfoResponse(nodeBytes=b"x").SerializeToString() == b"\x12\x01x"
    assert pb.PricingPodPriceRequest(pod_bytes=b"p").SerializeToString() == b"\x22\x01p"
    opts = pb.NodeGroupAutoscalingOptions(zeroOrMaxNodeScaling=True)
    opts.MaxNodeProvisionDuration.seconds = 1
    assert opts.SerializeToString() == b"\x30\x01\x52\x02\x08\x01"


@pytest.mark.parametrize("name", sorted(K8S_FIELDS))
def test_k8s_subset_uses_upstream_field_numbers(name: str) -> None:
    desc = k8s.DESCRIPTOR.message_types_by_name[name]
    assert {f.name: f.number for f in desc.fields} == K8S_FIELDS[name]


def test_k8s_node_bytes() -> None:
    node = k8s.Node()
    node.metadata.name = "n"
    node.spec.taints.add(key="k", effect="NoSchedule")
    node.status.capacity["cpu"].string = "4"
    # metadata{name}, spec{taints{key, effect}}, status{capacity{"cpu": {string "4"}}}
    assert node.SerializeToString(deterministic=True) == (
        b"\x0a\x03\x0a\x01n"
        + b"\x12\x11\x2a\x0f\x0a\x01k\x1a\x0aNoSchedule"
        + b"\x1a\x0c\x0a\x0a\x0a\x03cpu\x12\x03\x0a\x014"
    )
