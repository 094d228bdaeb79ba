"""The claim: one attempt, from pending to its terminal phase, where its workflow closes.

The run is the phases in order (launch, boot, serve, then reverse); the handlers only record inputs. Every move
goes through `ClaimRuntime.move`, which checks the legal-moves table, tells the group and projects the claim's
status, so the resource, the search attributes and the group's view never disagree.

Every run ends in a legal terminal phase, whatever an activity raises: a write no retry can fix (`Broken`)
fails the claim with a reason naming its cause. The workflow then closes, Completed for `completed` and Failed
(the claim's reason as the failure type) for `failed`, so Temporal's own list shows outcomes; what is left to
do for the machine (law 3) and the resource (collection after its TTL) is the group's.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from api import contracts as c
from api.names import ClaimPhase, ClaimReason, ConditionType, EventReason
from workflows.claim.boot import boot
from workflows.claim.launch import launch
from workflows.claim.liveness import serve
from workflows.claim.release import reverse
from workflows.claim.runtime import ClaimRuntime, failure_reason
from workflows.claim.state import ClaimState
from workflows.patches import Patch
from workflows.verbs import Broken, Deadline


def failed_close(said: str, namespace: str, claim: str, job: str) -> str:
    """The Failed close's message: the reason and message, then, for a failed Job, where its Pod's last words are
    (they are kept out of the history: a script's output may hold its secrets)."""
    if not job:
        return said
    return (
        f"{said}. The Pod's last words (its termination message, kept out of this history: it may hold secrets) are "
        f"the claim's status.message: kubectl -n {namespace} describe nodeclaim {claim}; its whole output: "
        f"kubectl -n {namespace} logs job/{job}"
    )


class Claim(ClaimRuntime):
    def __init__(self, seed: c.ClaimSeed, carried: ClaimState | None = None) -> None:
        self.s = carried if carried is not None else ClaimState.from_seed(seed)

    async def run(self, seed: c.ClaimSeed, carried: ClaimState | None = None) -> c.ClaimDigest:
        s = self.s
        if carried is None:
            await self._begin()
        try:
            while s.live and not s.abandoned:  # each pass moves the claim on, or hands over to the next step
                if await self._lifecycle():
                    await workflow.wait_condition(self.settled)
                    workflow.continue_as_new(args=[seed, s.carried()])
        except Deadline:
            await self._fail(
                ClaimReason.DEADLINE_EXCEEDED, f"not ready by the deadline {s.deadline_at:%Y-%m-%d %H:%M:%S}Z"
            )
        except Broken as err:
            await self._fail(failure_reason(err.kind), err.message)
        if s.live and s.abandoned:
            await self.move(ClaimPhase.FAILED, s.abandoned, s.abandoned_message)
        await workflow.wait_condition(self.settled)
        self.details(f"{s.phase} ({s.reason or 'no reason'})")
        if s.phase == ClaimPhase.FAILED:
            # The reason leads the message: the Web UI shows the message first, the failure type further down. It
            # says where a failed Job's last words are, and it is an expected outcome (benign: the data converter
            # leaves out its stack trace, which the Web UI would show as a crash).
            said = f"{s.reason}: {s.message}" if s.message else s.reason
            workflow.deprecate_patch(Patch.FAILED_CLOSE_SAYS_WHERE)
            raise ApplicationError(
                failed_close(said, s.seed.namespace, s.seed.name, s.failed_job),
                type=s.reason,
                non_retryable=True,
                category=ApplicationErrorCategory.BENIGN,
            )
        return s.digest(workflow_done=True)

    async def _lifecycle(self) -> bool:
        """The phases in order; True when a ready claim should continue as new (its history grew long)."""
        s = self.s
        if s.phase == ClaimPhase.PENDING:
            await launch(self)
        if s.phase == ClaimPhase.BOOTING and not s.abandoned:
            await boot(self)
        if s.phase == ClaimPhase.READY and not s.marked and not s.abandoned and await serve(self):
            return True
        if s.live and s.marked and not s.abandoned:
            await reverse(self)
        return False

    async def _fail(self, reason: str, message: str) -> None:
        """The claim ends failed (a live one only: a claim that already ended keeps its ending)."""
        if self.s.live:
            await self.move(ClaimPhase.FAILED, reason, message, True)

    async def _begin(self) -> None:
        s = self.s
        seed = s.seed
        self.search_attributes()
        self.details("created")
        if seed.refused_reason:
            # No group can take it (its slot or group does not exist): it ends here, and nothing else is touched. A
            # finalizer a lost run left on it is let go with the failure (none there: nothing is written for it).
            s.finalizer = True
            await self.move(ClaimPhase.FAILED, seed.refused_reason, seed.refused_message, warning=True)
            return
        if seed.create_resource:
            # A claim the group creates carries its finalizer from its first write, so it needs no separate
            # finalizer write before its startup Job; a claim taken over or adopted still adds it.
            workflow.deprecate_patch(Patch.CREATED_HELD)
            try:
                await self.write(c.Act.CREATE_CLAIM_HELD, seed, f"create claim {seed.name}")
            except Broken as err:  # the API server refuses the claim itself: nothing can be recorded on it
                s.resource_gone = True
                s.abandoned, s.abandoned_message = ClaimReason.CLAIM_REFUSED, err.message
                return
            s.finalizer = True
        else:
            # A run that takes a claim over adopts it whole: the lost run's Jobs (a running startup Job monitored to
            # its end, a running shutdown Job awaited and counted once), and what every live claim carries (its
            # slot's and group's labels, the slot as owner, spec.deadlineAt), written with the take-over's record.
            workflow.deprecate_patch(Patch.TAKEN_OVER_WHOLE)
            if seed.record is not None:
                s.adopt(seed.record, self.now())
            identity = c.ClaimIdentity(seed.slot, seed.group, s.deadline_at)
            await self.project(*self._taken_over(), summary=f"take over claim {seed.name}", identity=identity)
        if s.phase in (ClaimPhase.BOOTING, ClaimPhase.READY) and not s.resource_gone and not s.finalizer:
            # Already committed to a machine (adopted, or taken over mid-boot): the finalizer holds the claim until
            # that machine is verified off, as a boot's would.
            await self.write(c.Act.ADD_FINALIZER, self.claim_ref(), f"add the finalizer to claim {seed.name}")
            s.finalizer = not s.resource_gone

    def _taken_over(self) -> tuple[EventReason, str]:
        """The Event of a run started from a resource: a claim applied by hand is created now; one whose workflow
        was lost goes on from the record its resource holds."""
        seed = self.s.seed
        if seed.record is None:
            return EventReason.CLAIM_CREATED, f"attempt {seed.attempt} for slot {seed.slot} ({seed.call})"
        return EventReason.CLAIM_TAKEN_OVER, (
            f"its workflow was lost; a new run goes on from its record ({seed.phase}, revision "
            f"{seed.record.revision}, attempt {seed.attempt})"
        )

    # --- handlers: they record inputs, the run decides -------------------------------------------------
    def observe(self, observation: c.Observation) -> None:
        self.s.take(observation)

    def job_finished(self, finished: c.JobFinished) -> None:
        self.s.book.finish(finished)

    async def mark_for_deletion(self, request: c.MarkRequest) -> None:
        """A scale-down or a deletion; the first reason wins (it is the one the completion carries)."""
        s = self.s
        if s.terminal or not s.mark(request.reason):
            return
        s.set_condition(
            ConditionType.MARKED_FOR_DELETION, True, request.reason, "the machine will be shut down", self.now()
        )
        # The group hears it (a mark that did not come through it, such as a deletion, leaves its target now),
        # then the resource shows it, so the slot report sees a scale-down without asking the workflow.
        await self.notify_group()
        await self.project(summary=f"record the mark ({request.reason}) on claim {s.seed.name}")

    def superseded(self, by: str) -> None:
        """A newer live claim owns the slot: this one fails without touching the machine it hands over."""
        self._abandon(ClaimReason.SUPERSEDED, f"superseded by claim {by}")

    def slot_deleted(self) -> None:
        """The slot is gone: nothing can be started or stopped through it any more."""
        self._abandon(ClaimReason.SLOT_DELETED, f"slot {self.s.seed.slot} was deleted")

    def _abandon(self, reason: str, message: str) -> None:
        if not self.s.abandoned and self.s.live:
            self.s.abandoned, self.s.abandoned_message = reason, message

    async def reset_shutdown_streak(self) -> int:
        """The operator's escape hatch: the spent streak restarts now, not after the grace. Returns the old count."""
        before = self.s.book.attempts
        self.s.book.reset()
        await self.project()
        return before

    async def status_edited(self, edit: c.StatusEdit) -> None:
        """A person edited the claim's status (the watchers saw it land). Setting `shutdownAttempts` to 0 is the
        seed's way to reset a spent shutdown streak: an input, acted on as the reset Update is. Any other edit of
        what the claim records is overwritten with the record, and a Warning Event says which fields.
        """
        s = self.s
        if s.terminal:
            return
        edited = s.edited_fields(edit.status)
        before = s.book.attempts
        reset = "shutdownAttempts" in edited and not edit.status.get("shutdownAttempts")
        if reset:
            s.book.reset()
            edited = s.edited_fields(edit.status)
        if not edited and not reset:
            return
        streak = f"the shutdown streak was reset by hand (it stood at {before})"
        if not edited:
            await self.project(EventReason.SHUTDOWN_STREAK_RESET, streak, summary=f"record the reset on {s.seed.name}")
            return
        fields = ", ".join(f"status.{name}" for name in edited)
        message = f"{fields} edited by hand (on revision {edit.revision}); overwritten with the claim's record"
        await self.project(
            EventReason.STATUS_OVERWRITTEN,
            f"{message}; {streak}" if reset else message,
            warning=True,
            summary=f"overwrite a hand edit of claim {s.seed.name}",
        )

    def status(self) -> dict[str, Any]:
        s = self.s
        doc = s.status_document()
        doc.update(
            name=s.seed.name,
            slot=s.seed.slot,
            group=s.seed.group,
            call=s.seed.call,
            marked=s.marked,
            markReason=s.mark_reason or None,
            markPhase=s.mark_phase or None,
            abandoned=s.abandoned_message or None,
            deadlineAt=None if s.deadline_at is None else s.deadline_at.isoformat(),
            startupJob=s.startup_job or None,
            powered=s.powered,
            observation={
                "power": s.observation.power,
                "usable": s.observation.usable,
                "exists": s.observation.exists,
            },
        )
        return doc

    def digest(self) -> c.ClaimDigest:
        return self.s.digest()
