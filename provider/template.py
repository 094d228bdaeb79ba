"""The template node of a group as protobuf bytes of a k8s.io/api/core/v1 Node, for scale from zero.

The group workflow keeps a sanitized copy of the last kubelet Node it saw in the group (labels, lasting
taints, capacity, allocatable, nodeInfo). cluster-autoscaler simulates "what if one more machine" on it, so
the copy is made to look like a fresh, Ready, schedulable machine of the group and nothing more specific: the
labels that name one machine are dropped, and the Group's own `nodeLabels` and `nodeTaints` (what every node
of the group carries once ready) are laid over it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from api import names
from api.v2alpha1 import GroupSpec
from proto import k8s_node_pb2 as k8s

# Labels that identify one machine; a hypothetical new node of the group would not carry these values.
MACHINE_LABELS = ("kubernetes.io/hostname", names.LABEL_NODE)

# What a healthy kubelet reports; the template stands for a machine that has just become Ready.
HEALTHY_CONDITIONS: tuple[tuple[str, str, str], ...] = (
    ("Ready", "True", "KubeletReady"),
    ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID"),
    ("NetworkUnavailable", "False", "RouteCreated"),
)
_SYSTEM_INFO = (
    "machineID",
    "systemUUID",
    "bootID",
    "kernelVersion",
    "osImage",
    "containerRuntimeVersion",
    "kubeletVersion",
    "kubeProxyVersion",
    "operatingSystem",
    "architecture",
)
# Per-machine identities in nodeInfo: a new machine has its own.
_MACHINE_INFO = ("machineID", "systemUUID", "bootID")


def declared_template(spec: GroupSpec) -> dict[str, Any] | None:
    """The template of a group none of whose machines has registered yet, from its declared `nodeCapacity`.

    Without one, cluster-autoscaler has nothing to plan a scale-up from zero with and never picks the group.
    """
    if not spec.node_capacity:
        return None
    capacity = dict(spec.node_capacity)
    return {"metadata": {"labels": {}}, "spec": {}, "status": {"capacity": capacity, "allocatable": capacity}}


def template_name(group: str) -> str:
    return f"{group}-template"


def template_labels(template: Mapping[str, Any], spec: GroupSpec) -> dict[str, str]:
    """The snapshot's labels minus those naming one machine, with the Group's nodeLabels laid over them."""
    labels = {str(k): str(v) for k, v in ((template.get("metadata") or {}).get("labels") or {}).items()}
    for key in MACHINE_LABELS:
        labels.pop(key, None)
    labels.update(spec.node_labels)
    return labels


def template_taints(template: Mapping[str, Any], spec: GroupSpec) -> list[tuple[str, str, str]]:
    """(key, value, effect) of the snapshot's lasting taints plus the Group's nodeTaints, one per key and effect."""
    seen: dict[tuple[str, str], str] = {}
    for t in (template.get("spec") or {}).get("taints") or []:
        if t.get("key") and t.get("effect"):
            seen[(str(t["key"]), str(t["effect"]))] = str(t.get("value") or "")
    for taint in spec.node_taints:
        seen[(taint.key, str(taint.effect))] = taint.value or ""
    return [(key, value, effect) for (key, effect), value in seen.items()]


def _quantities(target: Any, values: Mapping[str, Any] | None) -> None:
    for name, amount in (values or {}).items():
        target[str(name)].string = str(amount)


def node_proto(group: str, template: Mapping[str, Any], spec: GroupSpec) -> k8s.Node:
    node = k8s.Node()
    node.metadata.name = template_name(group)
    node.metadata.labels.update(template_labels(template, spec))
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    node.metadata.annotations.update({str(k): str(v) for k, v in annotations.items()})
    node.spec.unschedulable = False
    for key, value, effect in template_taints(template, spec):
        node.spec.taints.add(key=key, value=value, effect=effect)
    status = template.get("status") or {}
    _quantities(node.status.capacity, status.get("capacity"))
    _quantities(node.status.allocatable, status.get("allocatable") or status.get("capacity"))
    info = status.get("nodeInfo") or {}
    for field in _SYSTEM_INFO:
        if info.get(field) and field not in _MACHINE_INFO:
            setattr(node.status.nodeInfo, field, str(info[field]))
    _conditions(node.status.conditions, HEALTHY_CONDITIONS)
    return node


def _conditions(target: Any, rows: Iterable[tuple[str, str, str]]) -> None:
    for kind, state, reason in rows:
        target.add(type=kind, status=state, reason=reason)


def node_bytes(group: str, template: Mapping[str, Any], spec: GroupSpec) -> bytes:
    """What `v1.Node.Marshal()` would produce for the template (the subset of fields we set)."""
    return node_proto(group, template, spec).SerializeToString(deterministic=True)
