"""The Helm chart on the real node (`make e2e-pods`): issue 30's part 7 with the chart's own Pods doing the work. The
images are the run's registry's, the Pods run in containerd on the real kubelet, the machine is a KWOK one switched
by the machine room that a power Job's container calls (tests/realcluster/podstack.py, as test_pods.py's story).
Each command is docs/install.md's, read from it (tests/realcluster/helm.py):

1. the guide's default StorageClass, then `helm install --create-namespace --wait` with the previous release's
   image: the operator's and Temporal's Pods Running and Ready on the real kubelet, their containers in containerd,
   `homelab-autoscaler --version` in them the previous release's, Temporal's volume claim bound by local-path;
2. one boot: a claim applied by hand is booted by the chart's operator Pod through a startup Job whose Pod runs
   busybox's `wget` to the machine room on the real node; the KWOK machine comes up and the claim ends ready;
3. `helm upgrade --wait` to this checkout's image: both Pods replaced and running it (its version), no restart, the
   new operator holds the watchers' Lease, Temporal kept the claim's workflow on its volume, and the booted claim is
   untouched: the same object, ready, no second startup Job, no second call to its BMC;
4. the operator's Pod started while Temporal's is down (what an install or a node's restart may do) waits for it,
   and runs without a restart once it is up (the real node found it exiting instead);
5. `helm uninstall`: the chart's objects and Pods gone from the node; the CRDs, the Group, the slot and the claim
   (ready, its finalizer), the namespace, `data-temporal-0` and the watchers' Lease left, the machine still on, as
   the guide says.

The previous release first, this checkout's next: that is the upgrade a Helm user makes (docs/upgrades.md), and the
chart at this checkout runs that image, because the container it renders (command, arguments, environment, ports,
probes, mounts) is the one v0.3.0's chart rendered (`git diff v0.3.0 -- charts/homelab-autoscaler/templates` changes
only where the Pods may run and their annotations): a difference there would fail step 1 and be found. Without a
previous release in the clone, this checkout's image is installed and the upgrade goes to the same image under
another tag (said when it runs).

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
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from api import names
from tests import releases
from tests.realcluster import inventory
from tests.realcluster.cluster import wait_until
from tests.realcluster.conftest import FAILED
from tests.realcluster.helm import CRDS, RELEASED, ChartReads, Helm, documented, install_command
from tests.realcluster.node import NODE_NAME
from tests.realcluster.podstack import PREVIOUS, PodStack, machine_room_service, powered
from tests.realcluster.stack import NS, GroupSpec, Homelab, SlotSpec, hand_claim, phase
from tests.realcluster.test_pods import node_ready

pytestmark = [pytest.mark.realpods, pytest.mark.timeout(900)]

PREFIX = "hlhelm-"
HOMELAB = Homelab(groups=(GroupSpec("workers", 1),), slots=(SlotSpec("machine-1", "workers"),))
CLAIM = "machine-1-by-hand"
SLOT = "machine-1"
BOOT_SECONDS = 3.0  # from the BMC's yes to the machine's kubelet
WATCH_LEASE = "homelab-autoscaler-watch"


@dataclass
class HelmPods(PodStack, ChartReads):
    """The real node with the chart installed by helm."""

    helm: Helm = field(init=False)
    chart_images: tuple[str, str] = ("", "")  # installed, upgraded to
    versions: tuple[str, str] = ("", "")  # what `homelab-autoscaler --version` says in each

    def start(self) -> HelmPods:
        super().start()
        self.helm = Helm(self.cluster.bins, self.cluster.admin_kubeconfig, self.dir / "helm")
        current, this = self.images["homelab-autoscaler"], f"homelab-autoscaler {releases.current()}"
        if PREVIOUS in self.images.refs:
            # Its version as its own pyproject.toml says (build_images exported its commit there).
            project = tomllib.loads((self.dir / "previous" / "pyproject.toml").read_text())["project"]
            self.chart_images = (self.images[PREVIOUS], current)
            self.versions = (f"homelab-autoscaler {project['version']}", this)
        else:
            # No previous release in this clone: the same image under a second tag, so the upgrade is a real rollout.
            second = f"{current}-next"
            self.builder.push(self.built["homelab-autoscaler"], second)
            self.chart_images, self.versions = (current, second), (this, this)
            print(f"\nno previous release's image: installing {current}, upgrading to the same image as {second}")
        return self

    # --- reading the node -------------------------------------------------------------------------------------------
    def core(self) -> Any:
        return k8s.CoreV1Api(self.cluster.admin)

    def running(self, pod: Any, image: str) -> str:
        """'' when every container of `pod` runs `image`, Ready, on the real node, as containerd's task; else what is
        not so."""
        if pod.spec.node_name != NODE_NAME or pod.status.phase != "Running":
            return f"{pod.metadata.name} is {pod.status.phase} on {pod.spec.node_name}"
        tasks = set(self.node.tasks())
        for c in pod.status.container_statuses or []:
            cid = str(c.container_id or "").removeprefix("containerd://")
            if not (c.ready and c.started and c.state.running) or cid not in tasks:
                return f"{pod.metadata.name}/{c.name}: ready={c.ready} started={c.started}, task {cid or '-'}"
            if c.image != image:
                return f"{pod.metadata.name}/{c.name} runs {c.image}, not {image}"
        return ""

    def chart_running(self, image: str) -> bool:
        """The operator's and Temporal's Pods (one each) all `running` `image`."""
        pods = self.chart_pods()
        kinds = sorted(p.metadata.labels["app.kubernetes.io/name"] for p in pods)
        return kinds == ["homelab-autoscaler", "temporal"] and not any(self.running(p, image) for p in pods)

    def version_in(self, what: str) -> str:
        """`homelab-autoscaler --version` in a container of the chart (`deployment/…` or a Pod's name)."""
        return self.cluster.kubectl("-n", NS, "exec", what, "--", "homelab-autoscaler", "--version").stdout.strip()

    def restarts(self) -> dict[str, int]:
        """Each of the chart's Pods' container restarts."""
        return {p.metadata.name: sum(c.restart_count for c in p.status.container_statuses or [])
                for p in self.chart_pods()}  # fmt: skip

    def lease_holder(self) -> str:
        lease: Any = k8s.CoordinationV1Api(self.cluster.admin).read_namespaced_lease(WATCH_LEASE, NS)
        return str(lease.spec.holder_identity or "")

    def operator_pod(self) -> str:
        (pod,) = [p.metadata.name for p in self.chart_pods()
                  if p.metadata.labels["app.kubernetes.io/name"] == "homelab-autoscaler"]  # fmt: skip
        return str(pod)


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
    s.helm.write_values(s.chart_images[0])
    with s.phase("helm install --wait"):
        s.helm.run(install_command())
    assert s.helm.history(NS) == ["deployed"]
    problems = [s.running(p, s.chart_images[0]) for p in s.chart_pods()]
    assert s.chart_running(s.chart_images[0]), problems or "no Pod of the chart"
    assert s.version_in("deployment/homelab-autoscaler") == s.versions[0]
    assert s.version_in("temporal-0") == s.versions[0], "Temporal runs the `temporal` CLI of the same image"
    pvc = s.volume_claim("data-temporal-0")
    assert pvc.status.phase == "Bound" and pvc.spec.storage_class_name == "local-path", pvc.status
    for name in CRDS:
        assert s.crd(name)["metadata"]["labels"]["app.kubernetes.io/part-of"] == "homelab-autoscaler"
    # The previous release's operator exits when Temporal does not answer yet, and the kubelet restarts it (fixed
    # since: it waits, test_worker_process.py); this checkout's image is held to no restart after the upgrade.
    STATE["restarts after install"] = s.restarts()
    print(f"\nrestarts after `helm install` of {s.versions[0]}: {STATE['restarts after install']}")
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


def test_3_helm_upgrade_to_the_next_image_leaves_the_booted_claim_be(stack: HelmPods) -> None:
    s = stack
    assert s.room is not None
    before, jobs, calls = s.claim(CLAIM), s.jobs_created(), list(s.room.calls)
    old_operator = s.operator_pod()
    s.helm.write_values(s.chart_images[1])
    upgraded_at = time.time()
    with s.phase("helm upgrade --wait"):
        s.helm.run(documented("helm upgrade homelab-autoscaler ./charts/homelab-autoscaler"))
        wait_until(f"the chart's Pods running {s.chart_images[1]} on the real node",
                   lambda: s.chart_running(s.chart_images[1]), within=120)  # fmt: skip
    assert s.helm.history(NS) == ["superseded", "deployed"]
    assert s.version_in("deployment/homelab-autoscaler") == s.versions[1]
    assert s.version_in("temporal-0") == s.versions[1]
    new_operator = s.operator_pod()
    assert new_operator != old_operator
    # Both Pods were replaced at once (Temporal's StatefulSet rolls while the operator's Deployment is recreated):
    # the new operator waited for the new Temporal instead of exiting.
    assert set(s.restarts().values()) == {0}, s.restarts()  # a failure prints the Pods' logs
    wait_until(f"the new operator Pod {new_operator} to hold the watchers' Lease",
               lambda: s.lease_holder() == new_operator, within=120)  # fmt: skip
    # Temporal's new Pod found the claim's workflow on the kept volume: started before the upgrade, still running.
    described = s.cluster.kubectl("-n", NS, "exec", "temporal-0", "--", "temporal", "workflow", "describe",
                                  "--workflow-id", f"nodeclaim/{NS}/{CLAIM}", "--address", "127.0.0.1:7233",
                                  "--output", "json").stdout  # fmt: skip
    info = json.loads(described)
    execution = info.get("workflowExecutionInfo") or info.get("execution_info") or info
    started = datetime.fromisoformat(str(execution.get("startTime")).replace("Z", "+00:00")).timestamp()
    assert started < upgraded_at, described[:400]
    assert "RUNNING" in str(execution.get("status")).upper(), described[:400]
    now = s.claim(CLAIM)
    assert before is not None and now is not None
    assert phase(now) == "ready" and now["metadata"]["uid"] == before["metadata"]["uid"]
    assert names.FINALIZER_CLAIM in now["metadata"]["finalizers"]
    assert s.jobs_created() == jobs, "the upgrade started a power Job"
    assert s.room.calls == calls, "the upgrade called a BMC"
    assert node_ready(s, SLOT)


def test_4_an_operator_pod_that_starts_before_temporal_waits_for_it(stack: HelmPods) -> None:
    """What every install and node restart does by chance, made certain: Temporal's StatefulSet scaled to 0, the
    operator's Pod deleted; the new one (this checkout's image) says it waits for Temporal; Temporal scaled back to
    the chart's one replica, the operator connects: no restart, the claim as it was."""
    s = stack
    assert s.room is not None
    jobs, calls = s.jobs_created(), list(s.room.calls)
    with s.phase("operator before Temporal"):
        s.cluster.kubectl("-n", NS, "scale", "statefulset/temporal", "--replicas=0")
        # Not waited out: the operator's Pod starts while temporal-0 may still be terminating, whose address then
        # answers a connect with nothing (one try hung for over a minute here before each try was bounded).
        wait_until("temporal-0 deleted", lambda: not any(p.metadata.name == "temporal-0" for p in s.chart_pods()),
                   within=120)  # fmt: skip
        old = s.operator_pod()
        s.cluster.kubectl("-n", NS, "delete", "pod", old, "--wait=false")

        def waiting() -> bool:
            pods = [p.metadata.name for p in s.chart_pods() if p.metadata.name != old]
            if not pods:
                return False
            done = s.cluster.kubectl("-n", NS, "logs", pods[0], check=False)
            return "does not answer yet" in done.stdout

        wait_until("the new operator Pod to say it waits for Temporal", waiting, within=60)
        s.cluster.kubectl("-n", NS, "scale", "statefulset/temporal", "--replicas=1")
        wait_until(f"the chart's Pods running {s.chart_images[1]} again", lambda: s.chart_running(s.chart_images[1]),
                   within=120)  # fmt: skip
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
    assert s.exists("namespace", NS) and s.exists("persistentvolumeclaim", "data-temporal-0")
    # The watchers' Lease stays too, as docs/install.md says: the operator's Pod stops after Helm has deleted the
    # Role that let it release the Lease (Helm waits for no Pod), so a reinstall leads after the Lease expires.
    assert s.exists("lease", WATCH_LEASE)
    assert node_ready(s, SLOT), "uninstalling powered the machine off"
    assert s.jobs_created() == jobs and s.room.calls == calls, "uninstalling started a power Job"
    assert s.helm.run(["helm", "list", "-n", NS, "-q"]).stdout.strip() == ""


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
