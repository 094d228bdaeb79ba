"""The claim workflow's verbs: activity calls with chosen policies, the one chokepoint for moves, bounded waits.

The steps (launch, boot, liveness, shutdown, collection) are written in these verbs only, so each reads as the
behaviour it implements.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey

from api import contracts as c
from api.names import ClaimPhase, ClaimReason, ConditionType, EventReason
from domain import claims
from workflows import metrics
from workflows.legacy.v2.claim_state import ClaimState
from workflows.legacy.v2.shutdown import ShutdownBook
from workflows.legacy.v2.verbs import SlotVerbs

KEY_GROUP = SearchAttributeKey.for_keyword(c.SA_GROUP)
KEY_SLOT = SearchAttributeKey.for_keyword(c.SA_SLOT)
KEY_PHASE = SearchAttributeKey.for_keyword(c.SA_PHASE)
KEY_REASON = SearchAttributeKey.for_keyword(c.SA_REASON)
KEY_ATTEMPT = SearchAttributeKey.for_int(c.SA_ATTEMPT)

MOVE_EVENTS: dict[str, EventReason] = {
    ClaimPhase.BOOTING: EventReason.CLAIM_BOOTING,
    ClaimPhase.READY: EventReason.CLAIM_READY,
    ClaimPhase.FAILED: EventReason.CLAIM_FAILED,
    ClaimPhase.COMPLETED: EventReason.CLAIM_COMPLETED,
}


class ClaimRuntime(SlotVerbs):
    """Claim state plus verbs; `NodeClaimWorkflow` adds the handlers and the order of the steps."""

    s: ClaimState

    def slot_ref(self) -> c.SlotRef:
        return c.SlotRef(self.s.seed.namespace, self.s.seed.slot)

    def take(self, observation: c.Observation) -> bool:
        return self.s.take(observation)

    def deadline(self) -> datetime | None:
        """The boot deadline: it ends waits in pending and booting only (cleared by the move to ready)."""
        return self.s.deadline_at

    def details(self, text: str) -> None:
        workflow.set_current_details(f"**{self.s.seed.name}** ({self.s.phase}): {text}")

    # --- the one chokepoint for moves --------------------------------------------------------------------
    async def move(self, target: ClaimPhase, reason: str = "", message: str = "", warning: bool = False) -> None:
        """Check the move against the legal-moves table, then project it, then tell the group."""
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
        if target in (ClaimPhase.FAILED, ClaimPhase.COMPLETED):
            s.finished_at = now
            if ConditionType.READY in s.conditions:
                s.set_condition(ConditionType.READY, False, reason or str(target), message, now)
        self.search_attributes()
        metrics.claim_moved(s.seed.namespace, s.seed.group, str(target), s.reason)
        if target is ClaimPhase.READY:
            metrics.claim_ready_after(s.seed.namespace, s.seed.group, now - s.seed.requested_at)
        event = MOVE_EVENTS.get(target, EventReason.CLAIM_CREATED)
        if target is ClaimPhase.FAILED and reason == ClaimReason.SUPERSEDED:
            event = EventReason.CLAIM_SUPERSEDED
        spec = {"deadlineAt": None} if target is ClaimPhase.READY else None
        await self.project(event, message or f"{target} {reason}".strip(), warning=warning, spec=spec)
        await self.notify_group()

    async def project(
        self,
        event: EventReason | None = None,
        message: str = "",
        *,
        warning: bool = False,
        spec: dict[str, Any] | None = None,
        summary: str = "",
    ) -> None:
        """Write the claim's status (and an Event after it landed); nothing when the resource is gone."""
        if self.s.resource_gone:
            return
        seed = self.s.seed
        await self.write(
            c.Act.RECORD_CLAIM,
            c.StatusWrite(
                namespace=seed.namespace,
                name=seed.name,
                status=self.s.status_document(),
                spec=spec,
                event_reason=str(event) if event else "",
                event_message=message,
                warning=warning,
            ),
            summary or f"record {self.s.phase} on claim {seed.name}",
        )

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

    async def notify_group(self, *, workflow_done: bool = False) -> None:
        """Tell the group what this claim is now (its target size and slot choice read it)."""
        group_id = c.group_workflow_id(self.s.seed.namespace, self.s.seed.group)
        handle = workflow.get_external_workflow_handle(group_id)
        try:
            await handle.signal(c.GroupSignal.CLAIM_CHANGED, self.s.digest(workflow_done=workflow_done))
        except Exception as err:
            workflow.logger.warning("could not tell group %s: %s", group_id, err)

    # --- what the shutdown driver needs (ShutdownHost) ----------------------------------------------------------------
    @property
    def book(self) -> ShutdownBook:
        return self.s.book

    def power_on(self) -> bool:
        return self.s.power_on

    def interrupted(self) -> bool:
        return bool(self.s.abandoned)

    def job_owner(self) -> str:
        return self.s.seed.name

    def claim_name(self) -> str:
        return self.s.seed.name

    async def on_attempt(self, job: str) -> None:
        await self.project(
            summary=f"record shutdown attempt {self.s.book.attempts} ({job}) on claim {self.s.seed.name}"
        )

    async def on_event(self, reason: EventReason, message: str, warning: bool) -> None:
        await self.project(reason, message, warning=warning, summary=f"record {reason} on claim {self.s.seed.name}")
