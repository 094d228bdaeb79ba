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

Here the machines are KWOK's: a Pod runs no container, so the chart's Pods are made Ready by KWOK on the always-on
control-plane node (the chart's placement values put them there) and the operator's roles run as the harness's
processes, as in the story. On issue 30's real node the same steps run with images from the local registry and the
chart's own Pods doing the boot (`HelmStack.host_operator = False`).
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from api import names
from tests import releases
from tests.procs import ROOT
from tests.realcluster import audit
from tests.realcluster.cluster import wait_until
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

CHART = ROOT / "charts" / "homelab-autoscaler"
INSTALL_DOC = ROOT / "docs" / "install.md"
RELEASE = "homelab-autoscaler"
HOMELAB = Homelab(groups=(GroupSpec("workers", 2),),
                  slots=(SlotSpec("machine-1", "workers"), SlotSpec("machine-2", "workers")))  # fmt: skip
CLAIM = "machine-1-by-hand"
SECOND = "machine-2-by-hand"
CRDS = [f"{p}.{names.GROUP}" for p in (names.PLURAL_GROUPS, names.PLURAL_NODES, names.PLURAL_NODECLAIMS)]
# Where the chart's Pods go here: the control-plane node, the one KWOK node that is always on and no machine.
PLACEMENT = {
    "nodeSelector": {CONTROL_PLANE_LABEL: ""},
    "tolerations": [{"key": CONTROL_PLANE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
}


def fenced_blocks() -> list[tuple[str, str]]:
    """docs/install.md's fenced blocks: (language, text), in order."""
    blocks: list[tuple[str, str]] = []
    language: str | None = None
    lines: list[str] = []
    for line in INSTALL_DOC.read_text().splitlines():
        if line.startswith("```"):
            if language is None:
                language, lines = line[3:].strip(), []
            else:
                blocks.append((language, "\n".join(lines) + "\n"))
                language = None
        elif language is not None:
            lines.append(line)
    return blocks


def documented(first_words: str, **placeholders: str) -> list[str]:
    """The first command of docs/install.md's `sh` blocks that starts with `first_words`, as a user types it (its
    continuation lines joined), split into arguments, with its placeholders (NAME) filled in."""
    for language, block in fenced_blocks():
        for command in block.replace("\\\n", " ").splitlines() if language == "sh" else []:
            command = command.split("  #", 1)[0].strip()
            if command.startswith(first_words):
                return [placeholders.get(arg, arg) for arg in shlex.split(command)]
    raise AssertionError(f"docs/install.md has no command starting with {first_words!r}")


def documented_refusal() -> tuple[list[str], str]:
    """docs/install.md's example of a bad value: the command (after `$ `) and what helm answers."""
    for language, block in fenced_blocks():
        first, _, answer = block.partition("\n")
        if not language and first.startswith("$ helm install"):
            return shlex.split(first.removeprefix("$ ")), answer
    raise AssertionError("docs/install.md shows no `$ helm install` refused")


@dataclass
class HelmStack(Stack):
    """The story's stack with the chart installed by `helm install` where the story applies deploy/."""

    homelab: Homelab = HOMELAB
    driver: str = "none"
    admission: bool = False
    host_operator: bool = True  # the operator's roles as the harness's processes (KWOK's Pods run nothing)
    images: tuple[str, str] = (f"ghcr.io/homecluster/homelab-autoscaler:{releases.current()}",
                               f"ghcr.io/homecluster/homelab-autoscaler:{releases.current()}-next")  # fmt: skip
    values: Path = field(init=False)
    chart: Path = CHART  # the chart the documented commands name (./charts/homelab-autoscaler): this release's
    log: list[str] = field(default_factory=list)
    refusal: str = ""  # the docs' answer to a bad value
    refused: subprocess.CompletedProcess[str] | None = None  # helm's
    stored_when_refused: str = ""  # the CRDs, ClusterRoles and namespaces after the refusal
    released_when_refused: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.values = self.dir / "my-values.yaml"
        self.write_values(self.images[0])

    def write_values(self, image: str) -> None:
        repository, _, tag = image.rpartition(":")
        self.values.write_text(yaml.safe_dump({
            "image": {"repository": repository, "tag": tag},
            "operator": PLACEMENT, "temporal": {"devServer": PLACEMENT},
        }))  # fmt: skip

    def run(self, argv: list[str], *, check: bool = True, timeout: float = 420) -> subprocess.CompletedProcess[str]:
        """A documented command: `helm` and `kubectl` are the built ones, the checkout is the working directory,
        `my-values.yaml` is the harness's values file, ./charts/homelab-autoscaler the release's chart."""
        tool = {"helm": self.cluster.bins / "helm", "kubectl": self.cluster.bins / "kubectl"}[argv[0]]
        here = "./charts/homelab-autoscaler"
        args = [str(tool)] + [
            str(self.values) if a == "my-values.yaml" else a.replace(here, str(self.chart), 1) for a in argv[1:]
        ]
        home = self.dir / "helm-home"
        env = {**os.environ, "KUBECONFIG": str(self.cluster.admin_kubeconfig), "HOME": str(home),
               "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
               "HELM_DATA_HOME": str(home / "data")}  # fmt: skip
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env, check=False)
        chart = f" (the chart: {self.chart.relative_to(self.dir)})" if self.chart != CHART else ""
        self.log.append(f"$ {shlex.join(argv)}  -> exit {done.returncode}{chart}")
        if check and done.returncode != 0:
            raise AssertionError(f"`{shlex.join(argv)}` failed ({done.returncode}):\n{done.stderr}{done.stdout}")
        return done

    def install(self) -> None:
        """The control-plane node and a volume for Temporal's claim (no provisioner here), then the chart as the
        docs install it, then the homelab a user describes."""
        self._control_plane_node()
        self.apply([{
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "temporal-data"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "hostPath": {"path": str(self.dir / "temporal-data")}},
        }])  # fmt: skip
        # The docs' bad value first: refused before anything is stored (no release, no CRD).
        command, self.refusal = documented_refusal()
        self.refused = self.run(command, check=False)
        self.stored_when_refused = self.run(["kubectl", "get", "crd,clusterrole,namespace", "-o", "name"]).stdout
        self.released_when_refused = self.run(["helm", "list", "-A", "-q"]).stdout
        self.run([*documented("helm install homelab-autoscaler ./charts/homelab-autoscaler"), "-f", "my-values.yaml"])
        wait_until(f"the serviceaccount controller to create {NS}/default",
                   lambda: k8s.CoreV1Api(self.cluster.admin).read_namespaced_service_account("default", NS),
                   within=60)  # fmt: skip
        self.apply(homelab_objects(self.homelab))

    def start_operator(self) -> None:
        if self.host_operator:
            super().start_operator()

    def stop_operator(self) -> None:
        for proc in self.roles.values():
            proc.stop()

    # --- reading the cluster ------------------------------------------------------------------------------------
    def exists(self, *what: str) -> bool:
        """Whether `kubectl get <what>` finds it (in the namespace unless cluster-scoped)."""
        done = self.cluster.kubectl("get", *what, "-n", NS, "-o", "name", check=False)
        if done.returncode != 0 and "NotFound" not in done.stderr:
            raise AssertionError(done.stderr)
        return done.returncode == 0

    def gone(self, *what: str) -> bool:
        return not self.exists(*what)

    def crd(self, name: str) -> dict[str, Any]:
        api: Any = k8s.ApiextensionsV1Api(self.cluster.admin)
        return dict(api.read_custom_resource_definition(name).to_dict())

    def claim(self, name: str) -> dict[str, Any] | None:
        api: Any = k8s.CustomObjectsApi(self.cluster.admin)
        try:
            return dict(api.get_namespaced_custom_object(names.GROUP, names.VERSION, NS, names.PLURAL_NODECLAIMS,
                                                         name))  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def jobs_created(self) -> list[str]:
        """The power Jobs the operator created so far, from the audit log (a finished Job's TTL deletes it)."""
        return [
            str((e.response or {}).get("metadata", {}).get("name") or e.name)
            for e in audit.read(self.cluster.audit_log)
            if e.user == audit.OPERATOR and e.verb == "create" and e.resource == "jobs" and e.code == 201
        ]

    def pod_images(self, selector: str) -> set[str]:
        """The images of the Pods `selector` finds, but those on their way out."""
        core: Any = k8s.CoreV1Api(self.cluster.admin)
        pods = core.list_namespaced_pod(NS, label_selector=selector).items
        return {str(c.image) for p in pods if p.metadata.deletion_timestamp is None for c in p.spec.containers}

    def volume_claim(self, name: str) -> Any:
        core: Any = k8s.CoreV1Api(self.cluster.admin)
        return core.read_namespaced_persistent_volume_claim(name, NS)


# The chart's objects (kind, name; cluster-scoped ones marked), which `helm uninstall` removes.
RELEASED = [
    ("serviceaccount", "homelab-autoscaler"), ("clusterrole", "homelab-autoscaler"),
    ("clusterrolebinding", "homelab-autoscaler"), ("role", "homelab-autoscaler-leader-election"),
    ("rolebinding", "homelab-autoscaler-leader-election"), ("service", "homelab-autoscaler-provider"),
    ("service", "homelab-autoscaler-metrics"), ("deployment", "homelab-autoscaler"), ("statefulset", "temporal"),
    ("service", "temporal-frontend"), ("service", "temporal-web"),
]  # fmt: skip


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Iterator[HelmStack]:
    with kept(request, "homelab-helm-real-", lambda d: HelmStack(d).start()) as s:
        assert isinstance(s, HelmStack)
        yield s
    print("\nthe documented commands run, in order:\n" + "\n".join(s.log))


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
    status = s.run(["helm", "status", RELEASE, "-n", NS, "-o", "json"])
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
    assert apps.read_namespaced_stateful_set("temporal", NS).status.ready_replicas == 1
    pvc = s.volume_claim("data-temporal-0")
    assert pvc.status.phase == "Bound" and pvc.spec.volume_name == "temporal-data"
    assert s.pod_images("app.kubernetes.io/name in (homelab-autoscaler, temporal)") == {s.images[0]}


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
    s.chart = _next_release(s)
    before = _columns(s)
    s.run(documented("helm upgrade homelab-autoscaler ./charts/homelab-autoscaler"))
    assert _columns(s) == before, "helm upgrade changed a CRD from crds/"
    apply = documented("kubectl apply --server-side --force-conflicts -f ./charts/homelab-autoscaler/crds/")
    without = s.run([a for a in apply if a != "--force-conflicts"], check=False)
    assert without.returncode != 0 and "conflict" in without.stderr.lower(), without.stderr
    assert _columns(s) == before
    s.run(apply)
    assert _columns(s) == [*before, "MaxSize"]


def test_4_helm_upgrade_to_the_next_image(stack: HelmStack) -> None:
    s = stack
    claim = s.claim(CLAIM)
    s.write_values(s.images[1])
    s.run(documented("helm upgrade homelab-autoscaler ./charts/homelab-autoscaler"))
    apps: Any = k8s.AppsV1Api(s.cluster.admin)
    for workload in (apps.read_namespaced_deployment("homelab-autoscaler", NS),
                     apps.read_namespaced_stateful_set("temporal", NS)):  # fmt: skip
        (c,) = workload.spec.template.spec.containers
        assert c.image == s.images[1], workload.metadata.name
    wait_until("the operator's and Temporal's Pods to run the next image only",
               lambda: s.pod_images("app.kubernetes.io/name in (homelab-autoscaler, temporal)") == {s.images[1]},
               within=120)  # fmt: skip
    history = yaml.safe_load(s.run(["helm", "history", RELEASE, "-n", NS, "-o", "json"]).stdout)
    assert [h["status"] for h in history] == ["superseded", "superseded", "deployed"]
    now = s.claim(CLAIM)
    assert now is not None and claim is not None and phase(now) == "ready"
    assert now["metadata"]["uid"] == claim["metadata"]["uid"]


def test_5_helm_uninstall_leaves_the_crds_the_claims_and_the_machines(stack: HelmStack) -> None:
    s = stack
    s.stop_operator()  # its Pods end with the release
    jobs = s.jobs_created()
    s.run(documented("helm uninstall homelab-autoscaler"))
    for kind, name in RELEASED:
        wait_until(f"{kind}/{name} to be deleted", functools.partial(s.gone, kind, name), within=60)
    for name in CRDS:
        s.crd(name)  # still there
    claim = s.claim(CLAIM)
    assert claim is not None and phase(claim) == "ready"
    assert names.FINALIZER_CLAIM in claim["metadata"]["finalizers"]
    assert s.exists("groups.infra.homecluster.dev", "workers") and s.exists("nodes.infra.homecluster.dev", "machine-1")
    assert s.exists("namespace", NS) and s.exists("persistentvolumeclaim", "data-temporal-0")
    assert s.node_ready("machine-1"), "uninstalling powered a machine off"
    assert s.jobs_created() == jobs, "uninstalling started a power Job"
    assert s.run(["helm", "list", "-n", NS, "-q"]).stdout.strip() == ""


def test_6_installed_again_over_what_stayed_the_operator_boots_and_leaves_its_claim_be(stack: HelmStack) -> None:
    s = stack
    jobs = s.jobs_created()
    install = [*documented("helm install homelab-autoscaler ./charts/homelab-autoscaler"), "-f", "my-values.yaml"]
    # Helm 4's install applies crds/ even over CRDs that exist: the older chart's would undo the newer CRDs that
    # kubectl applied, and that stops on kubectl's fields, before anything of the release is stored.
    next_chart, s.chart = s.chart, CHART
    older = s.run(install, check=False)
    assert older.returncode == 1 and 'conflict with "kubectl"' in older.stderr, older.stderr
    assert s.run(["helm", "list", "-n", NS, "-q"]).stdout.strip() == "" and _columns(s)[-1] == "MaxSize"
    s.chart = next_chart
    s.run(install)
    pvc = s.volume_claim("data-temporal-0")
    assert pvc.spec.volume_name == "temporal-data", "Temporal's StatefulSet found its kept volume claim"
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
    s.run(documented("helm uninstall homelab-autoscaler"))
    s.run([*documented("kubectl delete -f ./charts/homelab-autoscaler/crds/"), "--wait=false"])
    wait_until("the Group and slot CRDs to be deleted", lambda: not any(s.exists("crd", n) for n in CRDS[:2]),
               within=60)  # fmt: skip
    assert s.crd(CRDS[2])["metadata"]["deletion_timestamp"] is not None, "the NodeClaim CRD is Terminating"
    for name in (CLAIM, SECOND):
        claim = s.claim(name)
        assert claim is not None and names.FINALIZER_CLAIM in claim["metadata"]["finalizers"], name
        s.run(documented(f"kubectl -n {NS} patch nodeclaim NAME", NAME=name))
    wait_until("the NodeClaim CRD to be deleted", lambda: not s.exists("crd", CRDS[2]), within=60)
