"""The group: the single authority on a group's size, and the router of what its slots show.

cluster-autoscaler's writes arrive as Updates with validators (a refused call records nothing), its reads as
Queries, so what it reads right after a write is exactly what it wrote. A size change is decided and booked in
one synchronous step under the group's lock (`GroupState.book_claim`), so any number of concurrent callers, of
provider replicas, or of callers that gave up mid-Update, can never push the group past maxSize or put two
live claims on one slot; an Update is applied whole or not at all. The run loop then starts the booked claims
(all in one workflow task), sends the booked signals, starts releases, collects finished claims after their
TTL and records the last scale on the Group.

Each claim runs as a child NodeClaimWorkflow that outlives the group's run (ABANDON); each law-3 release as a
child ReleaseWorkflow. What the group reads from Kubernetes arrives parsed (`load_group`): an object the
contracts refuse is left out with its reason, never a failing workflow task.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError

from api import contracts as c
from api.names import CLAIM_TTL_SECONDS_AFTER_FINISHED, ClaimCall, ClaimPhase, ClaimReason, ConditionType
from domain import claims, law
from domain.timings import TIMINGS
from workflows import metrics
from workflows.claim.workflow import NodeClaimWorkflow
from workflows.group.choice import choose, unclaimable
from workflows.group.state import GroupState, Outgoing, SlotBook, new_slot
from workflows.handles import NOT_RUNNING, signal_outcome
from workflows.patches import Patch
from workflows.release import ReleaseWorkflow
from workflows.verbs import CallFailed, Verbs, run_activity

# The truth read of the group's resources: watchers ask for a reload on every change; this bounds a lost one.
# How long a deleted group waits for its claims to release their machines before it ends.
# Housekeeping writes (collection, the last scale) never hold the loop up: a few tries, then the next turn.
HOUSEKEEPING_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), backoff_coefficient=2.0, maximum_interval=timedelta(seconds=4),
    maximum_attempts=3,
)  # fmt: skip

KEY_GROUP = SearchAttributeKey.for_keyword(c.SA_GROUP)


def _outcome_heard(done: asyncio.Future[Any]) -> None:
    """A child's end reaches the group through its own signal; the result Temporal also delivers is not needed
    (a failed claim's workflow fails by design), so it is taken here rather than left as an unread exception.
    """
    if not done.cancelled():
        done.exception()


def _mark_on(record: c.ClaimRecord | None) -> str:
    """The scale-down a lost run had recorded on its claim (MarkedForDeletion), so a take-over does not forget it."""
    mark = record.condition(ConditionType.MARKED_FOR_DELETION) if record is not None else None
    return (mark.reason or ClaimReason.NODE_DELETED) if mark is not None and mark.status else ""


def _refuse(kind: str, message: str) -> ApplicationError:
    return ApplicationError(message, type=kind, non_retryable=True)


class Group(Verbs):
    def __init__(self, ref: c.GroupRef, carried: GroupState | None = None) -> None:
        self.ref = ref
        self.s = carried if carried is not None else GroupState(ref.namespace, ref.group)
        self.lock = asyncio.Lock()  # size changes are decided one at a time (their bodies never await inside)
        self.last_reload: datetime | None = None
        self.housekeeping_at: datetime | None = None
        self.waking_at = workflow.now()  # when the loop's current wait times out

    async def run(self, ref: c.GroupRef, carried: GroupState | None = None) -> None:
        s = self.s
        workflow.deprecate_patch(Patch.ERRORED_IN_TARGET)  # a failed claim's instance counts in the target
        s.errored_never_back = workflow.patched(Patch.ERRORED_INSTANCE_NEVER_COMES_BACK)
        s.updates = 0
        workflow.upsert_search_attributes([KEY_GROUP.value_set(ref.group)])
        self.last_reload = self.now()
        if not s.loaded:
            await self.reload()
        while True:
            self.details(self.summary())
            wake = self.next_wake()
            self.waking_at = self.now() + wake
            woke = await self.wait(self.has_work, wake, "periodic reload of the group")
            if s.reload_requested or (
                not woke and self.now() - (self.last_reload or self.now()) >= TIMINGS.reload_interval
            ):
                s.reload_requested = False
                await self.reload()
            await self.flush()
            while s.inbox:
                self.on_observation(s.inbox.pop(0))
            await self.flush()
            await self.housekeeping()
            s.forget_failures(self.now())
            metrics.group_claims(s.namespace, s.name, s.phase_counts())
            if s.loaded and not s.exists:
                await self.wind_down()
                return
            if self.should_continue():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(args=[ref, s])

    def summary(self) -> str:
        s = self.s
        text = f"{s.target_size()} claims wanted of max {s.max_size}; watching {len(s.slots)} slots"
        return f"{text}; the Group cannot be used: {s.problem}" if s.problem else text

    def has_work(self) -> bool:
        s = self.s
        return (
            s.reload_requested
            or bool(s.inbox or s.to_start or s.outbox)
            or any(b.release_due(self.now()) for b in s.slots.values())
            or self.housekeeping_due()
            or self.should_continue()
            or self.now() + self.next_wake() < self.waking_at  # something is due before the timer set
        )

    def next_wake(self) -> timedelta:
        """Until the next periodic reload or the next housekeeping (a collection due, a write to try again)."""
        now = self.now()
        wakes = [(self.last_reload or now) + TIMINGS.reload_interval]
        due = self.s.next_collection()
        if due is not None:
            wakes.append(max(due, self.housekeeping_at or due))
        if self.s.scale is not None and self.housekeeping_at is not None:
            wakes.append(self.housekeeping_at)
        wakes += [b.release_after for b in self.s.slots.values() if b.release is not None and b.release_after]
        return max(min(wakes) - now, timedelta(seconds=1))

    def should_continue(self) -> bool:
        """Continue as new when Temporal suggests it, or well before the per-run Update limit."""
        return workflow.info().is_continue_as_new_suggested() or self.s.updates >= self.s.updates_per_run

    # --- reading the group from Kubernetes ---------------------------------------------------------------
    async def reload(self) -> None:
        s = self.s
        self.last_reload = self.now()
        view = await self.read(c.Act.LOAD_GROUP, c.GroupRef(s.namespace, s.name), c.GroupView, "load the group")
        if view is None:
            return
        s.exists = view.exists
        if not view.exists:
            s.loaded = True
            return
        s.problem = view.problem
        if not view.problem:
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
            book.problem, book.attempts_reset_at = sv.problem, sv.attempts_reset_at
            if sv.last_claim is not None:
                book.record_outcome(sv.last_claim)
            if not sv.observation.older_than(book.observation):
                book.observation = sv.observation
        for name, book in s.slots.items():
            if name not in seen and book.exists:
                book.exists = False
                if book.live_claim:
                    s.send(c.claim_workflow_id(s.namespace, book.live_claim), c.ClaimSignal.SLOT_DELETED)
        for cv in view.claims:
            if cv.name not in s.claims and cv.slot in s.slots:
                self.take_over(cv)
        s.loaded = True
        for book in s.slots.values():
            if book.exists and not book.live_claim:
                s.inbox.append(c.SlotObservation(book.name, book.observation))

    def take_over(self, cv: c.ClaimView) -> None:
        """A claim resource the group does not track: hand-applied, or left by a lost run. It obeys every rule a
        provider-made claim does: attempt seeded from the slot, a deadline from requestedAt, its own TTL.
        """
        s = self.s
        book = s.slots[cv.slot]
        if cv.name in s.collect:
            return  # it ended here already; its resource may still show the phase before its last projection
        if cv.name in s.ended:  # its workflow has ended; the read predates its last writes (a cancel's delete, ...)
            workflow.deprecate_patch(Patch.ENDED_NOT_TAKEN_OVER)
            return
        if law.is_terminal(cv.phase):
            ended = cv.finished_at or cv.requested_at or self.now()
            s.collect[cv.name] = ended + timedelta(seconds=cv.ttl_seconds)
            return
        requested = cv.requested_at or self.now()
        group_max = max(s.max_provision_seconds, cv.max_provision_seconds)
        deadline = cv.deadline_at
        if deadline is None and law.in_boot_window(cv.phase):
            deadline = claims.deadline_at(requested, timedelta(seconds=group_max) if group_max else None)
        seed = c.ClaimSeed(
            namespace=s.namespace,
            name=cv.name,
            slot=cv.slot,
            group=s.name,
            call=cv.call or ClaimCall.MANUAL,
            attempt=cv.attempt if cv.has_attempt else book.next_attempt(),
            requested_at=requested,
            deadline_at=deadline,
            max_provision_seconds=claims.provision_time(timedelta(seconds=group_max)).total_seconds(),
            ttl_seconds=cv.ttl_seconds,
            phase=cv.phase or ClaimPhase.PENDING,
            reason=cv.reason,
            create_resource=False,
            observation=book.observation,
            marked_reason=ClaimReason.DELETED_BY_HAND if cv.marked else _mark_on(cv.record),
            record=cv.record,
        )
        s.book_claim(seed)
        if seed.name not in s.claims:
            # A newer live claim holds its slot, so booking dropped it as never started: its resource exists, so it
            # is started and superseded (its workflow ends it), never left pending with no workflow behind it.
            workflow.deprecate_patch(Patch.TAKEN_OVER_SUPERSEDED)
            s.start_superseded(seed)
            return
        if cv.phase in ("", ClaimPhase.PENDING) and not seed.marked_reason and s.target_size() > s.max_size:
            # A hand-applied claim the group has no room for (maxSize reached) is cancelled before it buys a
            # machine, as a DecreaseTargetSize would: the target never passes maxSize.
            workflow.deprecate_patch(Patch.HAND_CLAIMS_WITHIN_MAX_SIZE)
            s.mark(s.claims[seed.name], ClaimReason.MAX_SIZE_REACHED)

    # --- claims ------------------------------------------------------------------------------------------
    def new_seed(self, book: SlotBook, call: str, phase: str = ClaimPhase.PENDING, reason: str = "") -> c.ClaimSeed:
        s = self.s
        now = self.now()
        group_max = timedelta(seconds=s.max_provision_seconds) if s.max_provision_seconds else None
        s.claim_counter += 1
        pending = phase == ClaimPhase.PENDING
        return c.ClaimSeed(
            namespace=s.namespace,
            name=c.claim_name(book.name, workflow.uuid4().hex),
            slot=book.name,
            group=s.name,
            call=call,
            attempt=book.next_attempt() if pending else 1,
            requested_at=now,
            deadline_at=claims.deadline_at(now, group_max) if pending else None,
            max_provision_seconds=claims.provision_time(group_max).total_seconds(),
            ttl_seconds=CLAIM_TTL_SECONDS_AFTER_FINISHED,
            phase=phase,
            reason=reason,
            observation=book.observation,
        )

    async def flush(self) -> None:
        """Start the booked claims (all at once), then send the booked signals and start the booked releases."""
        s = self.s
        starts, s.to_start = s.to_start, []
        if starts:
            await asyncio.gather(*(self._start_claim(seed) for seed in starts))
        signals, s.outbox = s.outbox, []
        now = self.now()
        releases = [b for b in s.slots.values() if b.release_due(now)]
        if signals or releases:
            await asyncio.gather(*(self._signal(o) for o in signals), *(self._start_release(b) for b in releases))

    async def _start_claim(self, seed: c.ClaimSeed) -> None:
        try:
            handle = await workflow.start_child_workflow(
                NodeClaimWorkflow.run,
                args=[seed, None],
                id=c.claim_workflow_id(seed.namespace, seed.name),
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                static_summary=f"claim {seed.name} for slot {seed.slot} in group {seed.group}, attempt {seed.attempt}",
            )
        except WorkflowAlreadyStartedError:
            workflow.logger.info("claim %s already runs", seed.name)
            return
        handle.add_done_callback(_outcome_heard)

    async def _start_release(self, book: SlotBook) -> None:
        seed, book.release = book.release, None
        if seed is None:
            return
        why = f"the end of claim {seed.claim}" if seed.claim else "a machine on with no claim"
        try:
            handle = await workflow.start_child_workflow(
                ReleaseWorkflow.run,
                seed,
                id=c.release_workflow_id(self.s.namespace, book.name),
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                static_summary=f"release slot {book.name} of group {self.s.name}: {why}",
            )
        except WorkflowAlreadyStartedError:
            # The slot's previous release is still closing (or a lost run's still runs): this one starts again later.
            workflow.deprecate_patch(Patch.OWNER_END_RECHECK)
            book.release_refused(seed, self.now())
            workflow.logger.info("a release of slot %s still runs: starting again at %s", book.name, book.release_after)
            return
        book.release_started()
        handle.add_done_callback(_outcome_heard)

    async def _signal(self, out: Outgoing) -> None:
        if await signal_outcome(out.workflow_id, out.signal, out.arg) == NOT_RUNNING:
            # A live claim whose workflow does not run (terminated by hand, or lost with Temporal's state while this
            # run survived) is forgotten, and the reload takes it over from its resource.
            workflow.deprecate_patch(Patch.LOST_CLAIMS_TAKEN_OVER)
            self.s.claim_lost(out.workflow_id)

    # --- what the slots show -----------------------------------------------------------------------------
    def on_observation(self, obs: c.SlotObservation) -> None:
        s = self.s
        book = s.slots.get(obs.slot)
        if book is None:
            s.reload_requested = True
            return
        if not obs.observation.older_than(book.observation):
            book.observation = obs.observation
        owner = book.live_claim
        if owner:
            booked = next((i for i, seed in enumerate(s.to_start) if seed.name == owner), None)
            if booked is None:
                s.send(c.claim_workflow_id(s.namespace, owner), c.ClaimSignal.OBSERVE, book.observation)
            elif workflow.patched(Patch.BOOKED_CLAIM_SEES_NEWEST):
                # A claim booked in this task starts with what the book saw last (the watchers tell it nothing
                # they told the group before it was booked).
                s.to_start[booked] = replace(s.to_start[booked], observation=book.observation)
        elif book.releasing:
            if book.release is None:  # started: it hears the machine
                s.send(c.release_workflow_id(s.namespace, book.name), c.ReleaseSignal.OBSERVE, book.observation)
        elif book.exists and book.observation.power == "on":
            if book.ever_claimed:
                s.book_release(book)
            else:
                # A running machine in a slot that never had a claim is the homelab's, not an orphan: claim it.
                s.book_claim(self.new_seed(book, ClaimCall.ADOPTED, ClaimPhase.READY, ClaimReason.ADOPTED))

    # --- housekeeping: collection after the TTL, the last scale on Group.status --------------------------------
    def housekeeping_due(self) -> bool:
        now = self.now()
        if self.housekeeping_at is not None and now < self.housekeeping_at:
            return False
        due = self.s.next_collection()
        return self.s.scale is not None or (due is not None and due <= now)

    async def housekeeping(self) -> None:
        """Collect the claims past their TTL and record the last scale; a failure waits a minute, never the loop."""
        s = self.s
        if not self.housekeeping_due():
            return
        now = self.now()
        due = sorted(name for name, at in s.collect.items() if at <= now)
        writes: list[tuple[str, Any, str]] = [
            (c.Act.DELETE_CLAIM, c.ClaimRef(s.namespace, name), f"collect claim {name} (its TTL passed)")
            for name in due
        ]
        if s.scale is not None:
            writes.append((c.Act.RECORD_SCALE, s.scale, f"record {s.scale.action} on the Group"))
        results = await asyncio.gather(*(self._housekeeping_write(*w) for w in writes))
        for name, ok in zip(due, results, strict=False):
            if ok:
                s.collect.pop(name, None)
        if s.scale is not None and results[-1]:
            s.scale = None
        self.housekeeping_at = None if all(results) else now + TIMINGS.housekeeping_backoff

    async def _housekeeping_write(self, name: str, arg: Any, summary: str) -> bool:
        try:
            await run_activity(name, arg, timeout=TIMINGS.write_timeout, retry=HOUSEKEEPING_RETRY, summary=summary)
        except CallFailed as err:
            workflow.logger.warning("%s failed: %s", summary, err.cause or err)
            return False
        return True

    async def wind_down(self) -> None:
        """The Group is gone: release every live claim's machine, then end once no claim is live."""
        s = self.s
        for d in list(s.claims.values()):
            if law.is_live(d.phase) and not d.marked:
                s.mark(d, ClaimReason.NODE_DELETED)
        await self.flush()
        self.details("group deleted: waiting for its claims to release their machines")
        await self.wait(
            lambda: not any(law.is_live(d.phase) for d in s.claims.values()),
            TIMINGS.wind_down_timeout,
            "claims released after the group was deleted",
        )

    # --- signals -----------------------------------------------------------------------------------------
    def claim_changed(self, digest: c.ClaimDigest) -> None:
        if digest.name not in self.s.claims and workflow.patched(Patch.GROUP_HEARS_ITS_OWN_CLAIMS):
            # Not a claim this run tracks: a word that left a lost run late (a local call in flight across a wipe of
            # Temporal's database reaches the group started on the empty one), or one after the claim's end. Taken,
            # it kept the reload from taking the claim over, or brought an ended claim back; the reload reads it.
            workflow.logger.info("claim %s is not one this group tracks: its word is left to the reload", digest.name)
            return
        final = digest.workflow_done and digest.observation is not None
        if final:  # a claim's final report brings its last view of the machine: an "on" sent meanwhile is not lost
            workflow.deprecate_patch(Patch.OWNER_END_RECHECK)
        self.s.remember(digest)
        if digest.workflow_done:
            self.s.ended[digest.name] = self.now()
        metrics.group_claims(self.s.namespace, self.s.name, self.s.phase_counts())  # a move wakes no loop pass

    def observe_slot(self, obs: c.SlotObservation) -> None:
        self.s.inbox.append(obs)

    def refresh(self) -> None:
        """Something about the group's resources changed (a slot, the Group, a claim applied by hand)."""
        self.s.reload_requested = True

    def release_finished(self, done: c.SlotReleased) -> None:
        """A release ended; one that could not power the machine off is tried again at the next reload. Its last view
        of the machine comes with it: a machine the group heard on since is looked at again (law 3)."""
        book = self.s.slots.get(done.slot)
        if book is None:
            return
        workflow.deprecate_patch(Patch.OWNER_END_RECHECK)
        if book.release is not None:  # a restart waits for the run that has just ended: it may start now
            book.release_after = None
            return
        book.releasing = False
        if book.heard_on_after(done.observation) and not book.live_claim:
            self.s.inbox.append(c.SlotObservation(book.name, book.observation))

    # --- cluster-autoscaler's writes ---------------------------------------------------------------------
    async def _loaded(self) -> None:
        if not self.s.loaded:
            await workflow.wait_condition(lambda: self.s.loaded)

    async def increase_size(self, delta: int) -> int:
        await self._loaded()
        async with self.lock:
            s = self.s
            self._check_increase(delta)
            for book in choose(s.slots.values(), delta):
                s.book_claim(self.new_seed(book, ClaimCall.INCREASE_SIZE))
            self._scaled(f"IncreaseSize +{delta}")
            return s.target_size()

    def _validate_increase(self, delta: int) -> None:
        if delta <= 0:
            raise _refuse(c.ERR_INVALID_ARGUMENT, f"group {self.s.name}: delta must be positive, got {delta}")
        if self.s.loaded:
            self._check_increase(delta)

    def _check_increase(self, delta: int) -> None:
        s = self.s
        if not s.exists:
            raise _refuse(c.ERR_NOT_FOUND, f"group {s.name} does not exist")
        if s.problem:
            raise _refuse(c.ERR_FAILED_PRECONDITION, f"group {s.name} cannot be used: {s.problem}")
        target = s.target_size()
        if target + delta > s.max_size:
            raise _refuse(
                c.ERR_FAILED_PRECONDITION,
                f"group {s.name}: size {target} + {delta} would exceed maxSize {s.max_size}",
            )
        free = len(choose(s.slots.values(), delta))
        if free < delta:
            skipped = unclaimable(s.slots.values())
            why = f"; skipped: {'; '.join(skipped)}" if skipped else ""
            raise _refuse(
                c.ERR_NO_CAPACITY, f"group {s.name}: {delta} machines asked for, {free} slots can take a claim{why}"
            )

    async def decrease_target_size(self, delta: int) -> int:
        """Cancel pending claims only: a booting claim is committed and is reversed through DeleteNodes."""
        await self._loaded()
        async with self.lock:
            s = self.s
            self._check_decrease(delta)
            # An errored instance is the least fulfilled request there is: it is forgotten before a pending claim is
            # cancelled (only where it counts in the target).
            errored = s.listed_failures()
            forgotten = {f.name for f in errored[:-delta]}
            s.failures = [f for f in s.failures if f.name not in forgotten]
            for d in s.pending()[: -delta - len(forgotten)]:
                s.mark(d, ClaimReason.CANCELLED_BY_DECREASE_TARGET_SIZE)
            self._scaled(f"DecreaseTargetSize {delta}")
            return s.target_size()

    def _validate_decrease(self, delta: int) -> None:
        if delta >= 0:
            raise _refuse(c.ERR_INVALID_ARGUMENT, f"group {self.s.name}: delta must be negative, got {delta}")
        if self.s.loaded:
            self._check_decrease(delta)

    def _check_decrease(self, delta: int) -> None:
        s = self.s
        pending = len(s.pending())
        errored = len(s.listed_failures())
        if -delta > pending + errored:
            failed = f" and {errored} failed instances" if errored else ""
            raise _refuse(
                c.ERR_FAILED_PRECONDITION,
                f"group {s.name}: cannot decrease the target by {-delta}: only {pending} claims are pending{failed} "
                "(booting and ready machines are removed with DeleteNodes)",
            )

    async def delete_nodes(self, nodes: list[str]) -> int:
        """Mark the live claims of these nodes; each is reversed (shut down, verified off) by its workflow."""
        await self._loaded()
        async with self.lock:
            s = self.s
            self._check_delete(nodes)
            for node in nodes:
                book = s.slot_of(node)
                d = s.claims.get(book.live_claim) if book is not None and book.live_claim else None
                if d is None and book is not None:
                    # cluster-autoscaler deleting an instance it saw fail: the failure has been heard; forget it.
                    s.failures = [f for f in s.failures if f.slot != book.name]
                if d is None or d.marked:
                    continue
                s.mark(d, ClaimReason.NODE_DELETED)
            self._scaled(f"DeleteNodes {', '.join(nodes)}")
            return s.target_size()

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

    def _scaled(self, action: str) -> None:
        s = self.s
        s.updates += 1
        s.scale = c.ScaleRecord(s.namespace, s.name, self.now(), action)

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
            "problem": s.problem or None,
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
                    "releasing": b.releasing,
                    "exists": b.exists,
                    "activations24h": b.activations,
                    "claimable": b.claimability().ok,
                    "problem": b.problem or None,
                    "nextAttempt": b.next_attempt(),
                }
                for b in s.slots.values()
            },
            "claims": {
                d.name: {"slot": d.slot, "phase": d.phase, "marked": d.marked, "attempt": d.attempt, "call": d.call}
                for d in s.claims.values()
            },
            "collecting": sorted(s.collect),
        }
