"""What a user applies, applied for real (`make e2e-real`): every kustomization in deploy/ goes to the real
kube-apiserver as a server-side apply with a server-side dry run (the server runs defaulting, the structural
schemas, the CEL rules and admission, and stores nothing: without a container runtime the Deployments could not run
anyway), and every example in deploy/examples is applied for real. The CRDs and the namespace are applied for real
first, as a user does.

cert-manager's kinds cannot be checked here: their CRDs are not available offline. They are listed as skipped, with
that reason, and tests/test_deploy.py checks the fields the manifests rely on.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from api import names
from api.v2alpha1 import Group, Node, NodeClaim
from tests.realcluster import crds
from tests.realcluster.cluster import Cluster
from tests.realcluster.stack import DEPLOY

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(600)]

# Every kustomization a user applies (tests/test_deploy.py renders the same list offline).
KUSTOMIZATIONS = (
    "crds", "rbac", "base", "overlays/homelab", "overlays/homelab-mtls", "overlays/split",
    "overlays/temporal-cluster", "overlays/external-postgresql", "cluster-autoscaler/plaintext",
    "cluster-autoscaler/mtls", "kind",
)  # fmt: skip
NOT_OFFLINE = {"cert-manager.io"}  # API groups whose CRDs cannot be installed here
# Not Kubernetes objects: the simulated homelab's own file format (`python -m homelab_sim --homelab`).
NOT_FOR_THE_API = {"homelab.yaml"}
MODELS: dict[str, type[Group] | type[Node] | type[NodeClaim]] = {"Group": Group, "Node": Node, "NodeClaim": NodeClaim}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    directory = Path(tempfile.mkdtemp(prefix="homelab-deploy-real-"))
    c = Cluster(directory).start()
    try:
        c.kubectl("apply", "--server-side", "-f", str(DEPLOY / "base" / "namespace.yaml"))
        c.kubectl("apply", "--server-side", "-k", str(DEPLOY / "crds"))
        crds.established(c, "groups.infra.homecluster.dev", "nodes.infra.homecluster.dev",
                         "nodeclaims.infra.homecluster.dev")  # fmt: skip
        yield c
    finally:
        c.stop()
        shutil.rmtree(directory, ignore_errors=True)


def missing(applied: Any, stored: Any, where: str) -> list[str]:
    """Where `stored` lacks or changed what `applied` wrote (the server may add defaults, never drop or alter)."""
    if isinstance(applied, dict):
        if not isinstance(stored, dict):
            return [where]
        return [m for k, v in applied.items() for m in missing(v, stored.get(k), f"{where}.{k}")]
    if isinstance(applied, list):
        if not isinstance(stored, list) or len(stored) != len(applied):
            return [where]
        return [m for i, v in enumerate(applied) for m in missing(v, stored[i], f"{where}[{i}]")]
    return [] if applied == stored else [where]


def _group(doc: dict[str, Any]) -> str:
    return str(doc.get("apiVersion", "")).rpartition("/")[0]


def test_every_kustomization_in_deploy_is_accepted_by_the_real_api_server(cluster: Cluster) -> None:
    rows = ["| kustomization | objects | accepted (server-side dry run) | skipped |", "|---|---|---|---|"]
    refused: list[str] = []
    for path in KUSTOMIZATIONS:
        rendered = cluster.kubectl("kustomize", str(DEPLOY / path)).stdout
        docs = [d for d in yaml.safe_load_all(rendered) if d]
        checkable = [d for d in docs if _group(d) not in NOT_OFFLINE]
        skipped = [f"{d['kind']}/{d['metadata']['name']}" for d in docs if _group(d) in NOT_OFFLINE]
        done = cluster.kubectl("apply", "--server-side", "--dry-run=server", "--force-conflicts", "-f", "-",
                               input=yaml.safe_dump_all(checkable), check=False)  # fmt: skip
        if done.returncode != 0:
            refused.append(f"deploy/{path}:\n{done.stderr.strip()}")
        accepted = len(checkable) if done.returncode == 0 else "refused"
        reason = f"{', '.join(skipped)} (cert-manager's CRDs are not available offline)" if skipped else ""
        rows.append(f"| deploy/{path} | {len(docs)} | {accepted} | {reason} |")
    print("\nwhat a user applies, judged by the real API server:\n" + "\n".join(rows))
    assert not refused, "\n".join(refused)


def test_every_example_is_applied_for_real(cluster: Cluster) -> None:
    files = sorted(p for p in (DEPLOY / "examples").rglob("*.yaml") if p.name not in NOT_FOR_THE_API)
    rows = ["| example | objects | applied |", "|---|---|---|"]
    refused: list[str] = []
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        done = cluster.kubectl("apply", "--server-side", "-f", str(path), check=False)
        if done.returncode != 0:
            refused.append(f"{path.relative_to(DEPLOY.parent)}:\n{done.stderr.strip()}")
        rows.append(
            f"| {path.relative_to(DEPLOY.parent)} | {len(docs)} | {'yes' if done.returncode == 0 else 'REFUSED'} |"
        )
    print("\nthe examples, applied to the real API server:\n" + "\n".join(rows))
    assert not refused, "\n".join(refused)
    # Read back, every field an example sets is stored as written (the server's schema pruned none of them), and
    # the operator's models parse what is stored.
    pruned: list[str] = []
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or _group(doc) != names.GROUP:
                continue
            meta = doc["metadata"]
            plural = {"Group": "groups", "Node": "nodes", "NodeClaim": "nodeclaims"}[doc["kind"]]
            got = cluster.kubectl("get", f"{plural}.{names.GROUP}", meta["name"], "-n", meta["namespace"],
                                  "-o", "json").stdout  # fmt: skip
            stored = json.loads(got)
            pruned += [f"{path.name}: {doc['kind']}/{meta['name']} {where}"
                       for where in missing(doc.get("spec"), stored.get("spec"), "spec")]  # fmt: skip
            MODELS[doc["kind"]].model_validate(stored)
    assert not pruned, f"fields the real server did not keep: {pruned}"
