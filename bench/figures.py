"""The four figures of issue 14. Each starts its own homelab and operator (own namespace, own task queue) on the
shared Temporal server, takes its floor on that server first, and stops what it started, also on failure."""

from __future__ import annotations

import asyncio
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from homelab_sim.emulator import RequestInfo
from temporalio.client import Client, WorkflowExecutionStatus

from api import contracts as c
from api.names import ClaimPhase, JobType
from bench import floors
from bench import moves as claim_tasks
from bench.idle import layers as idle_layers
from bench.lab import LEASE_RENEW_SECONDS, World, homelab_doc
from bench.procs import (
    Proc,
    bounded,
    cpu_seconds,
    peak_rss_mb,
    rss_mb,
    self_cpu_seconds,
    thread_cpu_ticks,
    wait_until,
)
from bench.report import Report, Row, ms, percentile
from bench.stack import Stack
from bench.stages import p1_stages
from bench.tasks import TaskTrouble, task_trouble
from bench.trivial import OneActivity
from homelab_autoscaler.settings import WorkerSettings
from proto import externalgrpc_pb2 as pb
from workflows.registry import WORKFLOWS

ECHO_CALLS = 1000
# Issue 34's idle goals for a homelab's few slots.
IDLE_RSS_GOAL_MB = 100.0
IDLE_CPU_GOAL_S_PER_H = 10.0


@dataclass
class Sizes:
    p1_claims: int = 20
    p2_slots: int = 50
    p3_groups: int = 4
    p3_slots: int = 25
    p3_calls: int = 100
    idle_seconds: float = 30.0
    p1_boot_spread: tuple[float, float] = (20.0, 80.0)  # P1 staggered: kubelets up this many seconds after their Job
    p5_slots: tuple[int, ...] = (3, 100)
    # P5's window at the fewest slots, where the CPU goal is read: one clock tick is 1.2 CPU s/h over 30 s, an eighth
    # of the goal; over 120 s, 0.3.
    p5_goal_seconds: float = 120.0

    def wait_for(self, claims: int) -> float:
        """A generous bound for `claims` claims to move (the claims' own polls are 10-30 s)."""
        return 180.0 + 2.0 * claims


@dataclass(frozen=True)
class Idle:
    """CPU s/h at rest in one window: the operator, its two floors, and the operator's clock ticks by thread kind."""

    operator: float
    bare_worker: float
    grpc_server: float
    threads: dict[str, int]


@dataclass
class Burst:
    """One P2 burst: its worker processes, wall seconds, CPU seconds per process meanwhile, the server's share."""

    workers: int
    wall: float
    cpu: dict[str, float]
    server_cpu: float
    peak: float
    idle_mb: float

    def cores(self) -> str:
        """Where the cores went: each process's CPU seconds, and the share of what the machine had meanwhile."""
        have = self.wall * (os.cpu_count() or 1)
        used = sum(self.cpu.values())
        each = ", ".join(f"{name} {sec:.1f} s" for name, sec in self.cpu.items())
        return f"{each}; {used:.1f} of {have:.1f} core-seconds ({100 * used / have:.0f}%)"


@dataclass(frozen=True)
class Rest:
    """A Temporal server at rest beside an operator of `slots` slots, over `seconds`: its memory and CPU."""

    slots: int
    seconds: float
    mb: float
    cpu_s_per_h: float


class Figures:
    """The figures on one Temporal server. The dev server's rows are named as they always were; on another server
    (`on`, e.g. "PostgreSQL", with `server_pids` its processes) each row says so after its figure's number, and its
    worlds' tags end in `tag`."""

    def __init__(
        self,
        client: Client,
        temporal: str,
        workdir: Path,
        sizes: Sizes,
        report: Report,
        temporal_pid: int = 0,
        *,
        on: str = "",
        server_pids: tuple[int, ...] = (),
        tag: str = "",
    ) -> None:
        self.client, self.temporal, self.dir, self.sizes, self.report = client, temporal, workdir, sizes, report
        self.temporal_pid = temporal_pid  # the dev server's, for its CPU time (0: not measured)
        self.on, self.tag = on, tag
        # Every process of the server (those that ended counted too: PostgreSQL's autovacuum workers)
        self.server_pids = server_pids or ((temporal_pid,) if temporal_pid else ())
        self.trouble: dict[str, TaskTrouble] = {}
        self.rest: Rest | None = None  # P5: the server at rest at the fewest slots
        self.p1_lat: list[float] = []  # P1: Ready → claim ready stored, per claim
        self.p2_walls: tuple[float, float] | None = None  # P2: the floor's seconds and the one-worker burst's

    def server_cpu(self) -> float:
        return sum(cpu_seconds(pid, reaped=True) for pid in self.server_pids)

    def name(self, figure: str) -> str:
        """`P1 reaction, …` on the dev server; `P1 on PostgreSQL: reaction, …` on another."""
        if not self.on:
            return figure
        head, rest = figure.split(" ", 1)
        return f"{head} on {self.on}: {rest}"

    def add(self, row: Row) -> None:
        self.report.add(Row(self.name(row.figure), row.measured, row.floor, row.ratio, row.goal, row.values, self.on))

    async def world(
        self,
        tag: str,
        groups: int,
        per_group: int,
        *,
        instant: bool,
        boot_spread: tuple[float, float] | None = None,
        workers: int = 1,
    ) -> World:
        tag += self.tag
        doc = homelab_doc(f"bench-{tag}", groups, per_group, instant=instant, boot_spread=boot_spread)
        world = World(self.dir, self.temporal, tag, doc, time_scale=0.0 if instant else 1.0, workers=workers)
        try:
            return await world.start()
        except BaseException:
            await world.close()
            raise

    async def done(self, world: World) -> None:
        try:
            self.trouble[world.tag] = await bounded(
                task_trouble(self.client, world.task_queue),
                timeout=300,
                what=f"the histories of {world.tag}'s workflows",
            )
        except TimeoutError as exc:
            self.report.notes.append(f"{world.tag}: workflow tasks not counted: {exc}")
        await world.close()
        for proc in world.processes():
            self.report.processes[proc.name] = proc.peak_mb
        if world.retried_reads:
            self.report.notes.append(
                f"{world.tag}: {len(world.retried_reads)} untimed reads answered late and were asked again: "
                + ", ".join(sorted(set(world.retried_reads)))
            )
        if world.late_increases:
            self.report.notes.append(
                f"{world.tag}: IncreaseSize overran cluster-autoscaler's deadline (applied anyway, not retried): "
                + ", ".join(world.late_increases)
            )

    async def scale_up(self, world: World, n: int) -> None:
        """IncreaseSize on every group at once, `n` slots in all, spread evenly."""
        groups = world.group_names
        shares = [n // len(groups) + (1 if i < n % len(groups) else 0) for i in range(len(groups))]
        await bounded(
            asyncio.gather(*(world.increase(g, d) for g, d in zip(groups, shares, strict=True) if d)),
            timeout=self.sizes.wait_for(n),
            what=f"IncreaseSize of {n} over {len(groups)} groups",
        )

    async def ready(self, world: World, n: int) -> None:
        await wait_until(
            lambda: len(world.recorder.claims_in(ClaimPhase.READY)) >= n,
            timeout=self.sizes.wait_for(n),
            what=f"{n} claims of {world.tag} to be stored ready",
            every=0.05,
        )

    # --- P1 ----------------------------------------------------------------------------------------------------
    async def p1(self) -> None:
        n = self.sizes.p1_claims
        print(f"P1: signal floors ({n} at once), then {n} claims booting in real time", flush=True)
        self.floors_p1 = await floors.signal_latencies(self.client, n, self.sizes.wait_for(n))
        lat = self.p1_lat = await self.reaction("p1", n, None)
        self.p1_rows(
            f"P1 reaction, Ready → claim ready stored, {n} in flight", lat, n, "p99 ≤ 1.2× the two-activity floor's"
        )

    async def p1s(self) -> None:
        """P1 with the boots staggered: every Ready lands while most claims are still booting."""
        n, spread = self.sizes.p1_claims, self.sizes.p1_boot_spread
        print(f"P1 staggered: {n} claims whose machines come up {spread[0]:.0f}-{spread[1]:.0f} s after their Job",
              flush=True)  # fmt: skip
        if not hasattr(self, "floors_p1"):
            self.floors_p1 = await floors.signal_latencies(self.client, n, self.sizes.wait_for(n))
        lat = await self.reaction("p1s", n, spread)
        self.p1_rows(f"P1 staggered, Ready → claim ready stored, {n} claims up {spread[0]:.0f}-{spread[1]:.0f} s "
                     "after their Job", lat, n, "p99 ≤ 1.2× the two-activity floor's, and ≤ 2 s")  # fmt: skip

    async def reaction(self, tag: str, n: int, spread: tuple[float, float] | None) -> list[float]:
        """Ready stored → claim ready stored, per claim, for `n` claims scaled up at once."""
        groups = min(10, n)
        world = await self.world(tag, groups, math.ceil(n / groups), instant=False, boot_spread=spread)
        try:
            await self.scale_up(world, n)
            await wait_until(
                lambda: len(world.recorder.claims_in(ClaimPhase.READY)) >= n,
                timeout=self.sizes.wait_for(n) + (spread[1] if spread else 0.0),
                what=f"{n} claims of {world.tag} to be stored ready",
                every=0.05,
            )
            rec = world.recorder
            lat = []
            ready: dict[str, float] = {}
            for claim in rec.claims_in(ClaimPhase.READY):
                node_ready = rec.node_ready.get(rec.slot_of[claim])
                claim_ready = rec.first(claim, ClaimPhase.READY)
                if node_ready is not None and claim_ready is not None:
                    lat.append(claim_ready - node_ready)
                    ready[claim] = node_ready
            jobs = {claim: rec.job_complete.get(c.job_name(claim, JobType.STARTUP, 1)) for claim in ready}
            stages = await bounded(
                p1_stages(self.client, world.namespace, ready, jobs),
                timeout=self.sizes.wait_for(n),
                what=f"the histories of {len(ready)} claims",
            )
            self.report.notes.append(stages.note().replace("p1 stages:", f"{world.tag} stages:", 1))
        finally:
            await self.done(world)
        if len(lat) < n:
            self.report.notes.append(
                f"{tag}{self.tag}: {n - len(lat)} of {n} ready claims had no Ready Node on record (left out)"
            )
        return lat

    def p1_rows(self, figure: str, lat: list[float], n: int, goal: str) -> None:
        handled, two = self.floors_p1
        p50, p99 = percentile(lat, 50), percentile(lat, 99)
        values = {"claims": n, "samples": len(lat), "p50_s": p50, "p99_s": p99, "max_s": max(lat)}
        for label, floor in (("signal → handled", handled), ("signal → two trivial activities done", two)):
            f99 = percentile(floor, 99)
            self.add(
                Row(
                    f"{figure}, vs {label}",
                    f"p50 {ms(p50)}, p99 {ms(p99)}",
                    f"{label} p99 {ms(f99)} (p50 {ms(percentile(floor, 50))})",
                    p99 / f99,
                    goal,
                    {**values, "floor_p50_s": percentile(floor, 50), "floor_p99_s": f99},
                )
            )

    # --- P2 ----------------------------------------------------------------------------------------------------
    async def p2(self, *, two_workers: bool = True) -> None:
        """The burst with one worker process, its floor and the server's CPU per claim; with `two_workers`, the same
        burst again with a worker process beside the operator, and the operator's memory."""
        n = self.sizes.p2_slots
        where = f" on {self.on}" if self.on else ""
        print(f"P2{where}: floor of {n} one-activity workflows, then a burst of {n} slots in {min(10, n)} groups with "
              f"one worker process{', then with two' if two_workers else ''}", flush=True)  # fmt: skip
        cpu_before = self.server_cpu()
        floor, _ = await floors.one_activity_burst(self.client, n, self.sizes.wait_for(n))
        floor_cpu = self.server_cpu() - cpu_before
        one = await self.burst("p2", n, workers=1)
        two = await self.burst("p2w2", n, workers=2) if two_workers else None
        self.p2_walls = (floor, one.wall)
        if self.server_pids:
            per, floor_per = one.server_cpu / n, floor_cpu / n
            self.add(
                Row(
                    f"P2 Temporal server CPU per claim{' (temporal-server and postgres)' if self.on else ''}, "
                    f"IncreaseSize → ready, burst of {n}",
                    f"{ms(per)} ({one.server_cpu:.1f} s / {n})",
                    f"one-activity workflow {ms(floor_per)} ({floor_cpu:.1f} s / {n})",
                    per / floor_per if floor_per else math.inf,
                    "≤ 3× the floor's",
                    {"server_cpu_s": one.server_cpu, "floor_server_cpu_s": floor_cpu, "claims": n},
                )
            )
        for burst, label in ((one, "one worker process"), (two, "two worker processes")):
            if burst is None:
                continue
            self.add(
                Row(
                    f"P2 burst, IncreaseSize → all {n} ready (instant machines), {label}",
                    f"{ms(burst.wall)}; CPU {burst.cores()}",
                    f"{n} one-activity workflows {ms(floor)}",
                    burst.wall / floor,
                    "≤ 2.5× floor",
                    {"slots": n, "wall_s": burst.wall, "floor_s": floor, "cpu_s": burst.cpu, "workers": burst.workers},
                )
            )
        if two is None:
            return
        self.add(
            Row(
                f"P2 burst of {n} with two worker processes vs one (same run, same Temporal)",
                f"{ms(two.wall)} with two",
                f"{ms(one.wall)} with one",
                two.wall / one.wall,
                "≤ 0.7×",
                {"two_s": two.wall, "one_s": one.wall},
            )
        )
        self.report.notes.append(f"p2w2: workflow tasks by worker process: {self.trouble['p2w2'].spread()}"
                                 if "p2w2" in self.trouble else "p2w2: workflow tasks not counted")  # fmt: skip
        self.add(
            Row(
                f"P2 operator memory, peak over the burst of {n}",
                f"{one.peak:.0f} MB",
                f"same process idle before the burst {one.idle_mb:.0f} MB",
                one.peak / one.idle_mb,
                "≤ 300 MB at 1,000",
                {"peak_mb": one.peak, "idle_mb": one.idle_mb},
            )
        )

    async def burst(self, tag: str, n: int, *, workers: int) -> Burst:
        """IncreaseSize of `n` slots over up to 10 groups of instant machines, until every claim is stored ready;
        the wall time and the CPU each process spent meanwhile."""
        groups = min(10, n)
        world = await self.world(tag, groups, math.ceil(n / groups), instant=True, workers=workers)
        try:
            idle_mb = world.operator_rss_mb()
            procs = world.processes()
            began = time.time()
            cpu_before = {p.name: cpu_seconds(p.pid) for p in procs}
            server_before, bench_before = self.server_cpu(), self_cpu_seconds()
            await self.scale_up(world, n)
            await self.ready(world, n)
            cpu = {p.name: cpu_seconds(p.pid) - cpu_before[p.name] for p in procs}
            server = self.server_cpu() - server_before
            if self.server_pids:
                cpu["Temporal server" if not self.on else f"Temporal on {self.on}"] = server
            cpu["bench (simulated homelab, driver)"] = self_cpu_seconds() - bench_before
            last = max(
                t for cl in world.recorder.claims_in(ClaimPhase.READY) if (t := world.recorder.first(cl, "ready"))
            )
            peak = peak_rss_mb(world.operator.pid)
        finally:
            await self.done(world)
        return Burst(workers, last - began, cpu, server, peak, idle_mb)

    # --- P3 ----------------------------------------------------------------------------------------------------
    async def p3(self) -> None:
        g, s, k = self.sizes.p3_groups, self.sizes.p3_slots, self.sizes.p3_calls
        print(f"P3: {k} calls each at {g} groups × {s} slots, and a gRPC echo", flush=True)
        async with floors.echo_server() as port:
            echo = await floors.echo_latencies(port, max(k, ECHO_CALLS))  # cheap: a steadier p99
        world = await self.world("p3", g, s, instant=False)
        try:
            st = world.stub
            groups = world.group_names
            calls: dict[str, Callable[[int], Awaitable[Any]]] = {
                "NodeGroups": lambda i: st.NodeGroups(pb.NodeGroupsRequest(), timeout=30),
                "NodeGroupTargetSize": lambda i: st.NodeGroupTargetSize(
                    pb.NodeGroupTargetSizeRequest(id=groups[i % len(groups)]), timeout=30
                ),
                "NodeGroupNodes": lambda i: st.NodeGroupNodes(
                    pb.NodeGroupNodesRequest(id=groups[i % len(groups)]), timeout=30
                ),
                "Refresh": lambda i: st.Refresh(pb.RefreshRequest(), timeout=30),
            }
            measured: dict[str, list[float]] = {}
            for name, call in calls.items():
                lat = []
                for i in range(k):
                    if name == "NodeGroups":  # as cluster-autoscaler's loop asks it: right after a Refresh
                        await st.Refresh(pb.RefreshRequest(), timeout=30)
                    began = time.perf_counter()
                    await call(i)
                    lat.append(time.perf_counter() - began)
                measured[name] = lat
        finally:
            await self.done(world)
        e50, e99 = percentile(echo, 50), percentile(echo, 99)
        for name, lat in measured.items():
            p50, p99 = percentile(lat, 50), percentile(lat, 99)
            label = "NodeGroups after Refresh" if name == "NodeGroups" else name
            self.report.add(
                Row(
                    f"P3 {label}, {g} groups × {s} slots, {k} calls",
                    f"p50 {ms(p50)}, p99 {ms(p99)}",
                    f"gRPC echo p50 {ms(e50)}, p99 {ms(e99)} ({len(echo)} calls)",
                    p99 / e99,
                    "p99 ≤ 20 ms",
                    {"p50_s": p50, "p99_s": p99, "echo_p50_s": e50, "echo_p99_s": e99, "calls": k},
                )
            )

    # --- P4 ----------------------------------------------------------------------------------------------------
    async def p4(self) -> None:
        idle = self.sizes.idle_seconds
        print(f"P4: one full lifecycle, its history and API writes, then {idle:.0f} s idle", flush=True)
        _, floor_id = await floors.one_activity_burst(self.client, 1, 60)
        floor_history = await floors.history_events(self.client, floor_id)
        floor_events, floor_tasks = len(floor_history), claim_tasks.tasks(floor_history)
        world = await self.world("p4", 1, 1, instant=False)
        try:
            before = len(world.writes())
            await self.scale_up(world, 1)
            await self.ready(world, 1)
            (claim,) = world.recorder.claims_in(ClaimPhase.READY)
            nodes = await world.stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id="g0"), timeout=30)
            doomed = [pb.ExternalGrpcNode(providerID=i.id, name=i.id) for i in nodes.instances]
            await world.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id="g0", nodes=doomed), timeout=30)
            handle = self.client.get_workflow_handle(c.claim_workflow_id(world.namespace, claim))

            async def closed() -> bool:
                return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING

            end = time.monotonic() + self.sizes.wait_for(1)
            while not await closed():
                if time.monotonic() > end:
                    raise TimeoutError(f"waited for claim {claim}'s workflow to close after NodeGroupDeleteNodes")
                await asyncio.sleep(0.2)
            await wait_until(
                lambda: world.recorder.claims_in(ClaimPhase.COMPLETED) == [claim],
                timeout=30,
                what=f"claim {claim} to be stored completed",
            )
            await asyncio.sleep(3.0)  # the slot and group reports trail the claim
            lifecycle = world.writes()[before:]
            moves = len(world.recorder.phases[claim])
            claim_moves = claim_tasks.moves(await floors.history_events(self.client, handle.id))
            events = claim_moves.events
            replay = await floors.replay_seconds(self.client, handle.id, WORKFLOWS)
            floor_replay = await floors.replay_seconds(self.client, floor_id, [OneActivity])
            bare_replay = await floors.replay_seconds(self.client, handle.id, WORKFLOWS, sandboxed=False)
            mark = len(world.writes())
            await asyncio.sleep(idle)
            idle_writes = world.writes()[mark:]
        finally:
            await self.done(world)

        def by_plural(reqs: list[RequestInfo]) -> dict[str, int]:
            return dict(Counter(_kind(r) for r in reqs))

        def lease(r: RequestInfo) -> bool:
            return r.plural == "leases"

        claim_writes = [r for r in lifecycle if not lease(r)]
        idle_leases = sum(1 for r in idle_writes if lease(r))
        per_minute = 60.0 / idle
        boot = claim_moves.upto(ClaimPhase.READY)
        self.report.add(
            Row(
                "P4 workflow tasks per boot (claim started → ready)",
                f"{boot} tasks",
                f"one-activity workflow {floor_tasks} tasks",
                boot / floor_tasks,
                "≤ 3 tasks",
                {"tasks": boot, "floor_tasks": floor_tasks},
            )
        )
        self.report.add(
            Row(
                "P4 workflow tasks per lifecycle (up → ready → down → completed)",
                f"{claim_moves.total} tasks ({claim_moves.text()})",
                f"one-activity workflow {floor_tasks} tasks",
                claim_moves.total / floor_tasks,
                "measured",
                {"tasks": claim_moves.total, "per_move": claim_moves.tasks, "close": claim_moves.after,
                 "floor_tasks": floor_tasks},
            )
        )  # fmt: skip
        self.report.add(
            Row(
                "P4 history events per lifecycle (up → ready → down → completed)",
                f"{events} events",
                f"one-activity workflow {floor_events} events",
                events / floor_events,
                "≤ 80 events",
                {"events": events, "floor_events": floor_events},
            )
        )
        self.report.add(
            Row(
                "P4 replay of a lifecycle's history (what an evicted claim costs at its next task)",
                ms(replay),
                f"one-activity workflow {ms(floor_replay)}",
                replay / floor_replay,
                "≤ 2× floor (the price of a bounded cache)",
                {"replay_s": replay, "floor_replay_s": floor_replay},
            )
        )
        self.report.add(
            Row(
                "P4 replay of the same history without the sandbox (what stops the goal above)",
                f"{ms(bare_replay)}: the sandbox adds {ms(replay - bare_replay)} to each replay",
                f"one-activity workflow, sandboxed {ms(floor_replay)}",
                bare_replay / floor_replay,
                "printed",
                {"unsandboxed_replay_s": bare_replay, "sandbox_share_s": replay - bare_replay},
            )
        )
        self.report.add(
            Row(
                "P4 API writes per claim phase move",
                f"{len(claim_writes) / moves:.2f} ({len(claim_writes)} writes / {moves} moves, Lease excluded)",
                "1 (the status write that stores the phase)",
                len(claim_writes) / moves,
                "≤ 5",
                {"writes": len(claim_writes), "moves": moves, "by_kind": by_plural(claim_writes)},
            )
        )
        kinds = sorted(by_plural(claim_writes).items(), key=lambda kv: (-kv[1], kv[0]))
        self.report.notes.append("p4 writes in the lifecycle: " + ", ".join(f"{k} {n}" for k, n in kinds))
        total = len(idle_writes) * per_minute
        others = len(idle_writes) - idle_leases
        expected = 60.0 / LEASE_RENEW_SECONDS
        self.report.add(
            Row(
                f"P4 API writes in an idle minute (measured over {idle:.0f} s)",
                f"{total:.1f}/min ({idle_leases * per_minute:.1f} Lease, {others * per_minute:.1f} other)",
                f"Lease renewals only, every {LEASE_RENEW_SECONDS:.0f} s: {expected:.0f}/min",
                total / expected,
                "only the Lease",
                {"writes_per_minute": total, "idle_seconds": idle, "by_kind": by_plural(idle_writes)},
            )
        )

    # --- P5 ----------------------------------------------------------------------------------------------------
    async def p5(self) -> None:
        """The idle footprint: what a homelab at rest costs, at a few slots and at many; at the fewest, the
        operator's memory and CPU against issue 34's goals, beside a bare Temporal worker at rest in the same
        window, and where the memory goes."""
        fewest = min(self.sizes.p5_slots)
        for slots in self.sizes.p5_slots:
            idle = self.sizes.idle_seconds
            if slots == fewest:
                idle = max(idle, self.sizes.p5_goal_seconds)
            print(f"P5: {slots} slots at rest for {idle:.0f} s", flush=True)
            groups = max(1, min(10, slots // 10))
            world = await self.world(f"p5-{slots}", groups, math.ceil(slots / groups), instant=True)
            # The floors start once the world's ports are bound: each binds a port the kernel picks, which could be
            # one the world had picked and not bound yet (an operator refused its health port that way).
            bare = self.bare_worker(f"p5-{slots}") if slots == fewest else None
            grpc_alone = self.idle_grpc_server(f"p5-{slots}") if slots == fewest else None
            try:
                await asyncio.sleep(min(20.0, idle))  # the first sync's reports and the group reloads settle
                op_cpu, server_cpu, seen = cpu_seconds(world.operator.pid), self.server_cpu(), len(world.requests())
                bare_cpu = cpu_seconds(bare.pid) if bare else 0.0
                grpc_cpu = cpu_seconds(grpc_alone.pid) if grpc_alone else 0.0
                threads = thread_cpu_ticks(world.operator.pid)
                await asyncio.sleep(idle)
                threads = {k: n - threads.get(k, 0) for k, n in thread_cpu_ticks(world.operator.pid).items()}
                op_cpu = cpu_seconds(world.operator.pid) - op_cpu
                server_cpu = self.server_cpu() - server_cpu
                bare_cpu = cpu_seconds(bare.pid) - bare_cpu if bare else 0.0
                grpc_cpu = cpu_seconds(grpc_alone.pid) - grpc_cpu if grpc_alone else 0.0
                requests = world.requests()[seen:]
                op_mb = world.operator_rss_mb()
                bare_mb = rss_mb(bare.pid) if bare else 0.0
                server_mb = rss_mb(self.temporal_pid) if self.temporal_pid else 0.0
                if slots == fewest:
                    self.rest = Rest(slots, idle, server_mb, server_cpu * 3600.0 / idle)
            finally:
                for floor in (bare, grpc_alone):
                    if floor is not None:
                        floor.stop()
                        self.report.processes[floor.name] = floor.peak_mb
                await self.done(world)
            per_hour = 3600.0 / idle
            kinds = Counter(_kind(r) for r in requests)
            lease = sum(n for k, n in kinds.items() if "leases" in k)
            others = {k: n for k, n in kinds.items() if "leases" not in k}
            self.report.add(
                Row(
                    f"P5 idle footprint, {slots} slots (measured over {idle:.0f} s)",
                    f"operator {op_mb:.0f} MB, {op_cpu * per_hour:.0f} CPU s/h; Temporal server {server_mb:.0f} MB, "
                    f"{server_cpu * per_hour:.0f} CPU s/h; API requests {len(requests) * 60 / idle:.1f}/min "
                    f"({lease * 60 / idle:.1f} Lease, {sum(others.values()) * 60 / idle:.1f} other)",
                    "Lease requests only",
                    len(requests) / lease if lease else math.inf,
                    "printed; nothing but the Lease and the liveness reads",
                    {"slots": slots, "operator_mb": op_mb, "operator_cpu_s_per_h": op_cpu * per_hour,
                     "server_mb": server_mb, "server_cpu_s_per_h": server_cpu * per_hour,
                     "requests_by_kind": dict(kinds)},
                )
            )  # fmt: skip
            if others:
                listed = ", ".join(f"{k} {n}" for k, n in sorted(others.items(), key=lambda kv: -kv[1]))
                self.report.notes.append(f"p5-{slots}: idle requests other than the Lease: {listed}")
            if bare is not None:
                cpu_h = Idle(op_cpu * per_hour, bare_cpu * per_hour, grpc_cpu * per_hour, threads)
                await self.idle_goals(slots, idle, op_mb, bare_mb, cpu_h)

    async def p5_stack(self, stack: Stack, dev: Rest | None) -> None:
        """The bundled stack at rest beside an operator of the fewest slots, over the window the dev server's P5
        measured at the fewest slots: temporal-server's RSS and PostgreSQL's (PSS over its processes: they share
        its buffers), the CPU of each; beside the dev server's from its own P5 of this run (`dev`, when it ran)."""
        slots = dev.slots if dev else min(self.sizes.p5_slots)
        idle = dev.seconds if dev else max(self.sizes.idle_seconds, self.sizes.p5_goal_seconds)
        print(f"P5 on {self.on}: the bundled stack at rest beside {slots} slots for {idle:.0f} s", flush=True)
        groups = max(1, min(10, slots // 10))
        world = await self.world(f"p5-{slots}", groups, math.ceil(slots / groups), instant=True)
        try:
            await asyncio.sleep(min(20.0, idle))  # as P5: the first sync's reports and the group reloads settle
            server_cpu, pg_cpu = stack.cpu_seconds()
            await asyncio.sleep(idle)
            server_after, pg_after = stack.cpu_seconds()
            server_mb, pg_mb, pg_processes = stack.memory()
            pg_rss = rss_mb(stack.pids()[1])
        finally:
            await self.done(world)
        per_hour = 3600.0 / idle
        server_h, pg_h = (server_after - server_cpu) * per_hour, (pg_after - pg_cpu) * per_hour
        values = {"slots": slots, "idle_seconds": idle, "server_mb": server_mb, "postgres_pss_mb": pg_mb,
                  "postgres_rss_summed_mb": pg_rss, "postgres_processes": pg_processes,
                  "server_cpu_s_per_h": server_h, "postgres_cpu_s_per_h": pg_h}  # fmt: skip
        if dev is not None:
            values |= {"dev_server_mb": dev.mb, "dev_server_cpu_s_per_h": dev.cpu_s_per_h}
        self.add(
            Row(
                f"P5 the bundled stack's memory at rest, {slots} slots (measured over {idle:.0f} s)",
                f"temporal-server {server_mb:.0f} MB + postgres {pg_mb:.0f} MB (PSS of its {pg_processes} processes)"
                f" = {server_mb + pg_mb:.0f} MB",
                f"dev server {dev.mb:.0f} MB (this run's P5)" if dev else "dev server not measured (--only)",
                (server_mb + pg_mb) / dev.mb if dev and dev.mb else math.inf,
                "printed",
                values,
            )
        )
        tick = per_hour / os.sysconf("SC_CLK_TCK")  # one clock tick in the window, in CPU s/h
        self.add(
            Row(
                f"P5 the bundled stack's CPU at rest, {slots} slots (measured over {idle:.0f} s)",
                f"temporal-server {server_h:.0f} + postgres {pg_h:.0f} = {server_h + pg_h:.0f} CPU s/h",
                f"dev server {dev.cpu_s_per_h:.0f} CPU s/h (this run's P5)" if dev else "dev server not measured",
                (server_h + pg_h) / max(dev.cpu_s_per_h, tick) if dev else math.inf,
                "printed",
                values,
            )
        )

    def idle_grpc_server(self, tag: str) -> Proc:
        """An idle gRPC server (bench.idle grpc), as the provider's: grpcio's threads at rest are part of the floor."""
        return Proc(
            f"idle gRPC server ({tag})", [sys.executable, "-m", "bench.idle", "grpc"], self.dir / f"grpc-{tag}.log"
        ).start()

    def bare_worker(self, tag: str) -> Proc:
        """A bare Temporal worker (bench.idle) on this server and a queue of its own: the floor of P5's goals."""
        tuning = WorkerSettings()
        return Proc(
            f"bare Temporal worker ({tag})",
            [
                sys.executable,
                "-m",
                "bench.idle",
                self.temporal,
                f"bench-{tag}-bare",
                str(tuning.task_pollers),
                str(tuning.workflow_task_slots),
                "autoscaling" if tuning.poller_autoscaling else "fixed",
            ],
            self.dir / f"bare-worker-{tag}.log",
        ).start()

    async def idle_goals(self, slots: int, idle: float, op_mb: float, bare_mb: float, cpu: Idle) -> None:
        """Issue 34's idle goals at `slots` slots: RSS and CPU against a bare worker (and, for CPU, an idle gRPC
        server) measured in the same window, the operator's memory by layer (imports in a fresh interpreter; the rest
        is what running holds) and its CPU by kind of thread."""
        layers = await asyncio.to_thread(idle_layers)
        imports = layers[-1].total_mb
        kube = next(layer for layer in layers if layer.name == "Kubernetes client")
        floor_mb = bare_mb + kube.added_mb
        self.report.add(
            Row(
                f"P5 operator RSS at rest, {slots} slots",
                f"{op_mb:.0f} MB",
                f"bare Temporal worker at rest {bare_mb:.0f} MB + the Kubernetes client's import {kube.added_mb:.0f} MB"
                f" = {floor_mb:.0f} MB",
                op_mb / floor_mb,
                f"≤ {IDLE_RSS_GOAL_MB:.0f} MB",
                {"operator_mb": op_mb, "bare_worker_mb": bare_mb, "kube_client_mb": kube.added_mb},
            )
        )
        tick = 3600.0 / idle / os.sysconf("SC_CLK_TCK")  # one clock tick in the window, in CPU s/h
        floor_h = cpu.bare_worker + cpu.grpc_server
        self.report.add(
            Row(
                f"P5 operator CPU at rest, {slots} slots (measured over {idle:.0f} s)",
                f"{cpu.operator:.1f} CPU s/h",
                f"bare Temporal worker at rest {cpu.bare_worker:.1f} + idle gRPC server {cpu.grpc_server:.1f}"
                f" = {floor_h:.1f} CPU s/h"
                + (f" (under one clock tick in the window: ratio against {tick:.1f})" if floor_h < tick else ""),
                cpu.operator / max(floor_h, tick),
                f"≤ {IDLE_CPU_GOAL_S_PER_H:.0f} CPU s/h",
                {"operator_cpu_s_per_h": cpu.operator, "bare_worker_cpu_s_per_h": cpu.bare_worker,
                 "grpc_server_cpu_s_per_h": cpu.grpc_server},
            )
        )  # fmt: skip
        threads_h = {kind: n * tick for kind, n in cpu.threads.items()}
        ended = max(0.0, cpu.operator - sum(threads_h.values()))  # threads that ended in the window count only here
        self.report.add(
            Row(
                f"P5 where the operator's CPU goes at rest, {slots} slots",
                ", ".join(f"{kind} {h:.1f}" for kind, h in sorted(threads_h.items(), key=lambda kv: -kv[1]))
                + (f", threads that ended in the window {ended:.1f}" if ended >= tick else "")
                + " CPU s/h",
                f"bare Temporal worker {cpu.bare_worker:.1f}, idle gRPC server {cpu.grpc_server:.1f} CPU s/h",
                cpu.operator / max(floor_h, tick),
                "printed",
                {**threads_h, "ended threads": ended},
            )
        )
        self.report.add(
            Row(
                f"P5 where the operator's memory goes, {slots} slots",
                " + ".join(f"{layer.name} {layer.added_mb:.1f}" for layer in layers)
                + f" = imports {imports:.0f} MB; running (Temporal's Rust runtime and connections, threads, caches,"
                f" the code it touches) {op_mb - imports:.0f} MB",
                "each layer imported alone: " + ", ".join(f"{layer.name} {layer.alone_mb:.1f}" for layer in layers),
                op_mb / imports,
                "printed",
                {"layers": [vars(layer) for layer in layers], "running_mb": op_mb - imports},
            )
        )
        if op_mb > IDLE_RSS_GOAL_MB:
            self.report.notes.append(
                f"p5-{slots}: RSS {op_mb:.0f} MB against the goal of {IDLE_RSS_GOAL_MB:.0f}: a bare Temporal worker"
                f" at rest is {bare_mb:.0f} MB and the Kubernetes client's import adds {kube.added_mb:.0f} MB"
                f" ({floor_mb:.0f} MB before any code of ours); our roles' imports add {layers[-1].added_mb:.0f} MB"
            )
        if cpu.operator > IDLE_CPU_GOAL_S_PER_H:
            self.report.notes.append(
                f"p5-{slots}: CPU {cpu.operator:.1f} s/h against the goal of {IDLE_CPU_GOAL_S_PER_H:.0f}: a bare"
                f" Temporal worker at rest uses {cpu.bare_worker:.1f} s/h and an idle gRPC server"
                f" {cpu.grpc_server:.1f} in the same window"
            )

    def task_row(self) -> None:
        """Workflow tasks timed out or failed in each figure's workflows (the goal is none)."""
        if not self.trouble:
            return
        timed_out = sum(t.timed_out for t in self.trouble.values())
        self.report.add(
            Row(
                "Workflow tasks timed out during the figures",
                "; ".join(f"{tag}: {t.text()}" for tag, t in self.trouble.items()),
                "0",
                float(timed_out),
                "0",
                {tag: {"workflows": t.workflows, "timed_out": t.timed_out, "failed": t.failed}
                 for tag, t in self.trouble.items()},
            )
        )  # fmt: skip


def _kind(r: RequestInfo) -> str:
    """`patch nodes/status (infra.homecluster.dev)`: what a write request wrote."""
    if r.plural is None:  # not a resource: discovery, /version (the health check's reachability probe)
        return f"{r.verb} {r.path}"
    sub = f"/{r.subresource}" if r.subresource else ""
    return f"{r.verb} {r.plural}{sub} ({r.group or 'core'})"
