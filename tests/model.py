"""The adversary: a seeded random driver of the whole claim model, and the seed's invariants it checks.

One example is one homelab (five slots, maxSize 4) on Temporal's time-skipping server with the real worker and
activities, the simulated homelab and the real watchers (pumped after every step, so they signal what the
cluster shows). The driver draws steps from a seeded `random.Random`: concurrent IncreaseSize /
DecreaseTargetSize / DeleteNodes, time jumps (past gates, deadlines, grace, TTL, the 30 m reset), machine
faults (boot, never boot, boot late, vanish, refuse to power off), API faults (5xx, 409, 429, 422, timeouts) on
any resource, hand-applied and hand-deleted claims, deleted slots, a restarted worker, and Temporal losing every
workflow (the cluster keeps the record). After every step it checks the safety invariants (a claim's finalizer is
let go only with its terminal record among them); every few steps, once the cluster has settled, the eventual
ones; at the end, after a quiet spell with every fault cleared, that every machine's power agrees with the law and
every claim resource agrees with what its machine did, with no Event beside a write that did not land.

A failure names the seed and the steps taken: `MODEL_SEED=<seed> pytest tests/test_model.py` reruns the same
schedule (worker timing is real, so a rare interleaving may need a few runs).
"""

from __future__ import annotations

import asyncio
import functools
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from homelab_sim.emulator import Fault, RequestInfo
from homelab_sim.emulator_errors import ApiError
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from api import contracts as c
from api.names import ClaimPhase, ClaimReason
from domain.timings import TIMINGS
from tests import records
from tests.lab import NS, REFUSALS, ClockStalled, Lab, homelab, open_lab, refusal_watching_runtime
from watchers.main import Watchers
from watchers.signals import Signals
from workflows.group.workflow import GroupWorkflow

CRD = "infra.homecluster.dev/v2alpha1"
SLOTS = ("s1", "s2", "s3", "s4", "s5")
MAX_SIZE = 4
# The machine faults of the simulated homelab (its spec's names).
FAULTS = (
    "startupJobFails",
    "shutdownJobFails",
    "jobHangs",
    "neverBoots",
    "kubeletNeverRegisters",
    "kubeletNeverReady",
    "taintNeverClears",
    "shutdownDoesNothing",
)
# Time jumps: a poll, a gate, the boot deadline, MachineGone grace, the shutdown reset grace, a claim's TTL.
JUMPS = (1, 10, 60, 5 * 60, 13 * 60, 31 * 60, 61 * 60)
# API faults as a real server shows them: (status, reason) that retrying can fix, and refusals of a body.
TRANSIENT = ((500, "InternalError"), (503, "ServiceUnavailable"), (429, "TooManyRequests"), (409, "Conflict"))
RESOURCES = ("nodeclaims", "jobs", "nodes", "events", "groups")
VERBS = ("create", "patch", "get", "list", "delete")
QUIET = timedelta(hours=3)  # long enough for a spent shutdown streak (30 min) to resume twice, and a TTL
QUIET_HOLD = timedelta(minutes=40)  # the law must keep holding this long: past a shutdown verification and a pause
SETTLE_EVERY = 6
KUBE_TIMEOUT = 1.0  # a request slower than this is a timeout to the operator (the delay faults use it)
WORKERS = 2  # workers polling the queue, as two worker processes: a restart restarts one, the other carries on


# Task "failures" that are Temporal's own protocol, not an error of the workflow: a completion that raced a new
# event (the worker runs the task again with it), a sticky queue reset.
BENIGN_TASK_FAILURES = frozenset(
    {
        WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND,
        WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_STICKY_TASK_QUEUE,
    }
)


class Violation(AssertionError):
    """An invariant of the seed did not hold."""


@dataclass
class Model:
    """What the driver knows besides the system: the faults it set, the claims it saw, what it was told."""

    lab: Lab
    watchers: Watchers
    rng: random.Random
    log: list[str] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    claims: set[str] = field(default_factory=set)  # every claim name ever seen
    hand_applied: int = 0
    refusing_jobs: Fault | None = None  # a window in which the API server refuses every Job creation
    cancelled_in_window: set[str] = field(default_factory=set)  # cancels acknowledged while no Job could be made
    deleted_slots: set[str] = field(default_factory=set)
    checked_closed: set[str] = field(default_factory=set)
    restarts: bool = False  # whether this example restarts its worker (it then runs with no workflow cache)
    finalizers: records.Finalizers = field(default_factory=records.Finalizers)

    # --- driving -------------------------------------------------------------------------------------------
    async def run(self, steps: int) -> None:
        await self.pump()
        await self.until(lambda: self.loaded(), "the group loaded")
        for i in range(steps):
            name, action = self.choose()
            self.stats[name] += 1
            self.log.append(f"{i}: {name}")
            await action()
            await self.pump()
            await self.check_safety()
            if i % SETTLE_EVERY == SETTLE_EVERY - 1:
                await self.settle_and_check()
        await self.quiet_and_check()

    def choose(self) -> tuple[str, Callable[[], Awaitable[None]]]:
        table: list[tuple[str, float, Callable[[], Awaitable[None]]]] = [
            ("increase", 4, self.increase),
            ("decrease", 2, self.decrease),
            ("delete_nodes", 3, self.delete_nodes),
            ("advance", 6, self.advance),
            ("machine_fault", 2, self.machine_fault),
            ("die", 1, self.die),
            ("power_on_by_hand", 1, self.power_on_by_hand),
            ("api_fault", 2, self.api_fault),
            ("refuse_jobs", 1, self.refuse_jobs),
            ("hand_apply", 1, self.hand_apply),
            ("hand_delete", 1, self.hand_delete),
            ("delete_slot", 0.5, self.delete_slot),
            ("restore_slots", 0.5, self.restore_slots),
            ("lose_temporal", 0.5, self.lose_temporal),
            ("lose_temporal_mid_job", 0.7, self.lose_temporal_mid_job),
        ]
        if self.restarts:
            table.append(("restart_worker", 0.7, self.restart_worker))
        name, _, action = self.rng.choices(table, weights=[w for _, w, _ in table])[0]
        return name, action

    async def pump(self) -> None:
        await self.watchers.pump()

    async def increase(self) -> None:
        deltas = [self.rng.randint(1, 3) for _ in range(self.rng.randint(1, 4))]
        self.log[-1] += f" {deltas}"
        results = await asyncio.gather(
            *(self.lab.group().execute_update(GroupWorkflow.increase_size, d) for d in deltas), return_exceptions=True
        )
        self.refused_only_by_rules(results)
        over = [r for r in results if isinstance(r, int) and r > MAX_SIZE]
        if over and not await self.adoptions_explain(max(over)):
            raise self.violation(f"an IncreaseSize was accepted with the target at {max(over)} of maxSize {MAX_SIZE}")

    async def decrease(self) -> None:
        before = {n for n, d in (await self.lab.snapshot())["claims"].items() if d["phase"] == "pending"}
        delta = -self.rng.randint(1, 2)
        self.log[-1] += f" {delta}"
        try:
            await self.lab.group().execute_update(GroupWorkflow.decrease_target_size, delta)
        except WorkflowUpdateFailedError as err:
            self.refused_only_by_rules([err])
            return
        marked = {n for n, d in (await self.lab.snapshot())["claims"].items() if d["marked"]} & before
        if self.refusing_jobs is not None:
            # No Job can be made now: the claim must hear its cancel before the API server recovers, unless it has
            # ended on its own first (seed 2024489194: a hand-applied claim past its deadline failed at its start).
            for name in marked:
                await self.until(functools.partial(self.heard_or_ended, name), f"claim {name} heard its cancel")
            self.cancelled_in_window |= marked

    async def delete_nodes(self) -> None:
        instances = await self.lab.group().query(GroupWorkflow.instances)
        if not instances:
            return
        chosen = self.rng.sample(instances, self.rng.randint(1, len(instances)))
        ids = [i.id if self.rng.random() < 0.7 else i.slot for i in chosen]
        self.log[-1] += f" {ids}"
        try:
            await self.lab.group().execute_update(GroupWorkflow.delete_nodes, ids)
        except WorkflowUpdateFailedError as err:
            self.refused_only_by_rules([err])

    async def advance(self) -> None:
        seconds = self.rng.choice(JUMPS)
        self.log[-1] += f" {seconds}s"
        step = min(seconds, 300)
        spent = 0
        while spent < seconds:
            await self.lab.advance(step)
            spent += step
            await self.pump()

    async def machine_fault(self) -> None:
        slot, fault, on = self.rng.choice(SLOTS), self.rng.choice(FAULTS), self.rng.random() < 0.6
        self.log[-1] += f" {slot} {fault}={on}"
        self.lab.lab.set_fault(slot, fault, on)

    async def die(self) -> None:
        slot = self.rng.choice(SLOTS)
        self.log[-1] += f" {slot}"
        self.lab.lab.die(slot)

    async def power_on_by_hand(self) -> None:
        slot = self.rng.choice(SLOTS)
        self.log[-1] += f" {slot}"
        self.lab.lab.power_on_by_hand(slot)

    async def api_fault(self) -> None:
        plural, verb = self.rng.choice(RESOURCES), self.rng.choice(VERBS)
        times = self.rng.randint(1, 4)
        kind = self.rng.random()
        if kind < 0.15:
            fault = Fault(match=_matching(plural, verb), status=None, delay=KUBE_TIMEOUT * 1.5, times=1)
            what = "timeout"
        elif kind < 0.25 and verb == "create" and plural in ("jobs", "nodeclaims"):
            fault = Fault(match=_matching(plural, verb), status=422, reason="Invalid", times=1)
            what = "422"
        else:
            status, reason = self.rng.choice(TRANSIENT)
            fault = Fault(match=_matching(plural, verb), status=status, reason=reason, times=times)
            what = f"{status}x{times}"
        self.log[-1] += f" {verb} {plural} {what}"
        self.lab.lab.emulator.faults.append(fault)

    async def refuse_jobs(self) -> None:
        faults = self.lab.lab.emulator.faults
        if self.refusing_jobs is None:
            self.refusing_jobs = Fault(match=_matching("jobs", "create"), status=503, reason="Unavailable", times=None)
            faults.append(self.refusing_jobs)
            self.log[-1] += " on"
        else:
            if self.refusing_jobs in faults:
                faults.remove(self.refusing_jobs)
            self.refusing_jobs = None
            self.log[-1] += " off"

    async def hand_apply(self) -> None:
        self.hand_applied += 1
        name, slot = f"hand-{self.hand_applied}", self.rng.choice(SLOTS)
        now = await self.lab.env.get_current_time()
        requested = now - timedelta(seconds=self.rng.choice((0, 0, 30, 20 * 60)))
        spec: dict[str, Any] = {"node": slot, "group": "g", "requestedAt": _rfc3339(requested), "call": "Manual"}
        if self.rng.random() < 0.3:
            spec["ttlSecondsAfterFinished"] = self.rng.choice((0, 60, 600))
        self.log[-1] += f" {name} on {slot}"
        body = {"apiVersion": CRD, "kind": "NodeClaim", "metadata": {"name": name, "namespace": NS}, "spec": spec}
        self.lab.lab.call(lambda h: h.emulator.put_object(CRD, "nodeclaims", body, NS))
        self.claims.add(name)

    async def hand_delete(self) -> None:
        present = [o["metadata"]["name"] for o in self.lab.lab.call(lambda h: h.emulator.objects_of(CRD, "nodeclaims"))]
        if not present:
            return
        name = self.rng.choice(present)
        self.log[-1] += f" {name}"
        try:
            self.lab.lab.call(lambda h: h.emulator.delete_object(CRD, "nodeclaims", NS, name))
        except ApiError as err:  # the operator deleted it between the listing and this delete (collected, cancelled)
            if err.status != 404:
                raise
            self.log[-1] += " (already gone)"

    async def delete_slot(self) -> None:
        slot = self.rng.choice(SLOTS)
        if slot in self.deleted_slots:
            return
        self.log[-1] += f" {slot}"
        self.deleted_slots.add(slot)
        self.lab.lab.call(lambda h: h.emulator.delete_object(CRD, "nodes", NS, slot))

    async def restore_slots(self) -> None:
        if not self.deleted_slots:
            return
        self.log[-1] += f" {sorted(self.deleted_slots)}"
        self.lab.lab.call(lambda h: h.seed())  # re-creates what is missing, leaves the rest alone
        self.deleted_slots.clear()

    async def restart_worker(self) -> None:
        await self.lab.restart_worker()

    async def lose_temporal(self) -> None:
        """Temporal loses every workflow (its database is wiped); the cluster keeps every resource. The watchers'
        next relist (or the provider's next call) starts the group again, which takes the claims over from their
        resources."""
        self.claims |= set(self.resources()) | set((await self.lab.snapshot())["claims"])
        await self.lab.lose_temporal()
        self.watchers.signals = self.watchers.dispatcher.signals = Signals(self.lab.client)
        await self.watchers.dispatcher.refresh_groups()

    async def lose_temporal_mid_job(self) -> None:
        """Temporal is lost while a slow lifecycle Job of a claim runs (issue 32): a shutdown Job of a scale-down, or
        a startup Job of a boot. The run that takes the claim over must adopt that Job: no second Job of its kind is
        fired beside it, the attempt is not counted again, the boot is not failed by a check while its Job runs.
        Checked two minutes after the loss (past the 90 s registration check, within the Job's five minutes); then
        the slow Job ends. With no claim to stage it on, it is a plain loss."""
        kind = self.rng.choice(("startup", "shutdown"))
        staged = await (self._stage_shutdown() if kind == "shutdown" else self._stage_startup())
        if staged is None:
            self.log[-1] += f" {kind}: nothing to stage, a plain loss"
            await self.lose_temporal()
            return
        slot, claim, hung_before = staged
        job = await self._running_job_of(claim, kind)
        if job is None:
            self.log[-1] += f" {kind} on {slot} ({claim}): no running Job, a plain loss"
            await self.lose_temporal()
            await self._end_slow_jobs(slot, hung_before)
            return
        self.log[-1] += f" during {job} on {slot}"
        self.stats[f"lose_temporal_mid_job ({kind})"] += 1
        await self.lab.advance(60)
        await self.pump()
        attempts = self._shutdown_attempts(claim)
        overlaps = self._overlaps(slot)
        await self.lose_temporal()
        for _ in range(12):  # two minutes, the watchers pumped: the group loads and takes the claim over
            await self.lab.advance(10)
            await self.pump()
        jobs = [str(j["metadata"]["name"]) for j in self._jobs_of(claim, kind)]
        if len(jobs) > 1:
            raise self.violation(f"claim {claim} was taken over during {job} and made another {kind} Job: {jobs}")
        if self._overlaps(slot) > overlaps:
            raise self.violation(f"two lifecycle Jobs ran at once on {slot} after the loss during {job}")
        if kind == "shutdown" and self._shutdown_attempts(claim) > attempts:
            raise self.violation(f"claim {claim} counted {job} again: {attempts} -> {self._shutdown_attempts(claim)}")
        await self._end_slow_jobs(slot, hung_before)

    async def _stage_shutdown(self) -> tuple[str, str, bool] | None:
        """A ready claim's scale-down with a slow shutdown Job (its slot's Jobs hang)."""
        snap = await self.lab.snapshot()
        ready = sorted(
            (d["slot"], n)
            for n, d in snap["claims"].items()
            if d["phase"] == "ready" and not d["marked"] and d["slot"] not in self.deleted_slots
        )
        if not ready:
            return None
        slot, claim = self.rng.choice(ready)
        hung = self._hangs(slot)
        self.lab.lab.set_fault(slot, "jobHangs", True)
        try:
            await self.lab.group().execute_update(GroupWorkflow.delete_nodes, [slot])
        except WorkflowUpdateFailedError as err:
            self.refused_only_by_rules([err])
        return slot, claim, hung

    async def _stage_startup(self) -> tuple[str, str, bool] | None:
        """A boot with a slow startup Job: a claim applied by hand on a free slot whose Jobs hang."""
        books = (await self.lab.snapshot())["slots"]
        free = [
            s
            for s in SLOTS
            if s not in self.deleted_slots
            and not (books[s]["liveClaim"] or books[s]["releasing"])
            and self.lab.lab.power(s) == "off"
        ]
        if not free:
            return None
        slot = self.rng.choice(free)
        hung = self._hangs(slot)
        self.lab.lab.set_fault(slot, "jobHangs", True)
        self.hand_applied += 1
        claim = f"hand-{self.hand_applied}"
        now = await self.lab.env.get_current_time()
        spec = {"node": slot, "group": "g", "requestedAt": _rfc3339(now), "call": "Manual"}
        body = {"apiVersion": CRD, "kind": "NodeClaim", "metadata": {"name": claim, "namespace": NS}, "spec": spec}
        self.lab.lab.call(lambda h: h.emulator.put_object(CRD, "nodeclaims", body, NS))
        self.claims.add(claim)
        await self.pump()
        await self.lab.group().signal(GroupWorkflow.refresh)
        return slot, claim, hung

    async def _running_job_of(self, claim: str, kind: str) -> str | None:
        """The claim's running Job of this kind, once it is made (a few short settles), else None."""
        for _ in range(10):
            running = [str(j["metadata"]["name"]) for j in self._jobs_of(claim, kind) if _job_state(j) == "running"]
            if running:
                return running[-1]
            await self.settle(2)
        return None

    def _jobs_of(self, claim: str, kind: str) -> list[dict[str, Any]]:
        return [
            j
            for j in self.lab.jobs()
            if j["metadata"]["labels"].get("type") == kind
            and j["metadata"]["labels"].get("infra.homecluster.dev/nodeclaim") == claim
        ]

    def _hangs(self, slot: str) -> bool:
        return bool(self.lab.lab.call(lambda h: h.machine(slot).faults.job_hangs))

    def _overlaps(self, slot: str) -> int:
        return len([e for e in self.lab.lab.history(slot) if e.what == "jobs-overlap"])

    def _shutdown_attempts(self, claim: str) -> int:
        res = self.resources().get(claim) or {}
        return int((res.get("status") or {}).get("shutdownAttempts") or 0)

    async def _end_slow_jobs(self, slot: str, hung_before: bool) -> None:
        """The slow Jobs end (as their scripts say); the slot's hang switch goes back to what the model had set."""
        self.lab.lab.set_fault(slot, "jobHangs", hung_before)
        if not hung_before:
            self.lab.lab.end_hanging_jobs(slot)
        await self.pump()

    def workflow_ids(self) -> list[str]:
        ids = [c.group_workflow_id(NS, "g")]
        ids += [c.claim_workflow_id(NS, n) for n in sorted(self.claims - self.checked_closed)]
        ids += [c.release_workflow_id(NS, s) for s in SLOTS]
        return ids

    # --- what the system says --------------------------------------------------------------------------------
    async def adoptions_explain(self, target: int) -> bool:
        """Whether adopted machines (beyond any request) make up what the target has above maxSize."""
        claims = (await self.lab.snapshot())["claims"].values()
        adopted = sum(1 for d in claims if d["call"] == "Adopted" and d["phase"] == "ready" and not d["marked"])
        return target - adopted <= MAX_SIZE

    async def loaded(self) -> bool:
        try:
            return bool((await self.lab.snapshot())["loaded"])
        except RPCError:
            return False

    async def marked(self, name: str) -> bool:
        return bool((await self.lab.status(name))["marked"])

    async def heard_or_ended(self, name: str) -> bool:
        """Marked, or ended before the mark reached it: either way it makes no Job from now on."""
        st = await self.lab.status(name)
        return bool(st["marked"]) or st["phase"] in (ClaimPhase.FAILED, ClaimPhase.COMPLETED)

    async def until(self, check: Callable[[], Awaitable[bool]], what: str, seconds: float = 10) -> None:
        """A condition the system reaches without workflow time passing (signals, activities): real time only."""
        end = time.monotonic() + seconds
        while not await check():
            if time.monotonic() > end:
                raise self.violation(f"{what}: not within {seconds:.0f} real seconds")
            await self.pump()
            await asyncio.sleep(0.05)

    def refused_only_by_rules(self, results: list[Any]) -> None:
        """An Update may be refused for a rule (maxSize, capacity, minSize, bad input), never for an error."""
        known = {c.ERR_INVALID_ARGUMENT, c.ERR_FAILED_PRECONDITION, c.ERR_NOT_FOUND, c.ERR_NO_CAPACITY}
        for r in results:
            if isinstance(r, BaseException):
                cause = getattr(r, "cause", None)
                if not (isinstance(r, WorkflowUpdateFailedError) and isinstance(cause, ApplicationError)):
                    raise self.violation(f"an Update failed with {r!r}")
                if cause.type not in known:
                    raise self.violation(f"an Update was refused for {cause.type}: {cause.message}")

    async def open_claims(self) -> dict[str, dict[str, Any]]:
        """Every claim whose workflow the group tracks, with its workflow's own status (the truth)."""
        names = list((await self.lab.snapshot())["claims"])
        self.claims.update(names)
        out = {}
        for name in names:
            try:
                out[name] = await self.lab.status(name)
            except RPCError:
                continue  # booked, not started yet
        return out

    def resources(self) -> dict[str, dict[str, Any]]:
        objs = self.lab.lab.call(lambda h: h.emulator.objects_of(CRD, "nodeclaims", NS))
        return {o["metadata"]["name"]: o for o in objs}

    # --- invariants ----------------------------------------------------------------------------------------------
    def violation(self, what: str) -> Violation:
        return Violation(f"{what}\nsteps:\n  " + "\n  ".join(self.log))

    async def check_safety(self) -> None:
        """What holds at every instant, whatever is in flight."""
        snap = await self.lab.snapshot()
        live_by_slot: Counter[str] = Counter()
        for d in snap["claims"].values():
            if d["phase"] in ("pending", "booting", "ready"):
                live_by_slot[d["slot"]] += 1
        two = [s for s, n in live_by_slot.items() if n > 1]
        if two:
            raise self.violation(f"the group holds two live claims on slots {two}: {snap['claims']}")
        # IncreaseSize never passes maxSize; only adopting a machine someone switched on may (it is never powered
        # off on sight: docs/decisions.md), so the claims asked for stay within the bound.
        adopted = sum(
            1
            for d in snap["claims"].values()
            if d["call"] == "Adopted" and d["phase"] in ("pending", "booting", "ready") and not d["marked"]
        )
        if snap["targetSize"] - adopted > MAX_SIZE:
            raise self.violation(f"target {snap['targetSize']} ({adopted} adopted) is above maxSize {MAX_SIZE}")
        let_go = self.finalizers.let_go_early(self.resources().values())
        if let_go:
            raise self.violation(f"a finalizer let go before the claim's terminal record: {let_go}")
        # A boot's registration and readiness checks start after its startup Job: a claim failed by one of them while
        # that Job still runs never waited for it (a take-over that did not adopt the lost run's Job).
        running_startups = {
            j["metadata"]["labels"].get("infra.homecluster.dev/nodeclaim")
            for j in self.lab.jobs()
            if j["metadata"]["labels"].get("type") == "startup" and _job_state(j) == "running"
        }
        for name, res in self.resources().items():
            st = res.get("status") or {}
            if st.get("reason") == ClaimReason.READINESS_GATE_TIMEOUT and name in running_startups:
                raise self.violation(f"claim {name} failed {st['reason']} while its startup Job still runs")
        for job in self.lab.jobs():
            labels = job["metadata"]["labels"]
            claim = labels.get("infra.homecluster.dev/nodeclaim")
            if labels.get("type") != "startup" or not claim:
                continue
            if claim in self.cancelled_in_window:
                raise self.violation(f"claim {claim} was cancelled while no Job could be made, yet has a startup Job")
            self.claims.add(claim)
            resource = self.resources().get(claim)
            attempt = ((resource or {}).get("status") or {}).get("attempt")
            if isinstance(attempt, int) and attempt > TIMINGS.max_consecutive_attempts:
                raise self.violation(f"claim {claim} bought a machine on attempt {attempt}")
        await self.check_closed()

    async def check_closed(self) -> None:
        """A claim's workflow closes Completed, or Failed with its claim's reason; nothing else ever closes."""
        group = await self.lab.group().describe()
        if group.status != WorkflowExecutionStatus.RUNNING:
            raise self.violation(f"the group workflow is {group.status}")
        reasons = {str(r) for r in ClaimReason}
        for name in sorted(self.claims - self.checked_closed):
            handle = self.lab.claim(name)
            try:
                desc = await handle.describe()
            except RPCError:
                continue
            if desc.status == WorkflowExecutionStatus.RUNNING:
                continue
            if desc.status == WorkflowExecutionStatus.FAILED:
                try:
                    await handle.result()
                except WorkflowFailureError as err:
                    cause = err.cause
                    if not isinstance(cause, ApplicationError) or cause.type not in reasons:
                        raise self.violation(f"claim {name} failed without a claim reason: {cause!r}") from err
                    if (await self.lab.status(name))["phase"] != "failed":
                        raise self.violation(f"claim {name}'s workflow failed but its phase is not failed") from err
            elif desc.status != WorkflowExecutionStatus.COMPLETED:
                raise self.violation(f"claim {name}'s workflow ended {desc.status}")
            self.checked_closed.add(name)

    async def settle(self, rounds: int = 8) -> None:
        """Let signals, activities and short retries play out: a few small time steps with the watchers pumped."""
        for _ in range(rounds):
            await self.lab.advance(2)
            await self.pump()
            await asyncio.sleep(0.02)

    def claim_faults_active(self) -> bool:
        return bool(self.lab.lab.emulator.faults)

    async def settle_and_check(self) -> None:
        """What holds once the cluster has had a moment: the truth of the claims against the group and resources."""
        await self.settle()
        for attempt in range(3):
            try:
                await self._eventual()
                return
            except Violation:
                if attempt == 2:
                    raise
                await self.settle(4)

    async def _eventual(self) -> None:
        claims = await self.open_claims()
        live = {n: s for n, s in claims.items() if s["phase"] in ("pending", "booting", "ready")}
        by_slot: Counter[str] = Counter(s["slot"] for s in live.values())
        two = [slot for slot, n in by_slot.items() if n > 1]
        if two:
            raise self.violation(f"two live claims on slots {two}: {sorted(live)}")
        wanted = sum(1 for s in live.values() if not s["marked"])
        # A failed claim's errored instance stays in the target until cluster-autoscaler deletes it (the group's
        # `target-counts-errored-instances`, issue 21): the target is the unmarked live claims and those.
        errored = sum(1 for i in await self.lab.group().query(GroupWorkflow.instances) if i.error_code)
        target = await self.lab.group().query(GroupWorkflow.target_size)
        if wanted + errored != target:
            raise self.violation(
                f"the group's target is {target}, but {wanted} live claims are unmarked and {errored} instances errored"
            )
        if self.claim_faults_active():
            return  # a projection may be held back by the fault; checked again once it is gone
        resources = self.resources()
        for name, st in claims.items():
            res = resources.get(name)
            if res is not None and (res.get("status") or {}).get("phase") not in (None, st["phase"]):
                raise self.violation(
                    f"claim {name}: the resource says {res['status'].get('phase')}, the workflow {st['phase']}"
                )
        now = await self.lab.env.get_current_time()
        for name, st in live.items():
            deadline = _time(st.get("deadlineAt"))
            if st["phase"] in ("pending", "booting") and deadline and now > deadline + timedelta(minutes=2):
                raise self.violation(f"claim {name} is still {st['phase']} past its deadline {deadline}")

    async def quiet_and_check(self) -> None:
        """Every fault cleared, a quiet spell: then every machine's power agrees with the law, and keeps agreeing.

        The spell lasts until the law has held for `QUIET_HOLD` (at most `QUIET`: longer is a violation), so a
        slot still paused by a spent shutdown streak, or a claim still inside its deadline, has time to settle.
        """
        self.log.append("quiet")
        self.lab.lab.emulator.faults.clear()
        self.refusing_jobs = None
        for slot in SLOTS:
            for fault in FAULTS:
                self.lab.lab.set_fault(slot, fault, False)
        await self.restore_slots()
        spent, held_since = timedelta(), None
        while True:
            await self.lab.advance(600)
            await self.pump()
            spent += timedelta(seconds=600)
            await self.settle(2)
            problem = await self.law_disagreement()
            if problem is None:
                held_since = held_since or spent
                if spent - held_since >= QUIET_HOLD:
                    break
            else:
                held_since = None
                if spent >= QUIET:
                    raise self.violation(f"after {spent} of quiet: {problem}")
        await self.settle_and_check()
        await self.check_closed()
        await self.check_no_failed_tasks()
        await self.check_records()

    async def check_records(self) -> None:
        """Once quiet, every claim resource agrees with what its machine did, and no Event stands beside a write
        that did not land (whatever workflows were lost on the way)."""
        events = self.lab.events()
        found = []
        for claim in self.resources().values():
            slot = str(claim["spec"].get("node") or "")
            found += records.events_without_their_write(claim, events)
            found += records.record_disagreements(claim, self.lab.lab.power(slot) if slot in SLOTS else None)
        if found:
            raise self.violation("claim resources disagree with their machines or Events:\n  " + "\n  ".join(found))

    async def law_disagreement(self) -> str | None:
        """Where a machine's power disagrees with the law (on exactly when a settled live claim wants it), if any."""
        claims = await self.open_claims()
        for slot in SLOTS:
            power = self.lab.lab.power(slot)
            owners = [
                n for n, s in claims.items() if s["slot"] == slot and s["phase"] in ("pending", "booting", "ready")
            ]
            if owners and any(claims[n]["phase"] != "ready" or claims[n]["marked"] for n in owners):
                return f"slot {slot} still has an unsettled claim: {owners}"
            if (power == "on") != bool(owners):
                return f"slot {slot}'s machine is {power} with live claims {owners}\n{await self.picture(slot)}"
        # The group's books agree with what runs: a slot it holds busy with a release has one running.
        books = (await self.lab.snapshot())["slots"]
        for slot in SLOTS:
            live = {
                n for n, st in claims.items() if st["slot"] == slot and st["phase"] in ("pending", "booting", "ready")
            }
            if books[slot]["liveClaim"] and books[slot]["liveClaim"] not in live:
                return f"the group holds {books[slot]['liveClaim']} live on slot {slot}, its workflow does not\n" + (
                    await self.picture(slot)
                )
            if books[slot]["releasing"]:
                handle = self.lab.client.get_workflow_handle(c.release_workflow_id(NS, slot))
                try:
                    status = (await handle.describe()).status
                except RPCError:
                    status = None
                if status != WorkflowExecutionStatus.RUNNING:
                    return f"slot {slot} is held releasing with no release running\n{await self.picture(slot)}"
        return None

    async def picture(self, slot: str) -> str:
        """What every party says about one slot: for the failure message, so a report needs no rerun to read."""
        snap = await self.lab.snapshot()
        mine = {n: d for n, d in snap["claims"].items() if d.get("slot") == slot}
        res = self.lab.lab.call(lambda h: h.emulator.get_object(CRD, "nodes", NS, slot))
        node = self.lab.node(slot)
        release = self.lab.client.get_workflow_handle(c.release_workflow_id(NS, slot))
        try:
            rel = f"{(await release.describe()).status}"
        except RPCError as err:
            rel = f"none ({err.status})"
        jobs = [(j["metadata"]["name"], _job_state(j)) for j in self.lab.jobs(slot)]
        history = self.lab.lab.call(lambda h: [f"{e.what}({e.detail})" for e in h.history if e.slot == slot])
        node_deletes = sum(
            1 for r in self.lab.lab.emulator.requests if r.plural == "nodes" and r.verb == "delete" and r.name == slot
        )
        return (
            f"  group claims on {slot}: {mine}\n  slot status: {(res or {}).get('status')}\n"
            f"  node: {(node or {}).get('status', {}).get('conditions') if node else None}"
            f" (deleted by the operator {node_deletes}x; the writer deleted {self.watchers.writer.deleted_nodes})\n"
            f"  release workflow: {rel}\n  jobs: {jobs}\n  machine: {history}"
        )

    async def check_no_failed_tasks(self) -> None:
        """No workflow task of any workflow here ever failed (a failing task is a workflow stuck on bad data)."""
        failed = await self.failed_task()
        if failed:
            raise self.violation(failed)

    async def holding(self) -> str:
        """The workflows with a workflow task or an activity pending: what may hold the test server's clock."""
        found = []
        for wid in self.workflow_ids():
            try:
                desc = (await self.lab.client.get_workflow_handle(wid).describe()).raw_description
            except RPCError:
                continue
            activities = [f"{a.activity_type.name} (attempt {a.attempt})" for a in desc.pending_activities]
            task = desc.pending_workflow_task.state if desc.HasField("pending_workflow_task") else 0
            if activities or task:
                found.append(f"{wid}: workflow task state {task}, activities {activities}")
        return "pending: " + ("; ".join(found) or "nothing the model knows of")

    async def failed_task(self) -> str | None:
        """The first failed workflow task of any workflow here, with its workflow's id; None when there is none."""
        ids = [c.group_workflow_id(NS, "g")]
        ids += [c.claim_workflow_id(NS, n) for n in sorted(self.claims)]
        ids += [c.release_workflow_id(NS, s) for s in SLOTS]
        for wid in ids:
            try:
                history = await self.lab.client.get_workflow_handle(wid).fetch_history()
            except RPCError:
                continue
            failed = [
                e
                for e in history.events
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
                and e.workflow_task_failed_event_attributes.cause not in BENIGN_TASK_FAILURES
            ]
            if failed:
                return f"{wid}: a workflow task failed: {failed[0].workflow_task_failed_event_attributes}"
        return None


def _matching(plural: str, verb: str) -> Callable[[RequestInfo], bool]:
    return lambda r: r.plural == plural and r.verb == verb


def _job_state(job: dict[str, Any]) -> str:
    conds = [x["type"] for x in (job.get("status") or {}).get("conditions") or [] if x.get("status") == "True"]
    return ",".join(conds) or "running"


def _rfc3339(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


class Inconclusive(Exception):
    """An example the time-skipping server broke (tests.lab.TestServerRefusals): neither a pass nor a failure."""


def _inconclusive_if_refused(seed: int, refused_before: int, err: BaseException, cause: str) -> None:
    """A failure after the test server refused a workflow task's completion, with no failed workflow task to
    explain it, is that server's (the stranded workflow answers no Query again, and its task holds the clock), not
    the operator's."""
    if (cause and not isinstance(err, ClockStalled)) or len(REFUSALS.seen) <= refused_before:
        return
    first = (str(err) or repr(err)).splitlines()[0]
    raise Inconclusive(
        f"seed {seed}: the time-skipping server refused a workflow task's completion "
        f"({REFUSALS.seen[refused_before]}); what failed after it: {first}"
    )


async def _failing(model: Model, err: BaseException) -> str:
    """A workflow task failing on every try explains a Query or a wait that timed out better than the timeout; a
    stalled clock is explained by what holds it."""
    try:
        if isinstance(err, ClockStalled):
            return "\n" + await asyncio.wait_for(model.holding(), 60)
        found = await asyncio.wait_for(model.failed_task(), 60)
    except Exception as failed:  # the report is a diagnosis: its own failure must not hide the example's
        return f"\n(the workflows could not be read for a diagnosis: {failed!r})"
    return f"\nbecause {found}" if found else ""


def dump_tasks() -> None:
    """What every task of the test awaits, innermost last (`kill -USR1 <pid>` of a soak that seems stuck)."""
    for task in asyncio.all_tasks():
        chain: list[str] = []
        coro: Any = task.get_coro()
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is not None:
                chain.append(f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}")
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        if any("/tests/" in line for line in chain):
            print(f"task {task.get_name()}:\n  " + "\n  ".join(chain), flush=True)


async def run_example(seed: int, steps: int) -> Counter[str]:
    """One example: a fresh homelab, `steps` random steps from `seed`, then the quiet check; the steps' tally."""
    rng = random.Random(seed)
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)
    doc = homelab([{"name": s} for s in SLOTS], maxSize=MAX_SIZE)
    # One example in three restarts its worker. It runs with no workflow cache: every workflow task replays its
    # whole history, so a restarted worker meets no sticky queue of the one before (the test server never moves a
    # task off a dead one), and every step is a replay test as well. Replaying that much is slow in the sandbox,
    # which re-imports the workflow modules for every task; its guard (no I/O, no clocks in workflow code) is
    # checked statically by tests/test_hygiene.py, so it is left off there.
    restarts = rng.random() < 1 / 3
    cache, sandboxed = (0, False) if restarts else (1000, True)
    refused_before = len(REFUSALS.seen)
    # Two workers on the queue, as two worker processes would poll it: a restart restarts one, the other carries on.
    async with open_lab(
        doc,
        kube_timeout=KUBE_TIMEOUT,
        cached_workflows=cache,
        sandboxed=sandboxed,
        runtime=refusal_watching_runtime(),
        workers=WORKERS,
    ) as lab:
        watchers = Watchers(lab.kube, Signals(lab.client), namespaces=[NS])
        lab.settle_after_skip = 0.1  # see Lab.settle_after_skip: the driver signals right after every skip
        model = Model(lab, watchers, rng, restarts=restarts)
        model.log.append(f"worker restarts: {'yes' if restarts else 'no'}")
        try:
            await model.run(steps)
        except Exception as err:  # anything, not only a Violation, is a failure of the system: say where it was
            cause = await _failing(model, err)
            _inconclusive_if_refused(seed, refused_before, err, cause)
            if isinstance(err, Violation):
                raise Violation(f"seed {seed}: {err}{cause}") from None
            raise model.violation(f"seed {seed}: {err!r}{cause}") from err
        finally:
            watchers.close()
        return model.stats
