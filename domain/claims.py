"""Claim phases and their legal moves, the boot deadline, attempt seeding, and the shutdown streak.

All pure: every function that needs the time takes it as an argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from api.names import (
    JOB_TIMEOUT,
    ClaimPhase,
)
from domain.law import phase_of
from domain.timings import TIMINGS

_P = ClaimPhase

# Phase -> the phases it may move to. Terminal phases move nowhere. A move to the same phase is not in the
# table: a re-apply changes nothing, so the recorder must not write it or publish an Event for it; callers
# compare before they move.
LEGAL_MOVES: Mapping[ClaimPhase, frozenset[ClaimPhase]] = {
    _P.PENDING: frozenset({_P.BOOTING, _P.READY, _P.COMPLETED, _P.FAILED}),
    _P.BOOTING: frozenset({_P.READY, _P.COMPLETED, _P.FAILED}),
    _P.READY: frozenset({_P.COMPLETED, _P.FAILED}),
    _P.FAILED: frozenset(),
    _P.COMPLETED: frozenset(),
}


class IllegalMove(Exception):
    """A claim move the phase table refuses; nothing is written for it."""

    def __init__(self, current: ClaimPhase, target: ClaimPhase) -> None:
        super().__init__(f"illegal claim move {current} -> {target}")
        self.current = current
        self.target = target


def is_legal(current: ClaimPhase | str | None, target: ClaimPhase | str) -> bool:
    """Whether the table allows current -> target (a claim with no phase is pending)."""
    return ClaimPhase(target) in LEGAL_MOVES[phase_of(current)]


def move(current: ClaimPhase | str | None, target: ClaimPhase | str) -> ClaimPhase:
    """The target phase if the move is legal; otherwise IllegalMove, and the caller writes nothing."""
    cur, tgt = phase_of(current), ClaimPhase(target)
    if tgt not in LEGAL_MOVES[cur]:
        raise IllegalMove(cur, tgt)
    return tgt


# --- deadlines ---------------------------------------------------------------------------------------------

# The parts of one attempt, in series, measured from requestedAt (before the startup Job exists).
BUDGET_PARTS: tuple[timedelta, ...] = (
    JOB_TIMEOUT,
    TIMINGS.job_monitor_poll_interval,
    TIMINGS.node_registration_timeout,
    TIMINGS.readiness_gate_timeout,
    TIMINGS.max_uncordon_retry_interval,
    TIMINGS.boot_budget_slack,
)


def attempt_budget() -> timedelta:
    """One attempt's worst case: Job, poll, registration, gate, uncordon retry, slack (12m10s)."""
    return sum(BUDGET_PARTS, timedelta())


def machine_gone_grace() -> timedelta:
    """How long a ready claim may see its machine off before it fails MachineGone: one boot window."""
    return attempt_budget()


def provision_time(group_max: timedelta | None) -> timedelta:
    """The boot time in force: max(budget, group maxNodeProvisionTime). cluster-autoscaler is told this number."""
    return max(attempt_budget(), group_max or timedelta())


def deadline_at(requested_at: datetime, group_max: timedelta | None) -> datetime:
    """requestedAt + the provision time in force: never before cluster-autoscaler gives up."""
    return requested_at + provision_time(group_max)


# --- attempts ----------------------------------------------------------------------------------------------

# What the previous claim's phase says about the streak: True continues it (+1), False restarts it (1).
# pending/booting in a digest means the claim was collected or superseded before it reached ready: it
# bought no machine, so it counts as a failure of the streak, like failed.
CONTINUES_STREAK: Mapping[ClaimPhase, bool] = {
    _P.PENDING: True,
    _P.BOOTING: True,
    _P.READY: False,
    _P.COMPLETED: False,
    _P.FAILED: True,
}


def _field(obj: Any, name: str) -> Any:
    """A field of a digest given as a mapping or an object with attributes."""
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def seed_attempt(last_claim: Any, reset_at: datetime | None = None) -> int:
    """The attempt number of a new claim, from the slot's last-claim digest (None: the first claim, 1).

    +1 while the slot keeps failing, back to 1 after an episode that ended ready or completed. A digest with
    no attempt counts as attempt 1. `reset_at` (the slot's reset-attempts annotation) restarts the streak: a
    last claim requested at or before it no longer counts.
    """
    if last_claim is None:
        return 1
    requested = _field(last_claim, "requested_at")
    if reset_at is not None and (not isinstance(requested, datetime) or requested <= reset_at):
        return 1
    previous = max(int(_field(last_claim, "attempt") or 1), 1)
    return previous + 1 if CONTINUES_STREAK[phase_of(_field(last_claim, "phase"))] else 1


def attempt_limit_exceeded(attempt: int) -> bool:
    """Past MaxConsecutiveAttempts the claim fails AttemptLimitExceeded before a machine is bought."""
    return attempt > TIMINGS.max_consecutive_attempts


@dataclass(frozen=True)
class Claimability:
    """Whether a new claim on a slot could boot, and if not why (the slot's Claimable condition says the same)."""

    ok: bool
    reason: str = "Claimable"
    message: str = ""


def claimability(last_claim: Any, reset_at: datetime | None = None, problem: str = "") -> Claimability:
    """A slot takes a new claim only if its spec can power it and its next attempt is within the limit."""
    if problem:
        return Claimability(False, "InvalidSpec", problem)
    attempt = seed_attempt(last_claim, reset_at)
    if attempt_limit_exceeded(attempt):
        name = _field(last_claim, "name") or "?"
        return Claimability(
            False,
            "AttemptLimitReached",
            f"{attempt - 1} claims in a row failed to boot the machine (the last: {name}); annotate the slot "
            "with infra.homecluster.dev/reset-attempts=<now, RFC 3339> once it is fixed",
        )
    return Claimability(True, "Claimable", f"the next claim is attempt {attempt}")


# --- the shutdown streak -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShutdownStreak:
    """The shutdown Jobs a scale-down claim has fired (status.shutdownAttempts, lastShutdownAttemptAt)."""

    attempts: int = 0
    last_attempt_at: datetime | None = None


def reset() -> ShutdownStreak:
    """A streak with nothing spent, as after the machine is observed off or the operator's reset."""
    return ShutdownStreak(0, None)


def effective(streak: ShutdownStreak, now: datetime) -> ShutdownStreak:
    """The streak in force at `now`: reset once the grace has passed since the last attempt.

    A streak with attempts but no timestamp cannot be bounded, so it is treated as expired (a pause is
    never a sentence).
    """
    if streak.last_attempt_at is None or now >= streak.last_attempt_at + TIMINGS.shutdown_streak_reset_grace:
        return reset()
    return streak


def may_fire_shutdown(streak: ShutdownStreak, now: datetime) -> bool:
    """False while the streak is spent (attempts >= limit) and the grace since its last Job has not passed."""
    return effective(streak, now).attempts < TIMINGS.max_consecutive_attempts


def after_shutdown_job(streak: ShutdownStreak, now: datetime) -> ShutdownStreak:
    """The streak after one more shutdown Job at `now`; an expired streak restarts its count first."""
    current = effective(streak, now)
    return replace(current, attempts=current.attempts + 1, last_attempt_at=now)


def next_shutdown_allowed_at(streak: ShutdownStreak) -> datetime | None:
    """When a spent streak lets a shutdown fire again (a timer target); None when it is not spent."""
    if streak.attempts < TIMINGS.max_consecutive_attempts or streak.last_attempt_at is None:
        return None
    return streak.last_attempt_at + TIMINGS.shutdown_streak_reset_grace


# --- the timeline ------------------------------------------------------------------------------------------


def _duration(delta: timedelta) -> str:
    seconds = max(int(delta.total_seconds()), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"


def move_message(
    target: ClaimPhase | str,
    reason: str,
    message: str,
    seed: Any,
    job: str,
    deadline: datetime | None,
    now: datetime,
) -> str:
    """The Event of a move: what happened, then the attempt's numbers (attempt, Job, deadline, time taken)."""
    head = message or f"{target} {reason}".strip()
    facts = [f"attempt {_field(seed, 'attempt')}"]
    if job:
        facts.append(f"Job {job}")
    if deadline is not None:
        facts.append(f"deadline {deadline:%H:%M:%S}Z")
    requested = _field(seed, "requested_at")
    if isinstance(requested, datetime):
        facts.append(f"{_duration(now - requested)} since the request")
    return f"{head} ({', '.join(facts)})"
