"""Watch events become signals and report writes.

* kubelet Node → the observation of its slot, sent to the slot's live claim workflow (else to the group
  workflow, which applies law 3 or adopts) only when it changed: the debounce compares the facts a decision
  reads (`Observation.same_facts`; for a claim `same_for_claim`: power and the readiness gate) and the target,
  so heartbeats cost nothing. A claim the group just booked is not told what its group was told (its seed has
  it, or the group forwards it). Each observation carries the watcher's clock in `observed_at`; the workflows
  drop one older than what they hold. After every (re)list every slot's observation is sent once, whatever was
  sent before.
* Job → `job_finished` to its claim (or, for a law-3 Job, to the slot's release workflow), once per Job.
* NodeClaim → a deletionTimestamp, or a deletion, is `mark_for_deletion(DeletedByHand)` once per claim; a
  claim no workflow runs (applied by hand) makes its group reload, which takes it over. A person's edit of a
  claim's status (the fields its workflow owns changed, its revision did not) is `status_edited` to its workflow.
  A live claim whose slot or group does not exist, still so `homeless_claim_grace` after its creation and with
  no workflow, gets a workflow of its own that fails it (no group can take it).
* slot and Group → a new, changed (spec) or deleted one makes its group reload; every Group gets its workflow
  signalled-with-start after each list of the Groups.

Every event also refreshes the reports it can change. Nothing is signalled or written until every watch has
listed once (`ready`), and only while this replica leads; the cache is kept warm either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from api import contracts as c
from api.names import KIND_GROUP, KIND_NODE, KIND_NODECLAIM, ClaimReason
from domain import law
from domain.timings import TIMINGS
from kube import views
from kube.adapter import CLAIMS, GROUPS, JOBS, KUBELET_NODES, SLOTS, Resource
from kube.objects import meta, spec, status
from kube.views import job_status, observe, readiness_taints
from kube.watch import DELETED, SYNCED, WatchEvent
from watchers.cluster import JSON, Cluster, Key, key_of, newer_or_same
from watchers.report import ReportWriter
from watchers.signals import SignalSink

log = logging.getLogger(__name__)

RELEASE_MARK = c.RELEASE_MARK
# Signals in flight at once from the watchers (the process's way): enough to keep up with a burst of boots,
# few enough not to queue behind each other in the Temporal client.
SIGNALS_IN_FLIGHT = 32


class Dispatcher:
    def __init__(
        self,
        cluster: Cluster,
        signals: SignalSink,
        writer: ReportWriter,
        *,
        clock: Callable[[], datetime],
    ) -> None:
        self.cluster = cluster
        self.signals = signals
        self.writer = writer
        self.clock = clock
        self.acting = False  # every watch listed once, and this replica leads
        self.sent: dict[Key, tuple[str, c.Observation]] = {}  # per slot: the target and what it was told
        self.finished_jobs: set[tuple[str, str, str]] = set()
        self.hand_deleted: set[tuple[str, str, str]] = set()
        self.dropped_stale = 0
        self.deferred: asyncio.Event | None = None  # set: reports are written by `write_reports`, not inline
        self.concurrent: asyncio.Semaphore | None = None  # set: signals go out beside the next events
        self._chains: dict[Any, asyncio.Task[None]] = {}
        self.dirty_slots: set[Key] = set()
        self.dirty_groups: set[tuple[str, str]] = set()
        self.homeless: dict[Key, datetime] = {}  # live claims no group can take, and when they may be failed
        self.homeless_noted = asyncio.Event()  # a claim was added there: the process's check wakes for it

    # --- the one entry point ---------------------------------------------------------------------------
    async def handle(self, resource: Resource, event: WatchEvent, *, relisting: bool = False) -> None:
        """Fold one event into the picture, then act on it (when acting)."""
        if resource is KUBELET_NODES:
            await self._node(event, relisting)
        elif resource is JOBS:
            await self._job(event)
        elif resource is CLAIMS:
            await self._claim(event, relisting)
        elif resource is SLOTS:
            await self._slot(event, relisting)
        elif resource is GROUPS:
            await self._group(event, relisting)

    async def start_acting(self) -> None:
        """Leadership (or readiness) gained: what happened while nobody acted is delivered now (hand deletions,
        finished Jobs), every group is signalled, every observation sent, every report brought up to date.
        """
        self.acting = True
        self.sent.clear()
        for claim in list(self.cluster.claims.values()):
            if meta(claim).get("deletionTimestamp"):
                await self._hand_deleted(claim)
        for job in list(self.cluster.jobs.values()):
            await self._job_finished(job)
        await self.refresh_groups()
        await self.observe_all()
        await self.writer.everything(self.clock())

    def stop_acting(self) -> None:
        """Another replica writes from now on: the usage tallies are forgotten (it resumes them from the status)."""
        self.acting = False
        self.writer.usage.forget()

    # --- observations ------------------------------------------------------------------------------------
    def observation(self, key: Key) -> c.Observation | None:
        slot = self.cluster.slots.get(key)
        if slot is None:
            return None
        group = self.cluster.group_of(key)
        return observe(self.cluster.node_of(slot), readiness_taints(group), self.clock())

    async def observe(self, key: Key, *, force: bool = False) -> bool:
        """Send the slot's observation where it belongs, unless the same facts already went there."""
        if not self.acting:
            return False
        obs = self.observation(key)
        if obs is None:
            return False
        ns = key[0]
        group = str(spec(self.cluster.slots[key]).get("group") or "")
        live = self.cluster.live_claim(key)
        target = c.claim_workflow_id(ns, str(meta(live).get("name"))) if live else c.group_workflow_id(ns, group)
        held = self.sent.get(key)
        claim = str(meta(live).get("name")) if live is not None else ""
        if not force and held is not None:
            told_to, told = held
            if told_to == target and (obs.same_for_claim(told) if claim else obs.same_facts(told)):
                return False
            if claim and told_to == c.group_workflow_id(ns, group) and obs.same_for_claim(told):
                # A claim booked since its group was told: the group seeded it with what it held, or forwards it.
                self.sent[key] = (target, told)
                return False
        if self.concurrent is not None:
            # Sent beside the next events (observations carry their time: a workflow drops an older one), one at
            # a time per slot so the claim-then-group fallback keeps its order; forgotten if it did not land.
            self.sent[key] = (target, obs)
            self._spawn(key, lambda: self._deliver(key, claim, group, obs, target))
            return True
        return await self._deliver(key, claim, group, obs, target)

    async def _deliver(self, key: Key, claim: str, group: str, obs: c.Observation, target: str) -> bool:
        ns, slot = key
        booked = (target, obs)  # what `observe` may have recorded before sending
        delivered = False
        if claim:
            delivered = await self.signals.claim(ns, claim, c.ClaimSignal.OBSERVE, obs)
        if not delivered:
            # No live claim, or its workflow is gone: the group routes it (law 3, adoption, a draining claim).
            target = c.group_workflow_id(ns, group)
            exists = (ns, group) in self.cluster.groups
            delivered = await self.signals.group(
                ns, group, c.GroupSignal.OBSERVE_SLOT, c.SlotObservation(slot, obs), start=exists
            )
        if delivered:
            self.sent[key] = (target, obs)
        elif self.sent.get(key) in (booked, (target, obs)):
            del self.sent[key]  # not delivered: the next event sends it again
        return delivered

    def send_concurrently(self, limit: int = SIGNALS_IN_FLIGHT) -> None:
        """The process's way: signals go out beside the next events instead of one after another, at most
        `limit` at once, in order per slot. `pump()` (tests, the first sync) keeps them inline."""
        self.concurrent = asyncio.Semaphore(limit)

    async def _send(self, key: Any, send: Callable[[], Awaitable[Any]]) -> None:
        """A Temporal call: beside the next events (in order per key) in the process, in line under `pump()`."""
        if self.concurrent is not None:
            self._spawn(key, send)
        else:
            await send()

    def _spawn(self, key: Any, send: Callable[[], Awaitable[Any]]) -> None:
        """Run `send` after the previous send for `key` (chained), bounded by the semaphore."""
        before = self._chains.get(key)
        limit = self.concurrent

        async def chained() -> None:
            if before is not None:
                with contextlib.suppress(Exception):
                    await before
            assert limit is not None
            async with limit:
                try:
                    await send()
                except Exception:  # one failed send must not stop the others; the next event sends again
                    log.exception("sending to %s failed", key)

        task = asyncio.get_running_loop().create_task(chained())
        self._chains[key] = task
        task.add_done_callback(lambda done: self._chains.pop(key, None) if self._chains.get(key) is done else None)

    async def settle(self) -> None:
        """Wait for every signal in flight (a stop, a test)."""
        while self._chains:
            await asyncio.gather(*list(self._chains.values()), return_exceptions=True)

    async def observe_all(self) -> None:
        for key in list(self.cluster.all_slots()):
            await self.observe(key, force=True)

    async def refresh_groups(self) -> None:
        for ns, name in sorted(self.cluster.groups):
            if not meta(self.cluster.groups[(ns, name)]).get("deletionTimestamp"):
                await self.signals.group(ns, name, c.GroupSignal.REFRESH)

    async def _refresh(self, ns: str, group: str) -> None:
        if self.acting and group:
            await self.signals.group(ns, group, c.GroupSignal.REFRESH, start=(ns, group) in self.cluster.groups)

    async def _reports(self, slots: list[Key], groups: set[tuple[str, str]] | None = None) -> None:
        """Bring the reports these events can change up to date: at once, or (deferred) by `write_reports`."""
        if not self.acting:
            return
        touched = set(groups or ())
        for key in slots:
            if key in self.cluster.slots:
                touched.add((key[0], str(spec(self.cluster.slots[key]).get("group") or "")))
        if self.deferred is not None:
            self.dirty_slots.update(k for k in slots if k in self.cluster.slots)
            self.dirty_groups.update(touched)
            self.deferred.set()
            return
        now = self.clock()
        for key in slots:
            if key in self.cluster.slots:
                await self.writer.slot(key, now)
        for ns, name in sorted(touched):
            await self.writer.group(ns, name, now)

    def defer_reports(self) -> asyncio.Event:
        """The process's way: events only mark reports dirty, `write_reports` writes them, each slot once however
        many events touched it, so a signal never waits behind a report write (reports are output only)."""
        self.deferred = asyncio.Event()
        return self.deferred

    async def write_reports(self) -> int:
        """Write every dirty report (slots, then their groups); the number of reports brought up to date."""
        slots, self.dirty_slots = sorted(self.dirty_slots), set()
        groups, self.dirty_groups = sorted(self.dirty_groups), set()
        if self.deferred is not None:
            self.deferred.clear()
        if not self.acting:
            return 0
        now = self.clock()
        for key in slots:
            if key in self.cluster.slots:
                await self.writer.slot(key, now)
        for ns, name in groups:
            await self.writer.group(ns, name, now)
        return len(slots) + len(groups)

    # --- the cache ---------------------------------------------------------------------------------------
    def _fold(self, store: dict[Any, JSON], key: Any, event: WatchEvent) -> tuple[JSON | None, bool]:
        """Store the event's object; returns the version held before and whether the event was taken."""
        old = store.get(key)
        obj = event.object or {}
        if event.type == DELETED:
            store.pop(key, None)
            return old, True
        if not newer_or_same(obj, old):
            self.dropped_stale += 1
            return old, False
        store[key] = obj
        return old, True

    # --- kubelet Nodes -----------------------------------------------------------------------------------
    async def _node(self, event: WatchEvent, relisting: bool) -> None:
        if event.type == SYNCED:
            await self.observe_all()
            await self._reports(list(self.cluster.all_slots()))
            return
        obj = event.object or {}
        _, taken = self._fold(self.cluster.nodes, str(meta(obj).get("name")), event)
        if not taken or relisting:
            return
        slots = self.cluster.slots_of_node(obj)
        for key in slots:
            await self.observe(key)
        await self._reports(slots)

    # --- Jobs --------------------------------------------------------------------------------------------
    async def _job(self, event: WatchEvent) -> None:
        if event.type == SYNCED or event.object is None:
            return
        job = event.object
        key = key_of(job)
        if event.type == DELETED:
            self.cluster.jobs.pop(key, None)
            self.finished_jobs.discard((*key, str(meta(job).get("uid") or "")))
            return
        self.cluster.jobs[key] = job
        if not self.acting:
            return
        slot = views.job_owners(job)[0]
        if slot:
            await self._reports([(key[0], slot)])
        await self._job_finished(job)

    async def _job_finished(self, job: JSON) -> None:
        """`job_finished` to the Job's claim, or to the slot's release workflow, once per Job."""
        ns, name = key_of(job)
        ident = (ns, name, str(meta(job).get("uid") or ""))
        state = job_status(name, job)
        if state.state not in (c.JOB_SUCCEEDED, c.JOB_FAILED) or ident in self.finished_jobs:
            return
        slot, claim = views.job_owners(job)  # full names: the labels may hold bounded ones
        finished = c.JobFinished(job=name, succeeded=state.state == c.JOB_SUCCEEDED, reason=state.reason)
        send: Callable[[], Awaitable[bool]]
        if claim:
            send = lambda: self.signals.claim(ns, claim, c.ClaimSignal.JOB_FINISHED, finished)  # noqa: E731
        elif slot and RELEASE_MARK in name:
            send = lambda: self.signals.release(ns, slot, c.ReleaseSignal.JOB_FINISHED, finished)  # noqa: E731
        else:
            return
        await self._send(ident, send)
        # Once per Job, delivered or not: a workflow that missed it reads the Job when its own timer fires.
        self.finished_jobs.add(ident)

    async def _hand_deleted(self, claim: JSON) -> None:
        """`mark_for_deletion(DeletedByHand)` once per claim (by uid): a delete through the API is a scale-down."""
        ns, name = key_of(claim)
        ident = (ns, name, str(meta(claim).get("uid") or ""))
        if ident not in self.hand_deleted:
            self.hand_deleted.add(ident)
            mark = c.MarkRequest(ClaimReason.DELETED_BY_HAND)
            await self._send(
                ("claim", ns, name), lambda: self.signals.claim(ns, name, c.ClaimSignal.MARK_FOR_DELETION, mark)
            )

    async def _take_over_if_unrun(self, ns: str, name: str, group: str) -> None:
        """A claim no workflow runs (applied by hand, or left by a lost run): its group's reload takes it over."""
        if not await self.signals.claim_running(ns, name):
            await self._refresh(ns, group)

    # --- NodeClaims --------------------------------------------------------------------------------------
    async def _claim(self, event: WatchEvent, relisting: bool) -> None:
        if event.type == SYNCED or event.object is None:
            return
        key = key_of(event.object)
        old, taken = self._fold(self.cluster.claims, key, event)
        if not taken:
            return
        obj = event.object if event.type != DELETED else (old or event.object)
        ns, name = key
        slot_key = (ns, str(spec(obj).get("node") or ""))
        if event.type == DELETED and slot_key[1]:
            self.cluster.claim_departed(slot_key, obj)
        edit = views.status_edit(old, obj) if event.type != DELETED else None
        if edit is not None and self.acting:
            # Delivered whatever the edit left (even a status no contract accepts): the claim overwrites it.
            await self._send(("claim", ns, name), lambda: self._status_edited(ns, name, edit))
        problem = views.claim_problem(obj) if event.type != DELETED else ""
        self._note_homeless(key, obj if event.type != DELETED and not problem else None)
        if problem:
            # A claim that cannot be run is no claim to the picture (no report, no signal): only its Warning.
            self.cluster.claims.pop(key, None)
            if self.acting:
                await self.writer.warn_invalid(KIND_NODECLAIM, obj, problem, self.clock())
            return
        if not self.acting:
            return
        if event.type == DELETED:
            await self._hand_deleted(obj)
            self.hand_deleted.discard((ns, name, str(meta(obj).get("uid") or "")))  # gone: its uid never returns
        elif meta(event.object).get("deletionTimestamp"):
            await self._hand_deleted(obj)
        elif old is None:
            # Applied by hand (or left by a lost run)? The group's reload takes it over, newest-wins included. Asked
            # beside the next events: one Temporal round trip per new claim in line would hold every watch up.
            group = str(spec(obj).get("group") or "")
            await self._send(("claim", ns, name), lambda: self._take_over_if_unrun(ns, name, group))
        if slot_key[1]:
            if not relisting:
                await self.observe(slot_key)  # the live claim may have changed: the new one hears the machine
            await self._reports([slot_key])

    async def _status_edited(self, ns: str, name: str, edit: c.StatusEdit) -> None:
        if not await self.signals.claim(ns, name, c.ClaimSignal.STATUS_EDITED, edit):
            log.info("claim %s/%s: a hand edit of its status was not delivered (no workflow runs it)", ns, name)

    # --- claims no group can take ----------------------------------------------------------------------
    def home_problem(self, claim: JSON) -> tuple[str, str] | None:
        """Why no group can take a claim (a reason and a message), or None: its group and its slot exist, and the
        slot is in that group."""
        ns = key_of(claim)[0]
        group, slot_name = str(spec(claim).get("group") or ""), str(spec(claim).get("node") or "")
        if (ns, group) not in self.cluster.groups:
            return ClaimReason.GROUP_NOT_FOUND, f"group {group} does not exist in namespace {ns}"
        slot = self.cluster.slots.get((ns, slot_name))
        if slot is None:
            return ClaimReason.SLOT_NOT_FOUND, f"slot {slot_name} does not exist in namespace {ns}"
        if spec(slot).get("group") != group:
            return (
                ClaimReason.SLOT_NOT_FOUND,
                f"group {group} has no slot {slot_name} (it is in group {spec(slot).get('group')})",
            )
        return None

    def _note_homeless(self, key: Key, claim: JSON | None) -> None:
        """Keep a live claim (one that can be run; None forgets it) that no group can take until its grace has
        passed: then it is failed."""
        if claim is None or not law.is_live(status(claim).get("phase") or None) or self.home_problem(claim) is None:
            self.homeless.pop(key, None)
            return
        if key not in self.homeless:
            created = views.time_of(meta(claim).get("creationTimestamp")) or self.clock()
            self.homeless[key] = created + TIMINGS.homeless_claim_grace
            self.homeless_noted.set()

    def _note_homeless_of(self, which: Callable[[JSON], bool]) -> None:
        """A slot or a Group is gone: the claims that named it may have no group left to take them."""
        for key, claim in list(self.cluster.claims.items()):
            if which(claim):
                self._note_homeless(key, claim)

    def next_homeless(self) -> datetime | None:
        return min(self.homeless.values(), default=None)

    async def refuse_homeless(self) -> int:
        """Fail every claim no group can take whose grace has passed: its own workflow records the failure (the
        claim's one writer), and nothing else is touched. The number of workflows started."""
        if not self.acting:
            return 0
        now, started = self.clock(), 0
        for key, due in sorted(self.homeless.items()):
            claim = self.cluster.claims.get(key)
            problem = self.home_problem(claim) if claim is not None else None
            if claim is None or problem is None:
                self.homeless.pop(key, None)
                continue
            if due > now:
                continue
            view = views.claim_view(claim, now)
            if view is None or await self.signals.claim_running(*key):
                self.homeless.pop(key, None)  # a workflow runs it: its group or its own end decides
                continue
            seed = c.ClaimSeed(
                namespace=key[0],
                name=key[1],
                slot=view.slot,
                group=str(spec(claim).get("group") or ""),
                call=view.call,
                attempt=view.attempt,
                requested_at=view.requested_at or now,
                deadline_at=view.deadline_at,
                max_provision_seconds=view.max_provision_seconds,
                ttl_seconds=view.ttl_seconds,
                phase=view.phase,
                reason=view.reason,
                create_resource=False,
                record=view.record,
                refused_reason=problem[0],
                refused_message=problem[1],
            )
            if await self.signals.start_claim(seed):
                started += 1
                self.homeless.pop(key, None)
                log.warning("claim %s/%s: no group can take it: %s", key[0], key[1], problem[1])
        return started

    # --- slots -------------------------------------------------------------------------------------------
    async def _slot(self, event: WatchEvent, relisting: bool) -> None:
        if event.type == SYNCED:
            await self.observe_all()
            await self._reports(list(self.cluster.all_slots()))
            return
        obj = event.object or {}
        key = key_of(obj)
        old, taken = self._fold(self.cluster.slots, key, event)
        if not taken:
            return
        ns = key[0]
        if event.type != DELETED and self.acting:
            await self.writer.warn_invalid(KIND_NODE, obj, views.slot_problem(obj), self.clock())
            await self.writer.warn_annotation(KIND_NODE, obj, self.clock())
        if event.type == DELETED:
            self.sent.pop(key, None)
            self._note_homeless_of(lambda claim: key_of(claim)[0] == ns and spec(claim).get("node") == key[1])
            group = str(spec(old).get("group") or "")
            if not relisting:
                await self._refresh(ns, group)
            await self._reports([], {(ns, group)} if group else set())
            return
        changed = old is None or any(
            meta(old).get(f) != meta(obj).get(f) for f in ("generation", "deletionTimestamp", "uid")
        )
        if not changed:
            if views.usage_reset(old) != views.usage_reset(obj):
                await self._reports([key])  # a reset of its usage figures asked for: its report says it
            return  # a status write (ours): nothing a workflow decides from
        groups = {str(spec(obj).get("group") or ""), str(spec(old).get("group") or "")} - {""}
        if not relisting:
            for group in sorted(groups):
                await self._refresh(ns, group)
            await self.observe(key, force=True)
        await self._reports([key], {(ns, g) for g in groups})

    # --- Groups ------------------------------------------------------------------------------------------
    async def _group(self, event: WatchEvent, relisting: bool) -> None:
        if event.type == SYNCED:
            if self.acting:
                await self.refresh_groups()
            return
        obj = event.object or {}
        key = key_of(obj)
        old, taken = self._fold(self.cluster.groups, key, event)
        if not taken or relisting:
            return
        ns, name = key
        if event.type == DELETED:
            self._note_homeless_of(lambda claim: key_of(claim)[0] == ns and spec(claim).get("group") == name)
            if self.acting:
                await self.signals.group(
                    ns, name, c.GroupSignal.REFRESH, start=False
                )  # it winds down; nothing to start
            return
        if self.acting:
            found = views.group_spec(obj)
            await self.writer.warn_invalid(KIND_GROUP, obj, found if isinstance(found, str) else "", self.clock())
            await self.writer.warn_annotation(KIND_GROUP, obj, self.clock())
        if old is not None and all(
            meta(old).get(f) == meta(obj).get(f) for f in ("generation", "deletionTimestamp", "uid")
        ):
            if views.usage_reset(old) != views.usage_reset(obj):  # a reset of its slots' usage figures asked for
                await self._reports(self.cluster.slots_of_group(ns, name), {key})
            return  # a status write
        await self._refresh(ns, name)
        slots = self.cluster.slots_of_group(ns, name)
        for slot_key in slots:  # the readiness taints may have changed, and with them what is usable
            await self.observe(slot_key)
        await self._reports(slots, {key})
