"""The one writer of a slot's report phase and its history fields.

``record`` is called by every pass that owns a phase write; ``expire`` by the pass the window's expiry
schedules (``next_expiry`` says when). Both return a new ``NodeStatus`` and never mutate their argument.
Nothing reads these fields to decide anything: they are outputs for people and dashboards.

Decisions beyond the seed:

* An *activation* is one boot: a report transition from the no-machine side (``off``, ``pending``) to the
  machine side the pool asked for (``booting``, ``ready``). ``ready -> booting`` (a node that went NotReady
  or was cordoned under a ready claim) and ``draining -> booting`` (a machine that never went off) are the
  same boot, not new ones; ``off -> ready`` (a debounced watcher that never saw ``booting``, or an
  adopted machine) still counts once. The first report of a slot (no previous phase) is not an
  activation: there is nothing before it to say a boot happened.
* A row leaves the window when it is *older* than the window (``now - at > TIMINGS.history_window``), so
  ``next_expiry`` is one microsecond (the resolution of ``datetime``) past ``at + TIMINGS.history_window``: a pass
  scheduled at that instant is sure to prune, so a timer never re-arms at the same instant.
* A naive ``now`` is taken as UTC, as ``api.v2alpha1.Time`` does for every stored timestamp.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from api.names import Report
from api.v2alpha1 import NodeStatus, Transition
from domain.timings import TIMINGS

RESOLUTION = timedelta(microseconds=1)

# Reports with no machine the pool asked for, and reports of a machine it asked for.
NO_MACHINE: frozenset[Report] = frozenset({Report.OFF, Report.PENDING})
BOOTED: frozenset[Report] = frozenset({Report.BOOTING, Report.READY})


def _utc(t: datetime) -> datetime:
    """Naive means UTC, matching the model's Time type, so aware and naive never meet in a comparison."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t


def is_activation(old: Report | None, new: Report) -> bool:
    """Whether the report move old -> new is one boot (see the module docstring)."""
    return old in NO_MACHINE and new in BOOTED


def _in_window(at: datetime, now: datetime) -> bool:
    return now - _utc(at) <= TIMINGS.history_window


def _ring(rows: Iterable[Transition], now: datetime) -> list[Transition]:
    """The display ring: rows inside the window, newest TIMINGS.history_ring_rows, in the order the writes landed."""
    return [r for r in rows if _in_window(r.at, now)][-TIMINGS.history_ring_rows :]


def _ledger(stamps: Iterable[datetime], now: datetime) -> list[datetime]:
    """The activation ledger: boots inside the window, newest TIMINGS.activation_ledger_rows."""
    return [t for t in stamps if _in_window(t, now)][-TIMINGS.activation_ledger_rows :]


def _windowed(
    status: NodeStatus, now: datetime, extra_row: Sequence[Transition], extra_boot: Sequence[datetime]
) -> dict[str, Any]:
    """The windowed fields after appending the given rows and pruning; the count is the ledger's length."""
    ledger = _ledger([*status.recent_activations, *extra_boot], now)
    return {
        "recent_transitions": _ring([*status.recent_transitions, *extra_row], now),
        "recent_activations": ledger,
        "activations_last_24h": len(ledger),
    }


def expire(status: NodeStatus, now: datetime) -> NodeStatus:
    """The window's expiry pass: prune the ring and the ledger and recount, with no transition."""
    return status.model_copy(update=_windowed(status, _utc(now), (), ()))


def record(status: NodeStatus, phase: Report | str, now: datetime) -> NodeStatus:
    """Write the report phase and its history: a transition row, and an activation when it is a boot.

    The same phase again changes nothing but the window (an idempotent re-apply writes no row).
    """
    new, now = Report(phase), _utc(now)
    old = status.phase
    if old == new:
        return expire(status, now)
    boot = is_activation(old, new)
    row = Transition(from_phase=old, to_phase=new, at=now)
    update = _windowed(status, now, (row,), (now,) if boot else ())
    update |= {
        "phase": new,
        "previous_phase": old,
        "last_transition_time": now,
        "activations_total": status.activations_total + int(boot),
    }
    return status.model_copy(update=update)


def next_expiry(status: NodeStatus) -> datetime | None:
    """When the oldest ring or ledger row leaves the window (None when both are empty), for a timer."""
    stamps = [_utc(r.at) for r in status.recent_transitions] + [_utc(t) for t in status.recent_activations]
    if not stamps:
        return None
    return min(stamps) + TIMINGS.history_window + RESOLUTION
