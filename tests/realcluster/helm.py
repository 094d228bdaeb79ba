"""The Helm chart driven as docs/install.md drives it, for both tiers that install it: the real API server with KWOK
nodes (tests/realcluster/test_helm_real.py, `make e2e-real`) and the real node (tests/realcluster/test_helm_pods.py,
`make e2e-pods`). The commands are read from the guide, not written again here: `documented()` finds one by its
first words; `Helm.run` runs it with the built `helm`/`kubectl`, a values file of the run's own and a helm home
under the run (never the user's)."""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from api import names
from tests.procs import ROOT
from tests.realcluster import audit
from tests.realcluster.cluster import Cluster
from tests.realcluster.stack import NS

CHART = ROOT / "charts" / "homelab-autoscaler"
INSTALL_DOC = ROOT / "docs" / "install.md"
RELEASE = "homelab-autoscaler"
CRDS = [f"{p}.{names.GROUP}" for p in (names.PLURAL_GROUPS, names.PLURAL_NODES, names.PLURAL_NODECLAIMS)]
# The chart's objects with its default values (kind, name), which `helm uninstall` removes.
RELEASED = [
    ("serviceaccount", "homelab-autoscaler"), ("clusterrole", "homelab-autoscaler"),
    ("clusterrolebinding", "homelab-autoscaler"), ("role", "homelab-autoscaler-leader-election"),
    ("rolebinding", "homelab-autoscaler-leader-election"), ("service", "homelab-autoscaler-provider"),
    ("service", "homelab-autoscaler-metrics"), ("deployment", "homelab-autoscaler"),
    ("role", "homelab-autoscaler-temporal-setup"), ("rolebinding", "homelab-autoscaler-temporal-setup"),
    ("statefulset", "temporal-postgresql"), ("service", "temporal-postgresql"),
    ("service", "temporal-postgresql-headless"), ("configmap", "temporal-config"),
    ("deployment", "temporal-server"), ("service", "temporal-frontend"), ("deployment", "temporal-web"),
    ("networkpolicy", "homelab-autoscaler"), ("networkpolicy", "homelab-autoscaler-certs"),
    ("networkpolicy", "homelab-autoscaler-to-temporal"), ("networkpolicy", "temporal-server"),
    ("networkpolicy", "temporal-server-to-postgresql"), ("networkpolicy", "temporal-postgresql"),
    ("networkpolicy", "temporal-web"),
    ("service", "temporal-web"),
]  # fmt: skip
# The chart's Pods: the operator's and the bundled Temporal's.
CHART_PODS = "app.kubernetes.io/name in (homelab-autoscaler, temporal),app.kubernetes.io/component!=certs"


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


def documented(first_words: str, *, containing: str = "", **placeholders: str) -> list[str]:
    """The first command of docs/install.md's `sh` blocks that starts with `first_words` (and has `containing` among
    its arguments), as a user types it (its continuation lines joined), split into arguments, with its placeholders
    (NAME, or within an argument as in `oci://REGISTRY/charts`) filled in."""
    for language, block in fenced_blocks():
        for command in block.replace("\\\n", " ").splitlines() if language == "sh" else []:
            command = command.split("  #", 1)[0].strip()
            if command.startswith(first_words) and (not containing or containing in shlex.split(command)):
                return [_filled(arg, placeholders) for arg in shlex.split(command)]
    more = f" with {containing!r}" if containing else ""
    raise AssertionError(f"docs/install.md has no command starting with {first_words!r}{more}")


def _filled(arg: str, placeholders: dict[str, str]) -> str:
    for name, value in placeholders.items():
        arg = arg.replace(name, value)
    return arg


def documented_refusal() -> tuple[list[str], str]:
    """docs/install.md's example of a bad value: the command (after `$ `) and what helm answers."""
    for language, block in fenced_blocks():
        first, _, answer = block.partition("\n")
        if not language and first.startswith("$ helm install"):
            return shlex.split(first.removeprefix("$ ")), answer
    raise AssertionError("docs/install.md shows no `$ helm install` refused")


def install_command() -> list[str]:
    """The guide's `helm install` with a values file (`my-values.yaml`, which `Helm.run` makes the run's)."""
    return [*documented("helm install homelab-autoscaler ./charts/homelab-autoscaler"), "-f", "my-values.yaml"]


@dataclass
class Helm:
    """The built `helm` and `kubectl` on one cluster, as a user at the checkout's root types them."""

    bins: Path  # helm and kubectl
    kubeconfig: Path
    dir: Path  # the values file and helm's home
    chart: Path = CHART  # the chart the documented commands name (./charts/homelab-autoscaler): this release's
    more_values: dict[str, Any] = field(default_factory=dict)  # written beside the image every time
    log: list[str] = field(default_factory=list)
    values: Path = field(init=False)

    def __post_init__(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.values = self.dir / "my-values.yaml"

    def write_values(self, image: str, digest: str = "") -> None:
        """The values file: the image (`repository:tag`, pinned to `digest` when given) and `more_values`."""
        repository, _, tag = image.rpartition(":")
        pinned = {"digest": digest} if digest else {}
        self.values.write_text(yaml.safe_dump({"image": {"repository": repository, "tag": tag, **pinned},
                                               **self.more_values}))  # fmt: skip

    def run(self, argv: list[str], *, check: bool = True, timeout: float = 420) -> subprocess.CompletedProcess[str]:
        """A documented command: `helm` and `kubectl` are the built ones, the checkout is the working directory,
        `my-values.yaml` is the run's values file, ./charts/homelab-autoscaler is `chart`."""
        tool = {"helm": self.bins / "helm", "kubectl": self.bins / "kubectl"}[argv[0]]
        here = "./charts/homelab-autoscaler"
        args = [str(tool)] + [self._local(a).replace(here, str(self.chart), 1) for a in argv[1:]]
        home = self.dir / "helm-home"
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(home),
               "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
               "HELM_DATA_HOME": str(home / "data")}  # fmt: skip
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env, check=False)
        chart = f" (the chart: {self.chart.relative_to(self.dir)})" if self.chart != CHART else ""
        self.log.append(f"$ {shlex.join(argv)}  -> exit {done.returncode}{chart}")
        if check and done.returncode != 0:
            raise AssertionError(f"`{shlex.join(argv)}` failed ({done.returncode}):\n{done.stderr}{done.stdout}")
        return done

    def _local(self, arg: str) -> str:
        """The run's own path for a file the guide names relative to the checkout: the values file, and `dist/`
        (where the guide packages the chart) under the run; `charts/homelab-autoscaler` is `chart`."""
        if arg == "my-values.yaml":
            return str(self.values)
        if arg == "dist" or arg.startswith("dist/"):
            return str(self.dir / arg)
        if arg == "charts/homelab-autoscaler":
            return str(self.chart)
        return arg

    def history(self, namespace: str) -> list[str]:
        """The release's revisions' statuses, oldest first."""
        done = self.run(["helm", "history", RELEASE, "-n", namespace, "-o", "json"])
        return [str(h["status"]) for h in yaml.safe_load(done.stdout)]


class ChartReads:
    """What a test of the chart reads back from the cluster (`self.cluster`: the stack's), in the guide's namespace."""

    cluster: Cluster

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

    def chart_pods(self) -> list[Any]:
        """The operator's and Temporal's Pods, but those on their way out."""
        core: Any = k8s.CoreV1Api(self.cluster.admin)
        pods = core.list_namespaced_pod(NS, label_selector=CHART_PODS).items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def pod_images(self) -> set[str]:
        """The images the chart's Pods name."""
        return {str(c.image) for p in self.chart_pods() for c in p.spec.containers}

    def volume_claim(self, name: str) -> Any:
        core: Any = k8s.CoreV1Api(self.cluster.admin)
        return core.read_namespaced_persistent_volume_claim(name, NS)
