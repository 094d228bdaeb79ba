"""The whole product on the real control plane: what a user applies from deploy/, a homelab of KWOK machines
played by the power executor, a Temporal dev server, the operator's three roles as processes authenticated by
the ServiceAccount token deploy/rbac binds, and cluster-autoscaler (the real one when it can be had, else the
project's stand-in, tests/realcluster/standin.py) calling the provider over gRPC.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import os
import re
import shutil
import tempfile
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from homelab_autoscaler.devserver import DevServer
from tests.procs import BIN, ROOT, free_port, port_open
from tests.realcluster import crds, deployed
from tests.realcluster.cluster import Cluster, Proc, cluster_autoscaler_binary, wait_until
from tests.realcluster.conftest import FAILED
from tests.realcluster.executor import Executor, Machine

NS = "homelab-autoscaler-system"
OPERATOR_SA = "homelab-autoscaler"
CA_SA = "cluster-autoscaler"
CONTROL_PLANE = "control-plane"
MACHINE_LABEL = "homelab.dev/machine"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
DEPLOY = ROOT / "deploy"
MACHINE_CAPACITY = {"cpu": "4", "memory": "8Gi", "pods": "110"}
WEBHOOK_REGISTRATION = DEPLOY / "components" / "admission" / "webhook.yaml"
WEBHOOK = "nodeclaims.infra.homecluster.dev"


@contextlib.contextmanager
def kept(request: Any, prefix: str, make: Callable[[Path], Stack]) -> Iterator[Stack]:
    """A module's stack in a directory of its own: its logs printed after a failure, the directory removed unless
    something failed or HOMELAB_E2E_KEEP asks to keep it."""
    keep = os.environ.get("HOMELAB_E2E_KEEP", "") not in ("", "0")
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    s = make(directory)
    yield s
    failed = request.session.stash.get(FAILED, [])
    if failed:
        s.dump(80)
    s.stop()
    if not keep and not failed:
        shutil.rmtree(directory, ignore_errors=True)


def phase(claim: dict[str, Any]) -> str:
    return str((claim.get("status") or {}).get("phase") or "")


def hand_claim(name: str, slot: str, namespace: str = NS) -> str:
    """A NodeClaim as a person writes it for `kubectl apply`."""
    return yaml.safe_dump({
        "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "NodeClaim",
        "metadata": {"name": name, "namespace": namespace}, "spec": {"node": slot, "group": "workers"},
    })  # fmt: skip


def seed_refusal(name: str, slot: str, live: str, phase: str) -> str:
    """The seed's refusal of a second live claim, as the API server passes it on: the slot and its live claim
    named, and how the slot becomes free (spelt out here, not taken from admission/review.py)."""
    return (
        f'admission webhook "{WEBHOOK}" denied the request: nodeclaim "{name}" would be a second live claim on slot '
        f'"{slot}": "{live}" is live there ({phase}). One live claim per slot: wait until it ends, or delete it (a '
        "booting or ready claim powers its machine off first)"
    )


def webhook_registration(url_base: str, ca: Path) -> dict[str, Any]:
    """deploy/'s ValidatingWebhookConfiguration as the harness registers it: the Service reference becomes a URL on
    loopback (no kube-proxy routes a Service here) and the caBundle is the harness CA's (what cert-manager's CA
    injector puts there in a cluster). Everything else (rules, matchConditions, failure policy) is deploy/'s."""
    (doc,) = [d for d in yaml.safe_load_all(WEBHOOK_REGISTRATION.read_text())
              if d and d["kind"] == "ValidatingWebhookConfiguration"]  # fmt: skip
    doc["metadata"].pop("annotations", None)
    for hook in doc["webhooks"]:
        path = hook["clientConfig"]["service"].get("path", "")
        hook["clientConfig"] = {"url": url_base + path, "caBundle": base64.b64encode(ca.read_bytes()).decode()}
    return dict(doc)


@dataclass(frozen=True)
class SlotSpec:
    """One slot of the story's homelab and the machine behind it."""

    name: str
    group: str

    @property
    def node_name(self) -> str:
        return self.name

    @property
    def provider_id(self) -> str:
        return f"kwok://{self.name}"

    def machine(self) -> Machine:
        labels = {MACHINE_LABEL: "true", "homelab.dev/pool": self.group}
        return Machine(self.node_name, self.provider_id, labels, dict(MACHINE_CAPACITY))


@dataclass(frozen=True)
class GroupSpec:
    name: str
    max_size: int


@dataclass(frozen=True)
class Homelab:
    groups: tuple[GroupSpec, ...]
    slots: tuple[SlotSpec, ...]
    # The expander's preference, highest first (cluster-autoscaler's priority expander; the stand-in honours it).
    priorities: tuple[str, ...] = ()

    def slots_of(self, group: str) -> list[SlotSpec]:
        return [s for s in self.slots if s.group == group]


STORY_HOMELAB = Homelab(
    groups=(GroupSpec("workers", 2), GroupSpec("spares", 1)),
    slots=(SlotSpec("machine-1", "workers"), SlotSpec("machine-2", "workers"), SlotSpec("spare-1", "spares")),
    priorities=("workers", "spares"),
)


def _pod_spec(operation: str) -> dict[str, Any]:
    """A power Job's pod spec: it runs on the control plane (the machine it powers may be off). A finished shutdown
    Job goes after 30 s (step 2 watches the TTL controller take it); a startup Job stays 10 minutes, as in
    deploy/examples, so a failed boot's `kubectl logs job/…` still has its Pod when people (and step 4) read it."""
    return {
        "image": "registry.homelab.test/power-tool:1.0",
        "command": ["/power", operation],
        "nodeSelector": {CONTROL_PLANE_LABEL: ""},
        "tolerations": [{"key": CONTROL_PLANE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
        "activeDeadlineSeconds": 120,
        "backoffLimit": 0,
        "ttlSecondsAfterFinished": 30 if operation == "off" else 600,
    }


def homelab_objects(homelab: Homelab) -> list[dict[str, Any]]:
    """The Groups and slots a user would apply for this homelab."""
    docs: list[dict[str, Any]] = []
    for g in homelab.groups:
        docs.append({
            "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Group",
            "metadata": {"name": g.name, "namespace": NS},
            # nodeCapacity: a group none of whose machines was ever seen still has a template to scale from zero.
            "spec": {"minSize": 0, "maxSize": g.max_size, "scaleDownUnneededTime": "30s",
                     "scaleDownUnreadyTime": "5m", "maxNodeProvisionTime": "5m", "nodeReadinessTaints": [],
                     "powerOffNodePolicy": "Delete",
                     "nodeLabels": {"homelab.dev/pool": g.name, MACHINE_LABEL: "true"},
                     "nodeCapacity": dict(MACHINE_CAPACITY)},
        })  # fmt: skip
    for s in homelab.slots:
        docs.append({
            "apiVersion": "infra.homecluster.dev/v2alpha1", "kind": "Node",
            "metadata": {"name": s.name, "namespace": NS},
            "spec": {"group": s.group, "kubernetesNodeName": s.node_name, "providerID": s.provider_id,
                     "startupPodSpec": _pod_spec("on"), "shutdownPodSpec": _pod_spec("off")},
        })  # fmt: skip
    return docs


@dataclass
class Stack:
    """Start with `start()`; everything stops, by PID, in `stop()`."""

    dir: Path
    homelab: Homelab = STORY_HOMELAB
    driver: str = "auto"  # "ca": the real cluster-autoscaler, "standin": ours, "none", "auto": the real one if any
    admission: bool = True  # deploy/components/admission's webhook registered and served by the provider process
    cluster: Cluster = field(init=False)
    temporal: DevServer = field(init=False)
    executor: Executor = field(init=False)
    roles: dict[str, Proc] = field(default_factory=dict)
    autoscaler: Proc | None = None
    autoscaler_kind: str = "none"
    autoscaler_note: str = ""
    autoscaler_binary: Path | None = None
    autoscaler_launch: deployed.Launch | None = None
    mtls: bool = False  # the provider and cluster-autoscaler speak mTLS (switch_to_mtls)
    # What the provider's /metrics counted before it was restarted (its counters start again at 0).
    calls_before: Counter[tuple[str, str]] = field(default_factory=Counter)
    reviews_before: Counter[str] = field(default_factory=Counter)
    provider_port: int = field(default_factory=free_port)
    health_ports: dict[str, int] = field(default_factory=dict)
    ca_metrics_port: int = field(default_factory=free_port)
    provider_metrics_port: int = field(default_factory=free_port)
    webhook_port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cluster = Cluster(self.dir / "cluster")

    # --- start and stop -----------------------------------------------------------------------------------------
    def start(self) -> Stack:
        """The whole stack, the driver last. What failed to start is stopped, by PID."""
        return self._start(machines_on=None)

    def start_with_machines_on(self, group: str) -> Stack:
        """The stack with the machines of `group` already on when the operator starts (an install must never power
        off a running lab: it adopts them), then the driver."""
        return self._start(machines_on=group)

    def _start(self, *, machines_on: str | None) -> Stack:
        try:
            self.cluster.start()
            self.install()
            self.start_services()
            slots = self.homelab.slots_of(machines_on) if machines_on else []
            for slot in slots:
                self.executor.power_on(slot.name)
            for slot in slots:  # a kubelet that exits is said at once
                self.cluster.wait(f"{slot.node_name} Ready", functools.partial(self.node_ready, slot.node_name),
                                  within=60)  # fmt: skip
            self.start_operator()
            self.start_autoscaler()
        except BaseException:
            self.dump()
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.autoscaler is not None:
            self.autoscaler.stop()
        for proc in self.roles.values():
            proc.stop()
        with contextlib.suppress(AttributeError):
            self.executor.stop()
        with contextlib.suppress(AttributeError):
            self.temporal.stop()
        self.cluster.stop()

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def procs(self) -> list[Proc]:
        return [*self.cluster.procs, *self.roles.values(), *([self.autoscaler] if self.autoscaler else [])]

    def dump(self, lines: int = 60) -> str:
        text = self.cluster.dump(lines)
        for proc in [*self.roles.values(), *([self.autoscaler] if self.autoscaler else [])]:
            part = f"--- {proc.name} ({'alive' if proc.alive else 'stopped'}) {proc.log}\n{proc.tail(lines)}"
            print(part)
            text += "\n" + part
        with contextlib.suppress(AttributeError):
            for rec in self.executor.records:
                print(f"executor: {rec}")
            for err in self.executor.errors:
                print(f"executor error: {err}")
        return text

    # --- what a user applies -----------------------------------------------------------------------------------
    def install(self) -> None:
        """The namespace, CRDs and RBAC from deploy/ (server-side apply, as the admin), the control-plane node."""
        kc = self.cluster.kubectl
        kc("apply", "--server-side", "-f", str(DEPLOY / "base" / "namespace.yaml"))
        kc("apply", "--server-side", "-k", str(DEPLOY / "crds"))
        crds.established(self.cluster, "groups.infra.homecluster.dev", "nodes.infra.homecluster.dev",
                         "nodeclaims.infra.homecluster.dev")  # fmt: skip
        kc("apply", "--server-side", "-k", str(DEPLOY / "rbac"))
        kc("apply", "--server-side", "-n", NS, "-f", str(DEPLOY / "cluster-autoscaler" / "base" / "rbac.yaml"))
        self._control_plane_node()
        wait_until(f"the serviceaccount controller to create {NS}/default",
                   lambda: k8s.CoreV1Api(self.cluster.admin).read_namespaced_service_account("default", NS),
                   within=60)  # fmt: skip
        self.apply(homelab_objects(self.homelab))
        if self.homelab.priorities:
            self._priority_expander()
        if self.admission:  # as a user applies it: registered before the webhook is up
            self.apply([webhook_registration(f"https://127.0.0.1:{self.webhook_port}", self.cluster.pki.cert)])

    def apply(self, docs: list[dict[str, Any]]) -> None:
        self.cluster.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(docs))

    def _control_plane_node(self) -> None:
        """The always-on node: it hosts the power Jobs' Pods, belongs to no group, and runs nothing else."""
        body = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": CONTROL_PLANE,
                         "labels": {CONTROL_PLANE_LABEL: "", "kubernetes.io/hostname": CONTROL_PLANE,
                                    "kubernetes.io/os": "linux", "type": "kwok"}},
            "spec": {"taints": [{"key": CONTROL_PLANE_LABEL, "effect": "NoSchedule"}]},
            "status": {"capacity": {"cpu": "8", "memory": "16Gi", "pods": "110"},
                       "allocatable": {"cpu": "8", "memory": "16Gi", "pods": "110"}},
        }  # fmt: skip
        core: Any = k8s.CoreV1Api(self.cluster.admin)
        core.create_node(body)
        self.cluster.start_kubelet(CONTROL_PLANE)

        def ready() -> bool:
            node = core.read_node(CONTROL_PLANE)
            return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

        wait_until("KWOK to make the control-plane node Ready", ready, within=60,
                   procs=[self.cluster.kubelets[CONTROL_PLANE]])  # fmt: skip

    def _priority_expander(self) -> None:
        n = len(self.homelab.priorities)
        prio = {str((n - i) * 10): [f"^{g}$"] for i, g in enumerate(self.homelab.priorities)}
        self.apply([{
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cluster-autoscaler-priority-expander", "namespace": NS},
            "data": {"priorities": yaml.safe_dump(prio)},
        }])  # fmt: skip

    def start_services(self) -> None:
        """Temporal's dev server and the machines' executor: what the operator needs besides the cluster."""
        self.temporal = DevServer(port=free_port(), ui_port=free_port(), headless=True,
                                  db_file=self.dir / "temporal.db", log_file=self.dir / "temporal.log")  # fmt: skip
        self.temporal.start()
        self.executor = Executor(self.cluster, NS, {s.name: s.machine() for s in self.homelab.slots})
        self.executor.start()

    # --- the operator -------------------------------------------------------------------------------------------
    def start_operator(self) -> None:
        kubeconfig = self.cluster.token_kubeconfig("operator", NS, OPERATOR_SA)
        for role in ("worker", "provider", "watch"):
            self.health_ports[role] = free_port()
            # The provider's /metrics counts cluster-autoscaler's calls (the story prints them per driver).
            metrics = f"127.0.0.1:{self.provider_metrics_port}" if role == "provider" else ""
            args = [
                str(BIN / "homelab-autoscaler"), role, "--temporal-address", self.temporal.address,
                "--kubeconfig", str(kubeconfig), "--metrics-address", metrics, "--health-port",
                str(self.health_ports[role]),
            ]  # fmt: skip
            if role in ("provider", "watch"):
                args += ["--namespaces", NS]
            if role == "provider":
                args += ["--provider-address", f"127.0.0.1:{self.provider_port}", *self._webhook_args()]
            if role == "watch":
                args += ["--lease-namespace", NS]
            self.roles[role] = Proc(role, args, self.dir / f"operator-{role}.log",
                                    env={"HOMELAB_AUTOSCALER_LOG_LEVEL": "INFO"}).start()  # fmt: skip
        for role in list(self.health_ports):
            self.wait_ready(role)

    def wait_ready(self, role: str) -> None:
        wait_until(f"the operator's {role} to answer /readyz",
                   functools.partial(_http_ok, self.health_ports[role], "/readyz"), within=90,
                   procs=[self.roles[role]])  # fmt: skip
        if role == "provider" and self.admission:
            wait_until("the admission webhook to listen", functools.partial(port_open, self.webhook_port),
                       within=30, procs=[self.roles[role]])  # fmt: skip

    def _webhook_args(self) -> list[str]:
        """The webhook on loopback with a serving certificate of the harness CA (cert-manager's, in a cluster)."""
        if not self.admission:
            return []
        pair = self.cluster.pki.issue("webhook", "homelab-autoscaler-webhook", server=True, ips=("127.0.0.1",))
        return ["--webhook-address", f"127.0.0.1:{self.webhook_port}", "--webhook-tls-cert", str(pair.cert),
                "--webhook-tls-key", str(pair.key)]  # fmt: skip

    def restart_role(self, role: str) -> None:
        """A role's process started again with the arguments it had (a pod restarted by its Deployment)."""
        self.roles[role].start()
        self.wait_ready(role)

    # --- cluster-autoscaler -------------------------------------------------------------------------------------
    def start_autoscaler(self) -> None:
        """cluster-autoscaler as deploy/cluster-autoscaler/plaintext deploys it (deployed.py), else the stand-in; with
        driver "ca" (CI: HOMELAB_E2E_DRIVER=ca) a run that cannot have the real one fails here, saying why."""
        if self.driver == "none":
            return
        binary, self.autoscaler_note = self.choose_driver()
        if binary is not None:
            self.autoscaler_kind, self.autoscaler_binary = "cluster-autoscaler", binary
            self._run_autoscaler(binary, deployed.AUTOSCALER_PLAINTEXT)
            return
        kubeconfig = self.cluster.token_kubeconfig("cluster-autoscaler", NS, CA_SA)
        self.autoscaler_kind = "stand-in"
        args = [
            str(BIN / "python"), "-m", "tests.realcluster.standin", "--kubeconfig", str(kubeconfig),
            "--provider", f"127.0.0.1:{self.provider_port}", "--namespace", NS,
            "--priorities", ",".join(self.homelab.priorities), "--status-port", str(self.ca_metrics_port),
            *STANDIN_FLAGS,
        ]  # fmt: skip
        self.autoscaler = Proc("standin-autoscaler", args, self.dir / "standin-autoscaler.log").start()
        wait_until("the stand-in autoscaler to answer /health-check",
                   lambda: _http_ok(self.ca_metrics_port, "/health-check"), within=60,
                   procs=[self.autoscaler])  # fmt: skip

    def choose_driver(self) -> tuple[Path | None, str]:
        """The real cluster-autoscaler's binary (None: the stand-in drives) and a line naming the driver. With driver
        "ca" a run that cannot have the real one fails here, saying why."""
        binary, note = cluster_autoscaler_binary()
        if self.driver == "ca" and binary is None:
            raise AssertionError(f"the real cluster-autoscaler is required (HOMELAB_E2E_DRIVER=ca) and cannot be had: "
                                 f"{note}")  # fmt: skip
        if binary is not None and self.driver in ("ca", "auto"):
            return binary, note
        if self.driver == "standin":
            return None, "the project's stand-in (tests/realcluster/standin.py), asked for by HOMELAB_E2E_DRIVER"
        return None, f"the project's stand-in (tests/realcluster/standin.py); the real one: {note}"

    def _run_autoscaler(self, binary: Path, kustomization: str,
                        secrets: dict[str, dict[str, bytes]] | None = None) -> None:  # fmt: skip
        """The real cluster-autoscaler with the Deployment and cloud-config `kustomization` renders. A flag of the
        manifest the binary rejects ends the process, and the wait below fails with its log."""
        kubeconfig = self.cluster.token_kubeconfig("cluster-autoscaler", NS, CA_SA)
        stem = Path(kustomization).name
        self.autoscaler_launch = deployed.autoscaler_launch(
            self.cluster.kubectl, binary, kustomization, self.dir / f"cluster-autoscaler-{stem}",
            kubeconfig=kubeconfig, metrics_port=self.ca_metrics_port, provider_port=self.provider_port,
            secrets=secrets,
        )  # fmt: skip
        print(f"\ncluster-autoscaler as {kustomization} deploys it; the harness changed, and why:")
        print("".join(f"  {line}\n" for line in self.autoscaler_launch.changes), end="")
        print(f"  its command line: {' '.join(self.autoscaler_launch.argv)}")
        self.autoscaler = Proc("cluster-autoscaler", self.autoscaler_launch.argv,
                               self.dir / "cluster-autoscaler.log").start()  # fmt: skip
        wait_until("cluster-autoscaler to answer /health-check",
                   lambda: _http_ok(self.ca_metrics_port, "/health-check"), within=90,
                   procs=[self.autoscaler])  # fmt: skip

    def switch_to_mtls(self) -> None:
        """What a user's move to deploy/overlays/homelab-mtls and deploy/cluster-autoscaler/mtls rolls out: the
        provider restarted with the server certificate cert-manager would issue (it then requires a client
        certificate of the same CA), cluster-autoscaler restarted with the mtls cloud-config and its client
        certificate. The real driver only: the stand-in speaks plaintext."""
        assert self.autoscaler_kind == "cluster-autoscaler" and self.autoscaler is not None, self.autoscaler_kind
        docs = deployed.render(self.cluster.kubectl, deployed.OPERATOR_MTLS)
        secrets = deployed.issue_as_cert_manager(docs, self.dir / "cert-manager")
        env = deployed.provider_tls_env(docs, self.dir / "provider-mtls", secrets)
        assert self.autoscaler_binary is not None
        self.autoscaler.stop()
        self.calls_before, self.reviews_before = self.provider_calls(), self.admission_reviews()
        provider = self.roles["provider"]
        provider.stop()
        provider.env.update(env)
        self.restart_role("provider")
        self.mtls = True
        self._run_autoscaler(self.autoscaler_binary, deployed.AUTOSCALER_MTLS, secrets)

    # --- reading the cluster ------------------------------------------------------------------------------------
    def claims(self) -> list[dict[str, Any]]:
        api: Any = k8s.CustomObjectsApi(self.cluster.admin)
        doc = api.list_namespaced_custom_object("infra.homecluster.dev", "v2alpha1", NS, "nodeclaims")
        return list(doc["items"])

    def node(self, name: str) -> Any | None:
        try:
            return k8s.CoreV1Api(self.cluster.admin).read_node(name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def node_ready(self, name: str) -> bool:
        node = self.node(name)
        if node is None:
            return False
        return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

    def provider_metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.provider_metrics_port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def admission_reviews(self) -> Counter[str]:
        """The webhook's answers so far (allowed, refused, unjudged), from the provider's /metrics (and before its
        restart)."""
        return self.reviews_before + admission_reviews(self.provider_metrics())

    def provider_calls(self) -> Counter[tuple[str, str]]:
        """cluster-autoscaler's calls to the provider so far, by method and gRPC code, from the provider's /metrics
        (and before its restart)."""
        text = self.provider_metrics()
        calls: Counter[tuple[str, str]] = Counter(self.calls_before)
        for line in text.splitlines():
            m = CALLS.match(line)
            if m:
                labels = dict(LABEL.findall(m.group("labels")))
                calls[(labels.get("method", "?"), labels.get("code", "?"))] += int(float(m.group("value")))
        return calls

    def autoscaler_events(self) -> list[Any]:
        """cluster-autoscaler's own Events (source cluster-autoscaler) in every namespace, oldest first."""
        core: Any = k8s.CoreV1Api(self.cluster.admin)
        items = core.list_event_for_all_namespaces(field_selector=f"source={CA_SA}", _request_timeout=10).items
        return sorted(items, key=lambda e: str(e.last_timestamp or e.event_time or e.metadata.creation_timestamp))

    def autoscaler_status(self) -> str:
        """cluster-autoscaler's status ConfigMap (both drivers write it), or '' when there is none yet."""
        try:
            cm = k8s.CoreV1Api(self.cluster.admin).read_namespaced_config_map("cluster-autoscaler-status", NS)
        except ApiException as exc:
            if exc.status == 404:
                return ""
            raise
        return str((cm.data or {}).get("status", ""))


STANDIN_FLAGS = ("--scan-interval", "5", "--scale-down-unneeded-time", "30", "--backoff", "120")


# A counter sample of the provider's calls (the metric's exact name and suffix aside).
CALLS = re.compile(r"^homelab_provider_calls(?:_total)?\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.e+]+)$")
LABEL = re.compile(r'(\w+)="([^"]*)"')


def admission_reviews(text: str) -> Counter[str]:
    """The webhook's answers by decision, from the provider's /metrics text."""
    found: Counter[str] = Counter()
    for line in text.splitlines():
        m = REVIEWS.match(line)
        if m:
            found[dict(LABEL.findall(m.group("labels"))).get("decision", "?")] += int(float(m.group("value")))
    return found


REVIEWS = re.compile(r"^homelab_admission_reviews(?:_total)?\{(?P<labels>[^}]*)\}\s+(?P<value>[0-9.e+]+)$")


def _http_ok(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False
