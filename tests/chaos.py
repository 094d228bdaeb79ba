"""The chaos suite: the operator's roles as separate processes against a Temporal dev server and the simulated
homelab, driven through real lifecycles while a seeded schedule kills them, breaks the API and takes Temporal away.

    python -m tests.chaos --lifecycles 50 --kills 20 --outage 60 --wipes 2 [--seed N]      (make chaos)

What runs: `temporal server start-dev` on a SQLite file (restarted on it after every kill), the simulated homelab
(`python -m homelab_sim`, real time, with API faults at a rate, dropped watches and compactions), and
`homelab-autoscaler worker`, `provider` and `watch`, each its own process, restarted when it dies (as Kubernetes
restarts a pod). The driver plays cluster-autoscaler over gRPC: it asks for machines, deletes the ones that run,
and deletes the ones that failed. A schedule drawn from the seed kills (SIGKILL) a role or the Temporal server
every few seconds, takes Temporal away once for `--outage` seconds (the provider must answer UNAVAILABLE and every
role's /readyz must fail meanwhile), wipes Temporal's database `--wipes` times (stopped, its file deleted, started
again: every workflow is lost, the cluster keeps the record), and applies bad objects mid-run. The homelab's pod
specs and Secret names carry marker values that must never reach a workflow history or a log line; so do the last
words of a broken machine's wake-up script (`worker-broken` always fails, saying a marker and the password from its
env), which must reach its failed claims' status messages.

The admission webhook is registered as deploy/components/admission registers it (failurePolicy Fail), served by the
provider process (so it dies with every kill of the provider), and the roles speak with the operator's
ServiceAccount token: the emulator calls the webhook as kube-apiserver does. A person keeps applying a second claim
on a busy slot (a server-side dry run, so nothing is stored): each must be refused, naming the slot and its live
claim, or refused because the webhook is down; and no write of the operator's may ever reach the webhook.

After the lifecycles, quiet: faults off, nothing killed, everything settles; then the checks, printed as a table:
every violation count must be 0 (the claim resources are checked against their Events and their machines, and
their finalizers throughout the run). A failing seed reruns the same schedule (`--seed`); process timing is real,
so a rare interleaving may take a few runs to show again.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from homelab_sim import workloads
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from api import contracts as c
from api.names import ClaimReason, EventReason
from homelab_autoscaler.devserver import DevServer
from homelab_autoscaler.temporal import DATA_CONVERTER
from kube.adapter import CLAIMS, EVENTS, Kube
from proto import externalgrpc_pb2 as pb
from proto import externalgrpc_pb2_grpc as pb_grpc
from tests import records
from tests.lab import history_text
from tests.procs import BIN, ROOT, free_port, port_open, readyz, wait_for
from tests.realcluster import pki

NS = "homelab-autoscaler-system"
GROUP = "workers"
BROKEN = "worker-broken"  # the machine whose wake-up always fails, with last words to keep out of histories
SLOW = "worker-slow"  # with --slow-jobs: the machine whose lifecycle Jobs take that long; wipes are timed into them
SLOW_JOB_WAIT = 400.0  # real seconds a wipe waits for a running Job of the slow machine before it wipes anyway
OPERATOR_USER = "system:serviceaccount:homelab-autoscaler-system:homelab-autoscaler"
PERSON = "chaos-person"
WEBHOOK_REGISTRATION = ROOT / "deploy" / "components" / "admission" / "webhook.yaml"
LIVE = ("pending", "booting", "ready")
SETTLE_TIMEOUT = 600.0  # real seconds the quiet spell may take before the checks run anyway
CA_DEADLINE = 5.0
BENIGN_TASK_FAILURES = frozenset(
    {
        WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND,
        WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_STICKY_TASK_QUEUE,
    }
)


@dataclass
class Plan:
    seed: int
    lifecycles: int = 50
    kills: int = 20
    outage: float = 60.0
    fault_rate: float = 0.05
    wipes: int = 0
    slots: int = 6
    time_limit: float = 1500.0  # real seconds for the lifecycles; past it the run goes quiet anyway
    # Seconds each lifecycle Job of one more machine (worker-slow) takes; 0: no such machine. With it, each wipe of
    # Temporal's database waits for one of its Jobs to run (a startup Job, then a shutdown Job, in turn): a claim
    # taken over must adopt its lost run's running Job (issue 32).
    slow_jobs: float = 0.0
    # Worker processes on the one task queue (`worker`, `worker-2`, ...): each killed on its own, the others carry
    # its workflows on (sticky queues and local activities across a worker's death).
    workers: int = 1

    @property
    def roles(self) -> tuple[str, ...]:
        """The processes the killer picks from: the worker processes, the provider, the watchers."""
        return ("worker", *(f"worker-{i}" for i in range(2, self.workers + 1)), "provider", "watch")

    @property
    def machines(self) -> list[str]:
        """The machines the group's claims may take (the broken one aside, which never comes up)."""
        return [f"worker-{i}" for i in range(1, self.slots + 1)] + ([SLOW] if self.slow_jobs else [])

    @property
    def markers(self) -> dict[str, str]:
        """Values planted in the homelab's pod specs and Secret references, which must never leave Kubernetes."""
        tag = f"{self.seed:x}"
        return {
            "env value": f"chaosSecretValue{tag}",
            "Secret name": f"chaos-secret-{tag}",
            "image": f"chaos-image-{tag}",
            "command": f"chaosCommand{tag}",
            "last words": f"chaosLastWords{tag}",
        }


@dataclass
class Proc:
    """A process of the run: started, killed with SIGKILL, restarted; its output appended to one log."""

    name: str
    args: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.args,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        self.starts += 1

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@dataclass
class Report:
    plan: Plan
    lifecycles: int = 0
    kills: Counter[str] = field(default_factory=Counter)
    stats: dict[str, int] = field(default_factory=dict)
    outage: dict[str, Any] = field(default_factory=dict)
    violations: dict[str, list[str]] = field(default_factory=dict)
    hand_claims: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    wipes: int = 0
    wiped_during: Counter[str] = field(default_factory=Counter)  # what the slow machine was doing at each wipe
    taken_over: int = 0  # claims whose workflow was lost and that a new run took over (their ClaimTakenOver Events)
    broken_boots: int = 0  # claims of the broken machine that failed on their startup Job's exit code

    CHECKS = (
        "duplicate startup Jobs",
        "lifecycle Jobs overlapping on one machine",
        "boots failed by a check while their startup Job ran",
        "shutdown attempts counted above the Jobs fired",
        "machines on without a live claim",
        "machines off under a ready claim",
        "claims whose resource and workflow disagree",
        "workflows failed, or with a failing task",
        "slots with two live claims",
        "secret markers in histories and logs",
        "failed boots whose last words are not on their claim",
        "provider answers during the outage other than UNAVAILABLE",
        "roles ready during the outage",
        "claim Events without their landed write",
        "claim finalizers let go before the terminal record",
        "claim records that disagree with their machines",
        "tracebacks in the roles' logs",
        "operator writes sent to the admission webhook",
        "second live claims admitted on a busy slot",
        "refusals not naming the slot and its live claim",
        workloads.STAT,
    )

    @property
    def ok(self) -> bool:
        return not any(self.violations.get(check) for check in self.CHECKS)

    def table(self) -> str:
        kills = ", ".join(f"{role} {n}" for role, n in sorted(self.kills.items())) or "none"
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.stats.items())) or "none"
        lines = [
            f"chaos seed {self.plan.seed}: {self.plan.workers} worker processes, {self.lifecycles} lifecycles,"
            f" {sum(self.kills.values())} kills ({kills}),"
            f" {self.wipes} Temporal database wipes, one Temporal outage of {self.plan.outage:.0f} s,"
            f" {self.seconds:.0f} s in all",
            f"cluster: {faults}; claims taken over after a lost workflow: {self.taken_over}; failed boots of the"
            f" broken machine: {self.broken_boots}",
            f"wipes timed into the slow machine's Jobs ({self.plan.slow_jobs:.0f} s each):"
            f" {dict(sorted(self.wiped_during.items())) or 'none'}",
            f"during the outage: provider answered {dict(self.outage.get('codes', {}))},"
            f" /readyz answered {dict(self.outage.get('readyz', {}))}",
            f"second claims by hand on busy slots: {dict(sorted(self.hand_claims.items())) or 'none'}",
            "",
            "| check | violations |",
            "|---|---|",
        ]
        lines += [f"| {check} | {len(self.violations.get(check, []))} |" for check in self.CHECKS]
        for check in self.CHECKS:
            for example in self.violations.get(check, [])[:5]:
                lines.append(f"  {check}: {example}")
        return "\n".join(lines)


class Chaos:
    def __init__(self, plan: Plan, workdir: Path) -> None:
        self.plan = plan
        self.dir = workdir
        self.rng = random.Random(plan.seed)
        self.report = Report(plan)
        self.kube_port, self.provider_port, self.webhook_port = free_port(), free_port(), free_port()
        self.tokens = {"operator": f"operator-{plan.seed:x}", "person": f"person-{plan.seed:x}"}
        self.health = {role: free_port() for role in plan.roles}
        self.temporal = DevServer(
            ip="127.0.0.1",
            port=free_port(),
            ui_port=free_port(),
            db_file=workdir / "temporal.db",
            headless=True,
            log_file=workdir / "temporal.log",
        )
        self.procs: dict[str, Proc] = {}
        self.ready_seen: set[str] = set()
        self.ended: set[str] = set()
        self.started = 0
        self.in_outage = False
        self.quiet = False
        self.first_seen: dict[str, float] = {}
        self.temporal_lock = asyncio.Lock()
        self.finalizers = records.Finalizers()
        self.let_go: list[str] = []
        self.failed_mid_boot: list[str] = []
        self.wiped_mid_job: list[tuple[str, str, str]] = []  # (kind, claim, Job) running at a wipe

    # --- setting up ---------------------------------------------------------------------------------------------
    def homelab_file(self) -> Path:
        """The example homelab, grown to `slots` machines with fast timings, every pod spec carrying the markers."""
        m = self.plan.markers
        pod = {
            "image": f"registry.invalid/{m['image']}",
            "command": ["sh", "-c", m["command"]],
            "env": [
                {"name": "BMC_PASSWORD", "value": m["env value"]},
                {"name": "BMC_USER", "valueFrom": {"secretKeyRef": {"name": m["Secret name"], "key": "user"}}},
            ],
        }
        slots: list[dict[str, Any]] = [
            {
                "name": name,
                "group": GROUP,
                "startupPodSpec": pod,
                "shutdownPodSpec": pod,
                "node": {"labels": {"homelab.dev/pool": GROUP}},
            }
            for name in self.plan.machines
        ]
        if self.plan.slow_jobs:
            slots[-1]["timings"] = {"jobSeconds": self.plan.slow_jobs}
        # The broken machine: its wake-up says a marker and the password from its env, then fails (exit 3).
        script = f'echo "{m["last words"]}: no answer; logged in as $BMC_PASSWORD"\nexit 3'
        broken = {**pod, "command": ["sh", "-c", script]}
        slots.append(
            {"name": BROKEN, "group": GROUP, "startupPodSpec": broken, "shutdownPodSpec": pod,
             "node": {"labels": {"homelab.dev/pool": GROUP}}}
        )  # fmt: skip
        doc = {
            "apiVersion": "sim.homelab-autoscaler.dev/v1",
            "kind": "Homelab",
            "namespace": NS,
            "timings": {
                "jobSeconds": 1,
                "bootSeconds": 1,
                "readySeconds": 1,
                "taintClearSeconds": 0.5,
                "shutdownSeconds": 1,
            },
            "groups": [{"name": GROUP, "minSize": 0, "maxSize": len(slots), "nodeReadinessTaints": []}],
            "slots": slots,
            "workloads": True,  # a workload Pod (under a budget) and a DaemonSet's Pod on every usable machine
        }
        path = self.dir / "homelab.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    def kubeconfig(self) -> Path:
        """The operator's ServiceAccount token, as a pod would hold it, for the simulated homelab's API server."""
        path = self.dir / "operator.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "sim",
            "clusters": [{"name": "sim", "cluster": {"server": f"http://127.0.0.1:{self.kube_port}"}}],
            "users": [{"name": "operator", "user": {"token": self.tokens["operator"]}}],
            "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "operator"}}],
        }))  # fmt: skip
        return path

    def webhook_args(self) -> list[str]:
        """The admission webhook on loopback, with a certificate of a CA made for the run (cert-manager's, in a
        cluster); the CA goes to the registration's caBundle."""
        self.ca = pki.Authority(self.dir / "pki")
        pair = self.ca.issue("webhook", "homelab-autoscaler-webhook", server=True, ips=("127.0.0.1",))
        return ["--webhook-address", f"127.0.0.1:{self.webhook_port}", "--webhook-tls-cert", str(pair.cert),
                "--webhook-tls-key", str(pair.key)]  # fmt: skip

    def role(self, role: str) -> Proc:
        args = [
            str(BIN / "homelab-autoscaler"),
            "worker" if role.startswith("worker") else role,
            "--temporal-address",
            self.temporal.address,
            "--kubeconfig",
            str(self.kubeconfig()),
            "--kube-timeout-seconds",
            "5",
            "--metrics-address",
            "",
            "--health-port",
            str(self.health[role]),
        ]
        if role in ("provider", "watch"):
            args += ["--namespaces", NS]
        if role == "provider":
            args += ["--provider-address", f"127.0.0.1:{self.provider_port}", *self.webhook_args()]
        if role == "watch":
            args += ["--lease-namespace", NS, "--lease-duration-seconds", "6", "--lease-renew-seconds", "2"]
        return Proc(role, args, self.dir / f"{role}.log")

    def sim(self) -> Proc:
        args = [
            str(BIN / "python"),
            "-m",
            "homelab_sim",
            "--homelab",
            str(self.homelab_file()),
            "--port",
            str(self.kube_port),
            "--chaos-seed",
            str(self.plan.seed),
            "--fault-rate",
            str(self.plan.fault_rate),
            "--slow-seconds",
            "7",
            "--drop-watches-every",
            "20",
            "--compact-every",
            "45",
            "--user",
            f"{self.tokens['operator']}={OPERATOR_USER}",
            "--user",
            f"{self.tokens['person']}={PERSON}",
        ]
        return Proc("sim", args, self.dir / "sim.log")

    # --- the run ----------------------------------------------------------------------------------------------------
    async def run(self) -> Report:
        began = time.monotonic()
        self.temporal.start()
        self.procs["sim"] = self.sim()
        self.procs["sim"].start()
        wait_for(lambda: port_open(self.kube_port), timeout=30, what="the simulated homelab")
        for role in self.plan.roles:
            self.procs[role] = self.role(role)
            self.procs[role].start()
        self.register_webhook()
        wait_for(lambda: port_open(self.provider_port), timeout=60, what="the provider")
        self.client = await Client.connect(self.temporal.address, data_converter=DATA_CONVERTER)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{self.provider_port}") as channel:
                self.stub = pb_grpc.CloudProviderStub(channel)
                self.killing = asyncio.create_task(self.killer())
                tasks = [
                    asyncio.create_task(self.supervise()),
                    self.killing,
                    asyncio.create_task(self.bad_objects()),
                    asyncio.create_task(self.hand_claims()),
                ]
                try:
                    await self.autoscaler(began)
                finally:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                await self.go_quiet()
                await self.check()
        finally:
            for proc in self.procs.values():
                proc.stop()
            self.temporal.stop()
        self.report.lifecycles = len(self.ended)
        self.report.seconds = time.monotonic() - began
        return self.report

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.kube_port}/_sim/state", timeout=10) as resp:
            return dict(json.loads(resp.read()))

    def control(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.kube_port}/_sim/{name}", data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            return dict(json.loads(resp.read()))

    def as_person(self, method: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        """A request to the API server as a person (not the operator), and its answer."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.kube_port}{path}", data=json.dumps(body).encode(), method=method,
            headers={"Authorization": f"Bearer {self.tokens['person']}", "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return int(resp.status), dict(json.loads(resp.read()))
        except urllib.error.HTTPError as err:
            return int(err.code), dict(json.loads(err.read() or b"{}"))

    def register_webhook(self) -> None:
        """deploy/'s registration, its Service reference a loopback URL (no Service routes here), as a person
        applies it (through the API faults, so again until it lands)."""
        (doc,) = [d for d in yaml.safe_load_all(WEBHOOK_REGISTRATION.read_text())
                  if d and d["kind"] == "ValidatingWebhookConfiguration"]  # fmt: skip
        doc["metadata"].pop("annotations", None)
        hook = doc["webhooks"][0]
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{self.webhook_port}{hook['clientConfig']['service']['path']}",
            "caBundle": base64.b64encode(self.ca.cert.read_bytes()).decode(),
        }
        path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
        for _ in range(20):
            code, answer = self.as_person("POST", path, doc)
            if code == 201 or answer.get("reason") == "AlreadyExists":  # a fault's 409 is a Conflict
                return
            time.sleep(0.5)
        raise RuntimeError("the admission webhook could not be registered")

    async def hand_claims(self) -> None:
        """A person applies a second claim on a busy slot every few seconds (a server-side dry run: nothing is
        stored). The claim seen live before and after the request was live throughout: it must be refused."""
        path = f"/apis/infra.homecluster.dev/v2alpha1/namespaces/{NS}/nodeclaims?dryRun=All"
        for attempt in itertools.count():
            await asyncio.sleep(self.rng.uniform(2.0, 6.0))
            with contextlib.suppress(OSError):
                before = await asyncio.to_thread(self.state)
                busy = sorted({(cl["slot"], cl["name"]) for cl in before["claims"] if cl["phase"] in LIVE})
                if not busy:
                    continue
                slot, owner = self.rng.choice(busy)
                body = {"apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "NodeClaim",
                        "metadata": {"name": f"by-hand-{attempt}", "namespace": NS},
                        "spec": {"node": slot, "group": GROUP}}  # fmt: skip
                code, answer = await asyncio.to_thread(self.as_person, "POST", path, body)
                after = await asyncio.to_thread(self.state)
                still = any(cl["name"] == owner and cl["phase"] in LIVE for cl in after["claims"])
                self.judge_hand_claim(slot, owner, still, code, str(answer.get("message") or ""))

    def judge_hand_claim(self, slot: str, owner: str, still: bool, code: int, message: str) -> None:
        v = self.report.violations
        if code == 403:
            self.report.hand_claims["refused"] += 1
            if f'live claim on slot "{slot}": "' not in message or " is live there (" not in message:
                v.setdefault("refusals not naming the slot and its live claim", []).append(message[:200])
        elif code == 500 and "failed calling webhook" in message:
            self.report.hand_claims["refused, the webhook down"] += 1
        elif code == 503 and "cannot check slot" in message:
            self.report.hand_claims["refused, the claims unreadable"] += 1
        elif 200 <= code < 300:
            if still:
                v.setdefault("second live claims admitted on a busy slot", []).append(f"{slot} (live: {owner})")
            self.report.hand_claims["admitted, the slot freed meanwhile" if not still else "admitted"] += 1
        else:
            self.report.hand_claims[f"API fault {code}"] += 1

    def webhook_calls(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.kube_port}/_sim/webhook-calls", timeout=10) as resp:
            return list(json.loads(resp.read())["calls"])

    async def call(self, method: Any, request: Any) -> tuple[grpc.StatusCode, Any]:
        try:
            return grpc.StatusCode.OK, await method(request, timeout=CA_DEADLINE)
        except grpc.aio.AioRpcError as err:
            return err.code(), None

    def track(self, state: dict[str, Any]) -> None:
        """Lifecycles: claims seen ready, then ended (completed, failed or collected); and every claim's finalizer,
        which is let go only with its terminal record."""
        present = {cl["name"]: cl for cl in state["claims"]}
        for problem in self.finalizers.let_go_early(_as_resource(cl) for cl in state["claims"]):
            if problem not in self.let_go:
                self.let_go.append(problem)
        # A boot's registration and readiness checks start after its startup Job: one failed by them while that Job
        # still runs never waited for it (a take-over that did not adopt its lost run's Job).
        running = {j["name"] for j in state["jobs"] if not j["conditions"]}
        for name, cl in present.items():
            failed = cl["phase"] == "failed" and cl["reason"] == ClaimReason.READINESS_GATE_TIMEOUT
            said = f"{name} ({cl['reason']})"
            if failed and c.job_name(name, "startup", 1) in running and said not in self.failed_mid_boot:
                self.failed_mid_boot.append(said)
        for name, cl in present.items():
            if cl["phase"] == "ready":
                self.ready_seen.add(name)
            elif cl["phase"] in ("completed", "failed") and name in self.ready_seen:
                self.ended.add(name)
        self.ended |= {n for n in self.ready_seen if n not in present}

    async def autoscaler(self, began: float) -> None:
        """cluster-autoscaler: scale up while lifecycles are owed, delete what runs a little while, and what failed."""
        while (len(self.ended) < self.plan.lifecycles or not self.killing.done()) and (
            time.monotonic() - began < self.plan.time_limit
        ):
            await asyncio.sleep(0.5)
            try:
                self.track(await asyncio.to_thread(self.state))
            except OSError:
                continue
            code, nodes = await self.call(self.stub.NodeGroupNodes, pb.NodeGroupNodesRequest(id=GROUP))
            if code != grpc.StatusCode.OK:
                continue
            now = time.monotonic()
            doomed = []
            for inst in nodes.instances:
                first = self.first_seen.setdefault(inst.id, now)
                state = inst.status.instanceState
                errored = inst.status.HasField("errorInfo") and inst.status.errorInfo.errorCode
                if errored or (state == pb.InstanceStatus.instanceRunning and now - first > 2.0):
                    doomed.append(inst.id)
            if doomed:
                self.first_seen = {k: v for k, v in self.first_seen.items() if k not in doomed}
                request = pb.NodeGroupDeleteNodesRequest(
                    id=GROUP, nodes=[pb.ExternalGrpcNode(providerID=i, name=i) for i in doomed]
                )
                await self.call(self.stub.NodeGroupDeleteNodes, request)
            owed = self.plan.lifecycles - len(self.ended)
            room = len(self.plan.machines)
            if owed > 0 and len(nodes.instances) < room:
                delta = min(self.rng.randint(1, 2), room - len(nodes.instances))
                code, _ = await self.call(
                    self.stub.NodeGroupIncreaseSize, pb.NodeGroupIncreaseSizeRequest(id=GROUP, delta=delta)
                )
                self.started += delta if code == grpc.StatusCode.OK else 0

    async def supervise(self) -> None:
        """What Kubernetes does for a Deployment: a role that died is started again a moment later."""
        while True:
            await asyncio.sleep(1.0)
            for role in self.plan.roles:
                if not self.procs[role].alive:
                    self.procs[role].start()
            if not self.in_outage:
                await self.ensure_temporal()

    async def killer(self) -> None:
        """The schedule: a SIGKILL every few seconds (a role, or the Temporal server), and one long outage."""
        outage_after = self.rng.randint(1, max(1, self.plan.kills - 1))
        others = [i for i in range(self.plan.kills) if i != outage_after]
        wipes = set(self.rng.sample(others, min(self.plan.wipes, len(others))))
        for i in range(self.plan.kills):
            await asyncio.sleep(self.rng.uniform(3.0, 8.0))
            if i == outage_after:
                await self.outage()
            if i in wipes:
                if self.plan.slow_jobs:
                    await self.slow_job_running(("startup", "shutdown")[self.report.wipes % 2])
                await self.wipe_temporal()
            victim = self.rng.choice([*self.plan.roles, "temporal"])
            self.report.kills[victim] += 1
            if victim == "temporal":
                self.kill_temporal()
                await asyncio.sleep(self.rng.uniform(0.5, 2.0))
                await self.ensure_temporal()
            else:
                self.procs[victim].kill()
                await asyncio.sleep(self.rng.uniform(0.2, 2.0))
                if not self.procs[victim].alive:
                    self.procs[victim].start()

    async def ensure_temporal(self) -> None:
        """Start the Temporal server on its database unless it runs (the supervisor and the killer both ask)."""
        async with self.temporal_lock:
            if self.temporal.process is None or self.temporal.process.poll() is not None:
                await asyncio.to_thread(self.temporal.start)

    async def wipe_temporal(self) -> None:
        """Temporal's database is wiped: the server stopped, its SQLite file deleted, the server started again on an
        empty one. Every workflow is gone; the claims live on in the cluster, and the operator takes them over."""
        async with self.temporal_lock:
            await asyncio.to_thread(self.temporal.stop)
            db = self.temporal.db_file
            assert db is not None
            for path in (db, *(db.with_name(db.name + suffix) for suffix in ("-wal", "-shm", "-journal"))):
                path.unlink(missing_ok=True)
            await asyncio.to_thread(self.temporal.start)
        self.report.wipes += 1

    async def slow_job_running(self, kind: str) -> None:
        """Wait (a bounded while) until the slow machine runs a claim's `kind` Job, so the wipe that follows lands
        during it; the claim is remembered (after quiet: was it taken over, and did its Job end before the next?)."""
        ends = time.monotonic() + SLOW_JOB_WAIT
        while time.monotonic() < ends:
            with contextlib.suppress(OSError):
                for j in (await asyncio.to_thread(self.state))["jobs"]:
                    labels = j["labels"]
                    claim = labels.get("infra.homecluster.dev/nodeclaim")
                    mine = labels.get("infra.homecluster.dev/node") == SLOW and labels.get("type") == kind
                    if mine and claim and not j["conditions"]:
                        self.wiped_mid_job.append((kind, str(claim), str(j["name"])))
                        return
            await asyncio.sleep(0.5)
        self.report.wiped_during[f"no {kind} Job within {SLOW_JOB_WAIT:.0f} s"] += 1

    def kill_temporal(self) -> None:
        proc = self.temporal.process
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        self.temporal.process = None

    async def outage(self) -> None:
        """Temporal gone for `outage` seconds: the provider answers UNAVAILABLE, no role reports itself ready."""
        self.in_outage = True
        self.kill_temporal()
        codes: Counter[str] = Counter()
        readyz: Counter[str] = Counter()
        ends = time.monotonic() + self.plan.outage
        await asyncio.sleep(min(5.0, self.plan.outage / 2))  # a probe notices within a ping or two
        while time.monotonic() < ends:
            code, _ = await self.call(self.stub.NodeGroupTargetSize, pb.NodeGroupTargetSizeRequest(id=GROUP))
            codes[code.name] += 1
            for role in self.plan.roles:
                readyz[f"{role} {await asyncio.to_thread(self.readyz, role)}"] += 1
            await asyncio.sleep(2.0)
        self.in_outage = False
        await self.ensure_temporal()
        # Unreachable is not a failure of the provider's own: a killed provider (connection refused) says nothing.
        other = {k: v for k, v in codes.items() if k not in ("UNAVAILABLE",)}
        self.report.outage = {"codes": codes, "readyz": readyz}
        self.report.violations["provider answers during the outage other than UNAVAILABLE"] = [
            f"{k} x{v}" for k, v in other.items()
        ]
        self.report.violations["roles ready during the outage"] = [k for k in readyz if k.endswith(" 200")]

    def readyz(self, role: str) -> int:
        return readyz(self.health[role])  # 0 while the process is down (killed, restarting): not ready either

    async def bad_objects(self) -> None:
        """Mid-run, objects no contract accepts, stored as an older API server would have taken them."""
        await asyncio.sleep(self.rng.uniform(5.0, 20.0))
        bad = [
            ("nodeclaims", _claim("bad-phase", "worker-1", status={"phase": "exploded"})),
            ("nodeclaims", _claim("no-such-slot", "nowhere")),
            ("nodeclaims", {"metadata": {"name": "empty-spec", "namespace": NS}, "spec": {"group": GROUP}}),
            (
                "groups",
                {
                    "metadata": {"name": "absurd", "namespace": NS},
                    "spec": {"maxSize": 2, "maxNodeProvisionTime": "99999999h"},
                },
            ),
        ]
        for plural, obj in bad:
            obj.update({"apiVersion": "infra.homecluster.dev/v2alpha1", "kind": _KINDS[plural]})
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self.control, "store", {"plural": plural, "object": obj})

    # --- quiet, then the checks --------------------------------------------------------------------------------
    async def go_quiet(self) -> None:
        self.quiet = True
        with contextlib.suppress(OSError):
            self.report.stats = self.control("chaos", {"fault_rate": 0, "drop_watches_every": 0, "compact_every": 0})[
                "stats"
            ]
        await self.ensure_temporal()
        for role in self.plan.roles:
            if not self.procs[role].alive:
                self.procs[role].start()
        ends = time.monotonic() + SETTLE_TIMEOUT
        while time.monotonic() < ends:
            await asyncio.sleep(2.0)
            state = await asyncio.to_thread(self.state)
            self.track(state)
            unsettled = [cl for cl in state["claims"] if cl["phase"] in ("pending", "booting") or cl["deleting"]]
            powered = {s for s, m in state["machines"].items() if m["power"] == "on"}
            ready = {cl["slot"] for cl in state["claims"] if cl["phase"] == "ready" and not cl["deleting"]}
            if not unsettled and powered == ready:
                await asyncio.sleep(10.0)  # and it stays so
                state = await asyncio.to_thread(self.state)
                if not [cl for cl in state["claims"] if cl["phase"] in ("pending", "booting") or cl["deleting"]]:
                    break
        self.final = await asyncio.to_thread(self.state)
        self.report.stats = {**self.report.stats, **self.final["stats"]}

    async def check(self) -> None:
        v = self.report.violations
        state = self.final
        startup: Counter[str] = Counter(
            j["labels"].get("infra.homecluster.dev/nodeclaim", "")
            for j in state["jobs"]
            if j["labels"].get("type") == "startup"
        )
        v["duplicate startup Jobs"] = [f"{claim} x{n}" for claim, n in startup.items() if claim and n > 1]
        # The drain before dark: no shutdown Job started while a Pod other than a DaemonSet's was on its machine.
        v[workloads.STAT] = [f"{state['stats'][workloads.STAT]} Pods"] if state["stats"].get(workloads.STAT) else []
        v["lifecycle Jobs overlapping on one machine"] = (
            [f"{state['stats']['overlapping jobs']} times"] if state["stats"].get("overlapping jobs") else []
        )
        live = [cl for cl in state["claims"] if cl["phase"] in LIVE]
        by_slot = Counter(cl["slot"] for cl in live)
        v["slots with two live claims"] = [f"{slot} x{n}" for slot, n in by_slot.items() if n > 1]
        known = set(self.plan.machines)
        v["machines on without a live claim"] = [
            s for s, m in state["machines"].items() if m["power"] == "on" and s in known and s not in by_slot
        ]
        v["machines off under a ready claim"] = [
            cl["name"] for cl in live if cl["phase"] == "ready" and state["machines"][cl["slot"]]["power"] == "off"
        ]
        v["claims whose resource and workflow disagree"] = await self.disagreements(state)
        v["workflows failed, or with a failing task"] = await self.failed_workflows()
        v["secret markers in histories and logs"] = await self.leaks()
        v["claim finalizers let go before the terminal record"] = self.let_go
        v["tracebacks in the roles' logs"] = self.tracebacks()
        resources, events = await asyncio.to_thread(self.claims_and_events)
        self.report.taken_over = sum(1 for e in events if e.get("reason") == EventReason.CLAIM_TAKEN_OVER)
        taken = {(e.get("involvedObject") or {}).get("name") for e in events if e.get("reason") == "ClaimTakenOver"}
        for kind, claim, _ in self.wiped_mid_job:
            self.report.wiped_during[
                f"{kind} Job running, its claim taken over" if claim in taken else f"{kind} Job running"
            ] += 1
        broken = [
            cl for cl in resources
            if cl["spec"].get("node") == BROKEN and "exit code 3 (Error)" in str(cl.get("status", {}).get("message"))
        ]  # fmt: skip
        self.report.broken_boots = len(broken)
        v["failed boots whose last words are not on their claim"] = [
            f"{records.name(cl)}: {cl['status']['message']}"
            for cl in broken
            if self.plan.markers["last words"] not in cl["status"]["message"]
        ]
        v["boots failed by a check while their startup Job ran"] = self.failed_mid_boot
        shutdowns = Counter(
            j["labels"].get("infra.homecluster.dev/nodeclaim", "")
            for j in state["jobs"]
            if j["labels"].get("type") == "shutdown"
        )
        v["shutdown attempts counted above the Jobs fired"] = [
            f"{records.name(cl)}: {cl['status'].get('shutdownAttempts')} attempts, {shutdowns[records.name(cl)]} Jobs"
            for cl in resources
            if int((cl.get("status") or {}).get("shutdownAttempts") or 0) > shutdowns[records.name(cl)]
        ]
        v["claim Events without their landed write"] = [
            problem for claim in resources for problem in records.events_without_their_write(claim, events)
        ]
        machines = state["machines"]
        v["claim records that disagree with their machines"] = [
            problem
            for claim in resources
            if records.name(claim) not in UNRUNNABLE
            for problem in records.record_disagreements(claim, machines.get(claim["spec"].get("node"), {}).get("power"))
        ]

        # The person's claims are the only writes the registration may send: the operator's (its token names its
        # ServiceAccount) never, nor anything anonymous (a role that lost its identity would show up here).
        v["operator writes sent to the admission webhook"] = [
            f"{call['user']}: {call['operation']} {call['resource']} {call['name']}: {call['outcome']}"
            for call in await asyncio.to_thread(self.webhook_calls)
            if call["user"] != PERSON
        ]

    def tracebacks(self) -> list[str]:
        """An exception a role logged with its traceback is a bug: a failure the roles expect (an API fault, Temporal
        away) is one line. Each one's last line, by role."""
        found = []
        for role in self.plan.roles:
            lines = (self.dir / f"{role}.log").read_text(errors="replace").splitlines()
            for i, line in enumerate(lines):
                if line.startswith("Traceback (most recent call last)"):
                    end = next((j for j in range(i + 1, len(lines)) if not lines[j].startswith((" ", "\t"))), i)
                    found.append(f"{role}: {lines[end][:200]}")
        return found

    def claims_and_events(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The claim resources and the Events of the run's namespace, as the API server holds them after quiet."""
        kube = Kube.connect(server=f"http://127.0.0.1:{self.kube_port}", timeout=10)
        try:
            return kube.list_raw(CLAIMS, NS)[0], kube.list_raw(EVENTS, NS)[0]
        finally:
            kube.close()

    async def disagreements(self, state: dict[str, Any]) -> list[str]:
        found = []
        for cl in state["claims"]:
            if cl["name"] in BAD_CLAIMS:
                continue
            handle = self.client.get_workflow_handle(c.claim_workflow_id(NS, cl["name"]))
            try:
                st = await handle.query(c.ClaimQuery.STATUS)
            except RPCError as err:
                # A claim that ended before Temporal's database was wiped has no workflow left: its resource is the
                # record (its group collects it by its TTL). A live one always has one.
                if not (err.status == RPCStatusCode.NOT_FOUND and cl["phase"] in ("failed", "completed")):
                    found.append(f"{cl['name']}: no workflow answers ({err})")
                continue
            except Exception as err:
                found.append(f"{cl['name']}: no workflow answers ({err})")
                continue
            if (cl["phase"] or "pending") != st["phase"]:
                found.append(f"{cl['name']}: resource {cl['phase']}, workflow {st['phase']}")
        return found

    async def workflows(self) -> list[Any]:
        return [w async for w in self.client.list_workflows()]

    async def failed_workflows(self) -> list[str]:
        found = []
        reasons = {str(r) for r in ClaimReason}
        for wf in await self.workflows():
            handle = self.client.get_workflow_handle(wf.id, run_id=wf.run_id)
            if wf.status == WorkflowExecutionStatus.FAILED:
                try:
                    await handle.result(follow_runs=False)
                except WorkflowFailureError as err:
                    cause = err.cause
                    claim = wf.workflow_type == "NodeClaimWorkflow"
                    if not (claim and isinstance(cause, ApplicationError) and cause.type in reasons):
                        found.append(f"{wf.id} failed: {cause!r}")
            elif wf.status not in (
                WorkflowExecutionStatus.RUNNING,
                WorkflowExecutionStatus.COMPLETED,
                WorkflowExecutionStatus.CONTINUED_AS_NEW,
            ):
                found.append(f"{wf.id} ended {wf.status}")
            history = await handle.fetch_history()
            for e in history.events:
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                    task_cause = e.workflow_task_failed_event_attributes.cause
                    if task_cause not in BENIGN_TASK_FAILURES:
                        found.append(f"{wf.id}: a workflow task failed ({WorkflowTaskFailedCause.Name(task_cause)})")
                        break
        return found

    async def leaks(self) -> list[str]:
        """Every history (payloads decoded) and every log line the operator wrote, searched for the markers."""
        found = []
        markers = self.plan.markers
        for wf in await self.workflows():
            text = history_text(await self.client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history())
            found += [f"{what} in the history of {wf.id}" for what, m in markers.items() if m in text]
        for role in self.plan.roles:
            text = (self.dir / f"{role}.log").read_text(errors="replace")
            found += [f"{what} in the {role} log" for what, m in markers.items() if m in text]
        return found


_KINDS = {"nodeclaims": "NodeClaim", "groups": "Group", "nodes": "Node"}
# Claims stored mid-run that no contract accepts (or no group can take): they are judged by their own checks.
BAD_CLAIMS = ("bad-phase", "no-such-slot", "empty-spec")
UNRUNNABLE = ("bad-phase", "empty-spec")  # "no-such-slot" ends failed (SlotNotFound): its record is checked


def _as_resource(cl: dict[str, Any]) -> dict[str, Any]:
    """A claim of the simulator's state as the records checks read a resource."""
    meta = {"name": cl["name"], "uid": cl.get("uid"), "finalizers": cl.get("finalizers") or []}
    return {"metadata": meta, "status": {"phase": cl.get("phase")}}


def _claim(name: str, slot: str, **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {"node": slot, "group": GROUP, "requestedAt": "2026-01-01T00:00:00Z", "call": "Manual"},
        **extra,
    }


async def run(plan: Plan, workdir: Path | None = None) -> Report:
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        return await Chaos(plan, workdir).run()
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
        return await Chaos(plan, Path(tmp)).run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED") or random.randrange(2**31)))
    parser.add_argument("--lifecycles", type=int, default=50)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--outage", type=float, default=60.0, help="seconds of the Temporal outage")
    parser.add_argument("--fault-rate", type=float, default=0.05, help="fraction of API requests that fail")
    parser.add_argument("--wipes", type=int, default=0, help="times Temporal's database is wiped mid-run")
    parser.add_argument(
        "--slow-jobs",
        type=float,
        default=0.0,
        help="seconds each Job of one more machine takes; each wipe is then timed into one of its running Jobs",
    )
    parser.add_argument("--workers", type=int, default=1, help="worker processes on the task queue (1 or more)")
    parser.add_argument("--keep", type=Path, default=None, help="keep the logs and the Temporal database here")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers: at least 1")
    plan = Plan(
        args.seed,
        args.lifecycles,
        args.kills,
        args.outage,
        args.fault_rate,
        wipes=args.wipes,
        slow_jobs=args.slow_jobs,
        workers=args.workers,
    )
    print(f"chaos seed {plan.seed} (rerun with --seed {plan.seed})", flush=True)
    report = asyncio.run(run(plan, args.keep))
    print(report.table(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
