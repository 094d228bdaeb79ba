"""GroupWorkflow: the single authority on a group's size, and the router of what its slots show.

cluster-autoscaler's writes arrive as Updates with validators (a refused call records nothing), its reads as
Queries, so what it reads right after a write is exactly what it wrote. Each claim runs as a child
NodeClaimWorkflow that outlives the group's run (ABANDON); each law-3 release as a child ReleaseWorkflow.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError

from api import contracts as c
from api.names import ClaimCall, ClaimPhase, ClaimReason
from domain import claims, law
from domain.timings import TIMINGS
from workflows import metrics
from workflows.legacy.v2.group_choice import choose
from workflows.legacy.v2.group_state import GroupState, SlotBook, new_slot
from workflows.legacy.v2.verbs import Verbs

# The truth read of the group's resources: watchers ask for a reload on every change; this bounds a lost one.
# How long a deleted group waits for its claims to release their machines before it ends.

KEY_GROUP = SearchAttributeKey.for_keyword(c.SA_GROUP)


def _refuse(kind: str, message: str) -> ApplicationError:
    return ApplicationError(message, type=kind, non_retryable=True)


class LegacyGroup(Verbs):
    def __init__(self, ref: c.GroupRef, carried: GroupState | None = None) -> None:
        self.ref = ref
        self.s = carried if carried is not None else GroupState(ref.namespace, ref.group)
        self.outbox: list[tuple[str, str]] = []  # (older claim, newer claim) to supersede

    async def run(self, ref: c.GroupRef, carried: GroupState | None = None) -> None:
        s = self.s
        s.updates = 0
        workflow.upsert_search_attributes([KEY_GROUP.value_set(ref.group)])
        if not s.loaded:
            await self.reload()
        while True:
            self.details(f"{s.target_size()} claims wanted of max {s.max_size}; watching {len(s.slots)} slots")
            woke = await self.wait(
                lambda: s.reload_requested or bool(s.inbox) or bool(self.outbox) or self.should_continue(),
                TIMINGS.reload_interval,
                "periodic reload of the group",
            )
            if not woke or s.reload_requested:
                s.reload_requested = False
                await self.reload()
            await self.supersede_older()
            while s.inbox:
                await self.on_observation(s.inbox.pop(0))
            s.forget_failures(self.now())
            metrics.group_claims(s.namespace, s.name, s.phase_counts())
            if s.loaded and not s.exists:
                await self.wind_down()
                return
            if self.should_continue():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(args=[ref, s])

    def should_continue(self) -> bool:
        """Continue as new when Temporal suggests it, or well before the per-run Update limit."""
        return workflow.info().is_continue_as_new_suggested() or self.s.updates >= self.s.updates_per_run

    # --- reading the group from Kubernetes ---------------------------------------------------------------
    async def reload(self) -> None:
        s = self.s
        view = await self.read(c.Act.LOAD_GROUP, c.GroupRef(s.namespace, s.name), c.GroupView, "load the group")
        if view is None:
            return
        s.exists = view.exists
        if not view.exists:
            s.loaded = True
            return
        s.min_size, s.max_size, s.max_provision_seconds = view.min_size, view.max_size, view.max_provision_seconds
        if view.template is not None:
            s.template = view.template
        seen = set()
        for sv in view.slots:
            seen.add(sv.name)
            book = s.slots.get(sv.name)
            if book is None:
                book = s.slots[sv.name] = new_slot(s.namespace, sv)
            book.exists, book.node_name, book.activations = True, sv.node_name, sv.activations_last_24h
            book.provider_id = sv.provider_id or book.provider_id
            if book.last_outcome is None and sv.last_claim is not None:
                book.last_outcome = sv.last_claim
            if not sv.observation.older_than(book.observation):
                book.observation = sv.observation
        for name, book in s.slots.items():
            if name not in seen and book.exists:
                book.exists = False
                await self.slot_gone(book)
        for cv in view.claims:
            if cv.name not in s.claims and cv.slot in s.slots:
                await self.take_over(cv)
        s.loaded = True
        for book in s.slots.values():
            if book.exists and not book.live_claim and not book.draining_claim:
                s.inbox.append(c.SlotObservation(book.name, book.observation))

    async def slot_gone(self, book: SlotBook) -> None:
        """A deleted slot fails its claims (SlotDeleted); nothing can power its machine any more."""
        for name in {book.live_claim, book.draining_claim} - {""}:
            await self._signal(c.claim_workflow_id(self.s.namespace, name), c.ClaimSignal.SLOT_DELETED)

    async def take_over(self, cv: c.ClaimView) -> None:
        """A claim resource the group does not track: hand-applied, or left by a lost run. Run it."""
        s = self.s
        seed = c.ClaimSeed(
            namespace=s.namespace,
            name=cv.name,
            slot=cv.slot,
            group=s.name,
            call=cv.call or ClaimCall.MANUAL,
            attempt=max(cv.attempt, 1),
            requested_at=cv.requested_at or self.now(),
            deadline_at=cv.deadline_at,
            max_provision_seconds=s.max_provision_seconds,
            ttl_seconds=3600,
            phase=cv.phase or ClaimPhase.PENDING,
            reason=cv.reason,
            create_resource=False,
        )
        await self.start_claim(seed, marked=cv.marked)

    # --- claims ------------------------------------------------------------------------------------------
    def new_seed(self, book: SlotBook, call: str, phase: str = ClaimPhase.PENDING, reason: str = "") -> c.ClaimSeed:
        s = self.s
        now = self.now()
        group_max = timedelta(seconds=s.max_provision_seconds) if s.max_provision_seconds else None
        s.claim_counter += 1
        return c.ClaimSeed(
            namespace=s.namespace,
            name=f"{book.name}-{workflow.uuid4().hex[:6]}",
            slot=book.name,
            group=s.name,
            call=call,
            attempt=claims.seed_attempt(book.last_outcome) if phase == ClaimPhase.PENDING else 1,
            requested_at=now,
            deadline_at=claims.deadline_at(now, group_max) if phase == ClaimPhase.PENDING else None,
            max_provision_seconds=max(s.max_provision_seconds, claims.attempt_budget().total_seconds()),
            ttl_seconds=3600,
            phase=phase,
            reason=reason,
        )

    async def start_claim(self, seed: c.ClaimSeed, *, marked: bool = False) -> None:
        """Record the claim first (so the target and the slot choice see it at once), then start its workflow."""
        s = self.s
        s.remember(
            c.ClaimDigest(
                name=seed.name,
                slot=seed.slot,
                group=seed.group,
                phase=seed.phase,
                attempt=seed.attempt,
                call=seed.call,
                reason=seed.reason,
                marked=marked,
                requested_at=seed.requested_at,
                deadline_at=seed.deadline_at,
            )
        )
        self.check_one_live_claim(seed.slot, seed.name)
        wid = c.claim_workflow_id(seed.namespace, seed.name)
        try:
            await workflow.start_child_workflow(
                c.WorkflowName.CLAIM,
                args=[seed, None],
                id=wid,
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                static_summary=f"claim {seed.name} for slot {seed.slot} in group {seed.group}, attempt {seed.attempt}",
            )
        except WorkflowAlreadyStartedError:
            return
        if marked:
            await self._signal(wid, c.ClaimSignal.MARK_FOR_DELETION, c.MarkRequest(ClaimReason.DELETED_BY_HAND))

    def check_one_live_claim(self, slot_name: str, claim: str) -> None:
        """The newest live claim owns the slot; every older live one is superseded."""
        live = [
            d for d in self.s.claims.values() if d.slot == slot_name and law.is_live(d.phase) and not d.workflow_done
        ]
        if len(live) < 2:
            return
        live.sort(key=lambda d: (d.requested_at or self.now(), d.name))
        newest = live[-1]
        for older in live[:-1]:
            self.outbox.append((older.name, newest.name))
        book = self.s.slots.get(slot_name)
        if book is not None:
            book.live_claim = newest.name

    async def supersede_older(self) -> None:
        while self.outbox:
            older, newer = self.outbox.pop(0)
            await self._signal(c.claim_workflow_id(self.s.namespace, older), c.ClaimSignal.SUPERSEDED, newer)

    # --- what the slots show -----------------------------------------------------------------------------
    async def on_observation(self, obs: c.SlotObservation) -> None:
        s = self.s
        book = s.slots.get(obs.slot)
        if book is None:
            s.reload_requested = True
            return
        if not obs.observation.older_than(book.observation):
            book.observation = obs.observation
        owner = book.live_claim or book.draining_claim
        if owner:
            await self._signal(c.claim_workflow_id(s.namespace, owner), c.ClaimSignal.OBSERVE, book.observation)
        elif book.releasing:
            await self._signal(c.release_workflow_id(s.namespace, book.name), c.ReleaseSignal.OBSERVE, book.observation)
        elif book.exists and book.observation.power == "on":
            if book.ever_claimed:
                await self.release(book)
            else:
                await self.adopt(book)

    async def adopt(self, book: SlotBook) -> None:
        """A running machine in a slot that never had a claim is the homelab's, not an orphan: claim it ready."""
        seed = self.new_seed(book, ClaimCall.ADOPTED, ClaimPhase.READY, ClaimReason.ADOPTED)
        await self.start_claim(seed)

    async def release(self, book: SlotBook) -> None:
        """Law 3: a machine on with no claim, in a slot that has had one, is powered off."""
        book.releasing = True
        try:
            await workflow.start_child_workflow(
                c.WorkflowName.RELEASE,
                c.ReleaseSeed(self.s.namespace, book.name, self.s.name),
                id=c.release_workflow_id(self.s.namespace, book.name),
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                static_summary=f"release slot {book.name} of group {self.s.name}: machine on with no claim",
            )
        except WorkflowAlreadyStartedError:
            return

    async def wind_down(self) -> None:
        """The Group is gone: release every live claim's machine, then end once no claim is live."""
        s = self.s
        for d in list(s.claims.values()):
            if law.is_live(d.phase) and not d.marked:
                await self._signal(
                    c.claim_workflow_id(s.namespace, d.name),
                    c.ClaimSignal.MARK_FOR_DELETION,
                    c.MarkRequest(ClaimReason.NODE_DELETED),
                )
        self.details("group deleted: waiting for its claims to release their machines")
        await self.wait(
            lambda: not any(law.is_live(d.phase) for d in s.claims.values()),
            TIMINGS.wind_down_timeout,
            "claims released after the group was deleted",
        )

    async def _signal(self, workflow_id: str, signal: c.ClaimSignal | c.ReleaseSignal, *args: Any) -> None:
        try:
            await workflow.get_external_workflow_handle(workflow_id).signal(signal, *args)
        except Exception as err:
            workflow.logger.info("signal %s to %s not delivered: %s", signal, workflow_id, err)

    # --- signals -----------------------------------------------------------------------------------------
    def claim_changed(self, digest: c.ClaimDigest) -> None:
        self.s.remember(digest)
        if law.is_live(digest.phase) and not digest.workflow_done:
            self.check_one_live_claim(digest.slot, digest.name)

    def observe_slot(self, obs: c.SlotObservation) -> None:
        self.s.inbox.append(obs)

    def refresh(self) -> None:
        """Something about the group's resources changed (a slot, the Group, a claim applied by hand)."""
        self.s.reload_requested = True

    def release_finished(self, done: c.SlotReleased) -> None:
        book = self.s.slots.get(done.slot)
        if book is not None:
            book.releasing = False
            if not done.machine_off:
                self.s.reload_requested = True

    # --- cluster-autoscaler's writes ---------------------------------------------------------------------
    async def increase_size(self, delta: int) -> int:
        await workflow.wait_condition(lambda: self.s.loaded)
        self._check_increase(delta)
        self.s.updates += 1
        for book in choose(self.s.slots.values(), delta):
            await self.start_claim(self.new_seed(book, ClaimCall.INCREASE_SIZE))
        return self.s.target_size()

    def _validate_increase(self, delta: int) -> None:
        if delta <= 0:
            raise _refuse(c.ERR_INVALID_ARGUMENT, f"group {self.s.name}: delta must be positive, got {delta}")
        if self.s.loaded:
            self._check_increase(delta)

    def _check_increase(self, delta: int) -> None:
        s = self.s
        if not s.exists:
            raise _refuse(c.ERR_NOT_FOUND, f"group {s.name} does not exist")
        target = s.target_size()
        if target + delta > s.max_size:
            raise _refuse(
                c.ERR_FAILED_PRECONDITION,
                f"group {s.name}: size {target} + {delta} would exceed maxSize {s.max_size}",
            )
        free = len(choose(s.slots.values(), delta))
        if free < delta:
            raise _refuse(c.ERR_FAILED_PRECONDITION, f"group {s.name}: {delta} machines asked for, {free} free slots")

    async def decrease_target_size(self, delta: int) -> int:
        """Cancel pending claims only: a booting claim is committed and is reversed through DeleteNodes."""
        await workflow.wait_condition(lambda: self.s.loaded)
        self._check_decrease(delta)
        self.s.updates += 1
        for d in self.s.pending()[:-delta]:
            self.s.remember(_marked(d))
            await self._signal(
                c.claim_workflow_id(self.s.namespace, d.name),
                c.ClaimSignal.MARK_FOR_DELETION,
                c.MarkRequest(ClaimReason.CANCELLED_BY_DECREASE_TARGET_SIZE),
            )
        return self.s.target_size()

    def _validate_decrease(self, delta: int) -> None:
        if delta >= 0:
            raise _refuse(c.ERR_INVALID_ARGUMENT, f"group {self.s.name}: delta must be negative, got {delta}")
        if self.s.loaded:
            self._check_decrease(delta)

    def _check_decrease(self, delta: int) -> None:
        pending = len(self.s.pending())
        if -delta > pending:
            raise _refuse(
                c.ERR_FAILED_PRECONDITION,
                f"group {self.s.name}: cannot decrease the target by {-delta}: only {pending} claims are pending "
                "(booting and ready machines are removed with DeleteNodes)",
            )

    async def delete_nodes(self, nodes: list[str]) -> int:
        """Mark the live claims of these nodes; each is reversed (shut down, verified off) by its workflow."""
        await workflow.wait_condition(lambda: self.s.loaded)
        self._check_delete(nodes)
        self.s.updates += 1
        for node in nodes:
            book = self.s.slot_of(node)
            d = self.s.claims.get(book.live_claim) if book is not None and book.live_claim else None
            if d is None and book is not None:
                # cluster-autoscaler deleting an instance it saw fail: the failure has been heard; forget it.
                self.s.failures = [f for f in self.s.failures if f.slot != book.name]
            if d is None or d.marked:
                continue
            self.s.remember(_marked(d))
            await self._signal(
                c.claim_workflow_id(self.s.namespace, d.name),
                c.ClaimSignal.MARK_FOR_DELETION,
                c.MarkRequest(ClaimReason.NODE_DELETED),
            )
        return self.s.target_size()

    def _validate_delete(self, nodes: list[str]) -> None:
        if not nodes or any(not n for n in nodes):
            raise _refuse(c.ERR_INVALID_ARGUMENT, f"group {self.s.name}: DeleteNodes needs node names")
        if self.s.loaded:
            self._check_delete(nodes)

    def _check_delete(self, nodes: list[str]) -> None:
        s = self.s
        unknown = [n for n in nodes if s.slot_of(n) is None]
        if unknown:
            raise _refuse(c.ERR_INVALID_ARGUMENT, f"nodes {', '.join(unknown)} are not in group {s.name}")
        live = {b.live_claim for n in nodes if (b := s.slot_of(n)) is not None and b.live_claim}
        wanted = {name for name in live if name in s.claims and not s.claims[name].marked}
        if s.target_size() - len(wanted) < s.min_size:
            raise _refuse(
                c.ERR_FAILED_PRECONDITION,
                f"group {s.name}: deleting {len(wanted)} nodes would go below minSize {s.min_size}",
            )

    # --- cluster-autoscaler's reads ----------------------------------------------------------------------
    def target_size(self) -> int:
        return self.s.target_size()

    def instances(self) -> list[c.Instance]:
        return self.s.instances()

    def snapshot(self) -> dict[str, Any]:
        s = self.s
        return {
            "namespace": s.namespace,
            "name": s.name,
            "exists": s.exists,
            "loaded": s.loaded,
            "minSize": s.min_size,
            "maxSize": s.max_size,
            "maxProvisionSeconds": s.max_provision_seconds,
            "targetSize": s.target_size(),
            "template": s.template,
            "slots": {
                b.name: {
                    "nodeName": b.node_name,
                    "providerID": b.provider_id,
                    "power": b.observation.power,
                    "liveClaim": b.live_claim or None,
                    "drainingClaim": b.draining_claim or None,
                    "releasing": b.releasing,
                    "exists": b.exists,
                    "activations24h": b.activations,
                }
                for b in s.slots.values()
            },
            "claims": {
                d.name: {"slot": d.slot, "phase": d.phase, "marked": d.marked, "attempt": d.attempt}
                for d in s.claims.values()
            },
        }


def _marked(d: c.ClaimDigest) -> c.ClaimDigest:
    return replace(d, marked=True)
