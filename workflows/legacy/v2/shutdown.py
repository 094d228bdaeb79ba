"""ShutdownNode and its verification: a shutdown Job that succeeded is not a machine that is off.

Shared by the claim workflow (a scale-down, or the forced shutdown of a failed claim) and the release workflow
(law 3). The driver cordons, fires one shutdown Job, counts it on the streak, waits for the Job, then waits for
the machine to be observed off. A spent streak pauses the driver until the reset grace passes, the operator
resets it, or the machine is seen off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from api import contracts as c
from api.names import (
    JOB_TIMEOUT,
    EventReason,
    JobType,
)
from domain import claims
from domain.timings import TIMINGS
from workflows import metrics

# How long a machine may keep reporting Ready after its shutdown Job succeeded: the kubelet's Node stays Ready
# for node-monitor-grace-period (about 40 s) after a real power-off; twice a kubelet status period on top.

JOB_OUTCOME_SUCCEEDED = "succeeded"
JOB_OUTCOME_FAILED = "failed"
JOB_OUTCOME_TIMEOUT = "timeout"


@dataclass
class ShutdownBook:
    """The shutdown streak and the Jobs it fired, as a workflow carries them (and the claim projects them)."""

    attempts: int = 0
    last_attempt_at: datetime | None = None
    sequence: int = 0
    limit_reported: bool = False
    finished_jobs: dict[str, bool] = field(default_factory=dict)

    def streak(self) -> claims.ShutdownStreak:
        return claims.ShutdownStreak(self.attempts, self.last_attempt_at)

    def reset(self) -> None:
        self.attempts, self.last_attempt_at, self.limit_reported = 0, None, False


class ShutdownHost(Protocol):
    """What a workflow lends the driver: its verbs, its book, and when to stop."""

    @property
    def book(self) -> ShutdownBook: ...

    def now(self) -> datetime: ...

    def details(self, text: str) -> None: ...

    def power_on(self) -> bool: ...

    def interrupted(self) -> bool: ...

    def job_owner(self) -> str: ...

    def claim_name(self) -> str: ...

    def slot_ref(self) -> c.SlotRef: ...

    async def write(self, name: str, arg: Any, summary: str) -> Any: ...

    async def read(self, name: str, arg: Any, result_type: Any, summary: str) -> Any: ...

    async def observe_now(self) -> bool: ...

    async def wait(self, done: Callable[[], bool], timeout: timedelta | None, summary: str) -> bool: ...

    async def on_attempt(self, job: str) -> None: ...

    async def on_event(self, reason: EventReason, message: str, warning: bool) -> None: ...


async def monitor_job(host: Any, job: str, job_type: str, **wait_kw: Any) -> str:
    """The Job monitor: a signal ends the wait early; a read every poll interval catches a lost signal."""
    book: ShutdownBook = host.book
    ref = c.JobRef(host.slot_ref().namespace, job)
    end = host.now() + JOB_TIMEOUT
    while True:
        if job in book.finished_jobs:
            outcome = JOB_OUTCOME_SUCCEEDED if book.finished_jobs[job] else JOB_OUTCOME_FAILED
            metrics.job_finished(ref.namespace, job_type, outcome)
            return outcome
        remaining = end - host.now()
        if remaining <= timedelta(0):
            metrics.job_finished(ref.namespace, job_type, JOB_OUTCOME_TIMEOUT)
            return JOB_OUTCOME_TIMEOUT
        host.details(f"waiting for {job_type} Job {job} (times out at {end:%H:%M:%S})")
        if await host.wait(
            lambda: job in book.finished_jobs,
            min(TIMINGS.job_monitor_poll_interval, remaining),
            f"{job_type} Job {job}",
            **wait_kw,
        ):
            continue
        status = await host.read(c.Act.READ_JOB, ref, c.JobStatus, f"read {job_type} Job {job}")
        if status is None or status.state == c.JOB_RUNNING:
            continue
        # A Job that vanished before we saw its end cannot be trusted to have done its work.
        book.finished_jobs[job] = status.state == c.JOB_SUCCEEDED


async def poll_until(
    host: Any,
    done: Callable[[], bool],
    timeout: timedelta,
    summary: str,
    stop: Callable[[], bool] | None = None,
    **wait_kw: Any,
) -> bool:
    """Wait for an observation to satisfy `done`, reading the truth every retry interval; True when it did.

    `stop` (by default the host's interruption) ends the wait early with whatever `done()` says then.
    """
    stopped = stop or host.interrupted
    end = host.now() + timeout
    while True:
        if done():
            return True
        remaining = end - host.now()
        if remaining <= timedelta(0):
            return False
        if not await host.wait(
            lambda: done() or stopped(), min(TIMINGS.max_uncordon_retry_interval, remaining), summary, **wait_kw
        ):
            await host.observe_now()
        elif stopped():
            return done()


async def shut_down(host: ShutdownHost) -> bool:
    """Drive the machine off; True once it is observed off, False when interrupted first."""
    book = host.book
    slot = host.slot_ref()
    await host.observe_now()
    while True:
        if not host.power_on():
            return True
        if host.interrupted():
            return False
        now = host.now()
        streak = claims.effective(book.streak(), now)
        if streak.attempts == 0 and book.attempts:
            book.reset()  # the grace passed: the count restarts, which is what picks up a fixed script
        if not claims.may_fire_shutdown(book.streak(), now):
            await _pause(host)
            continue
        host.details("cordoning the node")
        await host.write(c.Act.CORDON, slot, f"cordon the node of slot {slot.slot}")
        book.sequence += 1
        job = c.job_name(host.job_owner() or slot.slot, JobType.SHUTDOWN, book.sequence)
        created = await host.write(
            c.Act.CREATE_JOB,
            c.JobRequest(slot.namespace, slot.slot, JobType.SHUTDOWN, book.sequence, host.claim_name(), job),
            f"shutdown Job {job}",
        )
        job = str(created["name"]) if isinstance(created, dict) else job
        after = claims.after_shutdown_job(book.streak(), host.now())
        book.attempts, book.last_attempt_at = after.attempts, after.last_attempt_at
        await host.on_attempt(job)
        outcome = await monitor_job(host, job, JobType.SHUTDOWN)
        if outcome == JOB_OUTCOME_SUCCEEDED:
            host.details(f"shutdown Job {job} succeeded; waiting to observe the machine off")
            if await poll_until(
                host, lambda: not host.power_on(), TIMINGS.shutdown_verify_timeout, "shutdown verification"
            ):
                return True
            if host.interrupted():
                return False
            await host.on_event(
                EventReason.SHUTDOWN_NOT_OBSERVED,
                f"shutdown Job {job} succeeded but the machine is still on (attempt {book.attempts} of "
                f"{TIMINGS.max_consecutive_attempts})",
                True,
            )
        else:
            await host.on_event(
                EventReason.SHUTDOWN_NOT_OBSERVED,
                f"shutdown Job {job} {'timed out' if outcome == JOB_OUTCOME_TIMEOUT else 'failed'} "
                f"(attempt {book.attempts} of {TIMINGS.max_consecutive_attempts})",
                True,
            )


async def _pause(host: ShutdownHost) -> None:
    """A spent streak: stop firing until the grace passes, the streak is reset, or the machine goes off."""
    book = host.book
    resume_at = claims.next_shutdown_allowed_at(book.streak())
    if not book.limit_reported:
        book.limit_reported = True
        await host.on_event(
            EventReason.SHUTDOWN_ATTEMPT_LIMIT_REACHED,
            f"{book.attempts} shutdown Jobs did not power the machine off; paused until "
            f"{resume_at:%Y-%m-%d %H:%M:%S}Z or a reset of the shutdown streak",
            True,
        )
    host.details(f"shutdown paused after {book.attempts} attempts; resumes at {resume_at:%H:%M:%S}")
    attempts = book.attempts
    timeout = None if resume_at is None else max(resume_at - host.now(), timedelta(0))
    await host.wait(
        lambda: book.attempts < attempts or not host.power_on() or host.interrupted(),
        timeout,
        "shutdown streak reset grace",
    )
    if not host.power_on():
        return
    await host.observe_now()
