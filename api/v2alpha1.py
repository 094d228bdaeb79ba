"""Pydantic models of the `infra.homecluster.dev/v2alpha1` resources: Group, Node (a slot) and NodeClaim.

The models are the single source of the API: the CRD schemas in `deploy/crds/` are generated from them
(`api/crds.py`), so a field is added here once and the server, the operator and the tests agree on it.
Python attributes are snake_case; the JSON names are the camelCase aliases Kubernetes stores. Read an API
object with `Model.model_validate(obj)` (or `load(obj)`), write one with
`model.model_dump(by_alias=True, exclude_none=True, mode="json")`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

from api import names
from api.names import (
    ClaimCall,
    ClaimPhase,
    ClaimReason,
    GroupHealth,
    PowerOffNodePolicy,
    PowerState,
    Report,
    TaintEffect,
    UsageState,
)

__all__ = [
    "DURATION_PATTERN",
    "ClaimDigest",
    "Condition",
    "ConditionStatus",
    "ConfigMapEnvSource",
    "DNSPolicy",
    "DrawFigures",
    "Duration",
    "EnvFromSource",
    "EnvVar",
    "EnvVarSource",
    "Group",
    "GroupSpec",
    "GroupStatus",
    "GroupUsage",
    "KeySelector",
    "MinimalPodSpec",
    "Node",
    "NodeClaim",
    "NodeClaimSpec",
    "NodeClaimStatus",
    "NodeSpec",
    "NodeStatus",
    "NodeTemplate",
    "ObjectMeta",
    "OwnerReference",
    "PodSpecTemplate",
    "PowerDraw",
    "Pricing",
    "Resource",
    "ResourceRequirements",
    "SecretEnvSource",
    "SlotUsage",
    "Taint",
    "TerminationMessagePolicy",
    "Time",
    "Toleration",
    "Transition",
    "UsageFigures",
    "VolumeMount",
    "format_duration",
    "load",
    "parse_duration",
]

# --- durations -----------------------------------------------------------------------------------------

_UNIT_MICROSECONDS: dict[str, Decimal] = {
    "ns": Decimal("0.001"),
    "us": Decimal(1),
    "µs": Decimal(1),  # U+00B5, what Go prints
    "μs": Decimal(1),  # U+03BC, what Go also accepts
    "ms": Decimal(1_000),
    "s": Decimal(1_000_000),
    "m": Decimal(60_000_000),
    "h": Decimal(3_600_000_000),
}
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_UNIT = r"(?:ns|us|µs|μs|ms|s|m|h)"
#: The CRD pattern of a duration: what Go's time.ParseDuration accepts, minus the sign.
DURATION_PATTERN = rf"^(0|({_NUMBER}{_UNIT})+)$"
_DURATION_RE = re.compile(DURATION_PATTERN)
_TERM_RE = re.compile(rf"({_NUMBER})({_UNIT})")


def parse_duration(value: object) -> timedelta:
    """Read a Go/Kubernetes duration ("90s", "1h30m", "500ms") or a number of seconds; reject negatives.

    Kubernetes users write metav1.Duration strings, so the operator must read exactly those, and a typo must
    fail loudly at admission rather than as a zero timeout at 3 am.
    """
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}: expected a string such as '90s', '2m' or '1h30m'")
    elif isinstance(value, int | float):
        result = timedelta(seconds=value)
    elif isinstance(value, str):
        text = value.strip()
        if text.startswith("-"):
            raise ValueError(f"negative duration {value!r} is not allowed")
        if not _DURATION_RE.fullmatch(text):
            raise ValueError(
                f"invalid duration {value!r}: expected a Go duration such as '90s', '2m', '1h30m' or '500ms'"
            )
        micros = Decimal(0)
        for number, unit in _TERM_RE.findall(text):
            try:
                micros += Decimal(number) * _UNIT_MICROSECONDS[unit]
            except InvalidOperation as exc:  # pragma: no cover - the pattern already guards this
                raise ValueError(f"invalid duration {value!r}") from exc
        result = timedelta(microseconds=int(micros))
    else:
        raise ValueError(f"invalid duration {value!r}: expected a string such as '90s', '2m' or '1h30m'")
    if result < timedelta(0):
        raise ValueError(f"negative duration {value!r} is not allowed")
    return result


def _fraction(whole: int, part: int, digits: int) -> str:
    """`whole` plus `part` (of 10**digits) as Go prints it: trailing zeros and a bare dot dropped."""
    if part == 0:
        return str(whole)
    return f"{whole}.{part:0{digits}d}".rstrip("0")


def format_duration(value: timedelta) -> str:
    """Print a duration exactly as Go's time.Duration.String() does ("15m0s", "1h30m0s", "500ms").

    That is what a Go client (and metav1.Duration) writes, so objects round-trip byte-for-byte whichever
    side wrote them last.
    """
    micros = value // timedelta(microseconds=1)
    if micros < 0:
        raise ValueError(f"negative duration {value!r} is not allowed")
    if micros == 0:
        return "0s"
    if micros < 1_000:
        return f"{micros}µs"
    if micros < 1_000_000:
        return _fraction(micros // 1_000, micros % 1_000, 3) + "ms"
    seconds, sub = divmod(micros, 1_000_000)
    hours, seconds = divmod(seconds, 3_600)
    minutes, seconds = divmod(seconds, 60)
    text = _fraction(seconds, sub, 6) + "s"
    if hours or minutes:
        text = f"{minutes}m{text}"
    if hours:
        text = f"{hours}h{text}"
    return text


#: A non-negative duration: Go duration strings or seconds in, Go duration strings out.
Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN}),
]


def _at_most(limit: timedelta) -> AfterValidator:
    """Refuse a duration past `limit`, naming the bound: a duration past any sensible bound is a typo, and one
    past the calendar would stop the group's arithmetic.
    """

    def check(value: timedelta) -> timedelta:
        if value > limit:
            raise ValueError(f"{format_duration(value)} is longer than {format_duration(limit)}")
        return value

    return AfterValidator(check)


def _schema_at_most(limit: timedelta) -> WithJsonSchema:
    """The same bound for the API server: a CEL rule on the duration string."""
    text = format_duration(limit)
    rule = {"rule": f"self == '0' || duration(self) <= duration('{text}')", "message": f"must be at most {text}"}
    return WithJsonSchema(
        {"type": "string", "pattern": DURATION_PATTERN, "maxLength": 32, "x-kubernetes-validations": [rule]}
    )


_DAY, _WEEK = timedelta(hours=24), timedelta(days=7)
#: How long a machine may take to be ready (at most a day); cluster-autoscaler's own knob of the same name.
ProvisionTime = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    _at_most(_DAY),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
    _schema_at_most(_DAY),
]
#: The drain bound when a Group sets none: cluster-autoscaler's own default for a Pod's graceful termination.
DEFAULT_DRAIN_TIMEOUT = timedelta(minutes=10)
DEFAULT_DRAIN_TIMEOUT_TEXT = "10m"
#: cluster-autoscaler's scale-down timings (at most a week).
ScaleDownTime = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    _at_most(_WEEK),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
    _schema_at_most(_WEEK),
]
# Counts with a bound: a group of more machines than this is a typo, and timers past these are no timers.
MAX_GROUP_SIZE = 10_000
MAX_TTL_SECONDS = 30 * 24 * 3600
MAX_JOB_SECONDS = 24 * 3600
MAX_JOB_BACKOFF = 10


# --- times ---------------------------------------------------------------------------------------------
# The times a claim's own may hold: its deadline and TTL are added to them, and must stay on the calendar.
_EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
_LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def _as_utc(value: object) -> object:
    """Treat a naive datetime as UTC: every clock in this project is UTC, and Kubernetes only speaks it."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def _format_time(value: datetime) -> str:
    """RFC 3339 in UTC with a `Z`, the form the API server writes for metav1.Time."""
    text = value.astimezone(UTC).isoformat()
    return text.removesuffix("+00:00") + "Z"


#: A timezone-aware timestamp (naive input is taken as UTC), serialized as RFC 3339 `...Z`.
Time = Annotated[
    datetime,
    BeforeValidator(_as_utc),
    PlainSerializer(_format_time, return_type=str, when_used="json"),
]


# --- bases ---------------------------------------------------------------------------------------------


class _Spec(BaseModel):
    """Base of every user-written part: camelCase on the wire, unknown keys refused so typos surface."""

    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, extra="forbid")


class _Status(BaseModel):
    """Base of every operator-written part: unknown keys ignored, so an old reader survives a new writer."""

    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, extra="ignore")


# --- metadata ------------------------------------------------------------------------------------------


class OwnerReference(BaseModel):
    """metav1.OwnerReference: Jobs are owned by their claim and slot, so garbage collection follows them."""

    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, extra="allow")

    api_version: str
    kind: str
    name: str
    uid: str
    controller: bool | None = None
    block_owner_deletion: bool | None = None


class ObjectMeta(BaseModel):
    """The part of metav1.ObjectMeta the operator reads; anything else the server sends is kept as is."""

    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, extra="allow")

    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: Time | None = None
    deletion_timestamp: Time | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    finalizers: list[str] = Field(default_factory=list)
    owner_references: list[OwnerReference] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _omit_empty(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Drop empty maps and lists like the API server (Go `omitempty`), so dumps equal stored objects."""
        data: dict[str, Any] = handler(self)
        return {key: value for key, value in data.items() if value != {} and value != []}


# --- shared shapes -------------------------------------------------------------------------------------


class Taint(_Spec):
    """core/v1 Taint; the effect is checked here because the API server would reject the Node patch later."""

    key: str = Field(min_length=1, description="The taint key.")
    value: str | None = Field(default=None, description="The taint value, if any.")
    effect: TaintEffect = Field(description="NoSchedule, PreferNoSchedule or NoExecute.")
    time_added: Time | None = Field(default=None, description="When a NoExecute taint was added (set by Kubernetes).")


ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(_Status):
    """metav1.Condition, the same shape and limits as every built-in condition, so tools read ours too."""

    type: str = Field(
        max_length=316,
        pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
        r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
    )
    status: ConditionStatus
    reason: str = Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str = Field(default="", max_length=32768)
    last_transition_time: Time
    observed_generation: int | None = Field(default=None, ge=0)


# --- Group ---------------------------------------------------------------------------------------------


def _default_readiness_taints() -> list[Taint]:
    return [Taint(key=key, effect=TaintEffect(effect)) for key, effect in names.DEFAULT_READINESS_TAINTS]


_DEFAULT_READINESS_TAINTS_JSON: list[JsonValue] = [
    {"key": key, "effect": effect} for key, effect in names.DEFAULT_READINESS_TAINTS
]


# --- what a machine draws, and what it did ---------------------------------------------------------------
# Bounds of the draw figures: no homelab machine draws 100 kW or spends 10 kWh on one boot; past them is a typo (a
# figure in mW, a missing decimal point), refused rather than turned into an energy figure.
MAX_WATTS = 100_000.0
MAX_BOOT_WATT_HOURS = 10_000.0

#: A non-negative, finite number of watts (or watt-hours); a string is refused, as the API server refuses it.
_Watts = Annotated[float, Field(ge=0, le=MAX_WATTS, allow_inf_nan=False, strict=True)]
_WattHours = Annotated[float, Field(ge=0, le=MAX_BOOT_WATT_HOURS, allow_inf_nan=False, strict=True)]


class PowerDraw(_Spec):
    """What a machine draws, so its usage figures include energy: watts while on and while off (standby), and the
    watt-hours one boot costs above standby until its kubelet is Ready. A slot's fields override its Group's, one
    by one; energy is reported only when all three are known (a figure nobody gave is never assumed).
    """

    on_watts: _Watts | None = Field(default=None, description="Watts drawn while the machine is on (at most 100000).")
    off_watts: _Watts | None = Field(
        default=None, description="Watts drawn while it is off: standby, wake-on-LAN, BMC (at most 100000)."
    )
    boot_watt_hours: _WattHours | None = Field(
        default=None,
        description="Watt-hours (Wh) one boot costs above standby, from the wake-up until its kubelet is Ready "
        "(at most 10000); 0 if a boot costs nothing more.",
    )

    def over(self, base: PowerDraw | None) -> PowerDraw:
        """These figures where given, `base`'s elsewhere (a slot's draw over its Group's)."""
        if base is None:
            return self
        return base.model_copy(update={name: getattr(self, name) for name in self.model_fields_set})

    def missing(self) -> list[str]:
        """The figures energy needs that are not given, by their API names."""
        return [str(info.alias) for name, info in type(self).model_fields.items() if getattr(self, name) is None]


#: A Kubernetes resource quantity ("4", "500m", "16Gi", "1e3"), as the API server's own pattern checks it.
CAPACITY_QUANTITY = Annotated[
    str,
    Field(
        pattern=r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$",
        max_length=64,
    ),
]


class GroupSpec(_Spec):
    """A pool of slots that cluster-autoscaler sees as one node group, with its autoscaler options."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.minSize) || self.minSize <= self.maxSize",
                    "message": "minSize must not exceed maxSize",
                }
            ]
        }
    )

    min_size: int = Field(
        default=0, ge=0, le=MAX_GROUP_SIZE, description="Fewest machines cluster-autoscaler keeps on in this group."
    )
    max_size: int = Field(
        ge=0,
        le=MAX_GROUP_SIZE,
        description="Most machines on at once (cluster-autoscaler sees it capped at the number of slots).",
    )
    scale_down_utilization_threshold: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Utilization below which a node may be scaled down; unset: cluster-autoscaler's default.",
    )
    scale_down_gpu_utilization_threshold: float | None = Field(
        default=None, ge=0, le=1, description="The same for GPU nodes; unset: cluster-autoscaler's default."
    )
    scale_down_unneeded_time: ScaleDownTime | None = Field(
        default=None, description="How long a node stays unneeded before it is scaled down (at most 7 days)."
    )
    scale_down_unready_time: ScaleDownTime | None = Field(
        default=None, description="How long an unready node stays unneeded before it is scaled down (at most 7 days)."
    )
    max_node_provision_time: ProvisionTime | None = Field(
        default=None,
        description="How long a machine may take to be ready before its claim fails (at most 24h); the provision "
        "time in force is never below the boot budget of 12m10s.",
    )
    drain_timeout: ProvisionTime | None = Field(
        default=None,
        description="How long the drain before a power-off may wait for the node's Pods to leave before a Warning "
        "names the ones in the way (at most 24h); the machine stays on and the drain goes on. Unset: "
        f"{DEFAULT_DRAIN_TIMEOUT_TEXT}.",
    )
    zero_or_max_node_scaling: bool | None = Field(
        default=None, description="Scale the group all the way up or all the way down, never in between."
    )
    ignore_daemon_sets_utilization: bool | None = Field(
        default=None, description="Leave DaemonSet pods out of the utilization that decides a scale-down."
    )
    node_readiness_taints: list[Taint] = Field(
        default_factory=_default_readiness_taints,
        json_schema_extra={"default": _DEFAULT_READINESS_TAINTS_JSON},
        description="Taints a new node must lose before its claim is ready; [] disables the gate.",
    )
    node_taints: list[Taint] = Field(
        default_factory=list, description="Taints stamped on a node when its claim becomes ready."
    )
    power_off_node_policy: PowerOffNodePolicy = Field(
        default=PowerOffNodePolicy.DELETE,
        description="Delete the kubelet Node of a machine verified off (it would count as unready), or Keep it.",
    )
    node_labels: dict[str, str] = Field(
        default_factory=dict, description="Labels of the template node cluster-autoscaler plans with."
    )
    node_capacity: dict[str, CAPACITY_QUANTITY] = Field(
        default_factory=dict,
        description="Capacity of the template node while none of the group's machines has registered a Node yet "
        "(cpu, memory, pods...): without it a new group cannot be scaled up from zero. A machine seen since wins.",
    )
    power_draw: PowerDraw | None = Field(
        default=None,
        description="What each machine of the group draws (a slot's own powerDraw overrides it field by field), "
        "for the energy in the usage figures; unset: hours only.",
    )

    @model_validator(mode="after")
    def _min_not_above_max(self) -> Self:
        if self.min_size > self.max_size:
            raise ValueError(f"minSize ({self.min_size}) must not exceed maxSize ({self.max_size})")
        return self


class UsageFigures(_Status):
    """Seconds by usage state, boots and shutdowns, and energy when the draw is known, since `since`."""

    since: Time | None = Field(default=None, description="When the period these figures cover began.")
    counted_to: Time | None = Field(default=None, description="When they were last counted (the writer's clock).")
    on_seconds: int = Field(default=0, ge=0, description="Seconds observed on (kubelet Ready) and not draining.")
    off_seconds: int = Field(default=0, ge=0, description="Seconds observed off with no machine wanted.")
    booting_seconds: int = Field(
        default=0, ge=0, description="Seconds a machine was wanted and not up yet (kubelet not Ready)."
    )
    draining_seconds: int = Field(default=0, ge=0, description="Seconds observed on while being let go.")
    unobserved_seconds: int = Field(
        default=0,
        ge=0,
        description="Seconds no watcher observed (past one flush interval of an operator outage): in no state.",
    )
    boots: int = Field(default=0, ge=0, description="Times the machine was observed to come on (kubelet Ready).")
    shutdowns: int = Field(default=0, ge=0, description="Times it was observed to go off.")
    off_percent: float | None = Field(
        default=None, description="Share of the observed time spent off or booting (kubelet not Ready), in percent."
    )
    energy_used_wh: float | None = Field(
        default=None, description="Energy used in the period, in Wh (unset without a whole powerDraw)."
    )
    energy_always_on_wh: float | None = Field(
        default=None, description="Energy the same machines would have used always on, in Wh."
    )
    energy_saved_wh: float | None = Field(
        default=None, description="energyAlwaysOnWh - energyUsedWh, in Wh (negative when boots cost more)."
    )


class DrawFigures(_Status):
    """The draw a slot's energy figures were computed with (its powerDraw over its Group's)."""

    on_watts: float | None = None
    off_watts: float | None = None
    boot_watt_hours: float | None = None


class SlotUsage(UsageFigures):
    """What the slot's machine did, counted by the watchers from what they observe (docs/operations.md)."""

    state: UsageState | None = Field(default=None, description="The usage state at countedTo.")
    reset_at: Time | None = Field(default=None, description="The reset-usage request this period began with.")
    draw: DrawFigures | None = Field(default=None, description="The draw the energy was computed with.")
    energy_note: str | None = Field(default=None, description="Why there is no energy figure, when there is none.")


class GroupUsage(UsageFigures):
    """The sums of the group's slots' usage figures, counted at one instant (`countedTo`)."""

    energy_slots: int = Field(default=0, ge=0, description="Slots whose draw is known (counted in the energy).")
    summary: str = Field(default="", description="The figures in one line, for kubectl describe.")


class GroupStatus(_Status):
    """What the operator reports about a group: slot counts, health, the last scale decision."""

    slots: int = Field(default=0, ge=0, description="Slots (Node resources) in the group.")
    on: int = Field(default=0, ge=0, description="Slots whose machine is observed on.")
    off: int = Field(default=0, ge=0, description="Slots whose machine is observed off.")
    health: GroupHealth | None = Field(default=None, description="Derived from the slots' reports.")
    last_scale_at: Time | None = Field(default=None, description="When the group last changed its size.")
    last_scale_action: str | None = Field(default=None, description="What that change was, in words.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Valid (the spec can be used) and Healthy, with reasons."
    )
    usage: GroupUsage | None = Field(
        default=None, description="Machine-hours, boots and energy of the group's slots, summed by the watchers."
    )


# --- Node (slot) ---------------------------------------------------------------------------------------


class KeySelector(_Spec):
    """A key of a Secret or ConfigMap: credentials reach the Job by reference, never by value."""

    name: str = Field(min_length=1, description="The Secret's or ConfigMap's name, in the slot's namespace.")
    key: str = Field(min_length=1, description="The key in it.")
    optional: bool | None = Field(default=None, description="Start the Job even when the key is missing.")


class EnvVarSource(_Spec):
    """Where an env value comes from: exactly one of a Secret key or a ConfigMap key."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.secretKeyRef) != has(self.configMapKeyRef)",
                    "message": "exactly one of secretKeyRef or configMapKeyRef",
                }
            ]
        }
    )

    secret_key_ref: KeySelector | None = Field(default=None, description="A key of a Secret.")
    config_map_key_ref: KeySelector | None = Field(default=None, description="A key of a ConfigMap.")

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.secret_key_ref is None) == (self.config_map_key_ref is None):
            raise ValueError("valueFrom needs exactly one of secretKeyRef or configMapKeyRef")
        return self


class EnvVar(_Spec):
    """One environment variable of a lifecycle Job: a literal value or a Secret/ConfigMap reference."""

    name: str = Field(min_length=1, description="The variable's name.")
    value: str | None = Field(default=None, description="A literal value (never a secret: use valueFrom).")
    value_from: EnvVarSource | None = Field(default=None, description="A Secret or ConfigMap key instead of a value.")

    @model_validator(mode="after")
    def _not_both(self) -> Self:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name!r} sets both value and valueFrom")
        return self


class SecretEnvSource(_Spec):
    """A whole Secret exposed as environment variables."""

    name: str = Field(min_length=1, description="The Secret's name, in the slot's namespace.")
    optional: bool | None = Field(default=None, description="Start the Job even when the Secret is missing.")


class ConfigMapEnvSource(_Spec):
    """A whole ConfigMap exposed as environment variables."""

    name: str = Field(min_length=1, description="The ConfigMap's name, in the slot's namespace.")
    optional: bool | None = Field(default=None, description="Start the Job even when the ConfigMap is missing.")


class EnvFromSource(_Spec):
    """envFrom entry: exactly one of a Secret or a ConfigMap, optionally prefixed."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.secretRef) != has(self.configMapRef)",
                    "message": "exactly one of secretRef or configMapRef",
                }
            ]
        }
    )

    prefix: str | None = Field(default=None, description="Put before every variable's name.")
    secret_ref: SecretEnvSource | None = Field(default=None, description="Every key of a Secret.")
    config_map_ref: ConfigMapEnvSource | None = Field(default=None, description="Every key of a ConfigMap.")

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.secret_ref is None) == (self.config_map_ref is None):
            raise ValueError("envFrom entry needs exactly one of secretRef or configMapRef")
        return self


class VolumeMount(_Spec):
    """A Secret or ConfigMap mounted into a lifecycle Job (SSH keys, IPMI configs, scripts)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {
                    "rule": "has(self.secretName) != has(self.configMapName)",
                    "message": "exactly one of secretName or configMapName",
                }
            ]
        }
    )

    name: str = Field(min_length=1, description="The volume's name in the Job's pod.")
    mount_path: str = Field(min_length=1, description="Where the container sees it.")
    secret_name: str | None = Field(default=None, description="Mount this Secret (in the slot's namespace).")
    config_map_name: str | None = Field(default=None, description="Mount this ConfigMap (in the slot's namespace).")
    read_only: bool = Field(default=True, description="Mount it read-only.")

    @model_validator(mode="after")
    def _exactly_one_source(self) -> Self:
        if (self.secret_name is None) == (self.config_map_name is None):
            raise ValueError(f"volume {self.name!r} needs exactly one of secretName or configMapName")
        return self


#: A resource quantity string ("100m", "64Mi"); the Job's container takes it as is.
Quantity = Annotated[str, Field(min_length=1)]


class ResourceRequirements(_Spec):
    """Requests and limits of the lifecycle container, as Kubernetes quantity strings."""

    requests: dict[str, Quantity] = Field(default_factory=dict, description="cpu, memory...: what is reserved.")
    limits: dict[str, Quantity] = Field(default_factory=dict, description="cpu, memory...: what may be used at most.")


class Toleration(_Spec):
    """core/v1 Toleration, so a lifecycle Job can run on tainted control-plane nodes."""

    key: str | None = Field(default=None, description="The taint key tolerated; empty with Exists: every taint.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Equal (the default) or Exists.")
    value: str | None = Field(default=None, description="The taint value, with Equal.")
    effect: TaintEffect | None = Field(default=None, description="The effect tolerated; empty: every effect.")
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated before eviction."
    )


#: core/v1 dnsPolicy, less `None` (which needs a dnsConfig the template does not offer).
DNSPolicy = Literal["ClusterFirst", "ClusterFirstWithHostNet", "Default"]
TerminationMessagePolicy = Literal["File", "FallbackToLogsOnError"]


class PodSpecTemplate(_Spec):
    """The container a lifecycle Job runs to power a machine on or off (wake-on-LAN, IPMI, SSH...).

    Deliberately small: the operator builds the Job, so it can bound it (timeouts, backoff) and label it.
    """

    image: str = Field(min_length=1, description="The container image that powers the machine on or off.")
    command: list[str] | None = Field(default=None, description="The entrypoint; unset: the image's.")
    args: list[str] | None = Field(default=None, description="Its arguments; unset: the image's.")
    env: list[EnvVar] = Field(default_factory=list, max_length=256, description="Environment variables.")
    env_from: list[EnvFromSource] = Field(
        default_factory=list, max_length=64, description="Whole Secrets or ConfigMaps as variables."
    )
    volumes: list[VolumeMount] = Field(
        default_factory=list, max_length=64, description="Secrets or ConfigMaps mounted as files (keys, configs)."
    )
    service_account: str | None = Field(default=None, description="The Job pod's ServiceAccount.")
    resources: ResourceRequirements | None = Field(default=None, description="The container's requests and limits.")
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TTL_SECONDS,
        description=f"When Kubernetes deletes the finished Job; unset: {names.JOB_TTL_SECONDS_AFTER_FINISHED} s.",
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        le=MAX_JOB_SECONDS,
        description=f"The Job's time limit; unset: {int(names.JOB_TIMEOUT.total_seconds())} s.",
    )
    backoff_limit: int | None = Field(
        default=None,
        ge=0,
        le=MAX_JOB_BACKOFF,
        description=f"Retries of the Job's pod before the Job fails; unset: {names.JOB_BACKOFF_LIMIT}.",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Where the Job's pod may run.")
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=64, description="Taints the Job's pod tolerates (control-plane nodes)."
    )
    host_network: bool | None = Field(
        default=None,
        description="true: the Job's pod uses its node's network, so a wake-on-LAN broadcast leaves on the node's "
        "LAN (Linux drops routed directed broadcasts by default); unset: the pod network.",
    )
    dns_policy: DNSPolicy | None = Field(
        default=None,
        description="The pod's dnsPolicy; unset: ClusterFirstWithHostNet with hostNetwork, else ClusterFirst.",
    )
    termination_message_policy: TerminationMessagePolicy | None = Field(
        default=None,
        description="Where the container's last words come from: File (its /dev/termination-log only) or "
        "FallbackToLogsOnError (that file, else the last lines of its log when it fails); unset: "
        "FallbackToLogsOnError, so a failed Job says why.",
    )


#: The v1alpha1 name of the same shape.
MinimalPodSpec = PodSpecTemplate


class Pricing(_Spec):
    """What a machine costs while on, so cluster-autoscaler's price expander can prefer cheap machines."""

    hourly_rate: float = Field(ge=0, description="What the machine costs per hour while on.")
    pod_rate: float | None = Field(default=None, ge=0, description="What one pod on it costs per hour.")


class NodeSpec(_Spec):
    """A slot: one physical machine the operator may power, and how. There is no power intent here."""

    group: str = Field(min_length=1, description="The Group this slot belongs to (same namespace).")
    kubernetes_node_name: str = Field(min_length=1, description="The name the machine's kubelet registers.")
    provider_id: str | None = Field(
        default=None,
        alias="providerID",
        description="The kubelet Node's spec.providerID, if it sets one; else `homelab://<namespace>/<slot>`.",
    )
    startup_pod_spec: PodSpecTemplate = Field(description="The Job that powers the machine on.")
    shutdown_pod_spec: PodSpecTemplate = Field(description="The Job that powers the machine off.")
    pricing: Pricing | None = Field(default=None, description="What the machine costs, for the price expander.")
    power_draw: PowerDraw | None = Field(
        default=None,
        description="What the machine draws (over its Group's powerDraw, field by field), for the energy in the "
        "usage figures; unset: hours only.",
    )
    taints_to_remove: list[Taint] = Field(
        default_factory=list, description="Taints removed from the node when its claim becomes ready."
    )


class Transition(_Status):
    """One row of the slot's report history: the report moved from `from` to `to` at `at`."""

    from_phase: Report | None = Field(default=None, alias="from")
    to_phase: Report = Field(alias="to")
    at: Time


class ClaimDigest(_Status):
    """The last claim's story, kept on the slot after the claim itself is collected by its TTL."""

    name: str
    phase: ClaimPhase | None = None
    attempt: int | None = Field(default=None, ge=1)
    call: ClaimCall | None = None
    group: str | None = None
    reason: ClaimReason | None = None
    requested_at: Time | None = None
    deadline_at: Time | None = None
    finished_at: Time | None = None
    # The claim's status message (a failed Job's exit code, reason and its Pod's last words), for people.
    message: str | None = None


class NodeTemplate(_Status):
    """What the slot's kubelet Node looked like when it was last deleted, for scale-from-zero.

    With `powerOffNodePolicy: Delete` the kubelet Node of a machine verified off is removed, so the group's
    template node (what cluster-autoscaler plans a scale-up with) is read from here when no Node exists.
    Only lasting facts are kept: no readiness taints, no cordon, no conditions.
    """

    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    capacity: dict[str, str] = Field(default_factory=dict)
    allocatable: dict[str, str] = Field(default_factory=dict)
    taken_at: Time | None = None


class NodeStatus(_Status):
    """The slot's report: outputs of the law and of observation, never inputs to a decision."""

    power_state: PowerState | None = Field(default=None, description="Observed power: kubelet Ready means on.")
    phase: Report | None = Field(default=None, description="The report the law derives from claim and observation.")
    last_transition_time: Time | None = Field(default=None, description="When the phase last changed.")
    previous_phase: Report | None = Field(default=None, description="The phase before that.")
    recent_transitions: list[Transition] = Field(
        default_factory=list, description="The last phase changes (32 rows, 24 hours at most)."
    )
    recent_activations: list[Time] = Field(
        default_factory=list, description="When the machine was last powered on (512 at most)."
    )
    activations_total: int = Field(default=0, ge=0, description="Power-ons since the slot was created.")
    activations_last_24h: int = Field(
        default=0, ge=0, alias="activationsLast24H", description="Power-ons in the last 24 hours."
    )
    last_claim: ClaimDigest | None = Field(
        default=None, description="The last claim's story, kept after the claim is collected."
    )
    conditions: list[Condition] = Field(
        default_factory=list, description="Valid (its pod specs can make Jobs) and Claimable, with reasons."
    )
    observed_generation: int | None = Field(default=None, ge=0, description="The spec generation last reported on.")
    node_template: NodeTemplate | None = Field(
        default=None, description="The kubelet Node as last seen, for scale-from-zero."
    )
    usage: SlotUsage | None = Field(
        default=None, description="Machine-hours, boots and energy since a reset, counted by the watchers."
    )


# --- NodeClaim -----------------------------------------------------------------------------------------


class NodeClaimSpec(_Spec):
    """One request for the machine of one slot; one claim is one attempt."""

    node: str = Field(min_length=1, description="The slot (Node) this claim wants powered on.")
    group: str = Field(min_length=1, description="The slot's Group.")
    requested_at: Time | None = Field(
        default=None,
        description="When the machine was asked for; unset (a claim written by hand): its creationTimestamp.",
    )
    deadline_at: Time | None = Field(
        default=None,
        description="Boot deadline; unset: requestedAt + the provision time in force. Cleared when the claim is ready.",
    )
    max_node_provision_time: ProvisionTime | None = Field(
        default=None, description="The provision time in force when the claim was made (the group's, at least 12m10s)."
    )
    ttl_seconds_after_finished: int = Field(
        default=names.CLAIM_TTL_SECONDS_AFTER_FINISHED,
        ge=0,
        le=MAX_TTL_SECONDS,
        description="How long a finished claim is kept before it is deleted.",
    )

    @model_validator(mode="after")
    def _times_on_the_calendar(self) -> Self:
        for name, when in (("requestedAt", self.requested_at), ("deadlineAt", self.deadline_at)):
            if when is not None and not (_EARLIEST <= when <= _LATEST):
                raise ValueError(f"{name} {when:%Y-%m-%d} is not a time a claim can have")
        return self

    call: ClaimCall = Field(default=ClaimCall.MANUAL, description="What made the claim.")


class NodeClaimStatus(_Status):
    """The claim's record, written only by its workflow. No phase means pending."""

    phase: ClaimPhase | None = Field(default=None, description="pending, booting, ready, failed or completed.")
    reason: ClaimReason | None = Field(default=None, description="Why the claim ended (or, for Adopted, began).")
    attempt: int | None = Field(default=None, ge=1, description="Which boot in a row of this slot it is.")
    shutdown_attempts: int = Field(default=0, ge=0, description="Shutdown Jobs fired for this claim's machine.")
    last_shutdown_attempt_at: Time | None = Field(default=None, description="When the last one was fired.")
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, MachineCommitted and MachineObservedOff, with reasons."
    )
    finished_at: Time | None = Field(default=None, description="When the claim reached failed or completed.")
    message: str | None = Field(default=None, description="The last move, in words.")
    revision: int | None = Field(
        default=None, ge=0, description="The workflow's number for this projection; an older one never lands over it."
    )


# --- resources -----------------------------------------------------------------------------------------


class Resource(BaseModel):
    """Base of the three kinds: envelope fields plus lenient metadata (the server owns most of it)."""

    model_config = ConfigDict(populate_by_name=True, alias_generator=to_camel, extra="ignore")

    api_version: Literal["infra.homecluster.dev/v2alpha1"] = "infra.homecluster.dev/v2alpha1"
    kind: str
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)


class Group(Resource):
    """groups.infra.homecluster.dev"""

    kind: Literal["Group"] = "Group"
    spec: GroupSpec
    status: GroupStatus = Field(default_factory=GroupStatus)


class Node(Resource):
    """nodes.infra.homecluster.dev: a slot (not the core/v1 Node its kubelet registers)."""

    kind: Literal["Node"] = "Node"
    spec: NodeSpec
    status: NodeStatus = Field(default_factory=NodeStatus)


class NodeClaim(Resource):
    """nodeclaims.infra.homecluster.dev"""

    kind: Literal["NodeClaim"] = "NodeClaim"
    spec: NodeClaimSpec
    status: NodeClaimStatus = Field(default_factory=NodeClaimStatus)


KINDS: dict[str, type[Group] | type[Node] | type[NodeClaim]] = {
    names.KIND_GROUP: Group,
    names.KIND_NODE: Node,
    names.KIND_NODECLAIM: NodeClaim,
}


def load(obj: dict[str, Any]) -> Group | Node | NodeClaim:
    """Validate an API object into its model by apiVersion and kind, refusing anything that is not ours."""
    api_version = obj.get("apiVersion")
    kind = obj.get("kind")
    if api_version != names.API_VERSION:
        raise ValueError(f"unsupported apiVersion {api_version!r} (expected {names.API_VERSION!r})")
    model = KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise ValueError(f"unknown kind {kind!r} for {names.API_VERSION} (expected one of {sorted(KINDS)})")
    return model.model_validate(obj)
