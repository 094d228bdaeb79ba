"""The Helm chart on the real kube-apiserver (`make e2e-real`), with the real `helm` (built from Go modules by
tests/realcluster/build.sh), each command typed as docs/install.md types it:

1. `helm install --create-namespace --wait`: the CRDs from crds/, the operator's RBAC, Deployment and Services, the
   Temporal StatefulSet (its volume claim bound) all stored and ready;
2. one boot through what the chart installed: a claim made by hand is booted by the operator, authenticated by the
   ServiceAccount token the chart's RBAC binds;
3. the next release's CRDs: `helm upgrade` leaves them as they are (Helm never upgrades crds/), the documented
   `kubectl apply --server-side --force-conflicts` upgrades them (and without `--force-conflicts` stops on Helm's
   fields, as the docs say);
4. `helm upgrade` to the next image: the operator's and Temporal's Pods run it, and the booted claim is untouched;
5. `helm uninstall`: the operator's objects gone; the CRDs, the Groups, slots and the claim (its phase and
   finalizer), the namespace, Temporal's volume claim and the machine's power left as they were;
6. installed again over what stayed, the operator takes its claim back without a second boot;
7. removing everything as the docs say: the CRDs deleted, the NodeClaim CRD held `Terminating` by the finalizer of
   a claim the operator did not end, until it is let go.

Here every node is KWOK's: a Pod runs no container, so the chart's Pods are made Ready by KWOK on the always-on
control-plane node (the chart's placement values put them there) and the operator's roles run as the harness's
processes, as in the story; the images are names no registry holds. What this tier cannot show, that the chart's own
Pods run (its images pulled, its probes, volumes, security context and RBAC on a real kubelet) and boot a machine, is
tests/realcluster/test_helm_pods.py's, on the real node of `make e2e-pods`: install, one boot, upgrade to the next
image, uninstall (steps 1, 2, 4 and 5 here); the CRD upgrade, the reinstall and the removal stay here.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from api import names
from tests import releases
from tests.realcluster.cluster import wait_until
from tests.realcluster.helm import (
    CHART,
    CRDS,
    RELEASE,
    RELEASED,
    ChartReads,
    Helm,
    documented,
    documented_refusal,
    install_command,
)
from tests.realcluster.stack import (
    CONTROL_PLANE_LABEL,
    NS,
    GroupSpec,
    Homelab,
    SlotSpec,
    Stack,
    hand_claim,
    homelab_objects,
    kept,
    phase,
)

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(600)]

HOMELAB = Homelab(groups=(GroupSpec("workers", 2),),
                  slots=(SlotSpec("machine-1", "workers"), SlotSpec("machine-2", "workers")))  # fmt: skip
CLAIM = "machine-1-by-hand"
SECOND = "machine-2-by-hand"
# Where the chart's Pods go here: the control-plane node, the one KWOK node that is always on and no machine.
PLACEMENT = {
    "nodeSelector": {CONTROL_PLANE_LABEL: ""},
    "tolerations": [{"key": CONTROL_PLANE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
}


@dataclass
class HelmStack(Stack, ChartReads):
    """The story's stack with the chart installed by `helm install` where the story applies deploy/."""

    homelab: Homelab = HOMELAB
    driver: str = "none"
    admission: bool = False
    images: tuple[str, str] = (f"ghcr.io/homecluster/homelab-autoscaler:{releases.current()}",
                               f"ghcr.io/homecluster/homelab-autoscaler:{releases.current()}-next")  # fmt: skip
    helm: Helm = field(init=False)
    refusal: str = ""  # the docs' answer to a bad value
    refused: subprocess.CompletedProcess[str] | None = None  # helm's
    stored_when_refused: str = ""  # the CRDs, ClusterRoles and namespaces after the refusal
    released_when_refused: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.helm = Helm(self.cluster.bins, self.cluster.admin_kubeconfig, self.dir,
                         more_values={"operator": PLACEMENT, "temporal": {"bundled": PLACEMENT}})  # fmt: skip
        self.helm.write_values(self.images[0])

    def install(self) -> None:
        """The control-plane node and a volume for Temporal's claim (no provisioner here), then the chart as the
        docs install it, then the homelab a user describes."""
        self._control_plane_node()
        self.apply([{
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "temporal-data"},
            "spec": {"capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"],
                     "hostPath": {"path": str(self.dir / "temporal-data")}},
        }])  # fmt: skip
        # The docs' bad value first: refused before anything is stored (no release, no CRD).
        command, self.refusal = documented_refusal()
        self.refused = self.helm.run(command, check=False)
        self.stored_when_refused = self.helm.run(["kubectl", "get", "crd,clusterrole,namespace", "-o", "name"]).stdout
        self.released_when_refused = self.helm.run(["helm", "list", "-A", "-q"]).stdout
        self.helm.run(install_command())
        wait_until(f"the serviceaccount controller to create {NS}/default",
                   lambda: k8s.CoreV1Api(self.cluster.admin).read_namespaced_service_account("default", NS),
                   within=60)  # fmt: skip
        self.apply(homelab_objects(self.homelab))

    def operator_images(self) -> set[str]:
        """The images the chart's Pods name, but the bundled Temporal's official ones (pinned apart)."""
        return {i for i in self.pod_images() if not i.startswith(("temporalio/", "postgres:"))}

    def stop_operator(self) -> None:
        for proc in self.roles.values():
            proc.stop()


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Iterator[HelmStack]:
    with kept(request, "homelab-helm-real-", lambda d: HelmStack(d).start()) as s:
        assert isinstance(s, HelmStack)
        yield s
    print("\nthe documented commands run, in order:\n" + "\n".join(s.helm.log))


def test_1_helm_install_stores_the_chart_and_waits_for_it_ready(stack: HelmStack) -> None:
    s = stack
    assert s.refused is not None and s.refused.returncode == 1, s.refused
    assert s.refused.stderr.rstrip() == s.refusal.rstrip(), "helm refused the docs' bad value otherwise"
    # Refused before any object of the chart: Helm installs crds/ first (docs/install.md says so), nothing more.
    stored = s.stored_when_refused.split()
    # The cluster's own CRDs (KWOK's Logs, which the story reads a failed boot's last words through) are not Helm's.
    ours = f".{names.GROUP}"
    assert sorted(n for n in stored if n.startswith("customresourcedefinition") and n.endswith(ours)) == sorted(
        f"customresourcedefinition.apiextensions.k8s.io/{n}" for n in CRDS
    )
    assert "clusterrole.rbac.authorization.k8s.io/homelab-autoscaler" not in stored
    assert f"namespace/{NS}" not in stored and s.released_when_refused.strip() == ""
    status = s.helm.run(["helm", "status", RELEASE, "-n", NS, "-o", "json"])
    assert yaml.safe_load(status.stdout)["info"]["status"] == "deployed"
    for name in CRDS:
        crd = s.crd(name)
        assert {c["type"]: c["status"] for c in crd["status"]["conditions"]}["Established"] == "True", name
        assert crd["metadata"]["labels"]["app.kubernetes.io/part-of"] == "homelab-autoscaler"
    for kind, name in RELEASED:
        assert s.exists(kind, name), f"{kind}/{name} was not installed"
    # Ready, as `--wait` promised: the Deployment available, Temporal's Pod ready on its bound volume claim.
    apps: Any = k8s.AppsV1Api(s.cluster.admin)
    assert apps.read_namespaced_deployment("homelab-autoscaler", NS).status.available_replicas == 1
    assert apps.read_namespaced_stateful_set("temporal-postgresql", NS).status.ready_replicas == 1
    assert apps.read_namespaced_deployment("temporal-server", NS).status.available_replicas == 1
    pvc = s.volume_claim("data-temporal-postgresql-0")
    assert pvc.status.phase == "Bound" and pvc.spec.volume_name == "temporal-data"
    assert s.operator_images() == {s.images[0]}


def test_2_one_boot_through_what_the_chart_installed(stack: HelmStack) -> None:
    s = stack
    s.cluster.kubectl("apply", "-f", "-", input=hand_claim(CLAIM, "machine-1"))
    wait_until(f"claim {CLAIM} ready", lambda: phase(s.claim(CLAIM) or {}) == "ready", within=180,
               procs=s.procs)  # fmt: skip
    assert s.node_ready("machine-1")
    (job,) = s.jobs_created()
    assert job.startswith(CLAIM), job


def _next_release(s: HelmStack) -> Path:
    """The chart as the next release ships it: here, one CRD changed (a printer column more), the rest as is."""
    chart = s.dir / "next" / "charts" / "homelab-autoscaler"
    shutil.copytree(CHART, chart)
    path = chart / "crds" / f"{names.PLURAL_GROUPS}.yaml"
    (crd,) = [d for d in yaml.safe_load_all(path.read_text()) if d]
    crd["spec"]["versions"][0]["additionalPrinterColumns"].append(
        {"name": "MaxSize", "type": "integer", "jsonPath": ".spec.maxSize", "description": "The next release's column"}
    )
    path.write_text(yaml.safe_dump(crd, sort_keys=False))
    return chart


def _columns(s: HelmStack) -> list[str]:
    crd = s.crd(CRDS[0])
    return [c["name"] for c in crd["spec"]["versions"][0]["additional_printer_columns"]]


def test_3_helm_never_upgrades_the_crds_and_the_documented_apply_does(stack: HelmStack) -> None:
    s = stack
    s.helm.chart = _next_release(s)
    before = _columns(s)
    s.helm.run(documented("helm upgrade homelab-autoscaler ./charts/homelab-autoscaler"))
    assert _columns(s) == before, "helm upgrade changed a CRD from crds/"
    apply = documented("kubectl apply --server-side --force-conflicts -f ./charts/homelab-autoscaler/crds/")
    without = s.helm.run([a for a in apply if a != "--force-conflicts"], check=False)
    assert without.returncode != 0 and "conflict" in without.stderr.lower(), without.stderr
    assert _columns(s) == before
    s.helm.run(apply)
    assert _columns(s) == [*before, "MaxSize"]


def test_4_helm_upgrade_to_the_next_image(stack: HelmStack) -> None:
    s = stack
    claim = s.claim(CLAIM)
    s.helm.write_values(s.images[1])
    s.helm.run(documented("helm upgrade homelab-autoscaler ./charts/homelab-autoscaler"))
    apps: Any = k8s.AppsV1Api(s.cluster.admin)
    (c,) = apps.read_namespaced_deployment("homelab-autoscaler", NS).spec.template.spec.containers
    assert c.image == s.images[1]
    wait_until("the operator's Pod to run the next image only",
               lambda: s.operator_images() == {s.images[1]},
               within=120)  # fmt: skip
    assert s.helm.history(NS) == ["superseded", "superseded", "deployed"]
    now = s.claim(CLAIM)
    assert now is not None and claim is not None and phase(now) == "ready"
    assert now["metadata"]["uid"] == claim["metadata"]["uid"]


def test_5_helm_uninstall_leaves_the_crds_the_claims_and_the_machines(stack: HelmStack) -> None:
    s = stack
    s.stop_operator()  # its Pods end with the release
    jobs = s.jobs_created()
    s.helm.run(documented("helm uninstall homelab-autoscaler"))
    for kind, name in RELEASED:
        wait_until(f"{kind}/{name} to be deleted", functools.partial(s.gone, kind, name), within=60)
    for name in CRDS:
        s.crd(name)  # still there
    claim = s.claim(CLAIM)
    assert claim is not None and phase(claim) == "ready"
    assert names.FINALIZER_CLAIM in claim["metadata"]["finalizers"]
    assert s.exists("groups.infra.homecluster.dev", "workers") and s.exists("nodes.infra.homecluster.dev", "machine-1")
    assert s.exists("namespace", NS) and s.exists("persistentvolumeclaim", "data-temporal-postgresql-0")
    assert s.node_ready("machine-1"), "uninstalling powered a machine off"
    assert s.jobs_created() == jobs, "uninstalling started a power Job"
    assert s.helm.run(["helm", "list", "-n", NS, "-q"]).stdout.strip() == ""


def test_6_installed_again_over_what_stayed_the_operator_boots_and_leaves_its_claim_be(stack: HelmStack) -> None:
    s = stack
    jobs = s.jobs_created()
    install = install_command()
    # Helm 4's install applies crds/ even over CRDs that exist: the older chart's would undo the newer CRDs that
    # kubectl applied, and that stops on kubectl's fields, before anything of the release is stored.
    next_chart, s.helm.chart = s.helm.chart, CHART
    older = s.helm.run(install, check=False)
    assert older.returncode == 1 and 'conflict with "kubectl"' in older.stderr, older.stderr
    assert s.helm.run(["helm", "list", "-n", NS, "-q"]).stdout.strip() == "" and _columns(s)[-1] == "MaxSize"
    s.helm.chart = next_chart
    s.helm.run(install)
    pvc = s.volume_claim("data-temporal-postgresql-0")
    assert pvc.spec.volume_name == "temporal-data", "PostgreSQL's StatefulSet found its kept volume claim"
    s.start_operator()  # a new token: the ServiceAccount is a new object
    s.cluster.kubectl("apply", "-f", "-", input=hand_claim(SECOND, "machine-2"))
    wait_until(f"claim {SECOND} ready", lambda: phase(s.claim(SECOND) or {}) == "ready", within=180,
               procs=s.procs)  # fmt: skip
    claim = s.claim(CLAIM)
    assert claim is not None and phase(claim) == "ready" and s.node_ready("machine-1")
    new = s.jobs_created()[len(jobs) :]
    assert len(new) == 1 and new[0].startswith(SECOND), f"one boot, machine-2's: {new}"


def test_7_removing_everything_as_the_docs_say(stack: HelmStack) -> None:
    """The operator gone before its claims ended: their finalizers hold the NodeClaim CRD until let go."""
    s = stack
    s.stop_operator()
    s.helm.run(documented("helm uninstall homelab-autoscaler"))
    s.helm.run([*documented("kubectl delete -f ./charts/homelab-autoscaler/crds/"), "--wait=false"])
    wait_until("the Group and slot CRDs to be deleted", lambda: not any(s.exists("crd", n) for n in CRDS[:2]),
               within=60)  # fmt: skip
    assert s.crd(CRDS[2])["metadata"]["deletion_timestamp"] is not None, "the NodeClaim CRD is Terminating"
    for name in (CLAIM, SECOND):
        claim = s.claim(name)
        assert claim is not None and names.FINALIZER_CLAIM in claim["metadata"]["finalizers"], name
        s.helm.run(documented(f"kubectl -n {NS} patch nodeclaim NAME", NAME=name))
    wait_until("the NodeClaim CRD to be deleted", lambda: not s.exists("crd", CRDS[2]), within=60)
