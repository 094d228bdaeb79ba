"""The Helm chart on the real node (`make e2e-pods`): issue 30's part 7 with the chart's own Pods doing the work, on
issue 40's default, the bundled Temporal on PostgreSQL. The images are the run's registry's (the operator's, and
same-version stand-ins for the official Temporal server, admin-tools, UI and PostgreSQL images the chart names), the
Pods run in containerd on the real kubelet, the machine is a KWOK one switched by the machine room that a power Job's
container calls (tests/realcluster/podstack.py, as test_pods.py's story). Each command is docs/install.md's, read
from it (tests/realcluster/helm.py):

1. the guide's default StorageClass, then the chart packaged, pushed to the run's registry as an OCI artifact and
   `helm install oci://... --create-namespace --wait` of the defaults from there, the images
   overridden by a values file as a private registry's user writes one: the operator's Pod and the bundled
   Temporal's three (PostgreSQL, the server, the Web UI) Running and Ready on the real kubelet, their containers in
   containerd, each init container (the operator's `temporal-setup`, the server's `schema`) done; PostgreSQL's
   volume claim bound by local-path, its password Secret made by the operator's init container;
2. one boot: a claim applied by hand is booted by the chart's operator Pod through a startup Job whose Pod runs
   busybox's `wget` to the machine room on the real node; the KWOK machine comes up and the claim ends ready;
3. `helm upgrade --wait` to every image under a second tag: all four Pods replaced and running them, the operator
   without a restart, the new operator holds the watchers' Lease, the server's `schema` step ran again on the
   up-to-date database, Temporal kept the claim's workflow in PostgreSQL (its volume kept across its Pod's
   replacement), and the booted claim is untouched: the same object, ready, no second startup Job, no second call
   to its BMC;
4. the operator's Pod started while the Temporal server is down (what an install or a node's restart may do): its
   `temporal-setup` init container says it waits for it, and once the server is back the operator runs, with no
   restart;
5. `helm uninstall`: the chart's objects and Pods gone from the node; the CRDs, the Group, the slot and the claim
   (ready, its finalizer), the namespace, PostgreSQL's volume claim and password Secret, and the watchers' Lease
   left, the machine still on, as the guide says;
6. the guide's `helm install` with cluster-autoscaler from the chart in kube-system (issue 44): its Pod Ready, its
   client certificate issued into kube-system, its status naming the provider's group (mTLS across the namespaces
   the NetworkPolicies separate); uninstalled again;
7. the arm64 image of the operator's index installed by the chart by its digest (issue 42) on this amd64 node,
   under emulation: its Pod Ready, `uname -m` aarch64 in it; it powers the machine off and boots it again through
   a startup Job Pod of the redfish power example's arm64 image (`curl` to the machine room).

This checkout's images, installed, then the same images under a second tag: the chart's operator Pod runs
`homelab-autoscaler temporal-setup` first, which the previous release's image does not have, so that image cannot
run this chart. The upgrade from 0.3.0's dev server to this default is test_pods.py's (docs/upgrades.md).

The node's namespace and cgroups are named `hlhelm-<hex>` (not test_pods.py's `hlas-`), so this module and another
real-node run on the shared machine never count each other's node; the last step checks that nothing named so, or
under the run's directory, is left.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from api import names
from tests import binfmt, releases
from tests.procs import ROOT
from tests.realcluster import inventory
from tests.realcluster.cluster import wait_until
from tests.realcluster.conftest import FAILED
from tests.realcluster.helm import CHART, CRDS, RELEASED, ChartReads, Helm, documented
from tests.realcluster.node import NODE_NAME
from tests.realcluster.podstack import MACHINE_ROOM, PodStack, machine_room_service, power_spec, powered
from tests.realcluster.stack import NS, GroupSpec, Homelab, SlotSpec, hand_claim, phase
from tests.realcluster.test_pods import node_ready

pytestmark = [pytest.mark.realpods, pytest.mark.timeout(900)]

PREFIX = "hlhelm-"
HOMELAB = Homelab(groups=(GroupSpec("workers", 1),), slots=(SlotSpec("machine-1", "workers"),))
CLAIM = "machine-1-by-hand"
SLOT = "machine-1"
BOOT_SECONDS = 3.0  # from the BMC's yes to the machine's kubelet
WATCH_LEASE = "homelab-autoscaler-watch"
CERTS_JOBS = "app.kubernetes.io/name=homelab-autoscaler,app.kubernetes.io/component=certs"
ARM64_CLAIM = "machine-1-on-arm64"
CA_NAMESPACE = "kube-system"  # where the guide's `helm install` with clusterAutoscaler puts it
CLIENT_SECRET = "cluster-autoscaler-client-tls"
# The certs step under emulation: qemu's translated code counts against the container's memory, and the chart's
# 128Mi limit (ample on either platform's hardware) saw it OOMKilled here.
EMULATED_CERTS = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}}
# The redfish example's tool (curl) posting to the machine room as its BMC, saying where it ran.
ARM64_STARTUP = (
    'echo "$(uname -m) $(curl --version | head -n 1)" && '
    f'curl -fsS -X POST "{MACHINE_ROOM}/machines/$HOMELAB_SLOT/on" '
    '|| { echo "the BMC of $HOMELAB_SLOT did not answer" > /dev/termination-log; exit 3; }'
)


# The images of the install, by their name in the run's registry (podstack's `Images.refs`), and the values that
# name each in the chart (temporal.bundled.images.*); the operator's is `image`.
OPERATOR = "homelab-autoscaler"
TEMPORAL_VALUES = {"temporal-server": "server", "temporal-admin-tools": "adminTools", "temporal-ui": "ui",
                   "postgresql": "postgresql"}  # fmt: skip
# Each of the chart's Pods by its labels (name, component), and the image each of its containers, init containers
# too, runs.
EXPECTED_PODS: dict[tuple[str, str], dict[str, str]] = {
    ("homelab-autoscaler", "operator"): {"homelab-autoscaler": OPERATOR, "temporal-setup": OPERATOR},
    ("temporal", "postgresql"): {"postgresql": "postgresql"},
    ("temporal", "server"): {"server": "temporal-server", "schema": "temporal-admin-tools"},
    ("temporal", "web"): {"web": "temporal-ui"},
}
PASSWORD_SECRET = "temporal-postgresql"
DATA_CLAIM = "data-temporal-postgresql-0"


@dataclass
class HelmPods(PodStack, ChartReads):
    """The real node with the chart installed by helm."""

    helm: Helm = field(init=False)
    # The images installed, and those upgraded to: the run's name of each (OPERATOR, TEMPORAL_VALUES) → its ref.
    chart_images: tuple[dict[str, str], dict[str, str]] = ({}, {})

    def start(self) -> HelmPods:
        super().start()
        self.helm = Helm(self.cluster.bins, self.cluster.admin_kubeconfig, self.dir / "helm")
        installed = {name: self.images[name] for name in (OPERATOR, *TEMPORAL_VALUES)}
        upgraded = {name: f"{ref}-next" for name, ref in installed.items()}
        # The same images under a second tag, so the upgrade is a real rollout of every Pod.
        for name, ref in upgraded.items():
            self.builder.push(self.built[name], ref)
        self.chart_images = (installed, upgraded)
        return self

    def write_values(self, images: dict[str, str], digest: str = "", **more: Any) -> None:
        """The run's values file: the operator's image and the bundled Temporal's, as `repository` and `tag`; the
        operator's pinned to `digest` when given; `more` values beside them."""
        bundled = {}
        for name, key in TEMPORAL_VALUES.items():
            repository, _, tag = images[name].rpartition(":")
            bundled[key] = {"repository": repository, "tag": tag}
        self.helm.more_values = {"temporal": {"bundled": {"images": bundled}}, **more}
        self.helm.write_values(images[OPERATOR], digest)

    # --- reading the node -------------------------------------------------------------------------------------------
    def core(self) -> Any:
        return k8s.CoreV1Api(self.cluster.admin)

    @staticmethod
    def kind(pod: Any) -> tuple[str, str]:
        labels = pod.metadata.labels
        return labels.get("app.kubernetes.io/name", ""), labels.get("app.kubernetes.io/component", "")

    def running(self, pod: Any, images: dict[str, str]) -> str:
        """'' when `pod` runs on the real node, each container Ready as containerd's task and each init container
        done, every one of them from its image of `images`; else what is not so."""
        if pod.spec.node_name != NODE_NAME or pod.status.phase != "Running":
            return f"{pod.metadata.name} is {pod.status.phase} on {pod.spec.node_name}"
        expected = {c: images[name] for c, name in EXPECTED_PODS.get(self.kind(pod), {}).items()}
        if not expected:
            return f"{pod.metadata.name}: not a Pod of the chart's ({self.kind(pod)})"
        tasks = set(self.node.tasks())
        statuses = [*(pod.status.init_container_statuses or []), *(pod.status.container_statuses or [])]
        if sorted(c.name for c in statuses) != sorted(expected):
            return f"{pod.metadata.name} has containers {sorted(c.name for c in statuses)}, not {sorted(expected)}"
        for c in pod.status.init_container_statuses or []:
            done = c.state.terminated
            if done is None or done.exit_code != 0:
                return f"{pod.metadata.name}/{c.name} (init): {c.state}"
        for c in pod.status.container_statuses or []:
            cid = str(c.container_id or "").removeprefix("containerd://")
            if not (c.ready and c.started and c.state.running) or cid not in tasks:
                return f"{pod.metadata.name}/{c.name}: ready={c.ready} started={c.started}, task {cid or '-'}"
        # The Pod's spec names the image; its status cannot tell two tags of one image apart: containerd 1.6 reports
        # the first of the image's tags, whichever the kubelet pulled (the upgrade's second tags are the same images).
        for c in [*(pod.spec.init_containers or []), *pod.spec.containers]:
            if c.image != expected[c.name]:
                return f"{pod.metadata.name}/{c.name} is to run {c.image}, not {expected[c.name]}"
        for c in statuses:
            if c.image.rpartition(":")[0] != expected[c.name].rpartition(":")[0] or not c.image_id:
                got = f"{c.image} ({c.image_id or 'no image ID'})"
                return f"{pod.metadata.name}/{c.name} runs {got}, not {expected[c.name]}"
        return ""

    def problems(self, images: dict[str, str]) -> list[str]:
        """What keeps the chart's Pods (one of each kind) from all `running` `images`; empty when nothing does."""
        pods = self.chart_pods()
        kinds = sorted(self.kind(p) for p in pods)
        if kinds != sorted(EXPECTED_PODS):
            return [f"the chart's Pods are {kinds}, not {sorted(EXPECTED_PODS)}"]
        return [problem for p in pods if (problem := self.running(p, images))]

    def chart_running(self, images: dict[str, str]) -> bool:
        """True when every Pod of the chart runs `images`; else an AssertionError saying what does not, which a
        wait that ends in vain names as its last error."""
        if problems := self.problems(images):
            raise AssertionError("; ".join(problems))
        return True

    def version_in(self, what: str) -> str:
        """`homelab-autoscaler --version` in a container of the chart (`deployment/…` or a Pod's name)."""
        return self.cluster.kubectl("-n", NS, "exec", what, "--", "homelab-autoscaler", "--version").stdout.strip()

    def restarts(self) -> dict[str, int]:
        """Each of the chart's Pods' container restarts, its init containers' too."""
        return {p.metadata.name: sum(c.restart_count for c in [*(p.status.init_container_statuses or []),
                                                               *(p.status.container_statuses or [])])
                for p in self.chart_pods()}  # fmt: skip

    def lease_holder(self) -> str:
        lease: Any = k8s.CoordinationV1Api(self.cluster.admin).read_namespaced_lease(WATCH_LEASE, NS)
        return str(lease.spec.holder_identity or "")

    def arm64_operator_ready(self, digest: str) -> bool:
        """True when the operator's one Pod runs the image of `digest` and is Ready, the certs Job it ran succeeded,
        and Temporal's run as before; else an AssertionError saying what is not so."""
        pods = [p for p in self.chart_pods() if self.kind(p) == ("homelab-autoscaler", "operator")]
        if len(pods) != 1:
            raise AssertionError(f"operator Pods: {[p.metadata.name for p in pods]}")
        (pod,) = pods
        (spec,) = [c for c in pod.spec.containers if c.name == "homelab-autoscaler"]
        statuses = {c.name: c for c in pod.status.container_statuses or []}
        status = statuses.get("homelab-autoscaler")
        if not spec.image.endswith(f"@{digest}") or status is None or not status.ready:
            raise AssertionError(f"{pod.metadata.name} ({spec.image}): {pod.status.phase}, {status}")
        if digest not in str(status.image_id):
            raise AssertionError(f"{pod.metadata.name} runs {status.image_id}, not {digest}")
        batch: Any = k8s.BatchV1Api(self.cluster.admin)
        jobs: list[Any] = batch.list_namespaced_job(NS, label_selector=CERTS_JOBS).items
        newest = max(jobs, key=lambda j: j.metadata.creation_timestamp, default=None)
        if newest is None or not newest.status.succeeded:
            raise AssertionError(f"the certs Job of this install has not succeeded: {newest and newest.status}")
        others = [p for p in self.chart_pods() if p.metadata.name != pod.metadata.name]
        problems = [problem for p in others if (problem := self.running(p, self.chart_images[1]))]
        if problems:
            raise AssertionError("; ".join(problems))
        return True

    def operator_pod(self) -> str:
        (pod,) = [p.metadata.name for p in self.chart_pods()
                  if p.metadata.labels["app.kubernetes.io/name"] == "homelab-autoscaler"]  # fmt: skip
        return str(pod)


def arm64_power_image(s: HelmPods, name: str) -> str:
    """A power example's image index (tests/machineroom/images.sh builds both platforms, cached by content) pushed
    to the run's registry; the reference of its arm64 image, by digest."""
    built = subprocess.run([str(ROOT / "tests" / "machineroom" / "images.sh")], capture_output=True, text=True,
                           timeout=3600)  # fmt: skip
    assert built.returncode == 0, f"tests/machineroom/images.sh failed:\n{built.stderr[-3000:]}"
    image = Path(built.stdout.strip().splitlines()[-1]) / name
    tag = (image / "tag").read_text().strip().rsplit(":", 1)[1]
    repository = f"hlmr/{name}"
    ref = s.load_image(image / "index.oci.tar", f"{repository}:{tag}", all_platforms=True)
    digest = s.registry.platform_digest(repository, tag, "linux/arm64")
    return f"{ref.rpartition(':')[0]}@{digest}"


def _netns() -> list[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False)
    return sorted(line.split()[0] for line in done.stdout.splitlines() if line.strip())


STATE: dict[str, Any] = {}


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Iterator[HelmPods]:
    STATE["began"] = time.monotonic()
    STATE["netns"] = _netns()
    STATE["before"] = inventory.take(markers=(PREFIX,))
    directory = Path(tempfile.mkdtemp(prefix=PREFIX))
    s = HelmPods(directory, prefix=PREFIX)
    s.start()
    print(
        f"\nreal node up in {time.monotonic() - STATE['began']:.0f} s in {directory}, its namespace "
        f"{s.node.layout.netns}; the chart installs {s.chart_images[0]}, upgrades to {s.chart_images[1]}"
    )
    yield s
    failed = bool(request.session.stash.get(FAILED, []))
    if failed:
        s.dump(80)
    s.stop()
    print("\nthe documented commands run, in order:\n" + "\n".join(s.helm.log))
    if failed or os.environ.get("HOMELAB_E2E_KEEP", "") not in ("", "0"):
        print(f"kept {directory}")
    else:
        shutil.rmtree(directory, ignore_errors=True)


def test_1_helm_install_runs_the_charts_pods_on_the_real_kubelet(stack: HelmPods) -> None:
    s = stack
    with s.phase("storage class"):  # the guide's step before any install
        s.install_storage()
        s.helm.run(documented("kubectl patch storageclass local-path"))
    s.write_values(s.chart_images[0])
    # The chart as an OCI artifact in the run's registry (plain HTTP on the loopback), as the guide pushes it.
    version = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["version"])
    places = {"VERSION": version, "REGISTRY": s.registry.address}
    with s.phase("helm package, push to the registry, install --wait from oci://"):
        s.helm.run(documented("helm package charts/homelab-autoscaler", **places))
        s.helm.run([*documented("helm push dist/", **places), "--plain-http"])
        assert s.registry.has("charts/homelab-autoscaler", version), "the pushed chart is not in the registry"
        s.helm.run([*documented("helm install homelab-autoscaler oci://", **places), "--plain-http", "-f",
                    "my-values.yaml"])  # fmt: skip
    assert s.helm.history(NS) == ["deployed"]
    (revision,) = yaml.safe_load(s.helm.run(["helm", "history", "homelab-autoscaler", "-n", NS, "-o", "json"]).stdout)
    assert revision["chart"] == f"homelab-autoscaler-{version}", revision
    assert s.chart_running(s.chart_images[0])
    assert s.version_in("deployment/homelab-autoscaler") == f"homelab-autoscaler {releases.current()}"
    pvc = s.volume_claim(DATA_CLAIM)
    assert pvc.status.phase == "Bound" and pvc.spec.storage_class_name == "local-path", pvc.status
    # Made by the operator's init container (no Helm hook): the chart renders no Secret.
    secret = s.core().read_namespaced_secret(PASSWORD_SECRET, NS)
    assert secret.metadata.labels.get("app.kubernetes.io/managed-by") == "homelab-autoscaler", secret.metadata
    assert "password" in (secret.data or {})
    for name in CRDS:
        assert s.crd(name)["metadata"]["labels"]["app.kubernetes.io/part-of"] == "homelab-autoscaler"
    STATE["restarts after install"] = s.restarts()
    print(f"\nrestarts after `helm install`: {STATE['restarts after install']}")
    wide = s.cluster.kubectl("get", "pods", "-A", "-o", "wide").stdout
    print(f"\nkubectl get pods -A -o wide after `helm install`:\n{wide}")


def test_2_one_boot_by_the_charts_operator_pod_through_a_job_pod_on_the_node(stack: HelmPods) -> None:
    s = stack
    room = s.start_machine_room({slot.name: slot.machine() for slot in HOMELAB.slots})
    room.boot_seconds = BOOT_SECONDS
    s.apply(machine_room_service(room.port))
    s.cluster.kubectl("apply", "--validate=strict", "-f", "-", input=yaml.safe_dump_all(powered(s, HOMELAB)))
    with s.phase("one boot"):
        s.cluster.kubectl("apply", "-f", "-", input=hand_claim(CLAIM, SLOT))
        wait_until(f"claim {CLAIM} ready", lambda: phase(s.claim(CLAIM) or {}) == "ready", within=240)
    assert s.jobs_created() == [f"{CLAIM}-startup"]
    (pod,) = s.core().list_namespaced_pod(NS, label_selector=f"job-name={CLAIM}-startup").items
    assert pod.spec.node_name == NODE_NAME and pod.status.phase == "Succeeded", (pod.spec.node_name, pod.status)
    (status,) = pod.status.container_statuses
    assert status.state.terminated.exit_code == 0 and status.container_id.startswith("containerd://"), status
    log = s.cluster.kubectl("-n", NS, "logs", pod.metadata.name).stdout
    assert f"{SLOT} on" in log, f"the machine room's answer, as wget printed it: {log!r}"
    assert [c.status for c in room.calls_of(SLOT, "on")] == [200], room.calls
    assert node_ready(s, SLOT)


def test_3_helm_upgrade_to_the_next_images_leaves_the_booted_claim_be(stack: HelmPods) -> None:
    s = stack
    assert s.room is not None
    before, jobs, calls = s.claim(CLAIM), s.jobs_created(), list(s.room.calls)
    old_pods = {p.metadata.name for p in s.chart_pods()}
    old_operator = s.operator_pod()
    s.write_values(s.chart_images[1])
    upgraded_at = time.time()
    with s.phase("helm upgrade --wait"):
        s.helm.run(documented("helm upgrade homelab-autoscaler ./charts/homelab-autoscaler"))
        wait_until(f"the chart's Pods running {s.chart_images[1]} on the real node",
                   lambda: s.chart_running(s.chart_images[1]), within=300)  # fmt: skip
    assert s.helm.history(NS) == ["superseded", "deployed"]
    assert not old_pods & {p.metadata.name for p in s.chart_pods() if p.metadata.name != "temporal-postgresql-0"}
    new_operator = s.operator_pod()
    assert new_operator != old_operator
    # Every Pod was replaced at once: the new operator's init container waited for the new server, which its own
    # init container held until PostgreSQL answered. Temporal's Pods may restart on a database replaced under
    # them (printed); the operator's may not.
    restarts = s.restarts()
    print(f"\nrestarts after `helm upgrade`: {restarts}")
    assert restarts[new_operator] == 0, restarts  # a failure prints the Pods' logs
    wait_until(f"the new operator Pod {new_operator} to hold the watchers' Lease",
               lambda: s.lease_holder() == new_operator, within=120)  # fmt: skip
    # The new server's schema step ran again on the up-to-date database and let the server start.
    schema = s.cluster.kubectl("-n", NS, "logs", "deployment/temporal-server", "-c", "schema").stdout
    assert "schemas of temporal and temporal_visibility are this release's" in schema, schema[-2000:]
    # Temporal found the claim's workflow in PostgreSQL, on its kept volume: started before the upgrade, running.
    execution = s.describe_claim(CLAIM)
    started = datetime.fromisoformat(str(execution.get("startTime")).replace("Z", "+00:00")).timestamp()
    assert started < upgraded_at, execution
    assert "RUNNING" in str(execution.get("status")).upper(), execution
    assert s.volume_claim(DATA_CLAIM).status.phase == "Bound"
    now = s.claim(CLAIM)
    assert before is not None and now is not None
    assert phase(now) == "ready" and now["metadata"]["uid"] == before["metadata"]["uid"]
    assert names.FINALIZER_CLAIM in now["metadata"]["finalizers"]
    assert s.jobs_created() == jobs, "the upgrade started a power Job"
    assert s.room.calls == calls, "the upgrade called a BMC"
    assert node_ready(s, SLOT)


def test_4_an_operator_pod_that_starts_before_temporal_waits_for_it(stack: HelmPods) -> None:
    """What every install and node restart does by chance, made certain: the Temporal server's Deployment scaled
    to 0, the operator's Pod deleted; the new one's `temporal-setup` init container (this checkout's image) says it
    waits for Temporal; the server scaled back to the chart's one replica, the operator connects: no restart, the
    claim as it was."""
    s = stack
    assert s.room is not None
    jobs, calls = s.jobs_created(), list(s.room.calls)

    def server_pods() -> list[str]:
        """The server's Pods, those terminating too: one that is still shutting down answers the new operator's
        `temporal-setup`, which then has nothing to wait for (seen here: it registered at once and the wait below
        was in vain)."""
        pods = s.core().list_namespaced_pod(NS, label_selector="app.kubernetes.io/component=server").items
        return [p.metadata.name for p in pods if s.kind(p) == ("temporal", "server")]

    with s.phase("operator before Temporal"):
        s.cluster.kubectl("-n", NS, "scale", "deployment/temporal-server", "--replicas=0")
        wait_until("the Temporal server's Pod gone, its shutdown over", lambda: not server_pods(), within=120)
        old = s.operator_pod()
        s.cluster.kubectl("-n", NS, "delete", "pod", old, "--wait=false")

        def waiting() -> bool:
            pods = [p.metadata.name for p in s.chart_pods()
                    if p.metadata.name != old and s.kind(p)[0] == "homelab-autoscaler"]  # fmt: skip
            if not pods:
                return False
            done = s.cluster.kubectl("-n", NS, "logs", pods[0], "-c", "temporal-setup", check=False)
            return "does not answer yet" in done.stdout + done.stderr

        wait_until("the new operator Pod's temporal-setup to say it waits for Temporal", waiting, within=60)
        s.cluster.kubectl("-n", NS, "scale", "deployment/temporal-server", "--replicas=1")
        wait_until(f"the chart's Pods running {s.chart_images[1]} again", lambda: s.chart_running(s.chart_images[1]),
                   within=240)  # fmt: skip
    assert set(s.restarts().values()) == {0}, s.restarts()
    claim = s.claim(CLAIM)
    assert claim is not None and phase(claim) == "ready"
    assert s.jobs_created() == jobs and s.room.calls == calls


def test_5_helm_uninstall_leaves_the_crds_the_claim_and_the_machine(stack: HelmPods) -> None:
    s = stack
    assert s.room is not None
    jobs, calls = s.jobs_created(), list(s.room.calls)
    containers = {str(c.container_id).removeprefix("containerd://") for p in s.chart_pods()
                  for c in p.status.container_statuses or []}  # fmt: skip
    with s.phase("helm uninstall"):
        s.helm.run(documented("helm uninstall homelab-autoscaler"))
        for kind, name in RELEASED:
            wait_until(f"{kind}/{name} to be deleted", functools.partial(s.gone, kind, name), within=60)
        wait_until("the chart's Pods gone from the node, their containers from containerd",
                   lambda: not s.chart_pods() and not containers & set(s.node.tasks()), within=120)  # fmt: skip
    for name in CRDS:
        s.crd(name)  # still there
    claim = s.claim(CLAIM)
    assert claim is not None and phase(claim) == "ready", claim
    assert names.FINALIZER_CLAIM in claim["metadata"]["finalizers"]
    assert s.exists(f"groups.{names.GROUP}", "workers") and s.exists(f"nodes.{names.GROUP}", SLOT)
    assert s.exists("namespace", NS) and s.exists("persistentvolumeclaim", DATA_CLAIM)
    # Not the chart's: the operator's init container made it, so a reinstall finds PostgreSQL's password with its data.
    assert s.exists("secret", PASSWORD_SECRET)
    # The watchers' Lease stays too, as docs/install.md says: the operator's Pod stops after Helm has deleted the
    # Role that let it release the Lease (Helm waits for no Pod), so a reinstall leads after the Lease expires.
    assert s.exists("lease", WATCH_LEASE)
    assert node_ready(s, SLOT), "uninstalling powered the machine off"
    assert s.jobs_created() == jobs and s.room.calls == calls, "uninstalling started a power Job"
    assert s.helm.run(["helm", "list", "-n", NS, "-q"]).stdout.strip() == ""


def test_6_cluster_autoscaler_from_the_chart_in_kube_system_reaches_the_provider_over_mtls(stack: HelmPods) -> None:
    """Issue 44, part 4: the guide's `helm install` with `clusterAutoscaler.enabled` in kube-system, typed as the
    guide types it (the images and one flag from the values file): its Pod Ready on the node in kube-system, its
    client certificate issued there by the chart's certs Job, and its status ConfigMap there naming the provider's
    group, which it can only have learned from the provider over mTLS, through the NetworkPolicies the node's engine
    enforces across the two namespaces. Then `helm uninstall` takes it away with the rest."""
    s = stack
    repository, _, tag = s.images["cluster-autoscaler"].rpartition(":")
    # It only looks: the claim booted by hand stays (scale-down's 10 minutes are longer than this step, and off).
    autoscaler = {"image": {"repository": repository, "tag": tag}, "extraArgs": ["--scale-down-enabled=false"]}
    s.write_values(s.chart_images[1], clusterAutoscaler=autoscaler)
    command = documented("helm install homelab-autoscaler ./charts/homelab-autoscaler",
                         containing="clusterAutoscaler.enabled=true")  # fmt: skip
    assert "clusterAutoscaler.namespace=kube-system" in command, command
    with s.phase("helm install --wait, cluster-autoscaler in kube-system"):
        s.helm.run([*command, "-f", "my-values.yaml"])
    core = s.core()

    def autoscaler_ready() -> bool:
        pods = core.list_namespaced_pod(CA_NAMESPACE, label_selector="app.kubernetes.io/name=cluster-autoscaler").items
        ready = [p for p in pods if p.spec.node_name == NODE_NAME and p.status.phase == "Running"
                 and all(c.ready for c in p.status.container_statuses or [])]  # fmt: skip
        if len(ready) != 1:
            seen = [(p.metadata.name, p.status.phase) for p in pods]
            raise AssertionError(f"cluster-autoscaler's Pods in {CA_NAMESPACE}: {seen}")
        return True

    wait_until(f"cluster-autoscaler Ready in {CA_NAMESPACE}", autoscaler_ready, within=120)
    secret = core.read_namespaced_secret(CLIENT_SECRET, CA_NAMESPACE)
    assert (secret.metadata.annotations or {}).get("homelab-autoscaler.dev/issued-by"), secret.metadata
    assert {"tls.crt", "tls.key", "ca.crt"} <= set(secret.data or {})

    def status() -> str:
        try:
            found = core.read_namespaced_config_map("cluster-autoscaler-status", CA_NAMESPACE)
        except k8s.ApiException as err:
            raise AssertionError(f"no status ConfigMap in {CA_NAMESPACE} yet ({err.status})") from None
        text = str((found.data or {}).get("status", ""))
        if "workers" not in text:
            raise AssertionError(f"its status names no group yet:\n{text}")
        return text

    wait_until("cluster-autoscaler's status to name the provider's group `workers`", lambda: bool(status()),
               within=120)  # fmt: skip
    log = s.cluster.kubectl("-n", CA_NAMESPACE, "logs", "deployment/cluster-autoscaler").stdout
    assert "handshake failed" not in log and "x509" not in log, log[-3000:]
    print(f"\ncluster-autoscaler from the chart, in {CA_NAMESPACE}: its status ConfigMap says\n{status()}")
    with s.phase("helm uninstall, cluster-autoscaler with it"):
        s.helm.run(documented("helm uninstall homelab-autoscaler"))

        def autoscaler_gone() -> bool:
            pods = core.list_namespaced_pod(CA_NAMESPACE, label_selector="app.kubernetes.io/name=cluster-autoscaler")
            return not pods.items and s.gone("clusterrole", "homelab-cluster-autoscaler")

        wait_until(f"cluster-autoscaler gone from {CA_NAMESPACE}", autoscaler_gone, within=120)
        wait_until("the chart's Pods gone", lambda: not s.chart_pods(), within=120)
    assert node_ready(s, SLOT), "cluster-autoscaler or the uninstall powered the machine off"


@pytest.mark.timeout(1500)  # Python under emulation: the operator's start and its init container are slow
def test_7_the_arm64_image_by_its_digest_boots_a_machine_through_an_arm64_power_image(stack: HelmPods) -> None:
    """Issue 42, part 3, on this amd64 node under emulation: the chart installed again with `image.digest` set to
    the arm64 image of the operator's index (never the index, so the node cannot pick amd64), its Pod Ready and its
    programs run as aarch64; the uninstalled release's claim deleted (its machine powered off by this operator), the
    slot's startup Job switched to the arm64 image of the redfish power example (its curl calls the machine room),
    and a new claim booted through it."""
    s = stack
    assert s.room is not None
    repository, _, tag = s.chart_images[1][OPERATOR].rpartition(":")
    digest = s.registry.platform_digest(repository.split("/", 1)[1], tag, "linux/arm64")
    power = arm64_power_image(s, "power-redfish")
    s.write_values(s.chart_images[1], digest, certs={"resources": EMULATED_CERTS})
    with binfmt.arm64():  # the node's arm64 programs run under emulation for this step only
        _arm64_install_and_boot(s, repository, digest, power)


def _arm64_install_and_boot(s: HelmPods, repository: str, digest: str, power: str) -> None:
    assert s.room is not None
    with s.phase("arm64: helm install --wait by digest"):
        places = {"VERSION": str(yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]),
                  "REGISTRY": s.registry.address}  # fmt: skip
        s.helm.run([*documented("helm install homelab-autoscaler oci://", **places), "--plain-http", "-f",
                    "my-values.yaml"], timeout=900)  # fmt: skip
        wait_until("the arm64 operator Pod Ready on the node", lambda: s.arm64_operator_ready(digest), within=600)
    pod = s.operator_pod()
    exec_ = ["-n", NS, "exec", pod, "-c", "homelab-autoscaler", "--"]
    machine = s.cluster.kubectl(*exec_, "uname", "-m").stdout.strip()
    version = s.cluster.kubectl(*exec_, "homelab-autoscaler", "--version").stdout.strip()
    node_arch = s.core().read_node(NODE_NAME).status.node_info.architecture
    print(
        f"\narm64: the operator Pod {pod} runs {repository}@{digest} on node {NODE_NAME} ({node_arch}): "
        f"`uname -m` says {machine}, `homelab-autoscaler --version` says {version}"
    )
    assert machine == "aarch64" and node_arch == "amd64"
    assert version == f"homelab-autoscaler {releases.current()}"
    calls = len(s.room.calls_of(SLOT, "on"))
    with s.phase("arm64: a machine off and booted again through the arm64 power image"):
        s.cluster.kubectl("-n", NS, "delete", "nodeclaim", CLAIM, "--wait=false")
        wait_until(f"claim {CLAIM} gone, its machine off", lambda: s.claim(CLAIM) is None, within=300)
        startup = {**power_spec(s, "on"), "image": power, "command": ["sh", "-c", ARM64_STARTUP]}
        s.cluster.kubectl("-n", NS, "patch", f"nodes.{names.GROUP}", SLOT, "--type=merge", "-p",
                          json.dumps({"spec": {"startupPodSpec": startup}}))  # fmt: skip
        s.cluster.kubectl("apply", "-f", "-", input=hand_claim(ARM64_CLAIM, SLOT))
        wait_until(f"claim {ARM64_CLAIM} ready", lambda: phase(s.claim(ARM64_CLAIM) or {}) == "ready", within=300)
    (job_pod,) = s.core().list_namespaced_pod(NS, label_selector=f"job-name={ARM64_CLAIM}-startup").items
    (status,) = job_pod.status.container_statuses
    log = s.cluster.kubectl("-n", NS, "logs", job_pod.metadata.name).stdout
    print(
        f"arm64: the startup Job Pod {job_pod.metadata.name} ran {job_pod.spec.containers[0].image} "
        f"(exit {status.state.terminated.exit_code}); it printed:\n{log.strip()}"
    )
    assert job_pod.spec.node_name == NODE_NAME and status.state.terminated.exit_code == 0
    assert "aarch64" in log and f"{SLOT} on" in log, log
    assert len(s.room.calls_of(SLOT, "on")) == calls + 1, s.room.calls
    assert node_ready(s, SLOT)


def test_zz_the_node_is_gone_and_nothing_of_the_run_is_left(stack: HelmPods) -> None:
    """Stopped: no network namespace, cgroup, process, mount or link naming the run's prefix or directory (what the
    node makes unnamed, shim sockets and the like, is left to test_pods.py's whole-inventory check: the machine is
    shared with other real-node runs). Then the phase times and the module's total."""
    s = stack
    s.stop()
    after = inventory.take(markers=(PREFIX,), cgroup_names=(s.node.layout.cgroup_root,))
    changes = inventory.diff(STATE["before"], after)
    ours = {kind: [i for i in added if PREFIX in i or str(s.dir) in i] for kind, (added, _) in changes.items()}
    print("\nphase times:\n" + "\n".join(f"  {k}: {v:.0f} s" for k, v in s.timings.items()))
    print(f"the module: {time.monotonic() - STATE['began']:.0f} s")
    print(f"ip netns list, before: {STATE['netns']}; after: {_netns()}")
    assert not any(ours.values()), f"the run left: {ours}"
    assert not [n for n in _netns() if n.startswith(PREFIX)]
