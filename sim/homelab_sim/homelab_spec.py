"""The simulated homelab's description: groups, slots, per-machine timings and fault switches, from one YAML file.

This is not a Kubernetes object: the file carries its own ``apiVersion: sim.homelab-autoscaler.dev/v1`` and
``kind: Homelab`` so that tools validating ``deploy/examples`` skip it. ``Homelab.seed()`` turns it into the
Namespace, Group and Node (slot) resources the operator reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from api.v2alpha1 import GroupSpec, PodSpecTemplate, PowerDraw, Pricing

__all__ = [
    "FAULT_NAMES",
    "SIM_API_VERSION",
    "SIM_KIND",
    "Faults",
    "GroupEntry",
    "HomelabSpec",
    "HomelabSpecError",
    "KubeletSpec",
    "SlotSpec",
    "Timings",
    "load_homelab_spec",
    "parse_homelab_spec",
]

SIM_API_VERSION: Literal["sim.homelab-autoscaler.dev/v1"] = "sim.homelab-autoscaler.dev/v1"
SIM_KIND: Literal["Homelab"] = "Homelab"

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class _Model(BaseModel):
    """camelCase keys as in the file; unknown keys refused, so a misspelt fault switch fails loudly."""

    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, extra="forbid")


class Timings(_Model):
    """How long each step of a machine's life takes, in seconds (0 = at once, inside the triggering write).

    ``jobSeconds``: a lifecycle Job from creation to completion. ``bootSeconds``: startup Job succeeded (or the
    power button pressed) → the kubelet registers its Node, NotReady and tainted. ``readySeconds``: NotReady →
    Ready. ``taintClearSeconds``: Ready → the group's readiness taints removed. ``shutdownSeconds``: shutdown
    Job succeeded → the kubelet stops posting (Ready=Unknown).
    """

    boot_seconds: float = Field(default=0.0, ge=0)
    ready_seconds: float = Field(default=0.0, ge=0)
    taint_clear_seconds: float = Field(default=0.0, ge=0)
    job_seconds: float = Field(default=0.0, ge=0)
    shutdown_seconds: float = Field(default=0.0, ge=0)

    def over(self, base: Timings) -> Timings:
        """These timings where set explicitly, ``base`` elsewhere (a slot overrides the homelab default)."""
        return base.model_copy(update={name: getattr(self, name) for name in self.model_fields_set})

    @property
    def all_zero(self) -> bool:
        return not any(getattr(self, name) for name in type(self).model_fields)


class Faults(_Model):
    """Fault switches of one machine; each names the Kubernetes-visible misbehaviour it produces."""

    startup_job_fails: bool = False  # startup Job ends Failed (BackoffLimitExceeded); machine stays off
    shutdown_job_fails: bool = False  # shutdown Job ends Failed; machine stays on
    job_hangs: bool = False  # lifecycle Jobs stay active (fail DeadlineExceeded only in real time)
    never_boots: bool = False  # startup Job succeeds, the machine never comes up, no Node appears
    kubelet_never_registers: bool = False  # the machine is on, but its kubelet registers no Node (until cleared)
    kubelet_never_ready: bool = False  # the Node registers but stays Ready=False
    taint_never_clears: bool = False  # the Node becomes Ready but keeps its readiness taints
    shutdown_does_nothing: bool = False  # shutdown Job succeeds, the machine stays on


#: Fault switch names as written in the file (camelCase); ``set_fault`` also takes the snake_case names.
FAULT_NAMES: tuple[str, ...] = tuple(info.alias or name for name, info in Faults.model_fields.items())


class KubeletSpec(_Model):
    """What the machine's kubelet puts on its core v1 Node: labels, capacity, and optionally a providerID."""

    labels: dict[str, str] = Field(default_factory=dict)
    capacity: dict[str, str] = Field(default_factory=lambda: {"cpu": "4", "memory": "16Gi", "pods": "110"})
    allocatable: dict[str, str] | None = None  # defaults to capacity
    provider_id: str | None = Field(default=None, alias="providerID")  # a bare-metal kubelet sets none


def _default_pod_spec(action: str) -> PodSpecTemplate:
    return PodSpecTemplate(image="busybox", command=["sh", "-c", f"echo {action}"])


class SlotSpec(_Model):
    """One machine: the slot resource's spec plus how the simulated hardware behaves."""

    name: str = Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)  # any name the slot CRD accepts
    group: str = Field(min_length=1)
    kubernetes_node_name: str | None = Field(default=None, pattern=_DNS_SUBDOMAIN)  # defaults to name
    provider_id: str | None = Field(default=None, alias="providerID")  # the slot's spec.providerID
    startup_pod_spec: PodSpecTemplate = Field(default_factory=lambda: _default_pod_spec("power on"))
    shutdown_pod_spec: PodSpecTemplate = Field(default_factory=lambda: _default_pod_spec("power off"))
    pricing: Pricing | None = None
    power_draw: PowerDraw | None = None  # the slot's spec.powerDraw, and what the machine draws in the ledger
    node: KubeletSpec = Field(default_factory=KubeletSpec)
    timings: Timings | None = None  # fields given here override the homelab's ``timings``
    faults: Faults = Field(default_factory=Faults)
    initially_on: bool = False  # on at install time: Ready Node, no readiness taints

    @property
    def node_name(self) -> str:
        """The kubelet Node's name (``kubernetesNodeName``, else the slot name)."""
        return self.kubernetes_node_name or self.name


class GroupEntry(GroupSpec):
    """A Group resource to seed: its name plus its spec, with the CRD's defaults."""

    name: str = Field(min_length=1, max_length=253, pattern=_DNS_SUBDOMAIN)  # any name the Group CRD accepts


class HomelabSpec(_Model):
    """A whole simulated homelab: one namespace, its groups and slots, default timings."""

    api_version: Literal["sim.homelab-autoscaler.dev/v1"] = SIM_API_VERSION
    kind: Literal["Homelab"] = SIM_KIND
    namespace: str = Field(default="homelab-autoscaler-system", pattern=_DNS_LABEL)
    timings: Timings = Field(default_factory=Timings)
    groups: list[GroupEntry] = Field(min_length=1)
    slots: list[SlotSpec] = Field(default_factory=list)
    # Work on the machines (homelab_sim.workloads): a usable Node gets a workload Pod and a DaemonSet's Pod, and a
    # shutdown Job started with the workload still there is counted (the chaos suite's drain check).
    workloads: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        groups = [group.name for group in self.groups]
        if len(set(groups)) != len(groups):
            raise ValueError(f"groups: duplicate group names in {groups}")
        slots = [slot.name for slot in self.slots]
        if len(set(slots)) != len(slots):
            raise ValueError(f"slots: duplicate slot names in {slots}")
        nodes = [slot.node_name for slot in self.slots]
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"slots: two slots share a kubernetesNodeName in {nodes}")
        for index, slot in enumerate(self.slots):
            if slot.group not in groups:
                raise ValueError(f"slots[{index}].group: unknown group {slot.group!r} (groups: {groups})")
        return self

    def slot(self, name: str) -> SlotSpec:
        for slot in self.slots:
            if slot.name == name:
                return slot
        raise KeyError(f"no slot {name!r} in the homelab")

    def group(self, name: str) -> GroupEntry:
        for group in self.groups:
            if group.name == name:
                return group
        raise KeyError(f"no group {name!r} in the homelab")

    def draw_of(self, slot: SlotSpec) -> PowerDraw | None:
        """What the machine draws: the slot's powerDraw over its group's, field by field."""
        group = self.group(slot.group).power_draw
        return group if slot.power_draw is None else slot.power_draw.over(group)

    def timings_of(self, slot: SlotSpec) -> Timings:
        """The slot's effective timings: its own where given, the homelab's elsewhere."""
        return slot.timings.over(self.timings) if slot.timings is not None else self.timings.model_copy()


class HomelabSpecError(ValueError):
    """A homelab file that cannot be used; the message names the file and the offending field."""


def _where(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def parse_homelab_spec(data: Any, source: str = "<homelab>") -> HomelabSpec:
    """Validate already-parsed YAML into a ``HomelabSpec``, turning pydantic's errors into one readable line each."""
    if not isinstance(data, dict):
        raise HomelabSpecError(f"{source}: expected a mapping with apiVersion {SIM_API_VERSION}, kind {SIM_KIND}")
    try:
        return HomelabSpec.model_validate(data)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            message = str(error["msg"]).removeprefix("Value error, ")
            lines.append(f"{_where(tuple(error['loc']))}: {message}" if error["loc"] else message)
        raise HomelabSpecError(f"{source}: invalid homelab: " + "; ".join(lines)) from None


def load_homelab_spec(path: str | Path) -> HomelabSpec:
    """Read a homelab YAML file (one document); every problem is one line naming the file, line or field."""
    path = Path(path)
    if not path.is_file():
        raise HomelabSpecError(f"{path}: no such file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise HomelabSpecError(f"{path}: cannot read it: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise HomelabSpecError(f"{where}: not valid YAML: {problem}") from None
    if data is None:
        raise HomelabSpecError(f"{path} is empty: a homelab has apiVersion, kind, groups and slots")
    return parse_homelab_spec(data, str(path))
