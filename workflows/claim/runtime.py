"""The claim workflow's verbs: activity calls with chosen policies, the one chokepoint for moves, bounded waits.

The steps (launch, boot, liveness, reversal) are written in these verbs only, so each reads as the behaviour
it implements.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey

from api import contracts as c
from api.names import ClaimPhase, ClaimReason, ConditionType, EventReason, Failure
from domain import claims
from workflows import metrics
from workflows.claim.state import ClaimState
from workflows.handles import signal_group
from workflows.patches import Patch
from workflows.shutdown import ShutdownBook
from workflows.verbs import Broken, SlotVerbs

KEY_GROUP = SearchAttributeKey.for_keyword(c.SA_GROUP)
KEY_SLOT = SearchAttributeKey.for_keyword(c.SA_SLOT)
KEY_PHASE = SearchAttributeKey.for_keyword(c.SA_PHASE)
KEY_REASON = SearchAttributeKey.for_keyword(c.SA_REASON)
KEY_ATTEMPT = SearchAttributeKey.for_int(c.SA_ATTEMPT)

MOVE_EVENTS: dict[ClaimPhase, EventReason] = {
    ClaimPhase.PENDING: EventReason.CLAIM_CREATED,
    ClaimPhase.BOOTING: EventReason.CLAIM_BOOTING,
    ClaimPhase.READY: EventReason.CLAIM_READY,
    ClaimPhase.FAILED: EventReason.CLAIM_FAILED,
    ClaimPhase.COMPLETED: EventReason.CLAIM_COMPLETED,
}

# What a write no retry can fix means for the claim: the reason it fails with, named after the cause.
FAILURE_REASONS: dict[Failure, ClaimReason] = {
    Failure.SLOT_DELETED: ClaimReason.SLOT_DELETED,
    Failure.INVALID_POD_SPEC: ClaimReason.INVALID_POD_SPEC,
    Failure.NOT_FOUND: ClaimReason.OPERATOR_ERROR,
    Failure.INVALID: ClaimReason.OPERATOR_ERROR,
    Failure.JOB_REFUSED: ClaimReason.JOB_REFUSED,
    Failure.CLAIM_REFUSED: ClaimReason.CLAIM_REFUSED,
}


@dataclass(frozen=True)
class Said:
    """The Event a projection is followed by, once it landed (none without a reason)."""

    event: EventReason | None
    message: str = ""
    warning: bool = False
    last_words_of: str = ""  # a failed Job whose Pod's words the recording activity adds
    fact: str = ""  # what it says, when more than one run may say it: a repeat of the fact is no Event


def failure_reason(kind: str) -> ClaimReason:
    """The claim reason of a `Broken` write (an error type we do not know is the operator's own fault)."""
    try:
        return FAILURE_REASONS[Failure(kind)]
    except ValueError:
        return ClaimReason.OPERATOR_ERROR


class ClaimRuntime(SlotVerbs):
    """Claim state plus verbs; `Claim` adds the handlers and the order of the steps."""

    s: ClaimState
    _telling: asyncio.Task[None] | None = None  # the last signal to the group, in flight beside the next steps
    _recording: asyncio.Lock | None = None  # held by the projection being recorded: one at a time

    def slot_ref(self) -> c.SlotRef:
        return c.SlotRef(self.s.seed.namespace, self.s.seed.slot)

    def claim_ref(self) -> c.ClaimRef:
        return c.ClaimRef(self.s.seed.namespace, self.s.seed.name)

    def take(self, observation: c.Observation) -> bool:
        return self.s.take(observation)

    def deadline(self) -> datetime | None:
        """The boot deadline: it ends waits in pending and booting only (cleared by the move to ready)."""
        return self.s.deadline_at

    def details(self, text: str) -> None:
        workflow.set_current_details(f"**{self.s.seed.name}** ({self.s.phase}): {text}")

    async def write(self, name: str, arg: Any, summary: str) -> Any:
        """A write; a claim resource found gone means someone deleted the claim: a scale-down by hand."""
        try:
            return await super().write(name, arg, summary)
        except Broken as err:
            self._gone_or_raise(name, err)
            return None

    async def buy(self, name: str, arg: Any, summary: str, **kw: Any) -> bool:
        try:
            return await super().buy(name, arg, summary, **kw)
        except Broken as err:
            self._gone_or_raise(name, err)
            return False

    def _gone_or_raise(self, name: str, err: Broken) -> None:
        if err.kind != Failure.NOT_FOUND or name not in CLAIM_WRITES:
            raise err
        self.s.resource_gone = True
        self.s.mark(ClaimReason.DELETED_BY_HAND)

    # --- the one chokepoint for moves --------------------------------------------------------------------
    async def move(
        self, target: ClaimPhase, reason: str = "", message: str = "", warning: bool = False, last_words_of: str = ""
    ) -> None:
        """Check the move against the legal-moves table, tell the group, then project it onto the resource.

        The group is told in the same workflow task (a signal always lands), so the target size and the slot
        follow the claim at once even while the API server refuses the projection. A terminal move is the
        claim's last word: its digest is final and the projection releases the finalizer. `last_words_of` names a
        failed Job whose Pod's words the recording activity adds to the status message and the Event.
        """
        s = self.s
        s.phase = claims.move(s.phase, target)
        now = self.now()
        if reason:
            s.reason = reason
        s.message = message
        if target is ClaimPhase.BOOTING:
            s.set_condition(ConditionType.MACHINE_COMMITTED, True, "StartupJobCreated", message, now)
        if target is ClaimPhase.READY:
            s.deadline_at = None
            s.set_condition(ConditionType.READY, True, reason or "ReadinessGatePassed", message, now)
        terminal = target in (ClaimPhase.FAILED, ClaimPhase.COMPLETED)
        if terminal:
            s.finished_at = now
            # A failed claim says so in the conventional condition, Ready=False with its reason and message, whether
            # or not it was ever ready.
            if ConditionType.READY not in s.conditions and target is ClaimPhase.FAILED:
                workflow.deprecate_patch(Patch.FAILED_NOT_READY)
            if ConditionType.READY in s.conditions or target is ClaimPhase.FAILED:
                s.set_condition(ConditionType.READY, False, reason or str(target), message, now)
        self.search_attributes()
        metrics.claim_moved(s.seed.namespace, s.seed.group, str(target), s.reason)
        if target is ClaimPhase.READY:
            metrics.claim_ready_after(s.seed.namespace, s.seed.group, now - s.seed.requested_at)
        event = MOVE_EVENTS[target]
        if target is ClaimPhase.FAILED and reason == ClaimReason.SUPERSEDED:
            event = EventReason.CLAIM_SUPERSEDED
        await self.notify_group(final=terminal)
        spec = {"deadlineAt": None} if target is ClaimPhase.READY else None
        job = s.startup_job
        if target is ClaimPhase.COMPLETED:  # it cites the shutdown Job that ended the episode (none if none was fired)
            workflow.deprecate_patch(Patch.COMPLETION_CITES_ITS_JOB)
            job = s.book.last_job
        await self.project(
            event,
            claims.move_message(target, s.reason, message, s.seed, job, s.deadline_at, now),
            warning=warning,
            spec=spec,
            release_finalizer=terminal and s.finalizer,
            last_words_of=last_words_of,
        )

    async def project(
        self,
        event: EventReason | None = None,
        message: str = "",
        *,
        warning: bool = False,
        spec: dict[str, Any] | None = None,
        summary: str = "",
        release_finalizer: bool = False,
        last_words_of: str = "",
        fact: str = "",
        identity: c.ClaimIdentity | None = None,
    ) -> None:
        """Write the claim's status (and an Event after it landed); nothing when the resource is gone.

        One projection at a time, each the whole state as it is when its turn comes, numbered above every revision
        the resource held: the record only moves forward, and the write lands or fails, never passes for landed. A
        projection the API server refuses for good is logged and left: the workflow is the claim's authority, and
        the next move projects the whole state again.
        """
        said = Said(event, message, warning, last_words_of, fact)
        workflow.deprecate_patch(Patch.SERIAL_RECORDS)
        if self._recording is None:
            self._recording = asyncio.Lock()
        async with self._recording:
            await self._record(said, spec, summary, release_finalizer, identity)

    async def _record(
        self,
        said: Said,
        spec: dict[str, Any] | None,
        summary: str,
        release_finalizer: bool,
        identity: c.ClaimIdentity | None,
    ) -> None:
        s = self.s
        if s.resource_gone:
            return
        seed = s.seed
        s.revision += 1
        try:
            landed = await self.write(
                c.Act.RECORD_CLAIM,
                c.StatusWrite(
                    namespace=seed.namespace,
                    name=seed.name,
                    status=s.status_document(),
                    spec=spec,
                    event_reason=str(said.event) if said.event else "",
                    event_message=said.message,
                    warning=said.warning,
                    release_finalizer=release_finalizer,
                    revision=s.revision,
                    above_held=True,
                    last_words_of=said.last_words_of,
                    event_fact=said.fact,
                    identity=identity,
                ),
                summary or f"record {s.phase} on claim {seed.name}",
            )
        except Broken as err:
            workflow.logger.error("claim %s: its status could not be recorded: %s", seed.name, err.message)
            return
        if isinstance(landed, int) and landed > s.revision:
            s.revision = landed  # another run's revision was on the resource: this one went above it
        if release_finalizer:
            s.finalizer = False

    def search_attributes(self) -> None:
        s = self.s
        workflow.upsert_search_attributes(
            [
                KEY_GROUP.value_set(s.seed.group),
                KEY_SLOT.value_set(s.seed.slot),
                KEY_PHASE.value_set(str(s.phase)),
                KEY_REASON.value_set(s.reason or "-"),
                KEY_ATTEMPT.value_set(s.seed.attempt),
            ]
        )

    async def notify_group(self, *, final: bool = False) -> None:
        """Tell the group what this claim is now (its target size, slot choice and collection read it).

        The word goes out in the workflow task that goes on to the projection, not awaited there: a live move's by a
        local call, the end's as a signal command (sent only once that task is committed). Words still leave in
        order (each after the one before it), and the run waits for them all before it closes (`settled`).
        """
        if self.s.seed.refused_reason:
            return  # no group takes this claim: it is not one of any group's
        digest = self.s.digest(workflow_done=final)
        workflow.deprecate_patch(Patch.TELL_BESIDE)
        # Sent by the worker (a local activity) rather than as a command: the server's acknowledgement of a
        # command woke the claim for a workflow task of its own, one per move.
        by_call = workflow.patched(Patch.TELL_BY_CALL)
        if by_call and final and workflow.patched(Patch.END_TOLD_ONCE_COMMITTED):
            # Not the end, though. A local call runs before the task that made the move is committed, and runs again
            # if that task is lost (a worker killed): on an end the group frees the slot and may book a release, while
            # the task, run again on newer inputs, can go another way. A signal command leaves once the task is
            # committed, once. A live move told early is harmless: the group frees nothing on it, and hears the next.
            by_call = False
        self._telling = asyncio.create_task(self._tell(digest, after=self._telling, by_call=by_call))

    async def _tell(
        self, digest: c.ClaimDigest, after: asyncio.Task[None] | None = None, *, by_call: bool = False
    ) -> None:
        if after is not None:
            await after
        seed = self.s.seed
        try:
            if by_call:
                tell = c.GroupTell(seed.namespace, seed.group, digest)
                await self.write(c.Act.TELL_GROUP, tell, f"tell group {seed.group}: {digest.phase}")
            else:
                await signal_group(seed.namespace, seed.group, c.GroupSignal.CLAIM_CHANGED, digest)
        except Exception as err:
            workflow.logger.warning("could not tell group %s: %s", seed.group, err)

    def settled(self) -> bool:
        """No handler still running and every signal to the group landed (or failed, which is logged): the run
        may close or continue as new. One condition, checked with nothing awaited after it: a handler that
        started while the run waited for a signal would otherwise be cut off, its own signal with it."""
        return workflow.all_handlers_finished() and (self._telling is None or self._telling.done())

    # --- what the shutdown driver needs (ShutdownHost) ----------------------------------------------------
    @property
    def book(self) -> ShutdownBook:
        return self.s.book

    def power_on(self) -> bool:
        return self.s.power_on

    def maybe_on(self) -> bool:
        return self.s.maybe_on

    def seen_on(self) -> bool:
        return self.s.was_seen_on

    def off_unseen(self) -> None:
        self.s.machine_off_verified = True

    def interrupted(self) -> bool:
        return bool(self.s.abandoned)

    def job_owner(self) -> str:
        return self.s.seed.name

    def claim_name(self) -> str:
        """The owner of its shutdown Jobs: the claim, or the slot alone once the claim resource is gone."""
        return "" if self.s.resource_gone else self.s.seed.name

    async def on_attempt(self, job: str, started: str = "", fact: str = "") -> None:
        summary = f"record shutdown attempt {self.s.book.attempts} ({job}) on claim {self.s.seed.name}"
        await self.project(EventReason.SCALE_DOWN_STARTED if started else None, started, summary=summary, fact=fact)

    async def on_event(
        self, reason: EventReason, message: str, warning: bool, last_words_of: str = "", fact: str = ""
    ) -> None:
        summary = f"record {reason} on claim {self.s.seed.name}"
        await self.project(reason, message, warning=warning, summary=summary, last_words_of=last_words_of, fact=fact)


# Writes that need the claim resource: NotFound there means the claim was deleted (its finalizer removed by hand,
# or it was deleted while pending, before it had one). A startup Job needs its claim as owner, so it is one.
CLAIM_WRITES = frozenset(
    {c.Act.ADD_FINALIZER, c.Act.RECORD_CLAIM, c.Act.RELEASE_CLAIM, c.Act.DELETE_CLAIM, c.Act.CREATE_JOB}
)
