"""The product as a user installs it, on a real node (`make e2e-pods`): a kubelet with containerd, runc, the CNI
bridge, kube-proxy and CoreDNS in a network namespace of the run's own, joined to the harness's control plane
beside the KWOK machines; images built here; deploy/ installed by docs/install.md's own commands.

The tests run in order on one stack; the last one stops it and checks the machine is left as found.
"""

from __future__ import annotations

import base64
import datetime
import functools
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.realcluster import audit, crds, doors, inventory
from tests.realcluster.certmanager import CertManager
from tests.realcluster.cluster import cluster_autoscaler_binary, wait_until
from tests.realcluster.conftest import FAILED
from tests.realcluster.node import NODE_NAME, PREFIX, cert_manager_crds
from tests.realcluster.podstack import (
    PREVIOUS,
    TOLERATE_CONTROL_PLANE,
    PodStack,
    machine_room_service,
    powered,
    temporal_images,
)
from tests.realcluster.stack import (
    DEPLOY,
    MACHINE_LABEL,
    NS,
    GroupSpec,
    Homelab,
    SlotSpec,
    hand_claim,
    phase,
    seed_refusal,
)

OPERATOR_IMAGE = "ghcr.io/homecluster/homelab-autoscaler"
CA_IMAGE = "registry.k8s.io/autoscaling/cluster-autoscaler"
ROOT = DEPLOY.parent
MANAGED = "app.kubernetes.io/managed-by=homelab-autoscaler"
# Every command docs/install.md types, as run here (the test overlays in place of deploy/'s paths) or why not.
GUIDE: list[tuple[str, str]] = []

pytestmark = [pytest.mark.realpods, pytest.mark.timeout(3600)]

STATE: dict[str, Any] = {}


@pytest.fixture(scope="module")
def pods(request: pytest.FixtureRequest) -> Iterator[PodStack]:
    STATE["before"] = inventory.take(markers=(PREFIX,))
    keep = os.environ.get("HOMELAB_E2E_KEEP", "") not in ("", "0")
    directory = Path(tempfile.mkdtemp(prefix="hlas-pods-"))
    began = time.monotonic()
    stack = PodStack(directory)
    stack.start()
    print(f"\nreal node up in {time.monotonic() - began:.0f} s in {directory}")
    STATE["stack"] = stack
    yield stack
    failed = bool(request.session.stash.get(FAILED, []))
    if failed:
        stack.dump(80)
    stack.stop()
    if keep or failed:  # what the Pods printed stays in kept-logs/ for whoever reads the failure
        if not keep:  # the bulk (unpacked images, the registry's run files) goes
            for bulky in ("node/containerd", "images", "registry", "previous"):
                shutil.rmtree(directory / bulky, ignore_errors=True)
        print(f"kept {directory}")
    else:
        shutil.rmtree(directory, ignore_errors=True)


def guide_text(doc: str) -> str:
    """A page of docs/ with each shell line continuation joined, so a command reads as one line."""
    return re.sub(r"\\\n\s*", "", (ROOT / "docs" / doc).read_text())


def typed(s: PodStack, command: str, paths: dict[str, Path] | None = None, *, doc: str = "install.md",
          timeout: float = 600) -> str:  # fmt: skip
    """A command of docs/install.md (or `doc`) run as written: the page must say it, word for word; `kubectl` of
    the cluster's release with the admin's kubeconfig, a deploy/ path replaced by the run's overlay of it (which
    renames images only), from the repository root."""
    assert command in guide_text(doc), f"docs/{doc} does not say `{command}`"
    args = shlex.split(command)
    assert args[0] == "kubectl", command
    for i, a in enumerate(args):
        if paths and a in paths:
            args[i] = str(paths[a])
    done = s.cluster.kubectl(*args[1:], timeout=timeout)
    how = "run" if not paths else f"run, {', '.join(paths)} through the run's overlay"
    GUIDE.append((command, how if doc == "install.md" else f"{how} (docs/{doc})"))
    return done.stdout


def test_the_node_runs_pods_with_cluster_dns_and_services(pods: PodStack) -> None:
    """A Pod on the real node resolves a Service by name (CoreDNS), reaches the API server through the `kubernetes`
    Service (kube-proxy), and reaches nothing outside: no name outside cluster.local resolves, no route leads off."""
    out = pods.run_pod("dns-check", (
        "nslookup kubernetes.default.svc.cluster.local && "
        "nc -w 5 kubernetes.default.svc.cluster.local 443 </dev/null && echo api-reachable; "
        "if nslookup example.com >/dev/null 2>&1; then echo OUTSIDE-RESOLVED; fi; "
        # TEST-NET-1: routed nowhere on any network; the node's namespace has no default route to try it on.
        "if nc -w 3 192.0.2.1 53 </dev/null 2>/dev/null; then echo OUTSIDE-REACHED; fi; true"
    ))  # fmt: skip
    assert out.startswith("Succeeded"), out
    assert "10.0.0.1" in out and "api-reachable" in out, out
    assert "OUTSIDE" not in out, out
    routes = subprocess.run(["nsenter", f"--net={pods.node.layout.netns_path}", "ip", "route"], capture_output=True,
                            text=True, timeout=30, check=True).stdout  # fmt: skip
    assert "default" not in routes, f"the node's namespace routes somewhere:\n{routes}"
    # An image brought as an archive, as a tier attaching to the node brings its own (issue 31's machine room).
    busybox = pods.built["busybox"]
    tag = busybox.local.rsplit(":", 1)[1]
    archive = pods.builder.archive(busybox, pods.dir / "busybox.oci.tar", f"localhost/hlas-loaded/busybox:{tag}")
    ref = pods.load_image(archive, f"hlas-loaded/busybox:{tag}")
    out = pods.run_pod("loaded-image", "echo from-the-archive", image=ref)
    assert out.startswith("Succeeded") and "from-the-archive" in out, out


# --- the install, typed as docs/install.md types it ------------------------------------------------------------------
def test_a_default_storage_class_as_the_guide_says(pods: PodStack) -> None:
    """local-path-provisioner installed, then marked the default with the guide's own `kubectl patch`."""
    with pods.phase("storage class"):
        pods.install_storage()
        before = typed(pods, "kubectl get storageclass")
        assert "local-path" in before and "(default)" not in before, before
        typed(
            pods,
            "kubectl patch storageclass local-path -p "
            '\'{"metadata": {"annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}}\'',
        )
        after = typed(pods, "kubectl get storageclass")
        assert "local-path (default)" in after, after


def test_the_homelab_install_as_the_guide_types_it(pods: PodStack) -> None:
    """`kubectl apply -k deploy/overlays/homelab` (through an overlay that renames the images only), the
    `rollout status` lines, and PostgreSQL's volume bound by the default StorageClass.

    With a previous release to start from (tests/releases.py's, as `make upgrade` has), the story begins as a user of
    it: that release's own deploy/overlays/homelab (0.3.0: the Temporal dev server on SQLite) and image, which
    test_a_rollout_of_a_new_image_while_claims_are_in_flight upgrades to this one with claims in flight; without
    one, this release's default is installed here."""
    core: Any = k8s.CoreV1Api(pods.cluster.admin)
    if PREVIOUS in pods.images.refs:
        previous = pods.dir / "previous" / "deploy" / "overlays" / "homelab"
        # 0.3.0 came before the ground rule: its Pods tolerate no taint, and a user's ran on an untainted node. This
        # run's only node is the control plane, tainted: the previous release's workloads get the toleration only.
        tolerate = json.dumps(
            [{"op": "add", "path": "/spec/template/spec/tolerations", "value": TOLERATE_CONTROL_PLANE}]
        )
        patches = [{"target": {"kind": kind}, "patch": tolerate} for kind in ("Deployment", "StatefulSet")]
        overlay = pods.overlay("previous-homelab", previous, {OPERATOR_IMAGE: pods.images[PREVIOUS]}, patches)
        with pods.phase("install of the previous release (its dev server)"):
            pods.cluster.kubectl("apply", "-k", str(overlay))
            pods.rollout(NS, "statefulset/temporal")
            pods.rollout(NS, "deployment/homelab-autoscaler")
        print(f"\nthe previous release's install runs: commit {pods.previous_commit} ({pods.images[PREVIOUS]})")
        STATE["previous-install"] = True
    else:
        install_this_release(pods, "install (apply, rollout status)")
    for pod in core.list_namespaced_pod(NS).items:
        assert pod.spec.node_name == NODE_NAME, f"{pod.metadata.name} is on {pod.spec.node_name}"


def install_this_release(pods: PodStack, phase_name: str, *, upgrade: bool = False) -> None:
    """docs/install.md's commands for this release's default (docs/upgrades.md's for an upgrade: the certs Job deleted
    first), the images renamed to the run's; the volume bound."""
    overlay = pods.overlay("homelab", DEPLOY / "overlays" / "homelab",
                           {OPERATOR_IMAGE: pods.images["homelab-autoscaler"], **temporal_images(pods)})  # fmt: skip
    paths = {"deploy/overlays/homelab": overlay}
    with pods.phase(phase_name):
        rendered = typed(pods, "kubectl kustomize deploy/overlays/homelab", paths)
        assert pods.images["homelab-autoscaler"] in rendered and "start-dev" not in rendered
        if upgrade:
            typed(pods, "kubectl -n homelab-autoscaler-system delete job homelab-autoscaler-certs --ignore-not-found",
                  doc="upgrades.md")  # fmt: skip
        typed(pods, "kubectl apply -k deploy/overlays/homelab", paths)
        typed(pods, "kubectl -n homelab-autoscaler-system rollout status statefulset/temporal-postgresql")
        typed(pods, "kubectl -n homelab-autoscaler-system rollout status deployment/temporal-server")
        typed(pods, "kubectl -n homelab-autoscaler-system rollout status deployment/homelab-autoscaler")
        pods.rollout(NS, "deployment/temporal-web")
    core: Any = k8s.CoreV1Api(pods.cluster.admin)
    pvc = core.read_namespaced_persistent_volume_claim("data-temporal-postgresql-0", NS)
    assert pvc.status.phase == "Bound" and pvc.spec.storage_class_name == "local-path", pvc.status
    STATE["postgresql-volume"] = pvc.metadata.uid


def test_the_web_ui_through_the_guides_port_forward(pods: PodStack) -> None:
    """`kubectl -n homelab-autoscaler-system port-forward svc/temporal-web 8233`, then its page: the API server
    reaches the kubelet through the node's door, the kubelet the Pod through containerd."""
    command = "kubectl -n homelab-autoscaler-system port-forward svc/temporal-web 8233"
    args = shlex.split(command)[1:]
    local = 8233
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 8233)) == 0:  # another program has the guide's port: pick a free one
            local = _free()
            args[-1] = f"{local}:8233"
    proc = subprocess.Popen([str(pods.cluster.bins / "kubectl"), "--kubeconfig", str(pods.cluster.admin_kubeconfig),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:

        def page() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=5) as r:
                return str(r.read().decode(errors="replace"))

        html = wait_until("the Web UI's page through kubectl port-forward", page, within=60)
        assert "<html" in html.lower() and "/_app/immutable/" in html, html[:300]

        def namespaces() -> str:  # the UI's server asks the Temporal frontend: the page is the live UI
            with urllib.request.urlopen(f"http://127.0.0.1:{local}/api/v1/namespaces", timeout=10) as r:
                return str(r.read().decode(errors="replace"))

        listed = wait_until("the Web UI to list Temporal's namespaces", namespaces, within=60)
        assert '"default"' in listed, listed[:300]
    finally:
        proc.terminate()
        proc.wait(10)
    GUIDE.append((command, "run" if local == 8233 else f"run on local port {local} (8233 was taken)"))


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the story through Pods ------------------------------------------------------------------------------------------
# Six machines in `workers` (one per step that boots one, and an idle one whose BMC fails), one in `spares`. Each
# machine takes BOOT_SECONDS to boot after its BMC said yes: the window in which a claim is "mid-boot".
STORY = Homelab(
    groups=(GroupSpec("workers", 6), GroupSpec("spares", 1)),
    slots=(*[SlotSpec(f"machine-{i}", "workers") for i in range(1, 7)], SlotSpec("spare-1", "spares")),
    priorities=("workers", "spares"),
)
BOOT_SECONDS = 12.0
WORKLOAD = "needs-a-machine"
LIVE = ("", "pending", "booting", "ready")
OPERATOR_PODS = "app.kubernetes.io/name=homelab-autoscaler,app.kubernetes.io/component!=certs"  # not the certs Job's
# The story's timings, as deploy/kind has them for `make e2e`: a loop every 5 s, scale-down in seconds.
STORY_FLAGS = ("--scan-interval=5s", "--scale-down-unneeded-time=30s", "--scale-down-delay-after-add=20s",
               "--scale-down-delay-after-delete=0s", "--expander=priority",
               "--skip-nodes-with-system-pods=false")  # fmt: skip
SPLIT_DEPLOYMENTS = ("homelab-autoscaler-worker", "homelab-autoscaler-provider", "homelab-autoscaler-watch")


# --- reading the story -----------------------------------------------------------------------------------------------
def core(s: PodStack) -> Any:
    return k8s.CoreV1Api(s.cluster.admin)


def claims(s: PodStack) -> list[dict[str, Any]]:
    api: Any = k8s.CustomObjectsApi(s.cluster.admin)
    return list(api.list_namespaced_custom_object("infra.homecluster.dev", "v2alpha1", NS, "nodeclaims")["items"])


def by_name(s: PodStack) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in claims(s)}


def reason(claim: dict[str, Any]) -> str:
    return str((claim.get("status") or {}).get("reason") or "")


def live(s: PodStack) -> list[dict[str, Any]]:
    return [c for c in claims(s) if phase(c) in LIVE]


def summary(s: PodStack) -> str:
    return ", ".join(f"{c['metadata']['name']}={phase(c)}/{reason(c)}" for c in claims(s)) or "no claims"


def wait(s: PodStack, what: str, check: Callable[[], Any], *, within: float, every: float = 0.25) -> Any:
    """`wait_until` a claim's move: it fails at once when a machine's kubelet exits unasked (a Node that will never
    be Ready), and says how the claims stand when it gives up, not how they stood when it began."""
    return s.cluster.wait(what, check, within=within, every=every, now=lambda: summary(s))


def node_ready(s: PodStack, name: str) -> bool:
    try:
        node = core(s).read_node(name)
    except k8s.exceptions.ApiException:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def workload_pods(s: PodStack) -> list[Any]:
    return list(core(s).list_namespaced_pod("default", label_selector=f"app={WORKLOAD}").items)


def running_on_machines(s: PodStack) -> int:
    return sum(p.status.phase == "Running" and (p.spec.node_name or "") in MACHINES for p in workload_pods(s))


MACHINES = {slot.node_name for slot in STORY.slots}


def set_workload(s: PodStack, replicas: int) -> None:
    """A Deployment whose Pods fit only a machine, one per machine (3 of a machine's 4 CPUs each)."""
    apps: Any = k8s.AppsV1Api(s.cluster.admin)
    body = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": WORKLOAD},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": WORKLOAD}},
                 "template": {"metadata": {"labels": {"app": WORKLOAD}},
                              "spec": {"nodeSelector": {MACHINE_LABEL: "true"}, "terminationGracePeriodSeconds": 1,
                                       "containers": [{"name": "app", "image": s.images["busybox"],
                                                       "resources": {"requests": {"cpu": "3"}}}]}}},
    }  # fmt: skip
    try:
        apps.create_namespaced_deployment("default", body)
    except k8s.exceptions.ApiException as exc:
        if exc.status != 409:
            raise
        apps.patch_namespaced_deployment_scale(WORKLOAD, "default", {"spec": {"replicas": replicas}})


class MissedMoment(Exception):
    """A fault meant for mid-boot could not land there: said at once, not waited out."""


def answered(s: PodStack, new: list[dict[str, Any]]) -> bool:
    """Every new claim is mid-boot: its BMC said yes, its machine is not up yet."""
    on = {c.slot for c in s.room.calls if c.operation == "on" and c.status == 200} if s.room else set()
    return all(c["spec"]["node"] in on and phase(c) == "booting" for c in new)


def startup_pods_running(s: PodStack, new: list[dict[str, Any]]) -> bool:
    """Every new claim's startup Job has a Pod Running (its container waiting on the BMC)."""
    running = {p.metadata.name.rsplit("-", 1)[0] for p in core(s).list_namespaced_pod(NS, label_selector=MANAGED).items
               if p.status.phase == "Running"}  # fmt: skip
    return all(f"{c['metadata']['name']}-startup" in running for c in new)


def empty_machines(s: PodStack) -> list[str]:
    """Machines with a live claim whose Node holds no workload Pod (Ready and idle, or still booting for nobody)."""
    used = {p.spec.node_name for p in workload_pods(s) if p.spec.node_name}
    return sorted(c["spec"]["node"] for c in live(s) if c["spec"]["node"] not in used)


def settle(s: PodStack) -> None:
    """Before a boot: no claim mid-boot and no machine idle, so the next machine the workload needs is a new one.
    A machine idle here was booted by a scale-up the workload did not need (cluster-autoscaler asked twice for
    one Pod): it is said, kept in the report, and waited out (cluster-autoscaler scales it down)."""
    idle = empty_machines(s)
    if idle:
        print(f"\nidle before a boot, waiting for cluster-autoscaler to scale it down: {idle} ({summary(s)})")
        EXTRA.extend(idle)
    wait(s, "no claim mid-boot and no machine idle",
         lambda: not empty_machines(s) and not [c for c in live(s) if phase(c) != "ready"],
         within=300)  # fmt: skip


EXTRA: list[str] = []


def boot(s: PodStack, replicas: int, what: str, *, during: Callable[[list[str]], None] | None = None,
         moment: Callable[[PodStack, list[dict[str, Any]]], bool] = answered) -> list[str]:  # fmt: skip
    """The workload grows to `replicas`: cluster-autoscaler asks for machines, each new claim boots through a real
    startup Job's Pod and ends ready, and the workload runs on them. `during(new claims)` runs once every new claim
    is at `moment` (by default mid-boot). Returns the new claims' names."""
    settle(s)
    before = set(by_name(s))
    want = replicas - len(live(s))
    assert want > 0, f"{what}: {replicas} replicas need no new machine ({summary(s)}); the story's count is off"
    set_workload(s, replicas)

    def reached() -> list[str]:
        new = [c for n, c in by_name(s).items() if n not in before]
        if during is not None and any(phase(c) not in ("", "pending", "booting") for c in new):
            raise MissedMoment(f"a new claim got past its boot before the fault could land ({summary(s)}); the "
                               "machine room's boot time is the window")  # fmt: skip
        if len(new) < want:
            return []
        return [c["metadata"]["name"] for c in new] if during is None or moment(s, new) else []

    names = wait(s, f"{want} new claim(s) for {what}", reached, within=300)
    if during is not None:
        during(names)
    wait(s, f"the new claims {names} ready",
         lambda: all(phase(by_name(s).get(n, {})) == "ready" for n in names), within=300)  # fmt: skip
    wait(s, f"{replicas} workload Pods Running on machines", lambda: running_on_machines(s) == replicas,
         within=180)  # fmt: skip
    BUSIEST.sample(s, what)
    return list(names)


def operator_pods(s: PodStack) -> list[Any]:
    return [p for p in core(s).list_namespaced_pod(NS, label_selector=OPERATOR_PODS).items
            if p.metadata.deletion_timestamp is None]  # fmt: skip


def job_creates(s: PodStack, job: str) -> list[int]:
    """The answers to the operator's creates of Job `job` (201 made it; 409 found it made already)."""
    return [e.code for e in audit.read(s.cluster.audit_log)
            if e.user == audit.OPERATOR and e.verb == "create" and e.resource == "jobs"
            and ((e.response or {}).get("metadata", {}).get("name") == job
                 or (e.request or {}).get("metadata", {}).get("name") == job)]  # fmt: skip


def once_each(s: PodStack, names: list[str]) -> None:
    """Each claim's startup Job was made once (a retried create finds it: 409) and its BMC was called once."""
    for name in names:
        claim = by_name(s)[name]
        creates = job_creates(s, f"{name}-startup")
        assert creates.count(201) == 1, f"{name}-startup created {creates}"
        ons = [c for c in s.room.calls_of(claim["spec"]["node"], "on")] if s.room else []
        assert len([c for c in ons if c.status == 200]) >= 1, ons


@dataclass
class Busiest:
    """`kubectl get pods -A -o wide` at the story's moments; the one with the most Pods is printed at the end, with
    what each container of the install used then (the kubelet's summary)."""

    text: str = ""
    pods: int = 0
    when: str = ""
    used: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    def sample(self, s: PodStack, when: str) -> None:
        out = s.cluster.kubectl("get", "pods", "-A", "-o", "wide").stdout
        count = len(out.strip().splitlines()) - 1
        if count > self.pods:
            self.text, self.pods, self.when = out, count, when
            self.used = footprint(s)


def footprint(s: PodStack) -> dict[tuple[str, str], tuple[float, float]]:
    """What each container of the install's Pods uses now, by (Pod's name up to its hash, container): working-set
    memory in MiB and CPU in millicores, as the kubelet's /stats/summary reports them (what metrics-server serves)."""
    raw = s.cluster.kubectl("get", "--raw", f"/api/v1/nodes/{NODE_NAME}/proxy/stats/summary").stdout
    out: dict[tuple[str, str], tuple[float, float]] = {}
    for pod in json.loads(raw).get("pods", []):
        if pod["podRef"]["namespace"] != NS:
            continue
        # A Deployment's Pod is <name>-<hash>-<5>, a StatefulSet's <name>-<ordinal>.
        owner = re.sub(r"-(\d+|([a-z0-9]{8,10}-)?[a-z0-9]{5})$", "", pod["podRef"]["name"])
        for c in pod.get("containers", []):
            memory = (c.get("memory") or {}).get("workingSetBytes") or 0
            cpu = (c.get("cpu") or {}).get("usageNanoCores") or 0
            out[(owner, c["name"])] = (memory / 2**20, cpu / 1e6)
    return out


def footprint_table(s: PodStack, rest: dict[tuple[str, str], tuple[float, float]],
                    busiest: dict[tuple[str, str], tuple[float, float]]) -> str:  # fmt: skip
    """Each long-running container of the install: its requests and limits beside what it used at rest and at the
    story's busiest moment."""
    asked: dict[tuple[str, str], str] = {}
    apps: Any = k8s.AppsV1Api(s.cluster.admin)
    workloads = [*apps.list_namespaced_deployment(NS).items, *apps.list_namespaced_stateful_set(NS).items]
    for w in workloads:
        for c in w.spec.template.spec.containers:
            r = c.resources
            requests, limits = r.requests or {}, r.limits or {}
            asked[(w.metadata.name, c.name)] = (f"{requests.get('cpu', '-')}/{requests.get('memory', '-')}"
                                                f" limit {limits.get('memory', '-')}")  # fmt: skip
    rows = [f"{'container':<44} {'requests cpu/memory, limit':<28} {'at rest':>18} {'busiest':>18}"]
    for key in sorted(asked):

        def cell(found: dict[tuple[str, str], tuple[float, float]], key: tuple[str, str] = key) -> str:
            return f"{found[key][0]:.0f} MiB {found[key][1]:.0f}m" if key in found else "-"

        rows.append(f"{'/'.join(key):<44} {asked[key]:<28} {cell(rest):>18} {cell(busiest):>18}")
    return "\n".join(rows)


def claims_created(s: PodStack) -> int:
    """NodeClaims created so far (the API server's audit log: each a lifecycle begun)."""
    return sum(1 for e in audit.read(s.cluster.audit_log)
               if e.verb == "create" and e.resource == "nodeclaims" and e.code == 201)  # fmt: skip


def database_bytes(s: PodStack) -> int:
    """The bundled PostgreSQL's two databases, in bytes (pg_database_size), read in its Pod over its socket."""
    query = "SELECT pg_database_size('temporal') + pg_database_size('temporal_visibility')"
    out = s.cluster.kubectl("-n", NS, "exec", "temporal-postgresql-0", "-c", "postgresql", "--", "psql", "-U",
                            "temporal", "-d", "postgres", "-tAc", query).stdout  # fmt: skip
    return int(out.strip())


BUSIEST = Busiest()


def patch_autoscaler_for_the_story(s: PodStack) -> None:
    """The story's timings added to cluster-autoscaler's flags (after each `kubectl apply -k`, which puts deploy/'s
    back), then its rollout."""
    patch = [{"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": flag} for flag in STORY_FLAGS]
    s.cluster.kubectl("-n", NS, "patch", "deployment/cluster-autoscaler", "--type=json", "-p", json.dumps(patch))
    s.rollout(NS, "deployment/cluster-autoscaler")


def needs_autoscaler(s: PodStack) -> None:
    """The story through Pods needs cluster-autoscaler's image; without its binary the steps skip and say why, or
    fail when the run asks for the real one (HOMELAB_E2E_DRIVER=ca, as CI does)."""
    if "cluster-autoscaler" in s.images.refs:
        return
    _, why = cluster_autoscaler_binary()
    message = f"no cluster-autoscaler binary to make its image from: {why}"
    if os.environ.get("HOMELAB_E2E_DRIVER") == "ca":
        pytest.fail(message + " (HOMELAB_E2E_DRIVER=ca asks for the real one)")
    pytest.skip(message)


def test_cluster_autoscaler_installed_as_the_guide_types_it(pods: PodStack) -> None:
    """`kubectl apply -k deploy/cluster-autoscaler/mtls` (the image renamed; then, for a story that ends in
    minutes, the scale-down timings shortened as deploy/kind does), its Pod Running on the control plane, speaking
    mTLS to the provider with the client certificate the install's `certs` Job issued (no cert-manager). Over a
    previous release's install, that release's own cluster-autoscaler, moved to mTLS by the upgrade."""
    needs_autoscaler(pods)
    if STATE.get("previous-install"):
        # A user of the previous release installed its cluster-autoscaler as its guide said (0.3.0: plaintext, its
        # provider spoke nothing else); test_a_rollout_of_a_new_image_while_claims_are_in_flight moves it to mTLS as
        # docs/upgrades.md says.
        previous = pods.dir / "previous" / "deploy" / "cluster-autoscaler" / "plaintext"
        overlay = pods.overlay("previous-cluster-autoscaler", previous, {CA_IMAGE: pods.images["cluster-autoscaler"]})
        with pods.phase("cluster-autoscaler install (the previous release's guide)"):
            pods.cluster.kubectl("apply", "-k", str(overlay))
            pods.rollout(NS, "deployment/cluster-autoscaler")
    else:
        install_autoscaler_with_mtls(pods, "cluster-autoscaler install")
    (pod,) = core(pods).list_namespaced_pod(NS, label_selector="app.kubernetes.io/name=cluster-autoscaler").items
    assert pod.spec.node_name == NODE_NAME, pod.spec.node_name


def install_autoscaler_with_mtls(pods: PodStack, phase_name: str, *, doc: str = "install.md") -> None:
    """`kubectl apply -k deploy/cluster-autoscaler/mtls` as `doc` types it, the image renamed; its rollout (its Pod
    mounts the client certificate the install's `certs` Job issued)."""
    overlay = pods.overlay("cluster-autoscaler", DEPLOY / "cluster-autoscaler" / "mtls",
                           {CA_IMAGE: pods.images["cluster-autoscaler"]})  # fmt: skip
    with pods.phase(phase_name):
        typed(pods, "kubectl apply -k deploy/cluster-autoscaler/mtls",
              {"deploy/cluster-autoscaler/mtls": overlay}, doc=doc)  # fmt: skip
        pods.rollout(NS, "deployment/cluster-autoscaler")


def test_the_homelab_described_with_power_jobs_that_call_the_machine_room(pods: PodStack) -> None:
    """The Groups and slots applied as the guide says (`kubectl apply --validate=strict`), each slot's power pod
    spec busybox's wget to the machine room through a Service; the story's cluster-autoscaler timings."""
    needs_autoscaler(pods)
    s = pods
    with s.phase("story: the homelab described"):
        # With a previous release installed (test_the_homelab_install_as_the_guide_types_it), its operator runs the
        # homelab from the start, on its own Temporal: every workflow is begun by the older code and store.
        room = s.start_machine_room({slot.name: slot.machine() for slot in STORY.slots})
        room.boot_seconds = BOOT_SECONDS
        s.apply(machine_room_service(room.port))
        s.cluster.kubectl("apply", "--validate=strict", "-f", "-", input=yaml.safe_dump_all(powered(s, STORY)))
        GUIDE.append(("kubectl apply --validate=strict", "run (the story's Groups and slots)"))
        s.apply([{"apiVersion": "v1", "kind": "ConfigMap",
                  "metadata": {"name": "cluster-autoscaler-priority-expander", "namespace": NS},
                  "data": {"priorities": "20: ['^workers$']\n10: ['^spares$']\n"}}])  # fmt: skip
        patch_autoscaler_for_the_story(s)


def test_a_rollout_of_a_new_image_while_claims_are_in_flight(pods: PodStack) -> None:
    """The previous release's install (its Temporal dev server on SQLite, its operator) has run the homelab since it
    was described; two machines are asked for; while both claims are mid-boot this release is applied as
    docs/upgrades.md says (`kubectl apply -k deploy/overlays/homelab`, then the old dev server's StatefulSet deleted,
    its volume kept): the operator is recreated on the new image and on the new, empty Temporal on PostgreSQL, takes
    each claim over from its resources (the cluster is the record), and both end ready as they would have, each
    startup Job made once."""
    needs_autoscaler(pods)
    s = pods
    if not STATE.get("previous-install"):
        pytest.skip("no previous release in this clone's history (a shallow clone?): nothing to upgrade from")
    previous, current = s.images[PREVIOUS], s.images["homelab-autoscaler"]
    old_volume = core(s).read_namespaced_persistent_volume_claim("data-temporal-0", NS).metadata.uid
    with s.phase("fault: the upgrade from the dev server while claims are in flight"):
        (old,) = operator_pods(s)
        assert old.spec.containers[0].image == previous, old.spec.containers[0].image
        in_flight: dict[str, str] = {}

        def upgrade(names: list[str]) -> None:
            in_flight.update({n: phase(by_name(s)[n]) for n in names})
            install_this_release(s, "upgrade: this release applied, Ready", upgrade=True)
            typed(s, "kubectl -n homelab-autoscaler-system delete statefulset temporal", doc="upgrades.md")
            # The provider now speaks mTLS only: the previous release's plaintext cluster-autoscaler is moved over.
            install_autoscaler_with_mtls(s, "upgrade: cluster-autoscaler on mTLS", doc="upgrades.md")
            patch_autoscaler_for_the_story(s)
            BUSIEST.sample(s, "the upgrade to Temporal on PostgreSQL with two claims in flight")

        # Two machines boot side by side: a longer boot keeps both in flight until the second's BMC has answered.
        assert s.room is not None
        s.room.boot_seconds = 2 * BOOT_SECONDS
        try:
            names = boot(s, 2, "two claims in flight through the upgrade", during=upgrade)
        finally:
            s.room.boot_seconds = BOOT_SECONDS
    assert set(in_flight.values()) == {"booting"}, in_flight
    (new,) = operator_pods(s)
    assert new.spec.containers[0].image == current and new.metadata.name != old.metadata.name
    once_each(s, names)
    # The old store is kept to read (docs/upgrades.md), the new one is in use.
    assert core(s).read_namespaced_persistent_volume_claim("data-temporal-0", NS).metadata.uid == old_volume
    for name in names:
        s.describe_claim(name)  # the claim's workflow runs on the new Temporal
    GUIDE.append(("(the Web UI after the upgrade)", "run: " + web_ui_lists(s, names)))


def test_temporal_through_the_guides_port_forward_only_with_the_operators_certificate(pods: PodStack) -> None:
    """docs/install.md's way in to the bundled Temporal, typed: the operator's client certificate read from its
    Secret, `kubectl port-forward svc/temporal-frontend 7233`, then the `temporal` CLI with it lists workflows; the
    same command without the client certificate is refused by the frontend itself (mTLS: the port-forward comes from
    the node, which NetworkPolicies do not stop). After the upgrade: the previous release's dev server had none."""
    cli = ROOT / ".venv" / "bin" / "temporal"
    if not cli.is_file():
        pytest.skip(f"no `temporal` CLI at {cli} (the `dev` extra): `make test`'s virtualenv has it")
    text = guide_text("install.md")
    folder = pods.dir / "temporal-cli"
    folder.mkdir(exist_ok=True)
    secret = "homelab-autoscaler-temporal-tls"
    for key in ("tls.crt", "tls.key", "ca.crt"):
        escaped = key.replace(".", "\\.")  # jsonpath's: a dot inside a key
        read = f"kubectl -n homelab-autoscaler-system get secret {secret} -o 'jsonpath={{.data.{escaped}}}'"
        line = f"{read} | base64 -d > {key}"
        assert line in text, f"docs/install.md does not say `{line}`"
        encoded = typed(pods, read)
        (folder / key).write_bytes(base64.b64decode(encoded))
    forward = "kubectl -n homelab-autoscaler-system port-forward svc/temporal-frontend 7233 &"
    assert forward in text, f"docs/install.md does not say `{forward}`"
    local = _free()
    args = [*shlex.split(forward.removesuffix(" &"))[1:-1], f"{local}:7233"]
    proc = subprocess.Popen([str(pods.cluster.bins / "kubectl"), "--kubeconfig", str(pods.cluster.admin_kubeconfig),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    listing = next(line for line in text.splitlines() if line.startswith("temporal workflow list --address"))
    command = [str(cli), *shlex.split(listing)[1:]]
    command[command.index("127.0.0.1:7233")] = f"127.0.0.1:{local}"
    try:

        def listed() -> str:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30, cwd=folder, check=False)
            if done.returncode != 0:
                raise AssertionError(done.stderr[-500:])
            return done.stdout or "(none yet)"

        out = wait_until("`temporal workflow list` with the operator's certificate through the port-forward", listed,
                         within=60)  # fmt: skip
        without = [a for i, a in enumerate(command) if a not in ("--tls-cert-path", "--tls-key-path")
                   and command[i - 1] not in ("--tls-cert-path", "--tls-key-path")]  # fmt: skip
        refused = subprocess.run(without, capture_output=True, text=True, timeout=60, cwd=folder, check=False)
    finally:
        proc.terminate()
        proc.wait(10)
    GUIDE.append(("(the temporal CLI through the port-forward)", "run: listed with the operator's certificate"))
    print(f"\n`temporal workflow list` through the guide's port-forward, with the operator's certificate:\n{out}"
          f"\nwithout it: exit {refused.returncode}: {refused.stderr.strip()[-300:]}")  # fmt: skip
    assert refused.returncode != 0, refused.stdout


def web_ui_lists(s: PodStack, names: list[str]) -> str:
    """The Web UI (through the guide's port-forward) lists the claims' workflows: its server asks Temporal's
    visibility, on PostgreSQL here."""
    local = _free()
    proc = subprocess.Popen([str(s.cluster.bins / "kubectl"), "--kubeconfig", str(s.cluster.admin_kubeconfig), "-n", NS,
                             "port-forward", "svc/temporal-web", f"{local}:8233"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:

        def listed() -> str:
            url = f"http://127.0.0.1:{local}/api/v1/namespaces/default/workflows"
            with urllib.request.urlopen(url, timeout=10) as r:
                text = str(r.read().decode(errors="replace"))
            return text if all(f"nodeclaim/{NS}/{n}" in text for n in names) else ""

        wait_until(f"the Web UI to list the claims {names}", listed, within=60)
    finally:
        proc.terminate()
        proc.wait(10)
    return f"the Web UI lists {', '.join(names)}"


# The default install's doors (docs/install.md, "What is closed"): (what, Service, port, try a TLS handshake).
DOORS = [
    ("the provider's gRPC", "homelab-autoscaler-provider", 8086, True),
    ("the operator's metrics", "homelab-autoscaler-metrics", 9464, False),
    ("Temporal's frontend", "temporal-frontend", 7233, False),
    ("the Web UI", "temporal-web", 8233, False),
    ("PostgreSQL", "temporal-postgresql", 5432, False),
]
INTRUDER = ("door-intruder", {"app": "curious"})


def test_the_doors_closed_to_a_pod_that_tries_and_open_to_the_right_ones(pods: PodStack) -> None:
    """The node enforces NetworkPolicy (kube-network-policies, tests/realcluster/node.py). A Pod in another namespace,
    with the cluster's DNS and no certificate, tries each door of the install: each is closed, and the table says
    how. The same doors from the Pods they are for: a namespace labelled as a metrics scraper reaches the metrics; a
    Pod labelled as cluster-autoscaler reaches the provider, which then refuses it a session without a client
    certificate; the operator's own Pod reaches Temporal's frontend and not PostgreSQL, and the frontend refuses it a
    session without the Pod's client certificate."""
    s = pods
    # The story at rest (no claim in flight, the upgrade behind it): what the install uses, and its database's size.
    STATE["at rest"], STATE["database at rest"] = footprint(s), database_bytes(s)
    STATE["claims at rest"] = claims_created(s)
    namespace, labels = INTRUDER
    attempts: list[doors.Attempt] = []
    try:
        with s.phase("the doors tried from a Pod in another namespace and from the right ones"):
            for what, service, port, tls in DOORS:
                ok, how = doors.try_door(s, namespace, labels, f"{service}.{NS}.svc", port, tls=tls)
                attempts.append(doors.Attempt(f"{namespace} (no certificate)", what, port, False, ok, how))
            scraper = "door-monitoring"
            doors.client_pod(s, scraper, {"app": "prometheus"})  # makes the namespace, then labels it
            s.cluster.kubectl("label", "namespace", scraper, "homelab-autoscaler.dev/metrics-scraper=true",
                              "--overwrite")  # fmt: skip
            ok, how = doors.try_door(s, scraper, {"app": "prometheus"}, f"homelab-autoscaler-metrics.{NS}.svc", 9464)
            attempts.append(doors.Attempt(f"{scraper} (metrics-scraper)", "the operator's metrics", 9464, True, ok,
                                          how))  # fmt: skip
            autoscaler = {"app.kubernetes.io/name": "cluster-autoscaler"}
            ok, how = doors.try_door(s, NS, autoscaler, f"homelab-autoscaler-provider.{NS}.svc", 8086)
            attempts.append(doors.Attempt("cluster-autoscaler's labels", "the provider's gRPC (TCP)", 8086, True, ok,
                                          how))  # fmt: skip
            ok, how = doors.try_door(s, NS, autoscaler, f"homelab-autoscaler-provider.{NS}.svc", 8086, tls=True)
            attempts.append(doors.Attempt("cluster-autoscaler's labels", "the provider's gRPC (TLS, no cert)", 8086,
                                          False, ok, how))  # fmt: skip
            for what, service, port, expected in (("Temporal's frontend", "temporal-frontend", 7233, True),
                                                  ("PostgreSQL", "temporal-postgresql", 5432, False)):  # fmt: skip
                ok, how = doors.probe_from(s, NS, "deployment/homelab-autoscaler", "homelab-autoscaler", service, port)
                attempts.append(doors.Attempt("the operator's Pod", what, port, expected, ok, how))
            # Let through by the policies, the frontend itself still wants a client certificate of the install's CA.
            operator = ("deployment/homelab-autoscaler", "homelab-autoscaler")
            ok, how = doors.probe_from(s, NS, *operator, "temporal-frontend", 7233, tls=True)
            attempts.append(doors.Attempt("the operator's Pod", "Temporal's frontend (TLS, no cert)", 7233, False, ok,
                                          how))  # fmt: skip
    finally:
        print("\n" + doors.table(attempts))
        for ns in (namespace, "door-monitoring"):
            s.cluster.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False)
        doors.forget_clients(s, NS)
    wrong = [a.row() for a in attempts if a.ok != a.expected]
    assert not wrong, "doors not as documented:\n" + "\n".join(wrong)
    for a in attempts:
        if a.source.startswith(namespace):  # dropped or refused by the policy, never a DNS or harness failure
            assert a.how.split(" ", 1)[0] in ("timeout", "refused"), a.row()
    handshakes = [a for a in attempts if "no cert" in a.target]
    assert len(handshakes) == 2, [a.row() for a in attempts]
    for handshake in handshakes:  # refused by TLS itself, not by a policy or a timeout
        assert handshake.how.startswith(("tls-refused", "tls-closed")), handshake.row()


def test_the_temporal_pods_deleted_mid_boot(pods: PodStack) -> None:
    """PostgreSQL's Pod, then the Temporal server's, deleted while a claim boots: the StatefulSet makes PostgreSQL
    again on the same volume (local-path, on the control plane), the Deployment the server again (its schema step
    finds the schema current), the claim's workflow is the one started before the fault (its history kept in
    PostgreSQL), and it ends ready."""
    needs_autoscaler(pods)
    s = pods
    for component, what in (("postgresql", "PostgreSQL's Pod"), ("server", "the Temporal server's Pod")):
        deleted: dict[str, Any] = {}

        def delete(names: list[str], component: str = component, deleted: dict[str, Any] = deleted) -> None:
            (pod,) = [p for p in core(s).list_namespaced_pod(
                NS, label_selector=f"app.kubernetes.io/name=temporal,app.kubernetes.io/component={component}").items
                if p.metadata.deletion_timestamp is None]  # fmt: skip
            deleted["uid"], deleted["at"] = pod.metadata.uid, time.time()
            s.cluster.kubectl("-n", NS, "delete", "pod", pod.metadata.name, "--wait=false")

        replicas = len(live(s)) + 1
        with s.phase(f"fault: {what} deleted mid-boot"):
            (name,) = boot(s, replicas, f"a claim through a restart of {what}", during=delete)
            workload = "statefulset/temporal-postgresql" if component == "postgresql" else "deployment/temporal-server"
            s.rollout(NS, workload)
        (pod,) = [p for p in core(s).list_namespaced_pod(
            NS, label_selector=f"app.kubernetes.io/name=temporal,app.kubernetes.io/component={component}").items
            if p.metadata.deletion_timestamp is None]  # fmt: skip
        assert pod.metadata.uid != deleted["uid"] and pod.spec.node_name == NODE_NAME
        execution = s.describe_claim(name)
        started = str(execution.get("startTime") or execution.get("start_time"))
        assert started and _epoch(started) < deleted["at"], f"{name}'s workflow started {started}: {execution}"
        once_each(s, [name])
        if component == "postgresql" and "postgresql-volume" in STATE:
            pvc = core(s).read_namespaced_persistent_volume_claim("data-temporal-postgresql-0", NS)
            assert pvc.metadata.uid == STATE["postgresql-volume"], "PostgreSQL came back on another volume"


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_the_operators_pod_force_deleted_mid_boot(pods: PodStack) -> None:
    """The operator's Pod force-deleted (`--force --grace-period=0`) while a startup Job's Pod waits on a slow BMC:
    the ReplicaSet's new Pod takes the claim over (it holds the watchers' Lease), the claim ends ready, and its
    startup Job was made once and its BMC called once."""
    needs_autoscaler(pods)
    s = pods
    assert s.room is not None
    s.room.slow("*", "on", 30)  # the next BMC takes 30 s to answer: the power Job's Pod is Running meanwhile
    killed: list[str] = []

    def force_delete(names: list[str]) -> None:
        (victim,) = operator_pods(s)
        killed.append(victim.metadata.name)
        s.cluster.kubectl("-n", NS, "delete", "pod", victim.metadata.name, "--force", "--grace-period=0")
        BUSIEST.sample(s, "the operator's Pod force-deleted while a startup Job's Pod waits on its BMC")

    with s.phase("fault: the operator's Pod force-deleted mid-boot"):
        (name,) = boot(s, len(live(s)) + 1, "a claim through a force-deleted operator", during=force_delete,
                       moment=startup_pods_running)  # fmt: skip
        s.rollout(NS, "deployment/homelab-autoscaler")
    (successor,) = operator_pods(s)
    assert successor.metadata.name not in killed and successor.spec.node_name == NODE_NAME

    def holder() -> str:
        lease: Any = k8s.CoordinationV1Api(s.cluster.admin).read_namespaced_lease("homelab-autoscaler-watch", NS)
        return str(lease.spec.holder_identity or "")

    wait_until(f"the new operator Pod {successor.metadata.name} to hold the watchers' Lease",
               lambda: holder() == successor.metadata.name, within=120)  # fmt: skip
    once_each(s, [name])
    slot = by_name(s)[name]["spec"]["node"]
    assert [c.status for c in s.room.calls_of(slot, "on")] == [200], s.room.calls_of(slot, "on")


# Every leaf certificate the certs step keeps in the default install (the webhook's is components/admission's).
ROTATED = ("homelab-autoscaler-provider-tls", "cluster-autoscaler-client-tls", "temporal-frontend-tls",
           "homelab-autoscaler-temporal-tls", "temporal-web-tls")  # fmt: skip


def power_jobs(s: PodStack) -> set[str]:
    """The power Jobs the operator has made (and not yet collected)."""
    batch: Any = k8s.BatchV1Api(s.cluster.admin)
    return {j.metadata.name for j in batch.list_namespaced_job(NS, label_selector=MANAGED).items}


def container_restarts(pod: Any, container: str) -> int:
    (status,) = [c for c in pod.status.container_statuses or [] if c.name == container]
    return int(status.restart_count)


def temporal_pod(s: PodStack, component: str) -> Any:
    (pod,) = [p for p in core(s).list_namespaced_pod(
        NS, label_selector=f"app.kubernetes.io/name=temporal,app.kubernetes.io/component={component}").items
        if p.metadata.deletion_timestamp is None]  # fmt: skip
    return pod


def test_the_certificates_issued_anew_mid_story(pods: PodStack) -> None:
    """Issue 43, part 5's rotation: every leaf certificate of the install issued anew by the same CA while claims are
    ready (their Secrets deleted, the certs CronJob run at once: `kubectl create job --from=cronjob/...`). The
    provider, the Temporal server and the Web UI take theirs from the mounted files; the operator connects to
    Temporal again with its new one and moves its roles onto that connection (homelab_autoscaler/renewal.py); no
    Pod and no container restarts, cluster-autoscaler has no call refused, the claims are untouched and their
    workflows read through the new certificates, and the story goes on over them."""
    needs_autoscaler(pods)
    s = pods
    c = core(s)
    before = {n: c.read_namespaced_secret(n, NS).data for n in ROTATED}
    (operator,) = operator_pods(s)
    restarts = container_restarts(operator, "homelab-autoscaler")
    server, web = temporal_pod(s, "server"), temporal_pod(s, "web")
    ready = sorted(n for n, claim in by_name(s).items() if phase(claim) == "ready")
    jobs = power_jobs(s)
    began = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with s.phase("fault: every certificate issued anew mid-story"):
        for name in ROTATED:
            s.cluster.kubectl("-n", NS, "delete", "secret", name)
        s.cluster.kubectl("-n", NS, "create", "job", "--from=cronjob/homelab-autoscaler-certs", "certs-now")
        s.cluster.kubectl("-n", NS, "wait", "--for=condition=complete", "job/certs-now", "--timeout=180s",
                          timeout=210)  # fmt: skip
        after = {n: c.read_namespaced_secret(n, NS).data for n in ROTATED}
        for name in ROTATED:
            assert after[name]["tls.crt"] != before[name]["tls.crt"], f"{name} was not issued anew"
            assert after[name]["ca.crt"] == before[name]["ca.crt"], f"{name}: the CA changed"

        def reconnected() -> str:
            logs = s.cluster.kubectl("-n", NS, "logs", operator.metadata.name, "-c", "homelab-autoscaler",
                                     f"--since-time={began}").stdout  # fmt: skip
            return next((line for line in logs.splitlines() if "connected to Temporal again" in line), "")

        # The kubelet's sync of the Secret volume (about a minute) and the operator's next look (a minute).
        line = wait_until("the operator connected to Temporal again with its renewed certificate", reconnected,
                          within=300)  # fmt: skip
    (now,) = operator_pods(s)
    assert now.metadata.uid == operator.metadata.uid, "the operator's Pod was replaced"
    assert container_restarts(now, "homelab-autoscaler") == restarts, "the operator's container restarted"
    for was, found in ((server, temporal_pod(s, "server")), (web, temporal_pod(s, "web"))):
        assert found.metadata.uid == was.metadata.uid, f"{was.metadata.name} was replaced"
        container = was.spec.containers[0].name
        assert container_restarts(found, container) == container_restarts(was, container), f"{container} restarted"
    for name in ready:
        assert s.describe_claim(name)["status"] == "RUNNING"  # through the operator's new certificate
        assert phase(by_name(s)[name]) == "ready"
    assert power_jobs(s) <= jobs, "the rotation made a power Job"
    GUIDE.append(("(the Web UI after the rotation)", "run: " + web_ui_lists(s, ready)))
    time.sleep(10)  # two of cluster-autoscaler's loops (5 s) over the new connection before its log is read
    seen = s.cluster.kubectl("-n", NS, "logs", "deployment/cluster-autoscaler", f"--since-time={began}").stdout
    refused = [line for line in seen.splitlines() if "rpc error" in line or "connection refused" in line]
    print(f"\nrotated {', '.join(ROTATED)}; the operator: {line.strip()[:200]}\nno Pod or container restarted; "
          f"claims {ready} untouched; cluster-autoscaler's calls refused across the rotation: {len(refused)}"
          + "".join(f"\n  {x[:240]}" for x in refused[:10]))  # fmt: skip
    assert not refused, "a call of cluster-autoscaler was refused across the rotation"


def empty_ready_machines(s: PodStack) -> list[str]:
    """Machines Ready with no Pod bound to them."""
    busy = {p.spec.node_name for p in core(s).list_pod_for_all_namespaces().items if p.spec.node_name}
    return [n for n in sorted(MACHINES) if node_ready(s, n) and n not in busy]


def test_the_operator_never_stands_on_a_machine_and_the_split_overlay_runs(pods: PodStack) -> None:
    """The ground (docs/decisions.md, "The operator's ground"): managed machines Ready and empty, kept by
    cluster-autoscaler's scale-down-disabled annotation while the install is switched to `deploy/overlays/split`
    as docs/install.md says; the five new Pods of the operator go to the control plane, none to the empty machine.
    Then cluster-autoscaler scales that machine down (a shutdown Job through split's worker), never the control
    plane, and a machine boots through split."""
    needs_autoscaler(pods)
    s = pods
    assert s.room is not None
    # Three Pods: every machine past the third is left Ready and empty, each kept by the annotation.
    extra = len(live(s)) - 3
    set_workload(s, 3)

    def left_empty() -> list[str]:
        found = empty_ready_machines(s)
        return found if len(found) >= extra else []

    empties = wait_until(f"{extra} machines Ready and empty", left_empty, within=120)
    for empty in empties:
        s.cluster.kubectl("annotate", "node", empty, "cluster-autoscaler.kubernetes.io/scale-down-disabled=true")
    overlay = pods.overlay("split", DEPLOY / "overlays" / "split",
                           {OPERATOR_IMAGE: s.images["homelab-autoscaler"], **temporal_images(s)})  # fmt: skip
    with s.phase("overlay split: switched, Ready"):
        typed(s, "kubectl apply -k deploy/overlays/split", {"deploy/overlays/split": overlay})
        typed(s, "kubectl -n homelab-autoscaler-system delete deployment homelab-autoscaler")
        for name in SPLIT_DEPLOYMENTS:
            s.rollout(NS, f"deployment/{name}")
    split = operator_pods(s)
    assert len(split) == 5, [p.metadata.name for p in split]  # worker ×2, provider, watch ×2
    for pod in split:
        assert pod.spec.node_name == NODE_NAME, f"{pod.metadata.name} on {pod.spec.node_name}, not the control plane"
    assert set(empties) <= set(empty_ready_machines(s)), f"{empties} no longer all Ready and empty"
    BUSIEST.sample(s, "split's Pods beside machines Ready and empty")
    owners = {c["metadata"]["name"]: c["spec"]["node"] for c in live(s) if c["spec"]["node"] in empties}
    with s.phase("overlay split: a scale-down and a boot"):
        for empty in empties:
            s.cluster.kubectl("annotate", "node", empty, "cluster-autoscaler.kubernetes.io/scale-down-disabled-")
        wait(s, f"{empties} scaled down and powered off through split",
             lambda: all(phase(by_name(s)[owner]) == "completed" and not node_ready(s, node)
                         for owner, node in owners.items()), within=300)  # fmt: skip
        for empty in empties:
            assert [c.status for c in s.room.calls_of(empty, "off")][-1:] == [200], s.room.calls_of(empty, "off")
        (name,) = boot(s, 4, "a boot through split")
    once_each(s, [name])


def answered_by_the_webhook(s: PodStack, claim: str) -> subprocess.CompletedProcess[str]:
    """`kubectl apply` of a hand-written claim once the API server reaches the webhook: its Service is new with the
    overlay, and a second after the Pod is Ready kube-proxy may not route the Service's address to it yet (the API
    server says "failed calling webhook": the node's egress answered 502 once, 2 s after the webhook listened)."""

    def apply() -> subprocess.CompletedProcess[str] | None:
        done = s.cluster.kubectl("apply", "-f", "-", input=claim, check=False)
        return None if "failed calling webhook" in done.stderr else done

    answered: subprocess.CompletedProcess[str] = wait_until(
        "the API server to reach the admission webhook through its Service", apply, within=60, every=1
    )
    return answered


def test_the_homelab_mtls_overlay_with_the_harness_as_cert_manager(pods: PodStack) -> None:
    """`deploy/overlays/homelab-mtls` and `deploy/cluster-autoscaler/mtls` applied as docs/install.md says, with
    cert-manager's CRDs installed and the harness issuing exactly what cert-manager would
    (tests/realcluster/certmanager.py): the provider accepts cluster-autoscaler's client certificate only, the API
    server calls the NodeClaim admission webhook through its Service, and a machine boots through mTLS."""
    needs_autoscaler(pods)
    s = pods
    definitions = cert_manager_crds()
    overlay = pods.overlay("homelab-mtls", DEPLOY / "overlays" / "homelab-mtls",
                           {OPERATOR_IMAGE: s.images["homelab-autoscaler"], **temporal_images(s)})  # fmt: skip
    ca_overlay = pods.overlay("cluster-autoscaler-mtls", DEPLOY / "cluster-autoscaler" / "mtls",
                              {CA_IMAGE: s.images["cluster-autoscaler"]})  # fmt: skip
    with s.phase("overlay homelab-mtls: switched, Ready"):
        s.cluster.kubectl("apply", "--server-side", "-f", str(definitions))
        crds.established(s.cluster, "certificates.cert-manager.io", "issuers.cert-manager.io")
        typed(s, "kubectl apply -k deploy/overlays/homelab-mtls", {"deploy/overlays/homelab-mtls": overlay})
        issuer = CertManager(s.cluster.admin, NS)
        waiting = issuer.reconcile()
        assert waiting == [], waiting
        print(f"\nthe harness issued, as cert-manager would: {', '.join(issuer.issued)}")
        typed(s, "kubectl -n homelab-autoscaler-system delete deployment homelab-autoscaler-worker "
                 "homelab-autoscaler-provider homelab-autoscaler-watch")  # fmt: skip
        typed(s, "kubectl -n homelab-autoscaler-system rollout status deployment/homelab-autoscaler")
        typed(s, "kubectl apply -k deploy/cluster-autoscaler/mtls", {"deploy/cluster-autoscaler/mtls": ca_overlay})
        patch_autoscaler_for_the_story(s)
    (op,) = operator_pods(s)
    assert op.spec.node_name == NODE_NAME
    # The admission webhook through its Service: a person's second live claim on a busy slot is refused.
    owner = next(c for c in live(s) if phase(c) == "ready")
    slot, live_name = owner["spec"]["node"], owner["metadata"]["name"]
    done = answered_by_the_webhook(s, hand_claim("by-hand", slot))
    assert done.returncode == 1, done.stdout
    assert seed_refusal("by-hand", slot, live_name, "ready") in done.stderr, done.stderr
    with s.phase("overlay homelab-mtls: a boot"):
        (name,) = boot(s, 5, "a boot through mTLS")
    once_each(s, [name])


def test_a_machine_that_never_boots_backs_its_group_off_and_spares_serve(pods: PodStack) -> None:
    """The idle machine's BMC does not answer: the startup Job's container exits 3 with its last words, the claim
    fails, cluster-autoscaler backs `workers` off and scales `spares` up instead; exactly one claim failed."""
    needs_autoscaler(pods)
    s = pods
    assert s.room is not None
    settle(s)
    busy = {c["spec"]["node"] for c in live(s)}
    (idle,) = [slot.name for slot in STORY.slots_of("workers") if slot.name not in busy]
    s.room.fail(idle, "on", times=5)
    with s.phase("story: a failed boot, spares serve"):
        set_workload(s, 6)
        wait(s, f"the claim on {idle} failed",
             lambda: any(phase(c) == "failed" and c["spec"]["node"] == idle for c in claims(s)),
             within=300)  # fmt: skip
        wait(s, "spares scaled up instead",
             lambda: any(phase(c) == "ready" and c["spec"]["node"] == "spare-1" for c in claims(s)),
             within=300)  # fmt: skip
        wait_until("6 workload Pods Running on machines", lambda: running_on_machines(s) == 6, within=180)
    BUSIEST.sample(s, "six machines serving the workload")
    failed = [c for c in claims(s) if phase(c) == "failed"]
    assert [(c["spec"]["node"], reason(c)) for c in failed] == [(idle, "StartupJobFailed")], summary(s)
    message = str(failed[0]["status"].get("message", ""))
    assert "exit code 3" in message and f"the BMC of {idle} did not answer" in message, message
    cm = core(s).read_namespaced_config_map("cluster-autoscaler-status", NS)
    assert "startup-job-failed" in (cm.data or {}).get("status", ""), cm.data


def test_the_workload_goes_and_every_machine_is_powered_off(pods: PodStack) -> None:
    """Every machine scaled down and powered off by a shutdown Job's Pod calling its BMC; every claim ended;
    cluster-autoscaler never touched the control plane (it belongs to no group)."""
    needs_autoscaler(pods)
    s = pods
    assert s.room is not None
    was_on = {c["spec"]["node"] for c in live(s)}
    with s.phase("story: scale-down of every machine"):
        k8s.AppsV1Api(s.cluster.admin).delete_namespaced_deployment(WORKLOAD, "default")

        def shutting_down() -> bool:
            BUSIEST.sample(s, "the workload gone, the machines' shutdown Jobs running")
            return not live(s) and not any(node_ready(s, n) for n in MACHINES)

        wait(s, "every claim ended and every machine powered off", shutting_down, within=420,
             every=3)  # fmt: skip
    for slot in was_on:
        assert 200 in [c.status for c in s.room.calls_of(slot, "off")], (slot, s.room.calls_of(slot, "off"))
    # Every machine booted was one a Pod needed (cluster-autoscaler asked twice for one Pod before the provider
    # kept a Node mid-boot out of its group: kubernetes/autoscaler#10245, docs/decisions.md).
    assert not EXTRA, f"machines booted for nobody: {EXTRA}"
    writes = ("update", "patch", "delete")
    touched = {e.name for e in audit.read(s.cluster.audit_log)
               if e.user == audit.AUTOSCALER and e.resource == "nodes" and e.verb in writes}  # fmt: skip
    assert touched and NODE_NAME not in touched, touched
    if "database at rest" in STATE:
        grown = database_bytes(s) - STATE["database at rest"]
        lifecycles = claims_created(s) - STATE["claims at rest"]
        STATE["bytes per lifecycle"] = (grown, lifecycles)
        print(f"\nPostgreSQL (temporal + temporal_visibility) grew {grown / 2**10:.0f} KiB over {lifecycles} claim "
              f"lifecycles begun and ended since the story was at rest (and the scale-downs of the claims live then):"
              f" {grown / max(lifecycles, 1) / 2**10:.0f} KiB each")  # fmt: skip
    if "at rest" in STATE:
        STATE["footprint"] = footprint_table(s, STATE["at rest"], BUSIEST.used)


# --- next to an existing Temporal with frontend mTLS (issue 40) -----------------------------------------------------
EXISTING = "temporal"  # the existing Temporal's namespace, as overlays/temporal-cluster's address names it
# What makes the bundled Temporal (rendered from overlays/homelab) a Temporal of its own elsewhere: its server and
# PostgreSQL, and the certs step that issues its frontend's and a client's certificates there.
EXISTING_KINDS = {("ConfigMap", "temporal-config"), ("Deployment", "temporal-server"), ("Service", "temporal-frontend"),
                  ("StatefulSet", "temporal-postgresql"), ("Service", "temporal-postgresql"),
                  ("ServiceAccount", "homelab-autoscaler-certs"), ("Role", "homelab-autoscaler-certs"),
                  ("RoleBinding", "homelab-autoscaler-certs"), ("Job", "homelab-autoscaler-certs")}  # fmt: skip
SEARCH_ATTRIBUTES = [("HomelabGroup", "Keyword"), ("HomelabSlot", "Keyword"), ("ClaimPhase", "Keyword"),
                     ("ClaimReason", "Keyword"), ("ClaimAttempt", "Int")]  # fmt: skip


def existing_temporal(s: PodStack) -> None:
    """A Temporal cluster of the user's own in namespace `temporal`: the real server (same-version stand-in) on
    PostgreSQL, its frontend requiring a client certificate of its own CA, its names those of its namespace."""
    overlay = s.overlay("existing-temporal", DEPLOY / "overlays" / "homelab",
                        {OPERATOR_IMAGE: s.images["homelab-autoscaler"], **temporal_images(s)})  # fmt: skip
    rendered = [d for d in yaml.safe_load_all(s.cluster.kubectl("kustomize", str(overlay)).stdout) if d]
    docs = [d for d in rendered if (d["kind"], d["metadata"]["name"]) in EXISTING_KINDS]
    assert {(d["kind"], d["metadata"]["name"]) for d in docs} == EXISTING_KINDS
    for doc in docs:
        doc["metadata"]["namespace"] = EXISTING
        for subject in doc.get("subjects", []):
            subject["namespace"] = EXISTING
    s.cluster.kubectl("create", "namespace", EXISTING)
    s.cluster.kubectl("-n", EXISTING, "create", "secret", "generic", "temporal-postgresql",
                      "--from-literal=password=an-existing-clusters-password")  # fmt: skip
    s.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
    s.cluster.kubectl("-n", EXISTING, "wait", "--for=condition=complete", "job/homelab-autoscaler-certs",
                      "--timeout=300s", timeout=330)  # fmt: skip
    s.rollout(EXISTING, "statefulset/temporal-postgresql")
    s.rollout(EXISTING, "deployment/temporal-server")


def test_the_temporal_cluster_overlay_next_to_a_temporal_with_frontend_mtls(pods: PodStack) -> None:
    """Issue 40, part 5: docs/install.md's "Next to an existing Temporal cluster", typed, against a Temporal of the
    user's own in another namespace whose frontend requires a client certificate: its namespace and search attributes
    made with the `temporal` CLI (through a port-forward, with that cluster's client certificate), the certificate
    put in the Secret the guide names, `deploy/overlays/temporal-cluster` applied; the operator's Pod Ready on it,
    a machine booted through it, the claim's workflow in that Temporal's `homelab` namespace. A session without a
    certificate is refused there."""
    needs_autoscaler(pods)
    s = pods
    cli = ROOT / ".venv" / "bin" / "temporal"
    if not cli.is_file():
        pytest.skip(f"no `temporal` CLI at {cli} (the `dev` extra): `make test`'s virtualenv has it")
    with s.phase("temporal-cluster: an existing Temporal with frontend mTLS in its own namespace"):
        existing_temporal(s)
    folder = s.dir / "existing-temporal-client"
    folder.mkdir(exist_ok=True)
    core: Any = k8s.CoreV1Api(s.cluster.admin)
    issued: dict[str, str] = core.read_namespaced_secret("homelab-autoscaler-temporal-tls", EXISTING).data
    for key, name in (("tls.crt", "client.pem"), ("tls.key", "client.key"), ("ca.crt", "ca.pem")):
        (folder / name).write_bytes(base64.b64decode(issued[key]))
    local = _free()
    proc = subprocess.Popen([str(s.cluster.bins / "kubectl"), "--kubeconfig", str(s.cluster.admin_kubeconfig), "-n",
                             EXISTING, "port-forward", "svc/temporal-frontend", f"{local}:7233"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    server_name = f"temporal-frontend.{EXISTING}.svc.cluster.local"
    connection = ["--address", f"127.0.0.1:{local}", "--tls-cert-path", "client.pem", "--tls-key-path", "client.key",
                  "--tls-ca-path", "ca.pem", "--tls-server-name", server_name]  # fmt: skip

    def cli_run(command: str, *, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A `temporal` command of the guide's (the search attributes' loop one at a time), with the connection."""
        done = subprocess.run([str(cli), *shlex.split(command)[1:], *connection], capture_output=True, text=True,
                              timeout=60, cwd=folder, check=False)  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"`{command}`: {done.stderr[-500:]}")
        return done

    try:
        with s.phase("temporal-cluster: its namespace and search attributes, by the temporal CLI"):
            wait_until("the existing Temporal's frontend through the port-forward, with its client certificate",
                       lambda: cli_run("temporal operator cluster health"), within=120)  # fmt: skip
            assert "temporal operator namespace create --namespace homelab" in guide_text("install.md")
            cli_run("temporal operator namespace create --namespace homelab")
            assert "temporal operator search-attribute create --namespace homelab --name $a --type Keyword" in (
                guide_text("install.md")
            )
            for name, kind in SEARCH_ATTRIBUTES:
                # The guide's loop, one attribute at a time; a namespace just made may take a moment to be known.
                command = f"temporal operator search-attribute create --namespace homelab --name {name} --type {kind}"
                wait_until(f"search attribute {name} in namespace homelab", functools.partial(cli_run, command),
                           within=60)  # fmt: skip
            bare = subprocess.run([str(cli), "operator", "namespace", "describe", "--namespace", "homelab",
                                   "--address", f"127.0.0.1:{local}", "--tls", "--tls-ca-path", "ca.pem",
                                   "--tls-server-name", server_name],
                                  capture_output=True, text=True, timeout=60, cwd=folder, check=False)  # fmt: skip
            assert bare.returncode != 0, f"the existing Temporal served a client without a certificate: {bare.stdout}"
    finally:
        proc.terminate()
        proc.wait(10)
    # The operator without the certificate: refused, and it says so in one line, naming what to give.
    address = f"temporal-frontend.{EXISTING}.svc.cluster.local:7233"
    out = s.run_pod("operator-without-certificate", f"homelab-autoscaler claims list --temporal-address {address} "
                    "--temporal-namespace homelab", image=s.images["homelab-autoscaler"])  # fmt: skip
    phase_, *said = [line for line in out.splitlines() if line.strip()]
    print(f"\nthe operator with no certificate against the existing Temporal ({phase_}): {said}")
    assert phase_ == "Failed" and len(said) == 1 and "--temporal-tls-cert" in said[0], out
    paths = {f"--from-file={k}={f}": Path(f"--from-file={k}={folder / f}")
             for k, f in (("tls.crt", "client.pem"), ("tls.key", "client.key"), ("ca.crt", "ca.pem"))}  # fmt: skip
    overlay = s.overlay("temporal-cluster", DEPLOY / "overlays" / "temporal-cluster",
                        {OPERATOR_IMAGE: s.images["homelab-autoscaler"]})  # fmt: skip
    with s.phase("temporal-cluster: the client Secret and the overlay applied, Ready"):
        secret = (
            "kubectl -n homelab-autoscaler-system create secret generic temporal-client-tls "
            "--from-file=tls.crt=client.pem --from-file=tls.key=client.key --from-file=ca.crt=ca.pem"
        )
        typed(s, secret, paths)
        # A switch: the certs Job of the bundled install (its template asks for Temporal's certificates) goes first.
        typed(s, "kubectl -n homelab-autoscaler-system delete job homelab-autoscaler-certs --ignore-not-found")
        typed(s, "kubectl apply -k deploy/overlays/temporal-cluster", {"deploy/overlays/temporal-cluster": overlay})
        s.rollout(NS, "deployment/homelab-autoscaler")
    (op,) = operator_pods(s)
    env = {e.name: e.value for e in op.spec.containers[0].env}
    assert env["HOMELAB_AUTOSCALER_TEMPORAL_ADDRESS"] == f"temporal-frontend.{EXISTING}.svc.cluster.local:7233", env
    assert not op.spec.init_containers, "the bundled Temporal's setup step is left behind"
    with s.phase("temporal-cluster: a boot"):
        (name,) = boot(s, len(live(s)) + 1, "a boot through the existing Temporal")
    once_each(s, [name])
    described = s.describe_claim(name)  # from the operator's Pod: its address, namespace and certificate
    assert described["status"] == "RUNNING", described
    print(f"\nthe claim {name}'s workflow on the existing Temporal (namespace homelab, frontend mTLS): {described}")


# --- the end: the machine as found ---------------------------------------------------------------------------------
def test_zz_the_machine_is_left_as_found(pods: PodStack) -> None:
    """Everything stopped; the inventory of namespaces, links, firewall tables, mounts, cgroups and processes is
    the one taken before the run. Then the guide's commands, run and not run, are printed."""
    pods.stop()
    after = inventory.take(markers=(PREFIX,))
    ours, theirs = inventory.left_behind(inventory.diff(STATE["before"], after), (PREFIX, str(pods.dir)))
    print("\nphase times:\n" + "\n".join(f"  {k}: {v:.0f} s" for k, v in pods.timings.items()))
    print("\ndocs/install.md's commands:\n" + "\n".join(f"  {c}  -- {how}" for c, how in GUIDE))
    if EXTRA:
        print(f"\nmachines booted for nobody (a second scale-up for one Pod), scaled down again: {EXTRA}")
    if BUSIEST.text:
        print(
            f"\nkubectl get pods -A -o wide at the story's busiest moment ({BUSIEST.when}, {BUSIEST.pods} "
            f"Pods):\n{BUSIEST.text}"
        )
    if STATE.get("footprint"):
        print(f"\nthe install's containers, asked and used (the kubelet's summary):\n{STATE['footprint']}")
    if theirs:
        print("appeared meanwhile, not the run's (the machine is shared):\n" + yaml.safe_dump(theirs))
    assert not ours, "the run left the machine changed:\n" + yaml.safe_dump(ours)
