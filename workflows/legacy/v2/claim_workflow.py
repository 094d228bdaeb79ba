"""NodeClaimWorkflow: one claim, one attempt, from pending to collected.

The run is the phases in order (launch, boot, serve, then reverse or drain, then collect); the handlers only
record inputs. Every move goes through `ClaimRuntime.move`, which checks the legal-moves table and projects the
claim's status, so the resource, the search attributes and the group's view never disagree.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

from api import contracts as c
from api.names import ClaimPhase, ClaimReason, ConditionType, EventReason
from workflows.legacy.v2.claim_boot import boot
from workflows.legacy.v2.claim_collection import collect
from workflows.legacy.v2.claim_launch import launch
from workflows.legacy.v2.claim_liveness import serve
from workflows.legacy.v2.claim_release import drain, reverse
from workflows.legacy.v2.claim_runtime import ClaimRuntime
from workflows.legacy.v2.claim_state import ClaimState
from workflows.legacy.v2.verbs import Deadline


class LegacyClaim(ClaimRuntime):
    def __init__(self, seed: c.ClaimSeed, carried: ClaimState | None = None) -> None:
        self.s = carried if carried is not None else ClaimState.from_seed(seed)

    async def run(self, seed: c.ClaimSeed, carried: ClaimState | None = None) -> c.ClaimDigest:
        s = self.s
        if carried is None:
            await self._begin()
        try:
            if s.phase == ClaimPhase.PENDING:
                await launch(self)
            if s.phase == ClaimPhase.BOOTING and not s.abandoned:
                await boot(self)
            if s.phase == ClaimPhase.READY and not s.marked and not s.abandoned and await serve(self):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(args=[seed, s.carried()])
        except Deadline:
            await self.move(
                ClaimPhase.FAILED,
                ClaimReason.DEADLINE_EXCEEDED,
                f"not ready by the deadline {s.deadline_at:%Y-%m-%d %H:%M:%S}Z",
                True,
            )
        if s.live and s.abandoned:
            await self.move(ClaimPhase.FAILED, s.abandoned, s.abandoned_message)
        if s.live and s.marked:
            await reverse(self)
        if s.terminal and not s.resource_gone:
            if not s.abandoned:
                await drain(self)
            await collect(self)
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self.notify_group(workflow_done=True)
        return s.digest(workflow_done=True)

    async def _begin(self) -> None:
        s = self.s
        seed = s.seed
        self.search_attributes()
        if seed.create_resource:
            await self.write(c.Act.CREATE_CLAIM, seed, f"create claim {seed.name}")
        self.details("created")
        await self.project(
            EventReason.CLAIM_CREATED,
            f"attempt {seed.attempt} for slot {seed.slot} ({seed.call})",
        )
        await self.notify_group()

    # --- handlers: they record inputs, the run decides -------------------------------------------------
    def observe(self, observation: c.Observation) -> None:
        self.s.take(observation)

    def job_finished(self, finished: c.JobFinished) -> None:
        self.s.book.finished_jobs[finished.job] = finished.succeeded

    async def mark_for_deletion(self, request: c.MarkRequest) -> None:
        """A scale-down or a deletion; the first reason wins (it is the one the completion carries).

        On a claim that already ended, a deletion (kubectl delete, the slot's garbage collection) means: collect
        now, do not wait for the TTL.
        """
        if self.s.terminal:
            self.s.collect_now = True
            return
        if self.s.marked:
            return
        self.s.marked = True
        self.s.mark_reason = request.reason
        self.s.set_condition(
            ConditionType.MARKED_FOR_DELETION, True, request.reason, "the machine will be shut down", self.now()
        )
        # The mark on the resource, so the slot report sees a scale-down without asking the workflow.
        if workflow.patched("project-the-mark"):
            await self.project(summary=f"record the mark ({request.reason}) on claim {self.s.seed.name}")

    def superseded(self, by: str) -> None:
        """A newer live claim owns the slot: this one fails without touching the machine it hands over."""
        self._abandon(ClaimReason.SUPERSEDED, f"superseded by claim {by}")

    def slot_deleted(self) -> None:
        """The slot is gone: nothing can be started or stopped through it any more."""
        self._abandon(ClaimReason.SLOT_DELETED, f"slot {self.s.seed.slot} was deleted")

    def _abandon(self, reason: str, message: str) -> None:
        if not self.s.abandoned:
            self.s.abandoned, self.s.abandoned_message = reason, message

    async def reset_shutdown_streak(self) -> int:
        """The operator's escape hatch: the spent streak restarts now, not after the grace. Returns the old count."""
        before = self.s.book.attempts
        self.s.book.reset()
        await self.project()
        return before

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
            abandoned=s.abandoned_message or None,
            deadlineAt=None if s.deadline_at is None else s.deadline_at.isoformat(),
            observation={
                "power": s.observation.power,
                "usable": s.observation.usable,
                "exists": s.observation.exists,
            },
        )
        return doc

    def digest(self) -> c.ClaimDigest:
        return self.s.digest()
