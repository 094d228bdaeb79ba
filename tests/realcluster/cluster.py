"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and
KWOK's fake kubelets, built by tests/realcluster/build.sh. Each process is started in order, waited for with a
bound that says what it waited for, stopped by its own PID, and logged to a file printed when something fails.

The harness itself speaks as `system:masters` (a client certificate); what is under test (the operator,
cluster-autoscaler) speaks with ServiceAccount tokens bound to the rules in deploy/, so RBAC is enforced.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from tests.procs import ROOT, free_port
from tests.realcluster import pki

HERE = Path(__file__).resolve().parent
BUILD = HERE / "build.sh"
SERVICE_CIDR = "10.0.0.0/24"
# The power Jobs' Pods are the executor's (tests/realcluster/executor.py): KWOK only makes Pods Ready and deletes
# them, it never completes one.
KWOK_STAGES = ("node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
               "pod/fast/pod-ready.yaml", "pod/fast/pod-delete.yaml")  # fmt: skip
# KWOK's Logs CRD (build.sh copies it beside the binaries): with `--enable-crds=Logs` a KWOK kubelet serves a Pod's
# `kubectl logs` from the file its Logs object names (the executor writes its power Pods' output there).
KWOK_LOGS_CRD = "kwok-crds/kwok.x-k8s.io_logs.yaml"
# Audit: the operator's requests in full (bodies and responses, for the emulator's replay), everyone's metadata (for
# the RBAC table), leases and events of the control plane's own components left out (noise); PodDisruptionBudgets in
# full, whoever reads or writes them (the eviction replay's judges).
OPERATOR_USER = "system:serviceaccount:homelab-autoscaler-system:homelab-autoscaler"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "RequestResponse", "users": [OPERATOR_USER]},
        {"level": "None", "userGroups": ["system:nodes"]},
        {
            "level": "None",
            "users": ["kwok", "system:kube-scheduler", "system:kube-controller-manager"],
            "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
        },
        # The replay seeds an eviction's budgets as the server held them: the operator may be refused by one it never
        # read (tests/realcluster/replay.py).
        {
            "level": "RequestResponse",
            "resources": [{"group": "policy", "resources": ["poddisruptionbudgets", "poddisruptionbudgets/status"]}],
        },
        {"level": "Metadata"},
    ],
}


class Unavailable(RuntimeError):
    """The binaries are not built (or cannot be): the tests skip with this message."""


def bin_dir() -> Path:
    """The cache directory build.sh fills; `--where` builds nothing."""
    out = subprocess.run([str(BUILD), "--where"], capture_output=True, text=True, timeout=30, check=True)
    return Path(out.stdout.strip()) / "bin"


def require_binaries() -> Path:
    """The bin directory, or `Unavailable` naming what is missing and the command that builds it."""
    where = bin_dir()
    missing = [n for n in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok",
                           f"../{KWOK_LOGS_CRD}") if not (where / n).is_file()]  # fmt: skip
    if missing:
        raise Unavailable(f"{', '.join(missing)} not built in {where}: run `make cluster-bins` (Go >= 1.26)")
    return where


def cluster_autoscaler_binary() -> tuple[Path | None, str]:
    """cluster-autoscaler if one can be had (HOMELAB_CLUSTER_AUTOSCALER, or built by build.sh into its own cache
    directory), with how it was had; else None and why not."""
    given = os.environ.get("HOMELAB_CLUSTER_AUTOSCALER")
    if given:
        path = Path(given)
        if not path.is_file():
            raise Unavailable(f"HOMELAB_CLUSTER_AUTOSCALER={given}: no such file")
        return path, f"cluster-autoscaler from HOMELAB_CLUSTER_AUTOSCALER ({given})"
    out = subprocess.run([str(BUILD), "--where-cluster-autoscaler"], capture_output=True, text=True, timeout=30,
                         check=True)  # fmt: skip
    where = Path(out.stdout.strip())
    binary, built, why = where / "bin" / "cluster-autoscaler", where / "built-from", where / "unavailable"
    if binary.is_file() and built.is_file():
        return binary, f"cluster-autoscaler {CLUSTER_AUTOSCALER_RELEASE} {built.read_text().strip()} ({binary})"
    text = why.read_text().strip() if why.is_file() else "build.sh has not tried to build it (make cluster-bins)"
    return None, text


def _versions() -> dict[str, str]:
    """tests/realcluster/versions.env's NAME=value lines."""
    pairs = (line.split("=", 1) for line in (HERE / "versions.env").read_text().splitlines()
             if "=" in line and not line.lstrip().startswith("#"))  # fmt: skip
    return {k.strip(): v.strip() for k, v in pairs}


CLUSTER_AUTOSCALER_RELEASE = _versions()["CLUSTER_AUTOSCALER_RELEASE"]


@dataclass
class Proc:
    """One process of the stack, its log, and how to stop it (by its own PID, SIGTERM then SIGKILL)."""

    name: str
    args: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = ROOT
    popen: subprocess.Popen[bytes] | None = None
    stopped: bool = False  # asked to stop (a machine powered off): its exit is no failure

    def start(self) -> Proc:
        self.stopped = False
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.args, cwd=self.cwd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env},
                start_new_session=True,
            )  # fmt: skip
        return self

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    @property
    def died(self) -> bool:
        """It exited when nobody asked it to: what a wait on it can never see happen."""
        return self.popen is not None and self.popen.poll() is not None and not self.stopped

    def stop(self, grace: float = 10.0) -> None:
        self.stopped = True
        proc = self.popen
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(grace)

    def tail(self, lines: int = 40) -> str:
        if not self.log.is_file():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def wait_until(what: str, check: Callable[[], Any], *, within: float, every: float = 0.25,
               procs: list[Proc] | Callable[[], list[Proc]] | None = None,
               now: Callable[[], str] | None = None) -> Any:  # fmt: skip
    """Poll `check` until it returns something truthy; fail naming what did not happen, how things stand then
    (`now`: `what` was written before the wait), and a process that died (`procs`, or a callable for processes
    started during the wait, such as the kubelets of machines that boot)."""
    end = time.monotonic() + within
    last: BaseException | None = None
    while True:
        for p in procs() if callable(procs) else procs or []:
            if p.died:
                assert p.popen is not None
                raise AssertionError(
                    f"{p.name} exited with code {p.popen.returncode} while waiting for {what}:\n{p.tail()}"
                )
        try:
            got = check()
            if got:
                return got
        except (OSError, ValueError, ApiException, urllib.error.URLError, AssertionError) as exc:
            last = exc
        if time.monotonic() > end:
            hint = f" (last error: {last})" if last else ""
            if now is not None:
                hint += f"; now: {now()}"
            raise AssertionError(f"waited {within:.0f} s for {what}, in vain{hint}")
        time.sleep(every)


class Cluster:
    """etcd → kube-apiserver → controller-manager and scheduler, in `directory`, and a KWOK kubelet per machine
    that is on; `stop()` reverses it."""

    def __init__(self, directory: Path, *, bins: Path | None = None, node_monitor_grace: str = "20s") -> None:
        self.dir = directory
        # Flags a tier adds to the API server before `start()` (the real node's egress door, its kubelet client).
        self.apiserver_extra_args: list[str] = []
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bins = bins or require_binaries()
        self.node_monitor_grace = node_monitor_grace
        self.procs: list[Proc] = []
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.port = free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.audit_log = self.dir / "audit.jsonl"
        self.pki = pki.Authority(self.dir / "pki")
        self.serving = self.pki.issue(
            "apiserver", "kube-apiserver", server=True, ips=("127.0.0.1", "10.0.0.1"),
            dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local"),
        )  # fmt: skip
        self.sa_key = pki.service_account_key(self.pki.dir / "sa.key")
        self.admin_kubeconfig = self._component_kubeconfig("admin", "kubernetes-admin", ("system:masters",))
        self._admin: k8s.ApiClient | None = None
        self._admin_lock = threading.Lock()
        self._kwok_kubeconfig: Path | None = None
        self.kubelets: dict[str, Proc] = {}
        # Machines boot on the machine room's timer threads, the executor's and the test's own, side by side: the
        # kubelets and what the first one sets up (KWOK's certificate, its CRD, its Stages) change under this lock.
        # Two first boots at once each issued the certificate, and a KWOK read one's cert with the other's key.
        self._kubelets_lock = threading.Lock()

    # --- kubeconfigs and clients --------------------------------------------------------------------------------
    def _component_kubeconfig(self, stem: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        pair = self.pki.issue(stem, user, organizations=groups)
        return pki.kubeconfig(self.dir / f"{stem}.kubeconfig", server=self.server, ca=self.pki.cert, user=user,
                              pair=pair)  # fmt: skip

    def token_kubeconfig(self, stem: str, namespace: str, service_account: str, *, hours: int = 6) -> Path:
        """A kubeconfig holding a bound token of a ServiceAccount (the TokenRequest API), as a pod would get one."""
        core: Any = k8s.CoreV1Api(self.admin)
        req = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=hours * 3600)
        )
        resp = core.create_namespaced_service_account_token(service_account, namespace, req)
        user = f"system:serviceaccount:{namespace}:{service_account}"
        return pki.kubeconfig(self.dir / f"{stem}.kubeconfig", server=self.server, ca=self.pki.cert, user=user,
                              token=str(resp.status.token))  # fmt: skip

    @property
    def admin(self) -> k8s.ApiClient:
        with self._admin_lock:  # the harness's threads share one client, made once
            if self._admin is None:
                self._admin = k8s_config.new_client_from_config(config_file=str(self.admin_kubeconfig))
            return self._admin

    def kubectl(self, *args: str, kubeconfig: Path | None = None, input: str | None = None, timeout: float = 120,
                check: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """kubectl of the same release as the server, as the admin unless another kubeconfig is given."""
        cfg = kubeconfig or self.admin_kubeconfig
        done = subprocess.run(
            [str(self.bins / "kubectl"), "--kubeconfig", str(cfg), *args], input=input, capture_output=True,
            text=True, timeout=timeout, cwd=ROOT, env={**os.environ, "HOME": str(self.dir)},
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}):\n{done.stderr}{done.stdout}")
        return done

    def _https_ok(self, port: int, path: str, *, client: pki.Pair | None = None) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.pki.cert)) if client else ssl._create_unverified_context()
        if client:
            ctx.load_cert_chain(str(client.cert), str(client.key))
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=ctx, timeout=3) as r:
                return bool(r.status == 200)
        except urllib.error.HTTPError:
            return False

    # --- the processes ------------------------------------------------------------------------------------------
    def _start(self, name: str, args: list[str], env: dict[str, str] | None = None) -> Proc:
        proc = Proc(name, args, self.dir / f"{name}.log", env=env or {}).start()
        self.procs.append(proc)
        return proc

    def start(self) -> Cluster:
        try:
            self._start_etcd()
            self._start_apiserver()
            self._start_controllers()
        except BaseException:
            self.dump()
            self.stop()
            raise
        return self

    def _start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        client_url = f"http://127.0.0.1:{self.etcd_port}"
        etcd = self._start("etcd", [
            str(self.bins / "etcd"), "--name", "default", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}", "--unsafe-no-fsync", "--log-level", "warn",
            "--listen-metrics-urls", f"http://127.0.0.1:{free_port()}",
        ])  # fmt: skip

        def healthy() -> bool:
            with urllib.request.urlopen(f"{client_url}/health", timeout=2) as r:
                return bool(json.loads(r.read()).get("health") == "true")

        wait_until("etcd to answer /health", healthy, within=60, procs=[etcd])

    def _start_apiserver(self) -> None:
        policy = self.dir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        api = self._start("kube-apiserver", [
            str(self.bins / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.port}",
            f"--tls-cert-file={self.serving.cert}", f"--tls-private-key-file={self.serving.key}",
            f"--client-ca-file={self.pki.cert}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.sa_key}", f"--service-account-signing-key-file={self.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=Node,RBAC",
            "--allow-privileged=true", "--profiling=false", "--endpoint-reconciler-type=none",
            f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}", "--audit-log-format=json",
            "--audit-log-mode=blocking", f"--cert-dir={self.dir / 'apiserver-certs'}",
            *self.apiserver_extra_args,
            # A KWOK node's Hostname address is its name, which resolves nowhere here: `kubectl logs` reaches its
            # kubelet at its InternalIP (127.0.0.1).
            "--kubelet-preferred-address-types=InternalIP",
        ])  # fmt: skip
        admin = pki.Pair(self.pki.dir / "admin.crt", self.pki.dir / "admin.key")
        wait_until("kube-apiserver to answer /readyz", lambda: self._https_ok(self.port, "/readyz", client=admin),
                   within=120, procs=[api])  # fmt: skip

    def _start_controllers(self) -> None:
        cm_cfg = self._component_kubeconfig("controller-manager", "system:kube-controller-manager")
        sched_cfg = self._component_kubeconfig("scheduler", "system:kube-scheduler")
        cm_port, sched_port = free_port(), free_port()
        cm = self._start("kube-controller-manager", [
            str(self.bins / "kube-controller-manager"), f"--kubeconfig={cm_cfg}",
            f"--authentication-kubeconfig={cm_cfg}", f"--authorization-kubeconfig={cm_cfg}",
            "--authentication-skip-lookup=true",
            "--bind-address=127.0.0.1", f"--secure-port={cm_port}", "--leader-elect=false",
            "--use-service-account-credentials=true", f"--service-account-private-key-file={self.sa_key}",
            f"--root-ca-file={self.pki.cert}", f"--node-monitor-grace-period={self.node_monitor_grace}",
            "--controllers=*,-cloud-node-lifecycle-controller,-service-lb-controller,-node-route-controller",
            f"--cert-dir={self.dir / 'cm-certs'}",
        ])  # fmt: skip
        sched = self._start("kube-scheduler", [
            str(self.bins / "kube-scheduler"), f"--kubeconfig={sched_cfg}",
            f"--authentication-kubeconfig={sched_cfg}", f"--authorization-kubeconfig={sched_cfg}",
            "--authentication-skip-lookup=true",
            "--bind-address=127.0.0.1", f"--secure-port={sched_port}", "--leader-elect=false",
            f"--cert-dir={self.dir / 'sched-certs'}",
        ])  # fmt: skip
        wait_until("kube-controller-manager to answer /healthz", lambda: self._https_ok(cm_port, "/healthz"),
                   within=90, procs=[cm])  # fmt: skip
        wait_until("kube-scheduler to answer /healthz", lambda: self._https_ok(sched_port, "/healthz"),
                   within=90, procs=[sched])  # fmt: skip

        def default_sa() -> bool:
            k8s.CoreV1Api(self.admin).read_namespaced_service_account("default", "default")
            return True

        wait_until("the serviceaccount controller to create default/default", default_sa, within=60, procs=[cm])

    def _kwok_config(self) -> Path:
        """KWOK's Stages, written once and whole: each machine's KWOK reads the file as it starts, and a rewrite for
        the next machine (truncate, then write) left one reading an empty file ("no stages found"; it exited, and
        its Node never turned Ready)."""
        path = self.dir / "kwok.yaml"
        if path.exists():
            return path
        stages_dir = self.bins.parent / "kwok-stages"
        docs: list[Any] = [yaml.safe_load((stages_dir / rel).read_text()) for rel in KWOK_STAGES]
        partial = path.with_suffix(".partial")
        partial.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        partial.replace(path)
        return path

    def start_kubelet(self, node: str) -> Proc:
        """A machine's kubelet: one KWOK process that manages only `node` (Ready, its Lease, its Pods' states).

        Stopping it is the machine losing power: the Lease goes stale and the node-lifecycle controller marks the
        Node NotReady after the grace period, as for a real kubelet (KWOK keeps renewing the Lease of a node it
        stopped managing through its selector, so one process per machine is the faithful way to stop one).
        """
        with self._kubelets_lock:
            return self._start_kubelet(node)

    def _start_kubelet(self, node: str) -> Proc:
        if node in self.kubelets and self.kubelets[node].alive:
            return self.kubelets[node]
        home = self.dir / "kwok-home"
        home.mkdir(exist_ok=True)
        if self._kwok_kubeconfig is None:
            self._kwok_kubeconfig = self._component_kubeconfig("kwok", "kwok", ("system:masters",))
            self._kwok_logs_crd()
        # Its kubelet server on the port the Node advertises (daemonEndpoints), where `kubectl logs` reaches it.
        port = free_port()
        proc = Proc(f"kubelet-{node}", [
            str(self.bins / "kwok"), f"--kubeconfig={self._kwok_kubeconfig}", f"--manage-single-node={node}",
            "--node-ip=127.0.0.1", "--node-lease-duration-seconds=40", f"--config={self._kwok_config()}",
            f"--server-address=127.0.0.1:{port}", f"--node-port={port}", "--enable-crds=Logs",
        ], self.dir / f"kubelet-{node}.log", env={"HOME": str(home)}).start()  # fmt: skip
        self.kubelets[node] = proc
        return proc

    def _kwok_logs_crd(self) -> None:
        """KWOK's Logs CRD, established before the first kubelet watches it."""
        self.kubectl("apply", "--server-side", "-f", str(self.bins.parent / KWOK_LOGS_CRD))
        self.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/logs.kwok.x-k8s.io")

    def stop_kubelet(self, node: str) -> None:
        with self._kubelets_lock:
            proc = self.kubelets.get(node)
        if proc is not None:
            proc.stop()

    def dead_kubelets(self) -> list[Proc]:
        """The kubelets that exited unasked (a machine powered off is asked): `wait` fails at once on one, with its
        log, not at its bound for a Node that never comes. A copy of the table, not the lock: a first kubelet's start
        holds that while kubectl waits for KWOK's CRD."""
        return [p for p in list(self.kubelets.values()) if p.died]

    def wait(self, what: str, check: Callable[[], Any], *, within: float, every: float = 0.25,
             procs: list[Proc] | None = None, now: Callable[[], str] | None = None) -> Any:  # fmt: skip
        """`wait_until` something the machines take part in: it fails at once when a kubelet (or one of `procs`)
        exits unasked, a Node that will never come."""
        return wait_until(what, check, within=within, every=every, now=now,
                          procs=lambda: [*(procs or []), *self.dead_kubelets()])  # fmt: skip

    def stop(self) -> None:
        for proc in [*self.kubelets.values(), *reversed(self.procs)]:
            proc.stop()
        if self._admin is not None:
            self._admin.close()
            self._admin = None

    def dump(self, lines: int = 40) -> str:
        """Every process's last lines, for a failure's report."""
        text = "\n".join(f"--- {p.name} ({'alive' if p.alive else 'stopped'}) {p.log}\n{p.tail(lines)}"
                         for p in [*self.procs, *self.kubelets.values()])  # fmt: skip
        print(text)
        return text

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running(directory: Path) -> Iterator[Cluster]:
    with Cluster(directory) as cluster:
        yield cluster
