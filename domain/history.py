"""The one writer of a slot's report phase and its history fields.

``record`` is called by every pass that owns a phase write; ``expire`` by the pass the window's expiry
schedules (``next_expiry`` says when). Both return a new ``NodeStatus`` and never mutate their argument.
Nothing reads these fields to decide anything: they are outputs for people and dashboards.

Decisions beyond the seed:

* An *activation* is one boot that brought the machine up: counted when the report reaches ``ready`` from the
  no-machine side (``off``, ``pending``), directly (a debounced watcher that never saw ``booting``, an adopted
  machine) or through ``booting`` (``pending -> booting -> ready``). A boot that never came up (``booting ->
  off``, a failed or cancelled claim) is no activation: the count is of machines that ran, which is what a
  person reading ``activationsLast24H`` asks. ``ready -> booting -> ready`` (a node that went NotReady or was
  cordoned under a ready claim) and ``draining -> booting -> ready`` (a machine that never went off) are the
  same boot, not new ones. The first report of a slot (no previous phase) is not an activation, nor is a
  ``booting`` first report's ``ready``: there is nothing before them to say a boot happened. The phase before
  ``booting`` is the status's ``previousPhase``, so the rule needs no ring row (they expire).
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

# Reports with no machine the pool asked for: a boot that reaches ready from one of them is an activation.
NO_MACHINE: frozenset[Report] = frozenset({Report.OFF, Report.PENDING})


def _utc(t: datetime) -> datetime:
    """Naive means UTC, matching the model's Time type, so aware and naive never meet in a comparison."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t


def is_activation(old: Report | None, new: Report, before: Report | None = None) -> bool:
    """Whether the report move old -> new, `before` being the phase before old, is a boot that came up."""
    if new is not Report.READY:
        return False
    return old in NO_MACHINE or (old is Report.BOOTING and before in NO_MACHINE)


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
    boot = is_activation(old, new, status.previous_phase)
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
