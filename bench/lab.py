"""One figure's world: the simulated homelab (in this process, so its store can be timed and its requests
counted) and `homelab-autoscaler run` (a process, as people run it) on a task queue of its own."""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from homelab_sim.emulator import RequestInfo, ResourceSpec
from homelab_sim.homelab import HomelabServer, parse_homelab_spec

from api import names
from api.names import ClaimPhase
from bench.procs import BIN, Proc, free_port, http_status, port_open, rss_mb, wait_until
from proto import externalgrpc_pb2 as pb
from proto import externalgrpc_pb2_grpc as pb_grpc

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
LEASE_RENEW_SECONDS = 5.0  # the operator's default renew period, passed explicitly
START_TIMEOUT = 120.0
CA_DEADLINE = 5.0
RETRIED = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE})


def homelab_doc(
    namespace: str, groups: int, slots_per_group: int, *, instant: bool, boot_spread: tuple[float, float] | None = None
) -> dict[str, Any]:
    """`groups` groups of `slots_per_group` slots; machines instant (all zero) or a few real seconds to boot, or,
    with `boot_spread` (low, high), machines whose kubelets come up evenly spread over that many seconds after
    their Job (the staggered P1: most claims are still booting when each one turns Ready)."""
    timings = (
        {"jobSeconds": 0, "bootSeconds": 0, "readySeconds": 0, "taintClearSeconds": 0, "shutdownSeconds": 0}
        if instant
        else {"jobSeconds": 1, "bootSeconds": 1, "readySeconds": 1, "taintClearSeconds": 0, "shutdownSeconds": 1}
    )
    pod = {"image": "busybox", "command": ["true"]}
    gnames = [f"g{i}" for i in range(groups)]
    return {
        "apiVersion": "sim.homelab-autoscaler.dev/v1",
        "kind": "Homelab",
        "namespace": namespace,
        "timings": timings,
        "groups": [{"name": g, "minSize": 0, "maxSize": slots_per_group, "nodeReadinessTaints": []} for g in gnames],
        "slots": [
            {"name": f"{g}-s{j}", "group": g, "startupPodSpec": pod, "shutdownPodSpec": pod}
            | ({"timings": {"bootSeconds": _spread(boot_spread, i * slots_per_group + j, groups * slots_per_group)}}
               if boot_spread else {})
            for i, g in enumerate(gnames)
            for j in range(slots_per_group)
        ],
    }  # fmt: skip


def _spread(bounds: tuple[float, float], k: int, n: int) -> float:
    """The k-th of n values evenly spread over [low, high], interleaved so every group gets early and late ones."""
    low, high = bounds
    step = 7919 if math.gcd(7919, n) == 1 else 1  # coprime with n: k -> k * step % n is a fixed permutation
    order = (k * step) % n
    return round(low + (high - low) * (order / max(1, n - 1)), 1)


def _condition_true(obj: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True" for c in (obj.get("status") or {}).get("conditions") or []
    )


@dataclass
class Recorder:
    """Emulator listener (on the emulator's loop): when each Node turned Ready and each claim changed phase."""

    node_ready: dict[str, float] = field(default_factory=dict)  # core Node name -> first Ready=True stored
    phases: dict[str, list[tuple[str, float]]] = field(default_factory=lambda: defaultdict(list))
    slot_of: dict[str, str] = field(default_factory=dict)  # claim -> slot
    job_complete: dict[str, float] = field(default_factory=dict)  # Job name -> first Complete=True stored
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, kind: str, spec: ResourceSpec, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        now = time.time()
        meta = obj.get("metadata") or {}
        name = str(meta.get("name"))
        if spec.key == ("", "v1", "nodes") and kind != "DELETED":
            ready = _condition_true(obj, "Ready")
            with self.lock:
                if ready and name not in self.node_ready:
                    self.node_ready[name] = now
                elif not ready:
                    self.node_ready.pop(name, None)
        elif spec.key == ("batch", "v1", "jobs") and kind != "DELETED":
            done = _condition_true(obj, "Complete")
            with self.lock:
                if done and name not in self.job_complete:
                    self.job_complete[name] = now
        elif spec.key == (names.GROUP, names.VERSION, names.PLURAL_NODECLAIMS) and kind != "DELETED":
            phase = str((obj.get("status") or {}).get("phase") or ClaimPhase.PENDING)
            with self.lock:
                self.slot_of[name] = str((obj.get("spec") or {}).get("node"))
                seen = self.phases[name]
                if not seen or seen[-1][0] != phase:
                    seen.append((phase, now))

    def first(self, claim: str, phase: str) -> float | None:
        with self.lock:
            return next((t for p, t in self.phases.get(claim, []) if p == phase), None)

    def claims_in(self, phase: str) -> list[str]:
        with self.lock:
            return [c for c, seen in self.phases.items() if seen and seen[-1][0] == phase]


class World:
    """The homelab and the operator for one figure; `close()` stops both (also after a failure)."""

    def __init__(
        self, workdir: Path, temporal: str, tag: str, doc: dict[str, Any], *, time_scale: float, workers: int = 1
    ) -> None:
        self.namespace = doc["namespace"]
        self.tag = tag
        self.spec = parse_homelab_spec(doc, f"<bench {tag}>")
        self.recorder = Recorder()
        self.lab = HomelabServer(self.spec, port=free_port(), time_scale=time_scale)
        self.provider_port, self.health_port = free_port(), free_port()
        self.task_queue = f"bench-{tag}"
        self.operator = Proc(
            f"operator ({tag})",
            [
                str(BIN / "homelab-autoscaler"), "run",
                "--temporal-address", temporal,
                "--task-queue", self.task_queue,
                "--kube-server", "",  # set in start(), once the homelab has its port
                "--namespaces", self.namespace,
                "--lease-namespace", self.namespace,
                "--lease-renew-seconds", str(LEASE_RENEW_SECONDS),
                "--provider-address", f"127.0.0.1:{self.provider_port}",
                "--health-port", str(self.health_port),
                "--metrics-address", "",
                "--log-level", "WARNING",
            ],
            workdir / f"operator-{tag}.log",
        )  # fmt: skip
        # Worker processes beside the operator's own (`homelab-autoscaler worker`, the scaled-out role): the same
        # task queue and API server, nothing else.
        self.worker_health = [free_port() for _ in range(workers - 1)]
        self.workers = [
            Proc(
                f"worker {i + 2} ({tag})",
                [
                    str(BIN / "homelab-autoscaler"), "worker",
                    "--temporal-address", temporal,
                    "--task-queue", self.task_queue,
                    "--kube-server", "",
                    "--health-port", str(port),
                    "--metrics-address", "",
                    "--log-level", "WARNING",
                ],
                workdir / f"worker-{i + 2}-{tag}.log",
            )
            for i, port in enumerate(self.worker_health)
        ]  # fmt: skip
        self.channel: grpc.aio.Channel | None = None
        self.late_increases: list[str] = []  # IncreaseSize calls that overran the deadline (applied anyway)
        self.retried_reads: list[str] = []  # reads the bench asked again (never timed ones)

    async def start(self) -> World:
        self.lab.start()
        self.lab.server.call(lambda emulator: emulator.listeners.append(self.recorder))
        for proc in (self.operator, *self.workers):
            proc.args[proc.args.index("--kube-server") + 1] = self.lab.url
            proc.start()
        await wait_until(
            lambda: port_open(self.provider_port) or not self.operator.alive,
            timeout=START_TIMEOUT,
            what=f"the provider of {self.operator.name} to listen",
        )
        await wait_until(
            lambda: http_status(f"http://127.0.0.1:{self.health_port}/readyz") == 200 or not self.operator.alive,
            timeout=START_TIMEOUT,
            what=f"{self.operator.name} /readyz to answer 200",
            every=0.25,
        )
        if not self.operator.alive:
            raise RuntimeError(f"{self.operator.name} exited at start:\n{self.operator.tail()}")
        for proc, port in zip(self.workers, self.worker_health, strict=True):
            await self._ready(proc, port)
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.provider_port}")
        self.stub = pb_grpc.CloudProviderStub(self.channel)
        await self.warm()
        return self

    @staticmethod
    async def _ready(proc: Proc, port: int) -> None:
        def answers() -> bool:
            return http_status(f"http://127.0.0.1:{port}/readyz") == 200 or not proc.alive

        await wait_until(answers, timeout=START_TIMEOUT, what=f"{proc.name} /readyz to answer 200", every=0.25)
        if not proc.alive:
            raise RuntimeError(f"{proc.name} exited at start:\n{proc.tail()}")

    @property
    def group_names(self) -> list[str]:
        return [g.name for g in self.spec.groups]

    def writes(self) -> list[RequestInfo]:
        """The API write requests the emulator has served so far (the operator's: the sim writes in-process)."""
        return [r for r in list(self.lab.emulator.requests) if r.verb in WRITE_VERBS]

    def operator_rss_mb(self) -> float:
        return rss_mb(self.operator.pid)

    def processes(self) -> list[Proc]:
        """The operator and the worker processes beside it."""
        return [self.operator, *self.workers]

    def requests(self) -> list[RequestInfo]:
        """Every API request the emulator has served so far (reads too)."""
        return list(self.lab.emulator.requests)

    async def read(self, call: Callable[..., Any], request: Any, what: str, tries: int = 10) -> Any:
        """A read the bench needs (not one it times): asked again after DEADLINE_EXCEEDED or UNAVAILABLE."""
        for attempt in range(tries):
            try:
                return await call(request, timeout=CA_DEADLINE)
            except grpc.aio.AioRpcError as err:
                if err.code() not in RETRIED or attempt == tries - 1:
                    raise
                self.retried_reads.append(f"{what}: {err.code().name}")
        raise AssertionError("unreachable")

    async def warm(self) -> None:
        """What cluster-autoscaler asks before it scales: Refresh, NodeGroups, each group's TargetSize (which
        starts the group workflows), one at a time."""
        await self.read(self.stub.Refresh, pb.RefreshRequest(), "Refresh")
        await self.read(self.stub.NodeGroups, pb.NodeGroupsRequest(), "NodeGroups")
        for g in self.group_names:
            await self.read(self.stub.NodeGroupTargetSize, pb.NodeGroupTargetSizeRequest(id=g), f"TargetSize {g}")

    async def target(self, group: str) -> int:
        req = pb.NodeGroupTargetSizeRequest(id=group)
        return int((await self.read(self.stub.NodeGroupTargetSize, req, f"TargetSize {group}")).targetSize)

    async def increase(self, group: str, delta: int) -> None:
        """NodeGroupIncreaseSize once; a call that ran out of time still applies (the Update runs on), so the
        target is then awaited rather than asked again (cluster-autoscaler's retry would double it)."""
        before = await self.target(group)
        try:
            await self.stub.NodeGroupIncreaseSize(
                pb.NodeGroupIncreaseSizeRequest(id=group, delta=delta), timeout=CA_DEADLINE
            )
        except grpc.aio.AioRpcError as err:
            self.late_increases.append(f"{group}+{delta}: {err.code().name}")
        want = before + delta
        while True:  # bounded by the caller (scale_up): a group busy starting claims answers late, not never
            try:
                got = (
                    await self.stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=group), timeout=CA_DEADLINE)
                ).targetSize
            except grpc.aio.AioRpcError as err:
                if err.code() not in RETRIED:
                    raise
                self.retried_reads.append(f"TargetSize {group}: {err.code().name}")
                continue
            if got >= want:
                return
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()
        for proc in (*self.workers, self.operator):
            proc.stop()
        self.lab.stop()
