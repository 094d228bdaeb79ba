"""``kubectl get`` tables (``meta.k8s.io/v1 Table``) as kube-apiserver's table convertors build them.

Custom resources get Name plus their CRD's ``additionalPrinterColumns``; built-in kinds the columns of
``pkg/printers/internalversion`` (``printJob``, ``printEvent``, ``printNode``, ``printLease``...), one
``Column`` per row of ``TABLES``. The server always sends every column with its priority; kubectl hides the
priority > 0 ones unless ``-o wide``. Ages and durations are ``duration.HumanDuration``.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["INCLUDE_OBJECT", "TABLES", "Column", "crd_columns", "human_duration", "table"]

Obj = Mapping[str, Any]
Cell = Callable[[Obj, datetime.datetime], Any]


@dataclass(frozen=True)
class Column:
    """One table column: its definition and how a row's cell is computed from the object and the time now."""

    name: str
    cell: Cell
    type: str = "string"
    priority: int = 0
    format: str = ""
    description: str = ""

    def definition(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "format": self.format,
            "description": self.description or self.name,
            "priority": self.priority,
        }


def human_duration(seconds: float) -> str:
    """apimachinery ``duration.HumanDuration``: 0s…119s, 2m5s…9m59s, 10m…179m, 3h…7h59m, 8h…47h, 2d…, 2y…."""
    total = int(seconds)
    if total < -1:
        return "<invalid>"
    if total < 0:
        return "0s"
    if total < 120:
        return f"{total}s"
    minutes = total // 60
    if minutes < 10:
        return f"{minutes}m" if total % 60 == 0 else f"{minutes}m{total % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years, days = hours // 24 // 365, (hours // 24) % 365
        return f"{years}y" if days == 0 else f"{years}y{days}d"
    return f"{hours // 24 // 365}y"


def _get(obj: Any, path: str) -> Any:
    for part in path.strip(".").split("."):
        obj = obj.get(part) if isinstance(obj, Mapping) else None
    return obj


def _time(value: Any) -> datetime.datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith("Z") else value)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def _since(value: Any, now: datetime.datetime) -> str:
    """``translateTimestampSince``: the age of a timestamp, ``<unknown>`` when there is none."""
    moment = _time(value)
    return "<unknown>" if moment is None else human_duration((now - moment).total_seconds())


def _field(path: str, default: Any = "") -> Cell:
    return lambda obj, _now: _get(obj, path) if _get(obj, path) is not None else default


def _age(obj: Obj, now: datetime.datetime) -> str:
    return _since(_get(obj, "metadata.creationTimestamp"), now)


def _has_condition(obj: Obj, kind: str) -> bool:
    conditions = _get(obj, "status.conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions if isinstance(c, Mapping))


def _job_status(obj: Obj, _now: datetime.datetime) -> str:
    """``printJob``'s STATUS (kubectl 1.30+)."""
    for condition, shown in (("Complete", "Complete"), ("Failed", "Failed")):
        if _has_condition(obj, condition):
            return shown
    if _get(obj, "metadata.deletionTimestamp"):
        return "Terminating"
    for condition in ("Suspended", "FailureTarget", "SuccessCriteriaMet"):
        if _has_condition(obj, condition):
            return condition
    return "Running"


def _job_completions(obj: Obj, _now: datetime.datetime) -> str:
    succeeded = int(_get(obj, "status.succeeded") or 0)
    completions = _get(obj, "spec.completions")
    if completions is not None:
        return f"{succeeded}/{completions}"
    parallelism = int(_get(obj, "spec.parallelism") or 0)
    return f"{succeeded}/1 of {parallelism}" if parallelism > 1 else f"{succeeded}/1"


def _job_duration(obj: Obj, now: datetime.datetime) -> str:
    start = _time(_get(obj, "status.startTime"))
    if start is None:
        return ""
    end = _time(_get(obj, "status.completionTime")) or now
    return human_duration((end - start).total_seconds())


def _containers(attribute: str) -> Cell:
    def cell(obj: Obj, _now: datetime.datetime) -> str:
        containers = _get(obj, "spec.template.spec.containers") or []
        return ",".join(str(c.get(attribute) or "") for c in containers if isinstance(c, Mapping))

    return cell


def _selector(obj: Obj, _now: datetime.datetime) -> str:
    labels = _get(obj, "spec.selector.matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "<none>"


def _event_first(obj: Obj, now: datetime.datetime) -> str:
    first = _get(obj, "firstTimestamp") or _get(obj, "deprecatedFirstTimestamp")
    return _since(first or _get(obj, "eventTime"), now)


def _event_last(obj: Obj, now: datetime.datetime) -> str:
    series = _get(obj, "series.lastObservedTime")
    if series:
        return _since(series, now)
    last = _get(obj, "lastTimestamp") or _get(obj, "deprecatedLastTimestamp")
    return _since(last, now) if last else _event_first(obj, now)


def _event_object(obj: Obj, _now: datetime.datetime) -> str:
    ref = _get(obj, "involvedObject") or _get(obj, "regarding") or {}
    kind = str(ref.get("kind") or "").lower()
    return f"{kind}/{ref['name']}" if ref.get("name") else kind


def _event_source(obj: Obj, _now: datetime.datetime) -> str:
    """``formatEventSource``: component[, host], or the reporting controller[, instance]."""
    source = _get(obj, "source") or _get(obj, "deprecatedSource") or {}
    parts = [source.get("component"), source.get("host")]
    if not parts[0]:
        parts = [_get(obj, "reportingComponent") or _get(obj, "reportingController"), _get(obj, "reportingInstance")]
    return ", ".join(str(p) for p in parts if p) or "<none>"


def _event_count(obj: Obj, _now: datetime.datetime) -> int:
    return int(_get(obj, "series.count") or _get(obj, "count") or _get(obj, "deprecatedCount") or 1)


def _event_message(obj: Obj, _now: datetime.datetime) -> str:
    return str(_get(obj, "message") or _get(obj, "note") or "").strip()


def _node_status(obj: Obj, _now: datetime.datetime) -> str:
    """``printNode``: Ready / NotReady / Unknown, then ``,SchedulingDisabled`` when cordoned."""
    ready = next((c for c in _get(obj, "status.conditions") or [] if c.get("type") == "Ready"), None)
    shown = {"True": "Ready", "False": "NotReady"}.get(str((ready or {}).get("status")), "Unknown")
    return shown + (",SchedulingDisabled" if _get(obj, "spec.unschedulable") else "")


def _node_roles(obj: Obj, _now: datetime.datetime) -> str:
    roles: set[str] = set()
    for key, value in (_get(obj, "metadata.labels") or {}).items():
        if key.startswith("node-role.kubernetes.io/") and key.split("/", 1)[1]:
            roles.add(key.split("/", 1)[1])
        elif key == "kubernetes.io/role" and value:
            roles.add(value)
    return ",".join(sorted(roles)) or "<none>"


def _node_address(kind: str) -> Cell:
    def cell(obj: Obj, _now: datetime.datetime) -> str:
        addresses = _get(obj, "status.addresses") or []
        return next((a.get("address") for a in addresses if a.get("type") == kind), "<none>")

    return cell


def _count(path: str) -> Cell:
    return lambda obj, _now: len(_get(obj, path) or {})


def _namespace_phase(obj: Obj, _now: datetime.datetime) -> str:
    return str(_get(obj, "status.phase") or "")


def _pod_ready(obj: Obj, _now: datetime.datetime) -> str:
    statuses = _get(obj, "status.containerStatuses") or []
    ready = sum(1 for st in statuses if st.get("ready") and (st.get("state") or {}).get("running"))
    return f"{ready}/{len(_get(obj, 'spec.containers') or [])}"


def _pod_status(obj: Obj, _now: datetime.datetime) -> str:
    """``printPod``'s STATUS: the phase, or the last container's waiting/terminated reason, or Terminating."""
    phase = str(_get(obj, "status.phase") or "")
    reason = str(_get(obj, "status.reason") or phase)
    for status in reversed(_get(obj, "status.containerStatuses") or []):
        state = status.get("state") or {}
        waiting, terminated = state.get("waiting") or {}, state.get("terminated")
        if waiting.get("reason"):
            reason = str(waiting["reason"])
        elif terminated is not None:
            signal = terminated.get("signal")
            reason = str(
                terminated.get("reason")
                or (f"Signal:{signal}" if signal else f"ExitCode:{terminated.get('exitCode', 0)}")
            )
    if _get(obj, "metadata.deletionTimestamp") and phase not in ("Succeeded", "Failed"):
        return "Terminating"
    return reason


def _pod_restarts(obj: Obj, _now: datetime.datetime) -> str:
    return str(sum(int(st.get("restartCount") or 0) for st in _get(obj, "status.containerStatuses") or []))


def _pod_ip(obj: Obj, _now: datetime.datetime) -> str:
    ips = _get(obj, "status.podIPs") or []
    return str(ips[0].get("ip") or "<none>") if ips else "<none>"


NAME = Column("Name", _field("metadata.name"), format="name", description="Name must be unique within a namespace.")
AGE = Column(
    "Age",
    _age,
    description="CreationTimestamp is a timestamp representing the server time when this object was created.",
)
_EVENT_COLUMNS = (
    Column("Last Seen", _event_last),
    Column("Type", _field("type")),
    Column("Reason", _field("reason")),
    Column("Object", _event_object),
    Column("Subobject", lambda o, _n: _get(o, "involvedObject.fieldPath") or "", priority=1),
    Column("Source", _event_source, priority=1),
    Column("Message", _event_message),
    Column("First Seen", _event_first, priority=1),
    Column("Count", _event_count, type="integer", priority=1),
    Column("Name", _field("metadata.name"), priority=1, format="name"),
)
TABLES: dict[tuple[str, str], tuple[Column, ...]] = {
    ("batch", "Job"): (
        NAME,
        Column("Status", _job_status),
        Column("Completions", _job_completions),
        Column("Duration", _job_duration),
        AGE,
        Column("Containers", _containers("name"), priority=1),
        Column("Images", _containers("image"), priority=1),
        Column("Selector", _selector, priority=1),
    ),
    ("", "Event"): _EVENT_COLUMNS,
    ("events.k8s.io", "Event"): _EVENT_COLUMNS,
    ("", "Node"): (
        NAME,
        Column("Status", _node_status),
        Column("Roles", _node_roles),
        AGE,
        Column("Version", _field("status.nodeInfo.kubeletVersion")),
        Column("Internal-IP", _node_address("InternalIP"), priority=1),
        Column("External-IP", _node_address("ExternalIP"), priority=1),
        Column("OS-Image", _field("status.nodeInfo.osImage", "<unknown>"), priority=1),
        Column("Kernel-Version", _field("status.nodeInfo.kernelVersion", "<unknown>"), priority=1),
        Column("Container-Runtime", _field("status.nodeInfo.containerRuntimeVersion", "<unknown>"), priority=1),
    ),
    ("", "Pod"): (
        NAME,
        Column("Ready", _pod_ready, description="The aggregate readiness state of this pod for accepting traffic."),
        Column("Status", _pod_status, description="The aggregate status of the containers in this pod."),
        Column(
            "Restarts",
            _pod_restarts,
            description="The number of times the containers in this pod have been restarted.",
        ),
        AGE,
        Column("IP", _pod_ip, priority=1, description="IP address assigned to the pod"),
        Column("Node", _field("spec.nodeName", "<none>"), priority=1, description="Name of the node assigned"),
        Column("Nominated Node", _field("status.nominatedNodeName", "<none>"), priority=1),
        Column("Readiness Gates", lambda _o, _n: "<none>", priority=1),
    ),
    ("coordination.k8s.io", "Lease"): (NAME, Column("Holder", _field("spec.holderIdentity")), AGE),
    ("", "Namespace"): (NAME, Column("Status", _namespace_phase), AGE),
    ("", "ConfigMap"): (NAME, Column("Data", _count("data"), type="integer"), AGE),
    ("", "Secret"): (NAME, Column("Type", _field("type")), Column("Data", _count("data"), type="integer"), AGE),
}
"""(group, kind) → the columns its table convertor prints; kinds not listed get Name and Age."""


def crd_columns(printer_columns: Sequence[Mapping[str, Any]]) -> tuple[Column, ...]:
    """Name, then a CRD's ``additionalPrinterColumns`` (Age alone when it declares none)."""
    if not printer_columns:
        return (NAME, AGE)

    def cell(spec: Mapping[str, Any]) -> Cell:
        def compute(obj: Obj, now: datetime.datetime) -> Any:
            value = _get(obj, str(spec.get("jsonPath", "")))
            if value is None:
                return None  # kubectl prints a null cell as <none>
            if spec.get("type") == "date":
                moment = _time(value)
                return "<invalid>" if moment is None else human_duration((now - moment).total_seconds())
            return value

        return compute

    declared = tuple(
        Column(
            str(spec["name"]),
            cell(spec),
            type=str(spec.get("type", "string")),
            format=str(spec.get("format", "")),
            priority=int(spec.get("priority", 0)),
            description=str(spec.get("description", spec["name"])),
        )
        for spec in printer_columns
    )
    return (NAME, *declared)


INCLUDE_OBJECT = ("Metadata", "Object", "None")
"""``includeObject`` values: a row's object as PartialObjectMetadata (the default), whole, or left out."""


def _row_object(item: Obj, include: str) -> Obj | None:
    if include == "Object":
        return dict(item)
    if include == "None":
        return None
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": item.get("metadata") or {}}


def table(
    items: Iterable[Obj],
    columns: Sequence[Column],
    now: datetime.datetime,
    resource_version: str,
    *,
    include: str = "Metadata",
) -> dict[str, Any]:
    """The Table of ``items``: one row of cells per object, with the object as ``includeObject`` asks.

    kubectl's ``--sort-by`` asks for ``includeObject=Object`` and sorts the rows by a field of each object; a row
    carrying only metadata sorts on nothing, and kubectl prints "No resources found".
    """
    rows = [{"cells": [column.cell(item, now) for column in columns], "object": _row_object(item, include)}
            for item in items]  # fmt: skip
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [column.definition() for column in columns],
        "rows": rows,
    }
