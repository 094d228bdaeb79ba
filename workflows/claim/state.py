"""The claim's whole state in one dataclass: what the workflow decides from, carried across continue-as-new (a field
a continued run no longer knows is left out, one it does not find takes its default).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from api.contracts import (
    JOB_RUNNING,
    JOB_SUCCEEDED,
    ClaimDigest,
    ClaimRecord,
    ClaimSeed,
    JobFinished,
    Observation,
)
from api.names import OWNED_CLAIM_STATUS, ClaimPhase, ClaimReason, ConditionType, JobType
from domain import law
from workflows.shutdown import ShutdownBook

# Reasons whose claim hands its machine over instead of ending its episode: the newer claim owns it, or no slot
# is left to act through.
HANDS_OVER = frozenset({ClaimReason.SUPERSEDED, ClaimReason.SLOT_DELETED})


@dataclass
class Condition:
    status: bool
    reason: str
    message: str
    since: datetime


@dataclass
class ClaimState:
    """Everything the claim is: its seed, its phase and reason, its counters, and what it last observed."""

    seed: ClaimSeed
    phase: str = ClaimPhase.PENDING
    reason: str = ""
    message: str = ""
    deadline_at: datetime | None = None
    finished_at: datetime | None = None
    marked: bool = False
    mark_reason: str = ""
    abandoned: str = ""
    abandoned_message: str = ""
    resource_gone: bool = False
    collect_now: bool = False
    observation: Observation = field(default_factory=Observation)
    observed_off_since: datetime | None = None
    machine_off_verified: bool = False
    book: ShutdownBook = field(default_factory=ShutdownBook)
    startup_job: str = ""
    conditions: dict[str, Condition] = field(default_factory=dict)
    committed: bool = False
    finalizer: bool = False
    continued: int = 0
    liveness_reads: int = 0
    powered: bool = False  # our startup Job succeeded, or the claim took a machine already on
    was_seen_on: bool = False  # the machine has been observed on since it was powered
    mark_phase: str = ""  # the phase the claim was in when the mark arrived (a cancel, or a reversal)
    revision: int = 0  # projections made: each carries its number, so a late one never lands over a newer one
    failed_job: str = ""  # the Job whose failure failed the claim (its Pod's words are on the resource, not here)
    # When the startup Job started, for one a lost run made (its budget counts from there).
    startup_started_at: datetime | None = None

    @classmethod
    def from_seed(cls, seed: ClaimSeed) -> ClaimState:
        s = cls(seed=seed, phase=seed.phase, reason=seed.reason, deadline_at=seed.deadline_at)
        if seed.record is not None:
            s.resume(seed.record)
        s.take(seed.observation)
        if seed.marked_reason:
            s.mark(seed.marked_reason)
        return s

    def resume(self, record: ClaimRecord) -> None:
        """Continue the record a lost run left on the resource: its revision (writes go on above it), its
        conditions with their clocks (MachineObservedOff's is MachineGone's), its shutdown streak, its end.

        Shutdown Jobs are numbered above the revision: each Job a run fired was recorded by a projection before it
        fired the next, so no Job name of the lost run is used again (a finished one would answer for a new one).
        """
        self.revision = record.revision
        self.message = record.message
        self.finished_at = record.finished_at
        self.book.attempts, self.book.last_attempt_at = record.shutdown_attempts, record.last_shutdown_attempt_at
        self.book.sequence = record.revision
        for cond in record.conditions:
            self.conditions[cond.type] = Condition(cond.status, cond.reason, cond.message, cond.since)
        off = record.condition(ConditionType.MACHINE_OBSERVED_OFF)
        if off is not None and off.status and self.phase == ClaimPhase.READY:
            self.observed_off_since = off.since

    def adopt(self, record: ClaimRecord, now: datetime) -> None:
        """Take over the claim's own Jobs, as the lost run held them: its startup Job (a pending or booting claim's)
        is monitored to its end with its budget counted from its start; its newest running shutdown Job is the
        attempt under way, awaited instead of doubled, and counted once (its annotation says which attempt it is:
        a record one behind it was lost between the Job and its record). No Job name seen is used again.

        When a Job started is read from the record where it says so (MachineCommitted's clock, the last attempt's
        time: the workflow's own clock), else from the Job's age when it was read.
        """
        jobs = record.jobs
        startup = next((j for j in jobs if j.job_type == JobType.STARTUP), None)
        if startup is not None and self.phase in (ClaimPhase.PENDING, ClaimPhase.BOOTING):
            committed = record.condition(ConditionType.MACHINE_COMMITTED)
            self.startup_job = startup.name
            self.startup_started_at = (
                committed.since
                if committed is not None and committed.status
                else now - timedelta(seconds=startup.age_seconds)
            )
            if startup.state != JOB_RUNNING:
                self.book.finish(JobFinished(startup.name, startup.state == JOB_SUCCEEDED, startup.reason))
        shutdowns = sorted((j for j in jobs if j.job_type == JobType.SHUTDOWN), key=lambda j: (j.sequence, j.name))
        if not shutdowns:
            return
        self.book.sequence = max(self.book.sequence, shutdowns[-1].sequence)
        self.book.last_job = shutdowns[-1].name
        running = [j for j in shutdowns if j.state == JOB_RUNNING]
        if not running or not self.live:
            return
        job = running[-1]
        started = now - timedelta(seconds=job.age_seconds)
        if job.attempt and self.book.attempts == job.attempt - 1:
            self.book.attempts, self.book.last_attempt_at = job.attempt, started  # fired, never recorded
        elif self.book.last_attempt_at is not None:
            started = self.book.last_attempt_at  # the attempt on record is this Job
        self.book.adopted, self.book.adopted_started = job.name, started

    # --- reads -------------------------------------------------------------------------------------------
    @property
    def live(self) -> bool:
        return law.is_live(self.phase)

    @property
    def terminal(self) -> bool:
        return law.is_terminal(self.phase)

    @property
    def power_on(self) -> bool:
        return self.observation.power == "on"

    @property
    def maybe_on(self) -> bool:
        """Observed on, or powered by this claim and never shown by its kubelet since (nor verified off)."""
        return self.power_on or (self.powered and not self.was_seen_on and not self.machine_off_verified)

    @property
    def hands_over(self) -> bool:
        return self.reason in HANDS_OVER

    @property
    def startup_running(self) -> bool:
        return bool(self.startup_job) and self.startup_job not in self.book.finished_jobs

    def law_input(self) -> law.Input:
        """The triple as this claim sees it (its own phase stands for the slot's live claim)."""
        return law.Input(
            claim_phase=self.phase,
            marked=self.marked,
            power=self.observation.power,
            usable=self.observation.usable,
        )

    def digest(self, *, workflow_done: bool = False) -> ClaimDigest:
        s = self.seed
        return ClaimDigest(
            name=s.name,
            slot=s.slot,
            group=s.group,
            phase=str(self.phase),
            attempt=s.attempt,
            call=s.call,
            reason=self.reason,
            marked=self.marked,
            requested_at=s.requested_at,
            deadline_at=self.deadline_at,
            finished_at=self.finished_at,
            machine_off=not self.maybe_on,
            workflow_done=workflow_done,
            ttl_seconds=s.ttl_seconds,
            hand_over=self.hands_over,
            powered=self.maybe_on and not self.power_on,
            startup_job=self.startup_job if self.startup_running else "",
            collected=self.resource_gone or self.collect_now,
            observation=self.observation if workflow_done else None,
            message=self.message if self.terminal else "",
        )

    # --- writes ------------------------------------------------------------------------------------------
    def take(self, observation: Observation) -> bool:
        """Keep an observation unless it is older than the one held; True when a decision input changed."""
        self.observation, changed = observation.replacing(self.observation)
        if self.power_on:
            self.was_seen_on = True
            self.machine_off_verified = False
        return changed

    def mark(self, reason: str) -> bool:
        """A scale-down or a deletion; the first reason wins (it is the one the completion carries)."""
        if self.marked:
            return False
        self.marked, self.mark_reason, self.mark_phase = True, reason, str(self.phase)
        return True

    def set_condition(self, kind: ConditionType, status: bool, reason: str, message: str, now: datetime) -> bool:
        """Set a condition; its clock moves only when its status flips. True when anything changed."""
        old = self.conditions.get(kind)
        if old is not None and old.status == status and old.reason == reason and old.message == message:
            return False
        since = old.since if old is not None and old.status == status else now
        self.conditions[kind] = Condition(status, reason, message, since)
        return True

    def status_document(self) -> dict[str, Any]:
        """NodeClaim.status as the API stores it: the projection the workflow writes after every move."""
        doc: dict[str, Any] = {
            "phase": str(self.phase),
            "reason": self.reason or None,
            "message": self.message or None,
            "attempt": self.seed.attempt,
            "shutdownAttempts": self.book.attempts,
            "lastShutdownAttemptAt": _ts(self.book.last_attempt_at),
            "finishedAt": _ts(self.finished_at),
            "conditions": [
                {
                    "type": str(kind),
                    "status": "True" if c.status else "False",
                    "reason": c.reason,
                    "message": c.message,
                    "lastTransitionTime": _ts(c.since),
                }
                for kind, c in sorted(self.conditions.items(), key=lambda kc: (kc[1].since, kc[0]))
            ],
        }
        return doc

    def edited_fields(self, stored: dict[str, Any]) -> list[str]:
        """The fields of a stored status (as a person left it) that differ from this record."""
        truth = self.status_document()
        return [name for name in OWNED_CLAIM_STATUS if stored.get(name) != truth.get(name)]

    def carried(self) -> ClaimState:
        """The state handed to the next run: the handled-job log is kept small."""
        return replace(self, continued=self.continued + 1, liveness_reads=0)


def _ts(when: datetime | None) -> str | None:
    if when is None:
        return None
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")
