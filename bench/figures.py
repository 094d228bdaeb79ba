"""The four figures of issue 14. Each starts its own homelab and operator (own namespace, own task queue) on the
shared Temporal server, takes its floor on that server first, and stops what it started, also on failure."""

from __future__ import annotations

import asyncio
import math
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
from bench.lab import LEASE_RENEW_SECONDS, World, homelab_doc
from bench.procs import bounded, peak_rss_mb, wait_until
from bench.report import Report, Row, ms, percentile
from bench.stages import p1_stages
from proto import externalgrpc_pb2 as pb

ECHO_CALLS = 1000


@dataclass
class Sizes:
    p1_claims: int = 20
    p2_slots: int = 50
    p3_groups: int = 4
    p3_slots: int = 25
    p3_calls: int = 100
    idle_seconds: float = 30.0

    def wait_for(self, claims: int) -> float:
        """A generous bound for `claims` claims to move (the claims' own polls are 10-30 s)."""
        return 180.0 + 2.0 * claims


class Figures:
    def __init__(self, client: Client, temporal: str, workdir: Path, sizes: Sizes, report: Report) -> None:
        self.client, self.temporal, self.dir, self.sizes, self.report = client, temporal, workdir, sizes, report

    async def world(self, tag: str, groups: int, per_group: int, *, instant: bool) -> World:
        doc = homelab_doc(f"bench-{tag}", groups, per_group, instant=instant)
        world = World(self.dir, self.temporal, tag, doc, time_scale=0.0 if instant else 1.0)
        try:
            return await world.start()
        except BaseException:
            await world.close()
            raise

    async def done(self, world: World) -> None:
        await world.close()
        self.report.processes[world.operator.name] = world.operator.peak_mb
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
        handled, two = await floors.signal_latencies(self.client, n, self.sizes.wait_for(n))
        groups = min(10, n)
        world = await self.world("p1", groups, math.ceil(n / groups), instant=False)
        try:
            await self.scale_up(world, n)
            await self.ready(world, n)
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
            self.report.notes.append(stages.note())
        finally:
            await self.done(world)
        if len(lat) < n:
            self.report.notes.append(f"p1: {n - len(lat)} of {n} ready claims had no Ready Node on record (left out)")
        p50, p99 = percentile(lat, 50), percentile(lat, 99)
        values = {"claims": n, "samples": len(lat), "p50_s": p50, "p99_s": p99, "max_s": max(lat)}
        for label, floor in (("signal → handled", handled), ("signal → two trivial activities done", two)):
            f99 = percentile(floor, 99)
            self.report.add(
                Row(
                    f"P1 reaction, Ready → claim ready stored, {n} in flight, vs {label}",
                    f"p50 {ms(p50)}, p99 {ms(p99)}",
                    f"{label} p99 {ms(f99)} (p50 {ms(percentile(floor, 50))})",
                    p99 / f99,
                    "p99 ≤ 1 s",
                    {**values, "floor_p50_s": percentile(floor, 50), "floor_p99_s": f99},
                )
            )

    # --- P2 ----------------------------------------------------------------------------------------------------
    async def p2(self) -> None:
        n = self.sizes.p2_slots
        print(f"P2: floor of {n} one-activity workflows, then a burst of {n} slots in {min(10, n)} groups", flush=True)
        floor, _ = await floors.one_activity_burst(self.client, n, self.sizes.wait_for(n))
        groups = min(10, n)
        world = await self.world("p2", groups, math.ceil(n / groups), instant=True)
        try:
            idle_mb = world.operator_rss_mb()
            began = time.time()
            await self.scale_up(world, n)
            await self.ready(world, n)
            last = max(
                t for cl in world.recorder.claims_in(ClaimPhase.READY) if (t := world.recorder.first(cl, "ready"))
            )
            wall = last - began
            peak = peak_rss_mb(world.operator.pid)
        finally:
            await self.done(world)
        self.report.add(
            Row(
                f"P2 burst, IncreaseSize → all {n} ready (instant machines)",
                ms(wall),
                f"{n} one-activity workflows {ms(floor)}",
                wall / floor,
                "≤ 2× floor",
                {"slots": n, "wall_s": wall, "floor_s": floor},
            )
        )
        self.report.add(
            Row(
                f"P2 operator memory, peak over the burst of {n}",
                f"{peak:.0f} MB",
                f"same process idle before the burst {idle_mb:.0f} MB",
                peak / idle_mb,
                "≤ 300 MB at 1,000",
                {"peak_mb": peak, "idle_mb": idle_mb},
            )
        )

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
        floor_events = await floors.history_length(self.client, floor_id)
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
            events = await floors.history_length(self.client, handle.id)
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
        self.report.add(
            Row(
                "P4 history events per lifecycle (up → ready → down → completed)",
                f"{events} events",
                f"one-activity workflow {floor_events} events",
                events / floor_events,
                "≤ 150 events",
                {"events": events, "floor_events": floor_events},
            )
        )
        self.report.add(
            Row(
                "P4 API writes per claim phase move",
                f"{len(claim_writes) / moves:.2f} ({len(claim_writes)} writes / {moves} moves, Lease excluded)",
                "1 (the status write that stores the phase)",
                len(claim_writes) / moves,
                "≤ 2",
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


def _kind(r: RequestInfo) -> str:
    """`patch nodes/status (infra.homecluster.dev)`: what a write request wrote."""
    sub = f"/{r.subresource}" if r.subresource else ""
    return f"{r.verb} {r.plural}{sub} ({r.group or 'core'})"
