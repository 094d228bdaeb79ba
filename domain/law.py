"""The input law: one pure function from (live claim, observed power, node usable) to report, state and the
operation to fire.

The law is a table (``ROWS``), expanded once at import into ``LAW``, a dict over every possible input, so
``derive``, ``state`` and ``fires`` are lookups of the same row and can never disagree. The expansion
refuses a gap or an overlap, so a table that does not cover every input fails at import, not in production.

Decisions beyond the seed, encoded in the rows:

* ``claim_phase=None`` in an ``Input`` means *no live claim* (the slot's claims are all gone or there never
  was one). The predicates below (``is_live`` …) take the phase of a claim that exists, where ``None`` reads
  as pending, because a claim is created with no phase.
* ``marked`` matters for live claims only; for no claim and for terminal claims it is ignored.
* A marked **pending** claim follows the "live, marked for deletion" rows: it wants no machine, nothing is in
  flight, so with the machine off there is nothing to do (deleting it is the cancel), and with the machine
  on the machine is unwanted and is shut down, as if there were no claim.
* A marked **booting** claim follows the booting row, not the marked rows: the startup Job is in flight and
  the state machine is in ``startingup``, where ``ShutdownNode`` is not an event. A boot is reversed, never
  interrupted: the Job monitor moves the claim on (ready or failed), and the next pass shuts the machine down
  through the marked-ready or terminal row.
* A marked **ready** claim on an unusable node follows the marked rows (the scale-down cordons the node, so
  unusable is what a marked claim normally looks like).
* The seed writes the state of "live, marked, on" as "ready / shuttingdown". ``state`` returns ``ready``:
  the state a pass *starts* in. Firing ``ShutdownNode`` moves the state machine to ``shuttingdown``
  (see ``domain.fsm``), so the second half of the seed's cell is the result of the operation, not an input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, cast

from api.names import ClaimPhase, NodeState, Operation, PowerState, Report


@dataclass(frozen=True)
class Input:
    """The whole input of a decision: the live claim (phase and mark), the observed power, node usability."""

    claim_phase: ClaimPhase | str | None
    marked: bool
    power: PowerState | str
    usable: bool

    def __post_init__(self) -> None:
        # Coerce strings once, so a typo fails at construction and lookups key on enums only.
        if self.claim_phase is not None and not isinstance(self.claim_phase, ClaimPhase):
            object.__setattr__(self, "claim_phase", ClaimPhase(self.claim_phase))
        if not isinstance(self.power, PowerState):
            object.__setattr__(self, "power", PowerState(self.power))
        object.__setattr__(self, "marked", bool(self.marked))
        object.__setattr__(self, "usable", bool(self.usable))


class Claim(StrEnum):
    """The 'Live claim' column of the seed's table: which (phase, marked) pairs a row covers."""

    NONE = "none"
    PENDING = "pending"
    BOOTING = "booting"
    READY = "ready"
    MARKED = "marked"
    TERMINAL = "terminal"


_P = ClaimPhase
# The (claim_phase, marked) pairs each claim column stands for. Together they partition all 12 pairs.
CLAIM_COLUMN: Mapping[Claim, tuple[tuple[ClaimPhase | None, bool], ...]] = {
    Claim.NONE: ((None, False), (None, True)),
    Claim.PENDING: ((_P.PENDING, False),),
    Claim.BOOTING: ((_P.BOOTING, False), (_P.BOOTING, True)),
    Claim.READY: ((_P.READY, False),),
    Claim.MARKED: ((_P.PENDING, True), (_P.READY, True)),
    Claim.TERMINAL: ((_P.FAILED, False), (_P.FAILED, True), (_P.COMPLETED, False), (_P.COMPLETED, True)),
}

ANY_POWER: tuple[PowerState, ...] = (PowerState.OFF, PowerState.ON)
ANY_USABLE: tuple[bool, ...] = (False, True)


@dataclass(frozen=True)
class Row:
    """One line of the input-law table; ``power``/``usable`` list the observations the line covers."""

    name: str
    claim: Claim
    power: tuple[PowerState, ...]
    usable: tuple[bool, ...]
    report: Report
    state: NodeState
    fires: Operation | None
    note: str = ""


_ON = (PowerState.ON,)
_OFF = (PowerState.OFF,)
_ANY = ANY_POWER
_ANYU = ANY_USABLE
_YES = (True,)
_NO = (False,)
_C = Claim
_S = NodeState
_R = Report
_START = Operation.START_NODE
_STOP = Operation.SHUTDOWN_NODE

# One Row per line of the seed's table. The note says who moves the slot when the law fires nothing.
# fmt: off
ROWS: tuple[Row, ...] = (
    #   name                 claim        power usable report       state          fires   note
    Row("none-off",          _C.NONE,     _OFF, _ANYU, _R.OFF,      _S.SHUTDOWN,   None,   "a free slot"),
    Row("none-on",           _C.NONE,     _ON,  _ANYU, _R.DRAINING, _S.READY,      _STOP,  "unwanted"),
    Row("pending-off",       _C.PENDING,  _OFF, _ANYU, _R.PENDING,  _S.SHUTDOWN,   _START, "law 1"),
    Row("pending-on",        _C.PENDING,  _ON,  _ANYU, _R.BOOTING,  _S.STARTINGUP, None,   "Job monitor"),
    Row("booting-any-any",   _C.BOOTING,  _ANY, _ANYU, _R.BOOTING,  _S.STARTINGUP, None,   "Job monitor"),
    Row("ready-on-usable",   _C.READY,    _ON,  _YES,  _R.READY,    _S.READY,      None,   "serving"),
    Row("ready-on-unusable", _C.READY,    _ON,  _NO,   _R.BOOTING,  _S.STARTINGUP, None,   "readiness gate"),
    Row("ready-off",         _C.READY,    _OFF, _ANYU, _R.BOOTING,  _S.STARTINGUP, None,   "MachineGone"),
    Row("marked-on",         _C.MARKED,   _ON,  _ANYU, _R.DRAINING, _S.READY,      _STOP,  "then finalizer"),
    Row("marked-off",        _C.MARKED,   _OFF, _ANYU, _R.OFF,      _S.SHUTDOWN,   None,   "ends completed"),
    Row("terminal-on",       _C.TERMINAL, _ON,  _ANYU, _R.DRAINING, _S.READY,      _STOP,  "not a want"),
    Row("terminal-off",      _C.TERMINAL, _OFF, _ANYU, _R.OFF,      _S.SHUTDOWN,   None,   ""),
)
# fmt: on

Key = tuple[ClaimPhase | None, bool, PowerState, bool]


def _expand(rows: Iterable[Row]) -> dict[Key, Row]:
    """Expand the rows over every input they cover; a key covered twice is a table bug."""
    law: dict[Key, Row] = {}
    for row in rows:
        for phase, marked in CLAIM_COLUMN[row.claim]:
            for power in row.power:
                for usable in row.usable:
                    key = (phase, marked, power, usable)
                    if key in law:
                        raise AssertionError(f"input {key} covered by {law[key].name} and {row.name}")
                    law[key] = row
    return law


ALL_PHASES: tuple[ClaimPhase | None, ...] = (None, *ClaimPhase)
ALL_KEYS: tuple[Key, ...] = tuple(
    (phase, marked, power, usable)
    for phase in ALL_PHASES
    for marked in (False, True)
    for power in PowerState
    for usable in (False, True)
)

LAW: Mapping[Key, Row] = _expand(ROWS)
_missing = set(ALL_KEYS) - set(LAW)
if _missing:  # pragma: no cover - a table bug, caught at import
    raise AssertionError(f"the input law has no row for {sorted(map(str, _missing))}")


def row(i: Input) -> Row:
    """The one row of the table that answers this input."""
    # __post_init__ coerced the strings, so the key is made of enums.
    return LAW[(cast("ClaimPhase | None", i.claim_phase), i.marked, PowerState(i.power), i.usable)]


def derive(i: Input) -> Report:
    """Node.status.phase for this input: the report, never an input to anything."""
    return row(i).report


def state(i: Input) -> NodeState:
    """The state the node state machine starts a pass in."""
    return row(i).state


def fires(i: Input) -> Operation | None:
    """The lifecycle operation this input calls for, or None when nothing (or another owner) moves it."""
    return row(i).fires


# --- observation predicates ---------------------------------------------------------------------------


def _get(obj: Any, key: str) -> Any:
    """Read a field from a mapping or an object, so plain dicts and models both work."""
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _ready_status(node: Mapping[str, Any] | None) -> str | None:
    """The status string of the node's Ready condition, or None when there is none."""
    if node is None:
        return None
    for cond in (node.get("status") or {}).get("conditions") or ():
        if _get(cond, "type") == "Ready":
            status = _get(cond, "status")
            return None if status is None else str(status)
    return None


def kubelet_silent(node: Mapping[str, Any] | None) -> bool:
    """The node-lifecycle controller says the kubelet stopped posting (Ready=Unknown).

    A booting kubelet posts Ready=False, never Unknown: only a silent Node may be deleted as powered off.
    """
    return _ready_status(node) == "Unknown"


def power_of(node: Mapping[str, Any] | None) -> PowerState:
    """Observed power: kubelet Ready=True means on; NotReady, Unknown, no condition or no node mean off."""
    return PowerState.ON if _ready_status(node) == "True" else PowerState.OFF


TaintSpec = tuple[str, str | None] | Mapping[str, Any] | Any


def _taint_pair(t: TaintSpec) -> tuple[str, str | None]:
    """A readiness taint as (key, effect), from a tuple, a dict, or a model with key/effect attributes."""
    if isinstance(t, tuple):
        key, effect = t
    else:
        key, effect = _get(t, "key"), _get(t, "effect")
    return str(key), (str(effect) if effect else None)


def unusable(node: Mapping[str, Any] | None, readiness_taints: Iterable[TaintSpec] = ()) -> bool:
    """True when the node cannot take the pool's work: missing, not Ready, readiness-tainted, or cordoned.

    A readiness taint matches a node taint with the same key and effect; a readiness taint with no effect
    matches that key with any effect (as an empty toleration effect does).
    """
    if node is None or power_of(node) is not PowerState.ON:
        return True
    spec = node.get("spec") or {}
    if spec.get("unschedulable") is True:
        return True
    present = {(str(_get(t, "key")), str(_get(t, "effect"))) for t in spec.get("taints") or ()}
    present_keys = {k for k, _ in present}
    for key, effect in map(_taint_pair, readiness_taints):
        matched = key in present_keys if effect is None else (key, effect) in present
        if matched:
            return True
    return False


# --- claim phase predicates ---------------------------------------------------------------------------

LIVE: frozenset[ClaimPhase] = frozenset({ClaimPhase.PENDING, ClaimPhase.BOOTING, ClaimPhase.READY})
TERMINAL: frozenset[ClaimPhase] = frozenset({ClaimPhase.FAILED, ClaimPhase.COMPLETED})
BOOT_WINDOW: frozenset[ClaimPhase] = frozenset({ClaimPhase.PENDING, ClaimPhase.BOOTING})


def phase_of(phase: ClaimPhase | str | None) -> ClaimPhase:
    """The phase of an existing claim; a claim with no phase yet is pending (it is created without one)."""
    return ClaimPhase.PENDING if phase is None or phase == "" else ClaimPhase(phase)


def is_live(phase: ClaimPhase | str | None) -> bool:
    """A live claim (pending, booting, ready) is a want on its slot."""
    return phase_of(phase) in LIVE


def is_terminal(phase: ClaimPhase | str | None) -> bool:
    """A terminal claim (failed, completed) wants nothing and never moves again."""
    return phase_of(phase) in TERMINAL


def wants_machine(phase: ClaimPhase | str | None, marked: bool) -> bool:
    """Law 1's question: live and not marked. A marked claim still owns the slot but is being reversed."""
    return is_live(phase) and not marked


def in_boot_window(phase: ClaimPhase | str | None) -> bool:
    """The deadline and the attempt bound apply while the claim is pending or booting, not once ready."""
    return phase_of(phase) in BOOT_WINDOW
