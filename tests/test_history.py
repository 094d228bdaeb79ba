"""The slot history writer, on the real api.v2alpha1.NodeStatus model."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from api.names import PowerState, Report
from api.v2alpha1 import NodeStatus, Transition
from domain import history
from domain.history import expire, next_expiry, record
from domain.timings import TIMINGS

T0 = datetime(2025, 3, 1, 0, 0, tzinfo=UTC)
CYCLE = (Report.PENDING, Report.BOOTING, Report.READY, Report.DRAINING, Report.OFF)


def test_first_transition() -> None:
    s0 = NodeStatus(power_state=PowerState.OFF)
    s1 = record(s0, Report.OFF, T0)
    assert s1.phase is Report.OFF
    assert s1.previous_phase is None
    assert s1.last_transition_time == T0
    assert s1.recent_transitions == [Transition(from_phase=None, to_phase=Report.OFF, at=T0)]
    assert (s1.activations_total, s1.activations_last_24h, s1.recent_activations) == (0, 0, [])
    assert s1.power_state is PowerState.OFF
    # the argument is not mutated
    assert s0.phase is None and s0.recent_transitions == []


def test_a_boot_is_one_activation_when_the_machine_comes_up() -> None:
    s = record(NodeStatus(), "off", T0)
    s = record(s, "pending", T0 + timedelta(seconds=1))
    assert s.activations_total == 0
    s = record(s, "booting", T0 + timedelta(seconds=2))
    assert (s.previous_phase, s.phase) == (Report.PENDING, Report.BOOTING)
    assert s.activations_total == 0 and s.recent_activations == [], "not yet: the machine has not come up"
    s = record(s, "ready", T0 + timedelta(seconds=3))
    assert s.activations_total == 1 and s.recent_activations == [T0 + timedelta(seconds=3)]
    # a readiness wobble under the same boot is not a second one
    s = record(s, "booting", T0 + timedelta(seconds=4))
    s = record(s, "ready", T0 + timedelta(seconds=5))
    assert s.activations_total == 1 and s.activations_last_24h == 1
    assert len(s.recent_transitions) == 6


def test_a_slot_that_never_booted_counts_no_activation() -> None:
    """A boot that failed (startup Job failed, never registered, deadline) or was cancelled ran no machine."""
    s = record(NodeStatus(), "off", T0)
    for minute, phase in enumerate(("pending", "booting", "off", "pending", "booting", "draining", "off"), 1):
        s = record(s, phase, T0 + timedelta(minutes=minute))
    assert (s.activations_total, s.activations_last_24h, s.recent_activations) == (0, 0, [])
    s = record(s, "pending", T0 + timedelta(minutes=10))
    s = record(s, "booting", T0 + timedelta(minutes=11))
    s = record(s, "ready", T0 + timedelta(minutes=12))
    assert (s.activations_total, s.recent_activations) == (1, [T0 + timedelta(minutes=12)])


def test_a_long_boot_counts_when_it_comes_up_after_its_rows_expired() -> None:
    """The phase before booting is previousPhase, which never expires: a day-long boot still counts once."""
    s = record(record(NodeStatus(), "pending", T0), "booting", T0 + timedelta(minutes=1))
    s = record(s, "ready", T0 + TIMINGS.history_window + timedelta(hours=1))
    assert s.activations_total == 1 and s.activations_last_24h == 1


@pytest.mark.parametrize(
    ("before", "old", "new", "counts"),
    [
        (None, Report.OFF, Report.READY, True),
        (None, Report.PENDING, Report.READY, True),
        (Report.PENDING, Report.BOOTING, Report.READY, True),
        (Report.OFF, Report.BOOTING, Report.READY, True),
        (None, Report.OFF, Report.BOOTING, False),
        (None, Report.PENDING, Report.BOOTING, False),
        (Report.PENDING, Report.BOOTING, Report.OFF, False),
        (Report.PENDING, Report.BOOTING, Report.DRAINING, False),
        (Report.BOOTING, Report.READY, Report.BOOTING, False),
        (Report.READY, Report.BOOTING, Report.READY, False),
        (Report.DRAINING, Report.BOOTING, Report.READY, False),
        (Report.READY, Report.DRAINING, Report.BOOTING, False),
        (None, Report.OFF, Report.DRAINING, False),
        (None, Report.OFF, Report.PENDING, False),
        (None, None, Report.BOOTING, False),
        (None, None, Report.READY, False),
        (None, Report.BOOTING, Report.READY, False),
    ],
)
def test_what_counts_as_an_activation(before: Report | None, old: Report | None, new: Report, counts: bool) -> None:
    assert history.is_activation(old, new, before) is counts


def test_same_phase_changes_nothing() -> None:
    s = record(record(NodeStatus(), "off", T0), "pending", T0 + timedelta(minutes=1))
    again = record(s, "pending", T0 + timedelta(minutes=2))
    assert again == s
    assert again is not s


def test_same_phase_prunes_the_window_only() -> None:
    s = record(record(NodeStatus(), "pending", T0), "booting", T0 + timedelta(minutes=1))
    later = T0 + TIMINGS.history_window + timedelta(minutes=2)
    again = record(s, "booting", later)
    assert again.recent_transitions == [] and again.recent_activations == []
    assert again.activations_last_24h == 0
    # nothing else moved
    assert again.activations_total == 0, "booting is not yet an activation"
    assert again.last_transition_time == s.last_transition_time
    assert again.previous_phase == s.previous_phase == Report.PENDING
    assert again.phase is Report.BOOTING


def test_forty_boots_in_one_day() -> None:
    """The seed's case: a count read through the 32-row ring would say 6; the ledger says 40."""
    s = record(NodeStatus(), "off", T0)
    now = T0
    for _ in range(40):
        for phase in CYCLE:
            now += timedelta(minutes=6)
            s = record(s, phase, now)
    assert now - T0 < TIMINGS.history_window
    assert s.activations_last_24h == 40
    assert s.activations_total == 40
    assert len(s.recent_activations) == 40
    assert len(s.recent_transitions) == TIMINGS.history_ring_rows == 32
    # the ring keeps the newest rows, in the order they landed
    assert s.recent_transitions[-1] == Transition(from_phase=Report.DRAINING, to_phase=Report.OFF, at=now)
    assert [r.at for r in s.recent_transitions] == sorted(r.at for r in s.recent_transitions)
    assert sum(history.is_activation(r.from_phase, r.to_phase, Report.PENDING) for r in s.recent_transitions) < 40


def test_old_rows_leave_the_ring_and_the_ledger() -> None:
    s = record(record(NodeStatus(), "pending", T0), "booting", T0)
    s = record(s, "ready", T0 + timedelta(hours=1))
    # exactly 24 h old: still inside
    at_edge = T0 + TIMINGS.history_window
    s_edge = record(s, "draining", at_edge)
    assert s_edge.activations_last_24h == 1
    assert len(s_edge.recent_transitions) == 4
    # a moment later the first two rows and the boot have left the window
    past = at_edge + timedelta(seconds=1)
    s2 = record(s_edge, "off", past)
    assert [r.to_phase for r in s2.recent_transitions] == [Report.READY, Report.DRAINING, Report.OFF]
    # the boot is stamped when the machine came up (T0 + 1 h), so it stays an hour longer
    assert s2.recent_activations == [T0 + timedelta(hours=1)]
    assert s2.activations_last_24h == 1
    later = expire(s2, T0 + timedelta(hours=1) + TIMINGS.history_window + timedelta(seconds=1))
    assert (later.recent_activations, later.activations_last_24h, later.activations_total) == ([], 0, 1)


def test_ledger_caps_at_512() -> None:
    s = record(NodeStatus(), "off", T0)
    now = T0
    boots = TIMINGS.activation_ledger_rows + 20
    for _ in range(boots):
        for phase in (Report.READY, Report.OFF):
            now += timedelta(seconds=30)
            s = record(s, phase, now)
    assert now - T0 < TIMINGS.history_window
    assert s.activations_total == boots
    assert len(s.recent_activations) == TIMINGS.activation_ledger_rows
    assert s.activations_last_24h == TIMINGS.activation_ledger_rows
    assert s.recent_activations[-1] == now - timedelta(seconds=30)
    assert len(s.recent_transitions) == TIMINGS.history_ring_rows


def test_expire_and_next_expiry() -> None:
    assert next_expiry(NodeStatus()) is None
    s = record(record(NodeStatus(), "pending", T0), "ready", T0 + timedelta(hours=2))
    first = next_expiry(s)
    assert first == T0 + TIMINGS.history_window + history.RESOLUTION
    assert first is not None
    # just before: nothing leaves
    assert expire(s, first - history.RESOLUTION) == s
    # at the expiry the oldest row leaves, the boot stays
    s2 = expire(s, first)
    assert [r.to_phase for r in s2.recent_transitions] == [Report.READY]
    assert s2.activations_last_24h == 1
    assert (s2.phase, s2.previous_phase, s2.last_transition_time, s2.activations_total) == (
        s.phase,
        s.previous_phase,
        s.last_transition_time,
        s.activations_total,
    )
    second = next_expiry(s2)
    assert second == T0 + timedelta(hours=2) + TIMINGS.history_window + history.RESOLUTION
    assert second is not None
    s3 = expire(s2, second)
    assert s3.recent_transitions == [] and s3.recent_activations == [] and s3.activations_last_24h == 0
    assert next_expiry(s3) is None
    # the input was not mutated
    assert len(s.recent_transitions) == 2


def test_naive_now_is_utc() -> None:
    s = record(NodeStatus(), "off", datetime(2025, 3, 1))
    assert s.last_transition_time == T0
    assert record(s, "pending", datetime(2025, 3, 1, 1)).last_transition_time == T0 + timedelta(hours=1)


def test_round_trips_through_the_wire() -> None:
    s = record(record(NodeStatus(), "pending", T0), "ready", T0 + timedelta(minutes=1))
    wire = s.model_dump(mode="json", by_alias=True)
    assert wire["activationsLast24H"] == 1
    assert wire["recentTransitions"][-1] == {"from": "pending", "to": "ready", "at": "2025-03-01T00:01:00Z"}
    assert NodeStatus.model_validate(wire) == s
