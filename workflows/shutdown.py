"""ShutdownNode and its verification: a shutdown Job that succeeded is not a machine that is off.

Shared by the claim workflow (a scale-down) and the release workflow (law 3, including the end of a failed
claim's machine). The driver cordons, fires one shutdown Job, counts it on the streak, waits for the Job, then
waits for the machine to be observed off. A spent streak pauses the driver until the reset grace passes, the
operator resets it, or the machine is seen off.

A machine that a startup Job powered but whose kubelet never showed it (no Node, or never Ready) cannot be
observed off: it is shut down all the same, and the Job's success, followed by a verification window in which
the machine does not show up, is taken as off. Past the streak with the machine still never seen, the driver
stops and says so rather than firing shutdown Jobs at a machine that may never have come up.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from temporalio import workflow

from api import contracts as c
from api.names import (
    JOB_TIMEOUT,
    EventReason,
    JobType,
)
from domain import claims
from domain.timings import TIMINGS
from workflows import metrics
from workflows.drain import drain
from workflows.patches import Patch
from workflows.verbs import Broken

# How long a machine may keep reporting Ready after its shutdown Job succeeded: the kubelet's Node stays Ready
# for node-monitor-grace-period (about 40 s) after a real power-off; twice a kubelet status period on top.

JOB_OUTCOME_SUCCEEDED = "succeeded"
JOB_OUTCOME_FAILED = "failed"
JOB_OUTCOME_TIMEOUT = "timeout"
JOB_OUTCOME_INTERRUPTED = "interrupted"  # the host stopped waiting (superseded, aborted): the Job's end is unknown
# The Job controller's reason for a Job its own activeDeadlineSeconds ended: a timeout, not a failure.
JOB_DEADLINE_REASON = "DeadlineExceeded"

SHUTDOWN_EVENTS: dict[str, EventReason] = {
    JOB_OUTCOME_SUCCEEDED: EventReason.SHUTDOWN_NOT_OBSERVED,
    JOB_OUTCOME_FAILED: EventReason.SHUTDOWN_JOB_FAILED,
    JOB_OUTCOME_TIMEOUT: EventReason.SHUTDOWN_JOB_TIMEOUT,
}


@dataclass
class ShutdownBook:
    """The shutdown streak and the Jobs it fired, as a workflow carries them (and the claim projects them)."""

    attempts: int = 0
    last_attempt_at: datetime | None = None
    sequence: int = 0
    limit_reported: bool = False
    finished_jobs: dict[str, bool] = field(default_factory=dict)
    finished_reasons: dict[str, str] = field(default_factory=dict)
    last_job: str = ""  # the last shutdown Job fired: the one a completion cites
    # A running shutdown Job a lost run fired (a taken-over claim's): the attempt under way, awaited and judged
    # before any other is fired, its budget counted from its start.
    adopted: str = ""
    adopted_started: datetime | None = None

    def streak(self) -> claims.ShutdownStreak:
        return claims.ShutdownStreak(self.attempts, self.last_attempt_at)

    def reset(self) -> None:
        self.attempts, self.last_attempt_at, self.limit_reported = 0, None, False

    def finish(self, finished: c.JobFinished) -> None:
        self.finished_jobs[finished.job] = finished.succeeded
        if finished.reason:
            self.finished_reasons[finished.job] = finished.reason

    def outcome(self, job: str) -> str | None:
        """How a Job ended (None while it runs): a Job ended by its own deadline timed out."""
        if job not in self.finished_jobs:
            return None
        if self.finished_jobs[job]:
            return JOB_OUTCOME_SUCCEEDED
        return JOB_OUTCOME_TIMEOUT if self.finished_reasons.get(job) == JOB_DEADLINE_REASON else JOB_OUTCOME_FAILED


class ShutdownHost(Protocol):
    """What a workflow lends the driver: its verbs, its book, what it believes of the machine, when to stop."""

    @property
    def book(self) -> ShutdownBook: ...

    def now(self) -> datetime: ...

    def details(self, text: str) -> None: ...

    def power_on(self) -> bool: ...

    def maybe_on(self) -> bool: ...

    def seen_on(self) -> bool: ...

    def off_unseen(self) -> None: ...

    def interrupted(self) -> bool: ...

    def job_owner(self) -> str: ...

    def claim_name(self) -> str: ...

    def slot_ref(self) -> c.SlotRef: ...

    async def write(self, name: str, arg: Any, summary: str) -> Any: ...

    async def buy(
        self,
        name: str,
        arg: Any,
        summary: str,
        *,
        stop: Callable[[], bool],
        landed: Callable[[], Awaitable[bool]] | None = None,
    ) -> bool: ...

    async def read(self, name: str, arg: Any, result_type: Any, summary: str) -> Any: ...

    async def observe_now(self) -> bool: ...

    async def wait(self, done: Callable[[], bool], timeout: timedelta | None, summary: str) -> bool: ...

    async def on_attempt(self, job: str, started: str = "", fact: str = "") -> None:
        """A shutdown Job was created; `started` (first attempt only) is the ScaleDownStarted message to publish,
        `fact` what it says (`scale_down_fact`): said once per scale-down, whatever run says it."""
        ...

    async def on_event(
        self, reason: EventReason, message: str, warning: bool, last_words_of: str = "", fact: str = ""
    ) -> None:
        """A Warning or Event; `last_words_of` names a failed Job whose Pod's words the writing activity adds; `fact`
        (when more than one run may say it) makes a repeat of the same fact no Event."""
        ...


def scale_down_fact(owner: str) -> str:
    """What ScaleDownStarted says, once per scale-down of a claim (or a release episode): another run of the claim
    saying it again (a take-over, a streak resumed after its grace) adds no Event."""
    return f"{owner}: scale-down started"


def streak_spent_fact(owner: str, last_attempt_at: datetime | None) -> str:
    """What ShutdownAttemptLimitReached says, once per spent streak: the streak is named by its last attempt, to
    the second, as the claim's record holds it (so a run that took the claim over names it alike)."""
    spent = "-" if last_attempt_at is None else f"{last_attempt_at:%Y-%m-%dT%H:%M:%SZ}"
    return f"{owner}: shutdown streak spent at {spent}"


async def monitor_job(host: Any, job: str, job_type: str, *, started: datetime | None = None, **wait_kw: Any) -> str:
    """The Job monitor: a signal ends the wait early; a read every poll interval catches a lost signal. A host
    interrupted meanwhile (a superseded claim) stops waiting: the Job is someone else's to wait out now. The Job's
    budget counts from `started` when it began before this run (a lost run's Job), else from now.
    """
    book: ShutdownBook = host.book
    ref = c.JobRef(host.slot_ref().namespace, job)
    end = (started or host.now()) + JOB_TIMEOUT
    while True:
        outcome = book.outcome(job)
        if outcome is not None:
            metrics.job_finished(ref.namespace, job_type, outcome)
            return outcome
        remaining = end - host.now()
        if remaining <= timedelta(0):
            metrics.job_finished(ref.namespace, job_type, JOB_OUTCOME_TIMEOUT)
            return JOB_OUTCOME_TIMEOUT
        host.details(f"waiting for {job_type} Job {job} (times out at {end:%H:%M:%S})")
        if await host.wait(
            lambda: job in book.finished_jobs or host.interrupted(),
            min(TIMINGS.job_monitor_poll_interval, remaining),
            f"{job_type} Job {job}",
            **wait_kw,
        ):
            if job not in book.finished_jobs:
                return JOB_OUTCOME_INTERRUPTED
            continue
        status = await host.read(c.Act.READ_JOB, ref, c.JobStatus, f"read {job_type} Job {job}")
        if status is None or status.state == c.JOB_RUNNING:
            continue
        # A Job that vanished before we saw its end cannot be trusted to have done its work.
        book.finish(c.JobFinished(job, status.state == c.JOB_SUCCEEDED, status.reason))


async def job_exit(host: Any, job: str, job_type: str) -> c.JobExit | None:
    """How a failed Job's Pod ended, as a history may hold it (exit code and reason); None when it cannot be read."""
    ref = c.JobRef(host.slot_ref().namespace, job)
    summary = f"read how {job_type} Job {job} ended"
    ended: c.JobExit | None = await host.read(c.Act.READ_JOB_EXIT, ref, c.JobExit, summary)
    return ended


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
    """Drive the machine off; True once it is observed (or, never seen, taken to be) off, False when stopped.

    A shutdown Job the API server refuses raises `Broken`: no retry makes that Job, so the caller decides.
    """
    book = host.book
    slot = host.slot_ref()
    owner = host.job_owner() or slot.slot
    await host.observe_now()
    if book.adopted:
        # A lost run's shutdown Job still runs: it is the attempt under way (counted when the claim was taken
        # over), awaited and judged as the lost run would have, never doubled. ScaleDownStarted is said if that run
        # had not said it yet (a repeat of the fact is no Event).
        job, started, book.adopted, book.adopted_started = book.adopted, book.adopted_started, "", None
        book.last_job = job
        await host.on_attempt(job, f"cordoned the node of slot {slot.slot}; shutdown Job {job}", scale_down_fact(owner))
        judged = await _judge(host, job, started)
        if judged is not None:
            return judged
    while True:
        if not host.maybe_on():
            return True
        if host.interrupted():
            return False
        now = host.now()
        streak = claims.effective(book.streak(), now)
        if streak.attempts == 0 and book.attempts:
            book.reset()  # the grace passed: the count restarts, which is what picks up a fixed script
        if not claims.may_fire_shutdown(book.streak(), now):
            if not host.seen_on() and not host.power_on():
                await host.on_event(
                    EventReason.MACHINE_OFF_UNSEEN,
                    f"{book.attempts} shutdown Jobs did not succeed for a machine its kubelet never showed on; "
                    "taken to be off (it is released by law 3 if it ever shows up)",
                    True,
                )
                host.off_unseen()
                return True
            await _pause(host)
            continue
        host.details("cordoning the node")
        first = book.attempts == 0
        if first:  # ScaleDownStarted goes out with the first shutdown Job's record, not before the cordon on its own
            workflow.deprecate_patch(Patch.STARTED_WITH_JOB)
        # The writes that act on the machine stop the moment the host is interrupted (a superseded claim hands
        # its machine to a newer one), even while they are being retried: no shutdown for a machine not ours.
        try:
            if not await host.buy(c.Act.CORDON, slot, f"cordon the node of slot {slot.slot}", stop=host.interrupted):
                return False
        except Broken as err:  # a cordon only keeps pods away meanwhile; the power-off does not need it
            await host.on_event(EventReason.SHUTDOWN_JOB_FAILED, f"could not cordon: {err.message}", True)
        # The drain before dark: the node's Pods leave through the Eviction API before its shutdown Job is made.
        if workflow.patched(Patch.DRAIN_BEFORE_DARK):
            if not await drain(host):
                return False
            if not host.maybe_on():
                return True
        book.sequence += 1
        job = c.job_name(host.job_owner() or slot.slot, JobType.SHUTDOWN, book.sequence)

        async def job_exists(job: str = job) -> bool:
            found = await host.read(c.Act.READ_JOB, c.JobRef(slot.namespace, job), c.JobStatus, f"read Job {job}")
            return found is not None and found.state != c.JOB_MISSING

        # The Job carries its number in the streak, so a run that takes the claim over counts it once.
        attempt = claims.after_shutdown_job(book.streak(), host.now()).attempts
        if not await host.buy(
            c.Act.CREATE_JOB,
            c.JobRequest(slot.namespace, slot.slot, JobType.SHUTDOWN, book.sequence, host.claim_name(), job, attempt),
            f"shutdown Job {job}",
            stop=host.interrupted,
            landed=job_exists,
        ):
            return False
        book.last_job = job
        after = claims.after_shutdown_job(book.streak(), host.now())
        book.attempts, book.last_attempt_at = after.attempts, after.last_attempt_at
        said = f"cordoned the node of slot {slot.slot}; shutdown Job {job}" if first else ""
        await host.on_attempt(job, said, scale_down_fact(owner) if said else "")
        judged = await _judge(host, job)
        if judged is not None:
            return judged


async def _judge(host: ShutdownHost, job: str, started: datetime | None = None) -> bool | None:
    """Await a shutdown Job and judge it: True once the machine is (taken to be) off, False when the host stopped,
    None when the attempt did not land (its Warning said), for the driver to go on."""
    book = host.book
    outcome = await monitor_job(host, job, JobType.SHUTDOWN, started=started)
    if outcome == JOB_OUTCOME_INTERRUPTED:
        return False
    if outcome == JOB_OUTCOME_SUCCEEDED:
        if await _verified_off(host, job):
            return True
        if host.interrupted():
            return False
        said, words = "succeeded but the machine is still on", ""
    else:
        # How its Pod ended (exit code, reason) is said in the Warning; the activity writing it adds the Pod's words.
        workflow.deprecate_patch(Patch.SHUTDOWN_FAILURE_SAYS_WHY)
        said, words = "timed out" if outcome == JOB_OUTCOME_TIMEOUT else "failed", job
        ended = await job_exit(host, job, JobType.SHUTDOWN)
        said += f": {ended.said()}" if ended is not None else ""
    await host.on_event(
        SHUTDOWN_EVENTS[outcome],
        f"shutdown Job {job} {said} (attempt {book.attempts} of {TIMINGS.max_consecutive_attempts})",
        True,
        words,
    )
    return None


async def _verified_off(host: ShutdownHost, job: str) -> bool:
    """After a successful shutdown Job: the machine observed off, or (never seen on) not showing up in the window."""
    host.details(f"shutdown Job {job} succeeded; waiting to observe the machine off")
    if host.seen_on() or host.power_on():
        return await poll_until(
            host, lambda: not host.power_on(), TIMINGS.shutdown_verify_timeout, "shutdown verification"
        )
    # Never seen on: if its kubelet shows up now, it was coming up after all and the verification continues.
    appeared = await poll_until(host, host.power_on, TIMINGS.shutdown_verify_timeout, "shutdown verification (unseen)")
    if not appeared:
        host.off_unseen()
        return True
    return await poll_until(host, lambda: not host.power_on(), TIMINGS.shutdown_verify_timeout, "shutdown verification")


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
            fact=streak_spent_fact(host.job_owner() or host.slot_ref().slot, book.last_attempt_at),
        )
    host.details(f"shutdown paused after {book.attempts} attempts; resumes at {resume_at:%H:%M:%S}")
    attempts = book.attempts
    timeout = None if resume_at is None else max(resume_at - host.now(), timedelta(0))
    await host.wait(
        lambda: book.attempts < attempts or not host.maybe_on() or host.interrupted(),
        timeout,
        "shutdown streak reset grace",
    )
    if not host.power_on():
        return
    await host.observe_now()
