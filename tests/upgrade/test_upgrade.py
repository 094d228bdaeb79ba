"""An upgrade that upgrades: the previous release runs the operator with claims in every phase, stops, and this
commit's operator takes over on the same Temporal server and the same homelab; every claim ends as it would have.

Beside the replay corpus (tests/test_replay.py), which checks this code against histories this code's own tests
recorded, this runs the previous release as a user installed it (tests/upgrade/previous.py: a wheel of its tag in a
virtualenv of its own) and upgrades it as a Deployment rollout does: `homelab-autoscaler run` of the old version gets
SIGTERM, the new one starts and replays every open workflow from its history (a new process has no cache). At that
moment the homelab holds, each started by the old release:

  a ready claim (b-ready)                        stays ready, untouched; later scaled down
  a claim draining, its shutdown Job running     completes NodeDeleted once its Job ends, the machine off
  a booting claim, its startup Job running       becomes ready; one startup Job
  a pending claim, its startup Job refused       buys its machine once the API takes Jobs again; ready
  a group mid-scale (IncreaseSize +2 just sent)  both claims start (or go on) and become ready
  a failed claim waiting for its TTL (60 s)      is collected by the new operator when its TTL passes

then cluster-autoscaler deletes every node and each claim completes with its machine off. No workflow task may fail
(a non-determinism error is one) and no Job may be made twice. `make upgrade` runs it (~3 min, a first build of the
previous release ~1-2 min more); `make test` skips it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from homelab_sim.emulator import Fault
from homelab_sim.homelab import HomelabServer
from homelab_sim.homelab_spec import parse_homelab_spec
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowHistory

from api import contracts as c
from api.names import provider_id
from homelab_autoscaler.devserver import DevServer
from homelab_autoscaler.temporal import DATA_CONVERTER
from proto import externalgrpc_pb2 as pb
from proto import externalgrpc_pb2_grpc as pb_grpc
from tests import releases
from tests.chaos import BENIGN_TASK_FAILURES, Proc
from tests.procs import BIN, free_port, port_open, readyz, wait_for
from tests.upgrade.previous import previous_operator

ENABLED = os.environ.get("HOMELAB_UPGRADE", "") not in ("", "0")
pytestmark = pytest.mark.skipif(not ENABLED, reason="the upgrade from the previous release runs under `make upgrade`")

NS = "homelab-upgrade"
GROUP = "workers"
CRD = "infra.homecluster.dev/v2alpha1"
SLOW = 20.0  # seconds a slow machine's lifecycle Jobs take: long enough to be running across the upgrade
TTL = 60  # the failed claim's ttlSecondsAfterFinished
WAIT = 180.0  # seconds any one step may take
# Slots by name: with every machine off and none ever activated, the group's choice is by name.
SLOTS = ("a-drain", "b-ready", "c-boot", "d-pending", "e-scale", "f-scale", "z-broken")


def homelab_doc() -> dict[str, Any]:
    slow = {"jobSeconds": SLOW}
    slots: list[dict[str, Any]] = [{"name": s, "group": GROUP} for s in SLOTS]
    slots[0]["timings"] = slots[2]["timings"] = slow
    slots[-1]["faults"] = {"startupJobFails": True}
    return {
        "apiVersion": "sim.homelab-autoscaler.dev/v1",
        "kind": "Homelab",
        "namespace": NS,
        "timings": {"jobSeconds": 1, "bootSeconds": 1, "readySeconds": 1, "taintClearSeconds": 0.5,
                    "shutdownSeconds": 1},
        "groups": [{"name": GROUP, "minSize": 0, "maxSize": len(SLOTS), "nodeReadinessTaints": []}],
        "slots": slots,
    }  # fmt: skip


@dataclass
class Stack:
    """Temporal, the homelab, and the operator of one release or the other, driven as cluster-autoscaler."""

    dir: Path
    temporal: DevServer
    homelab: HomelabServer
    client: Client
    stub: Any = None
    provider_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    operator: Proc | None = None

    # --- the operator -----------------------------------------------------------------------------------------------
    def start(self, script: Path, name: str) -> None:
        args = [
            str(script), "run",
            "--temporal-address", self.temporal.address,
            "--kube-server", self.homelab.url,
            "--kube-timeout-seconds", "5",
            "--namespaces", NS,
            "--provider-address", f"127.0.0.1:{self.provider_port}",
            "--lease-namespace", NS, "--lease-duration-seconds", "6", "--lease-renew-seconds", "2",
            "--health-port", str(self.health_port),
            "--metrics-address", "",
        ]  # fmt: skip
        self.operator = Proc(name, args, self.dir / f"{name}.log")
        self.operator.start()
        wait_for(lambda: readyz(self.health_port) == 200, timeout=WAIT, what=f"the {name} operator's /readyz")
        wait_for(lambda: port_open(self.provider_port), timeout=WAIT, what=f"the {name} operator's provider")

    def stop(self) -> None:
        """A rollout's end of the old Pod: SIGTERM, and its process gone before the new one starts."""
        assert self.operator is not None
        self.operator.stop()
        assert not self.operator.alive

    # --- cluster-autoscaler -----------------------------------------------------------------------------------------
    async def increase(self, delta: int) -> None:
        await self.stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=delta), timeout=30)

    async def delete(self, *slots: str) -> None:
        nodes = [pb.ExternalGrpcNode(providerID=provider_id(NS, s), name=s) for s in slots]
        await self.stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id=GROUP, nodes=nodes), timeout=30)

    # --- the cluster's truth ----------------------------------------------------------------------------------------
    def claims(self) -> dict[str, dict[str, Any]]:
        """Every claim resource by its slot's name: the newest one of each slot."""
        objs = self.homelab.call(lambda h: h.emulator.objects_of(CRD, "nodeclaims", NS))
        newest: dict[str, dict[str, Any]] = {}
        for o in sorted(objs, key=lambda o: o["metadata"]["creationTimestamp"]):
            newest[o["spec"]["node"]] = o
        return newest

    def claim(self, slot: str) -> dict[str, Any]:
        return self.claims().get(slot) or {}

    def phase(self, slot: str) -> str:
        return str((self.claim(slot).get("status") or {}).get("phase") or "")

    def jobs(self) -> list[dict[str, Any]]:
        return list(self.homelab.call(lambda h: h.emulator.objects_of("batch/v1", "jobs", NS)))

    def running_job(self, name: str) -> bool:
        return any(j["metadata"]["name"] == name and not (j.get("status") or {}).get("conditions") for j in self.jobs())

    def power(self, slot: str) -> str:
        return str(self.homelab.power(slot))

    async def until(self, check: Callable[[], bool], what: str, within: float = WAIT) -> None:
        """Wait for `check`; a non-determinism error in the running operator's log fails at once (its workflows
        would retry that task forever)."""
        end = time.monotonic() + within
        while not check():
            if time.monotonic() > end:
                raise AssertionError(f"{what}: not true within {within:.0f} s\n{self.tell()}")
            if self.operator is not None and (stuck := nondeterminism(self.operator.log)):
                raise AssertionError(f"{what}: the operator cannot replay its workflows:\n{stuck}")
            await asyncio.sleep(0.5)

    def tell(self) -> str:
        rows = [f"  {slot}: {self.phase(slot) or '-'} power={self.power(slot)}" for slot in SLOTS]
        return "\n".join(rows)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    temporal = DevServer(
        ip="127.0.0.1", port=free_port(), ui_port=free_port(), db_file=tmp_path / "temporal.db", headless=True,
        log_file=tmp_path / "temporal.log",
    )  # fmt: skip
    temporal.start()
    try:
        with HomelabServer(parse_homelab_spec(homelab_doc(), "upgrade"), time_scale=1.0) as homelab:
            client = await Client.connect(temporal.address, data_converter=DATA_CONVERTER)
            s = Stack(tmp_path, temporal, homelab, client)
            try:
                yield s
            finally:
                if s.operator is not None:
                    s.operator.stop()
                for log in sorted(tmp_path.glob("*.log")):
                    tail = "".join(log.read_text(errors="replace").splitlines(True)[-40:])
                    print(f"--- {log.name} (last lines)\n{tail}")
    finally:
        temporal.stop()


@pytest.fixture(scope="session")
def previous() -> Iterator[tuple[releases.Release, Path]]:
    before = releases.previous()
    assert before is not None, f"no release older than {releases.current()} in tests/releases.py"
    yield before, previous_operator(before)


@pytest.mark.timeout(1500)
async def test_the_previous_release_hands_every_claim_in_flight_to_this_one(
    stack: Stack, previous: tuple[releases.Release, Path]
) -> None:
    release, old = previous
    s = stack
    s.start(old, f"operator-{release.version}")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{s.provider_port}") as channel:
        s.stub = pb_grpc.CloudProviderStub(channel)
        # --- the previous release: a claim in every phase ---------------------------------------------------------
        await s.increase(2)  # a-drain (slow) and b-ready
        broken = {"node": "z-broken", "group": GROUP, "call": "Manual", "ttlSecondsAfterFinished": TTL}
        s.homelab.call(lambda h: h.emulator.put_object(CRD, "nodeclaims", {
            "apiVersion": CRD, "kind": "NodeClaim", "metadata": {"name": "z-broken-by-hand", "namespace": NS},
            "spec": broken}, NS))  # fmt: skip
        await s.until(lambda: s.phase("b-ready") == "ready" and s.phase("a-drain") == "ready", "two claims ready")
        await s.until(lambda: s.phase("z-broken") == "failed", "the broken machine's claim failed")
        await s.delete("a-drain")
        await s.increase(1)  # c-boot (slow)
        drain_job = c.job_name(s.claim("a-drain")["metadata"]["name"], "shutdown", 1)
        await s.until(lambda: s.running_job(drain_job), "a-drain's shutdown Job running")
        await s.until(lambda: s.phase("c-boot") == "booting", "c-boot booting")
        boot_job = c.job_name(s.claim("c-boot")["metadata"]["name"], "startup", 1)
        assert s.running_job(boot_job)
        refused = Fault(match=lambda r: r.plural == "jobs" and r.verb == "create", status=503, times=None)
        s.homelab.call(lambda h: h.emulator.faults.append(refused))
        await s.increase(1)  # d-pending: its startup Job is refused until the new release runs
        await s.until(lambda: s.phase("d-pending") == "pending", "d-pending pending")
        await asyncio.sleep(2.0)  # a few of its tries refused
        await s.increase(2)  # e-scale and f-scale: the group mid-scale when the old release stops
        in_flight = {slot: s.claim(slot)["metadata"]["name"] for slot in SLOTS if s.claim(slot)}
        before = {slot: s.phase(slot) for slot in in_flight}
        assert s.operator is not None and s.operator.popen is not None
        old_pid = s.operator.popen.pid
        s.stop()
        assert s.running_job(drain_job) and s.running_job(boot_job), "the Jobs ran across the upgrade"
        assert before["a-drain"] == "ready" and before["b-ready"] == "ready" and before["z-broken"] == "failed"
        assert before["c-boot"] == "booting" and before["d-pending"] == "pending", before
        # --- this commit ---------------------------------------------------------------------------------------
        began = time.monotonic()
        s.start(BIN / "homelab-autoscaler", "operator-new")
        assert s.operator is not None and s.operator.popen is not None
        new_pid = s.operator.popen.pid
        s.homelab.call(lambda h: h.emulator.faults.remove(refused))
        await s.until(lambda: s.phase("a-drain") == "completed" and s.power("a-drain") == "off", "a-drain completed")
        for slot in ("c-boot", "d-pending", "e-scale", "f-scale"):
            await s.until(lambda slot=slot: s.phase(slot) == "ready", f"{slot} ready")  # type: ignore[misc]
        assert s.claim("b-ready")["metadata"]["name"] == in_flight["b-ready"] and s.phase("b-ready") == "ready"
        await s.until(lambda: not s.claim("z-broken"), "the failed claim collected after its TTL", within=TTL + WAIT)
        print(f"the new release brought every claim in flight to its end in {time.monotonic() - began:.0f} s")
        # --- cluster-autoscaler scales everything down ---------------------------------------------------------------
        await s.delete("b-ready", "c-boot", "d-pending", "e-scale", "f-scale")
        for slot in ("b-ready", "c-boot", "d-pending", "e-scale", "f-scale"):
            await s.until(
                lambda slot=slot: s.phase(slot) == "completed" and s.power(slot) == "off",  # type: ignore[misc]
                f"{slot} completed, machine off",
            )
    # --- what every claim did -------------------------------------------------------------------------------------
    claims = s.claims()
    for slot in SLOTS[:-1]:
        status = claims[slot]["status"]
        assert (status["phase"], status["reason"]) == ("completed", "NodeDeleted"), (slot, status)
    assert claims["a-drain"]["metadata"]["name"] == in_flight["a-drain"], "the draining claim is the one that drained"
    jobs = sorted(j["metadata"]["name"] for j in s.jobs() if not j["metadata"]["name"].startswith("z-broken"))
    names = [claims[slot]["metadata"]["name"] for slot in SLOTS[:-1]]
    expected = sorted(c.job_name(name, kind, 1) for name in names for kind in ("startup", "shutdown"))
    assert jobs == expected, "one startup Job and one shutdown Job per claim"
    # --- the workflows: the old release started them, the new one replayed them, no task failed -------------------
    histories = await all_histories(s.client)
    crossed = {h.workflow_id for h in histories if crossed_over(h, old_pid, new_pid)}
    started_before = {c.claim_workflow_id(NS, name) for slot, name in in_flight.items() if slot != "z-broken"}
    assert started_before | {c.group_workflow_id(NS, GROUP)} <= crossed, "the previous release started them"
    failed = [f for h in histories for f in failed_tasks(h)]
    assert not failed, f"workflow tasks failed: {failed}"
    assert not tracebacks(s.dir / "operator-new.log"), tracebacks(s.dir / "operator-new.log")


async def all_histories(client: Client) -> list[WorkflowHistory]:
    found = []
    async for wf in client.list_workflows():
        found.append(await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history())
    return found


def task_workers(history: WorkflowHistory) -> list[str]:
    """The identity of the worker that completed each workflow task, in order (the SDK's default, `<pid>@<host>`)."""
    return [
        e.workflow_task_completed_event_attributes.identity
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    ]


def crossed_over(history: WorkflowHistory, old_pid: int, new_pid: int) -> bool:
    """The run was begun by the previous release's process and carried on by this one's: its first workflow task was
    completed by the old operator, a later one by the new (whatever either release records in markers)."""
    workers = task_workers(history)
    return bool(workers) and workers[0].startswith(f"{old_pid}@") and any(w.startswith(f"{new_pid}@") for w in workers)


def failed_tasks(history: WorkflowHistory) -> list[str]:
    """Each workflow task that failed, but for what the server asks of any worker (a sticky queue reset, a command
    that raced a new event): a non-determinism error is one."""
    found = []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            attrs = e.workflow_task_failed_event_attributes
            if attrs.cause not in BENIGN_TASK_FAILURES:
                cause = WorkflowTaskFailedCause.Name(attrs.cause)
                found.append(f"{history.workflow_id} event {e.event_id}: {cause}: {attrs.failure.message[:300]}")
    return found


def nondeterminism(log: Path) -> str:
    """The first non-determinism error a worker logged (Temporal's TMPRL1100), or ""."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return next((line[:600] for line in text.splitlines() if "TMPRL1100" in line), "")


def tracebacks(log: Path) -> list[str]:
    """An exception logged with its traceback is a bug (a failure the operator expects is one line): each one's last
    line."""
    lines = log.read_text(errors="replace").splitlines()
    return [
        next((lines[j] for j in range(i + 1, len(lines)) if not lines[j].startswith((" ", "\t"))), line)[:300]
        for i, line in enumerate(lines)
        if line.startswith("Traceback (most recent call last)")
    ]
