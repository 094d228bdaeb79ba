"""Claim moves, the boot budget and deadline, attempt seeding, and the shutdown streak."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from api.names import ClaimPhase
from domain import claims
from domain.claims import (
    IllegalMove,
    ShutdownStreak,
    after_shutdown_job,
    attempt_budget,
    attempt_limit_exceeded,
    deadline_at,
    effective,
    machine_gone_grace,
    may_fire_shutdown,
    move,
    next_shutdown_allowed_at,
    seed_attempt,
)
from domain.timings import TIMINGS

P = ClaimPhase
LEGAL = {
    (None, P.BOOTING),
    (None, P.READY),
    (None, P.COMPLETED),
    (None, P.FAILED),
    (P.PENDING, P.BOOTING),
    (P.PENDING, P.READY),
    (P.PENDING, P.COMPLETED),
    (P.PENDING, P.FAILED),
    (P.BOOTING, P.READY),
    (P.BOOTING, P.COMPLETED),
    (P.BOOTING, P.FAILED),
    (P.READY, P.COMPLETED),
    (P.READY, P.FAILED),
}
PAIRS = [(cur, tgt) for cur in (None, *P) for tgt in P]


def _id(pair: tuple[P | None, P]) -> str:
    return f"{pair[0] or 'none'}->{pair[1]}"


@pytest.mark.parametrize(("current", "target"), PAIRS, ids=[_id(p) for p in PAIRS])
def test_every_move(current: P | None, target: P) -> None:
    if (current, target) in LEGAL:
        assert move(current, target) is target
        assert claims.is_legal(current, target)
    else:
        with pytest.raises(IllegalMove) as err:
            move(current, target)
        assert str(current or "pending") in str(err.value) and str(target) in str(err.value)
        assert not claims.is_legal(current, target)


def test_pair_count() -> None:
    assert len(PAIRS) == 30


def test_illegal_move_changes_nothing() -> None:
    status = {"phase": P.COMPLETED}
    with pytest.raises(IllegalMove):
        status["phase"] = move(status["phase"], P.BOOTING)
    assert status == {"phase": P.COMPLETED}


def test_same_phase_is_illegal() -> None:
    for phase in P:
        with pytest.raises(IllegalMove):
            move(phase, phase)


def test_moves_accept_strings() -> None:
    assert move("pending", "booting") is P.BOOTING


# --- deadlines ---------------------------------------------------------------------------------------------

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def test_attempt_budget() -> None:
    assert attempt_budget() == timedelta(minutes=12, seconds=10)
    assert machine_gone_grace() == attempt_budget()


@pytest.mark.parametrize(
    ("group_max", "expected"),
    [
        pytest.param(None, timedelta(minutes=12, seconds=10), id="no-group-max"),
        pytest.param(timedelta(minutes=5), timedelta(minutes=12, seconds=10), id="group-max-below-budget"),
        pytest.param(timedelta(minutes=15), timedelta(minutes=15), id="group-max-above-budget"),
        pytest.param(timedelta(0), timedelta(minutes=12, seconds=10), id="group-max-zero"),
    ],
)
def test_deadline_at(group_max: timedelta | None, expected: timedelta) -> None:
    assert deadline_at(T0, group_max) == T0 + expected


# --- attempts ----------------------------------------------------------------------------------------------


@dataclass
class Digest:
    phase: str | None
    attempt: int | None


@pytest.mark.parametrize(
    ("last", "expected"),
    [
        pytest.param(None, 1, id="no-previous-claim"),
        pytest.param(Digest("failed", 1), 2, id="failed-1"),
        pytest.param(Digest("failed", 3), 4, id="failed-3"),
        pytest.param({"phase": "failed", "attempt": 2}, 3, id="failed-dict"),
        pytest.param(Digest("ready", 3), 1, id="ready"),
        pytest.param(Digest("completed", 2), 1, id="completed"),
        pytest.param({"phase": "completed", "attempt": 4}, 1, id="completed-dict"),
        pytest.param(Digest("booting", 2), 3, id="booting-never-succeeded"),
        pytest.param(Digest("pending", 1), 2, id="pending-never-succeeded"),
        pytest.param(Digest(None, 1), 2, id="no-phase-is-pending"),
        pytest.param(Digest("failed", None), 2, id="failed-no-attempt"),
    ],
)
def test_seed_attempt(last: Any, expected: int) -> None:
    assert seed_attempt(last) == expected


def test_attempt_limit() -> None:
    assert TIMINGS.max_consecutive_attempts == 3
    assert not attempt_limit_exceeded(1)
    assert not attempt_limit_exceeded(3)
    assert attempt_limit_exceeded(4)


def test_four_failures_in_a_row_hit_the_limit() -> None:
    last = None
    seen = []
    for _ in range(4):
        attempt = seed_attempt(last)
        seen.append(attempt)
        last = Digest("failed", attempt)
    assert seen == [1, 2, 3, 4]
    assert [attempt_limit_exceeded(a) for a in seen] == [False, False, False, True]


# --- the shutdown streak -----------------------------------------------------------------------------------


def test_three_jobs_then_paused_then_resumes_after_grace() -> None:
    streak = claims.reset()
    now = T0
    for _ in range(3):
        assert may_fire_shutdown(streak, now)
        streak = after_shutdown_job(streak, now)
        now += timedelta(minutes=1)
    last = T0 + timedelta(minutes=2)
    assert streak == ShutdownStreak(3, last)
    assert not may_fire_shutdown(streak, now)
    assert next_shutdown_allowed_at(streak) == last + TIMINGS.shutdown_streak_reset_grace
    # not before the grace
    just_before = last + TIMINGS.shutdown_streak_reset_grace - timedelta(seconds=1)
    assert not may_fire_shutdown(streak, just_before)
    assert effective(streak, just_before) == streak
    # at and after the grace the streak is spent no longer
    at = last + TIMINGS.shutdown_streak_reset_grace
    assert may_fire_shutdown(streak, at)
    assert effective(streak, at) == ShutdownStreak(0, None)
    # and the count restarts with the next Job
    assert after_shutdown_job(streak, at) == ShutdownStreak(1, at)


def test_streak_below_limit_is_not_paused() -> None:
    streak = ShutdownStreak(2, T0)
    assert may_fire_shutdown(streak, T0)
    assert next_shutdown_allowed_at(streak) is None
    assert after_shutdown_job(streak, T0 + timedelta(minutes=1)) == ShutdownStreak(3, T0 + timedelta(minutes=1))


def test_streak_without_timestamp_is_not_a_sentence() -> None:
    streak = ShutdownStreak(5, None)
    assert may_fire_shutdown(streak, T0)
    assert next_shutdown_allowed_at(streak) is None
    assert effective(streak, T0) == claims.reset()


def test_seed_attempt_reads_the_real_digest() -> None:
    from api.v2alpha1 import ClaimDigest

    assert seed_attempt(ClaimDigest(name="c1", phase=ClaimPhase.FAILED, attempt=2)) == 3
    assert seed_attempt(ClaimDigest(name="c1", phase=ClaimPhase.COMPLETED, attempt=2)) == 1
