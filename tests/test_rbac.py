"""Least privilege, proven: deploy/rbac grants exactly what the operator asks of the API server.

Two sources of truth, both from the emulated API server's request log (`emulator.requests`):

- a representative workload run here: real claim workflows through the real worker and activities (boot,
  readiness gate, scale-down with a verified shutdown, TTL collection), plus the adapter calls of the
  roles that run outside the worker (the watchers' lists and watches across namespaces, their report write
  and Node deletion, the Lease of leader election, the provider's listings, the admission webhook's list,
  a repeated Event). It must need every rule of deploy/rbac and nothing more;
- every other test of the session (recorded by tests/conftest.py into `RBAC_USAGE`, and by `make unit`'s other
  processes into HOMELAB_RBAC_USAGE): the last test here fails on any request deploy/rbac does not grant, naming
  the test that made it. The module runs in the serial part of `make unit`, after the parallel one (`serial`).

A namespaced request is granted by a Role or a ClusterRole; a request across all namespaces only by a
ClusterRole bound with a ClusterRoleBinding.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import pytest

from admission.server import Webhook
from api import names
from kube.adapter import CLAIMS, GROUPS, JOBS, KUBELET_NODES, SLOTS, ObjectRef
from tests.conftest import Use, session_rbac_usage, uses_of
from tests.drain_objects import pod
from tests.lab import NS, homelab, open_lab
from tests.test_deploy import needs_kubectl, render
from workflows.group.workflow import GroupWorkflow

pytestmark = pytest.mark.serial  # reads what the whole run requested: after the parallel part

MIN = 60.0
LEASE_NAMESPACE = "homelab-autoscaler-system"
SERVICE_ACCOUNT = ("homelab-autoscaler-system", "homelab-autoscaler")

# Grants no request in these tests can show, each with the reason it is needed anyway. Keep it tiny.
NOT_REQUESTED_BUT_NEEDED = {
    # The OwnerReferencesPermissionEnforcement admission plugin (OpenShift, hardened clusters) checks this
    # when a Job is created whose ownerReferences set blockOwnerDeletion on its claim or slot. It is an
    # authorization check by the API server, not a request, so no emulator can record it.
    ("infra.homecluster.dev", "nodeclaims/finalizers", "update"),
    ("infra.homecluster.dev", "nodes/finalizers", "update"),
}

# What the operator must never ask for: the power Jobs' pods mount Secrets and ConfigMaps themselves.
NEVER = {("", "secrets"), ("", "configmaps")}


@dataclass(frozen=True)
class Grant:
    group: str
    resource: str
    verb: str
    cluster_wide: bool  # from a ClusterRole bound cluster-wide; else only inside the Role's namespace


@functools.cache
def grants() -> frozenset[Grant]:
    """Every (group, resource, verb) deploy/rbac grants the operator's ServiceAccount."""
    docs = render("rbac")
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs
             if d["kind"] in ("Role", "ClusterRole")}  # fmt: skip
    out: set[Grant] = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(
            s["kind"] == "ServiceAccount" and (s.get("namespace"), s["name"]) == SERVICE_ACCOUNT
            for s in binding.get("subjects", [])
        ):
            continue
        ref = binding["roleRef"]
        ns = None if ref["kind"] == "ClusterRole" else binding["metadata"]["namespace"]
        role = roles[(ref["kind"], ns, ref["name"])]
        cluster_wide = binding["kind"] == "ClusterRoleBinding"
        for rule in role.get("rules", []):
            assert "resourceNames" not in rule, "a rule limited to names: teach this test to check names"
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert "*" not in (group, resource, verb), f"wildcard in {ref['name']}: least privilege"
                        out.add(Grant(group, resource, verb, cluster_wide))
    return frozenset(out)


def granted(use: Use) -> bool:
    return any(
        (g.group, g.resource, g.verb) == (use.group, use.resource, use.verb)
        and (g.cluster_wide or not use.cluster_wide)
        for g in grants()
    )


def table(uses: set[Use]) -> str:
    return "\n".join(
        f"  {u.group or 'core'} {u.resource} {u.verb}{' (all namespaces)' if u.cluster_wide else ''}"
        for u in sorted(uses)
    )


# --- the workload -------------------------------------------------------------------------------------------
async def _workload() -> set[Use]:
    async with open_lab(homelab([{"name": "s1"}])) as lab:
        # A claim's whole life through the real worker: boot (startup Job, readiness gate: taints, labels,
        # providerID), scale-down (cordon, shutdown Job, verified off), TTL collection (finalizer, delete).
        await lab.start_group()
        assert await lab.increase(1) == 1
        (claim,) = await lab.claim_names()
        await lab.wait_phase(claim, "ready", within=3 * MIN)
        # Why a lifecycle Job failed: the Job, then its Pods by its selector (the cause a failed boot carries).
        assert lab.kube.job_cause(NS, f"{claim}-startup").exit_code == 0
        # The drain before the power-off: the node's Pods listed and evicted (pods/eviction).
        node_name = (lab.node("s1") or {})["metadata"]["name"]
        lab.lab.call(lambda h: h.emulator.put_object("v1", "pods", pod("web-1", node_name, NS)))
        assert await lab.group().execute_update(GroupWorkflow.delete_nodes, ["s1"]) == 0
        await lab.wait_phase(claim, "completed", within=5 * MIN, step=10)
        assert lab.pod("web-1") is None, "evicted before the power-off"
        await lab.advance(50 * MIN)
        await lab.until(lambda: lab.claim_resource(claim) is None, within=15 * MIN, step=60, what="collected")

        kube = lab.kube
        # The watchers of the namespaces the operator manages: a list, then a watch from its resourceVersion.
        for res in (GROUPS, SLOTS, CLAIMS, KUBELET_NODES, JOBS):
            ns = NS if res.namespaced else None
            _items, rv = kube.list_raw(res, ns)
            stream = kube.open_watch(res, ns, None, rv, timeout_seconds=1)
            stream.close()
        # The report writer: Node.status, Group.status, and the kubelet Node of a machine verified off
        # (powerOffNodePolicy Delete).
        kube.patch_slot_status(NS, "s1", {"powerState": "off"})
        kube.patch_group_status(NS, "g", {"slots": 1, "on": 0, "off": 1})
        assert kube.delete_node("s1")
        # Leader election of the `watch` role: read, create, renew with compare-and-set.
        assert kube.get_lease(LEASE_NAMESPACE, "homelab-autoscaler-watch") is None
        lease = kube.create_lease(LEASE_NAMESPACE, "homelab-autoscaler-watch", {"holderIdentity": "a"})
        assert lease is not None
        kube.patch_lease(
            LEASE_NAMESPACE, "homelab-autoscaler-watch", {"holderIdentity": "a"}, lease["metadata"]["resourceVersion"]
        )
        # The provider's catalog: the Groups and slots of the namespaces it serves.
        kube.list_raw(GROUPS, NS)
        kube.list_raw(SLOTS, NS)
        # The admission webhook: the namespace's claims, listed for a write that would make a claim live.
        Webhook(kube).claims(NS, 5.0)
        # A blocked drain names its budget (list); a forced one deletes the Pod and takes its annotation off the slot.
        kube.budgets(NS)
        lab.lab.call(lambda h: h.emulator.put_object("v1", "pods", pod("web-2", "s1", NS)))
        assert kube.delete_pod(NS, "web-2")
        kube.patch_raw(SLOTS, NS, "s1", {"metadata": {"annotations": {names.ANNOTATION_FORCE_DRAIN: None}}})
        # A repeated Event: found by name, its count bumped.
        ref = ObjectRef(names.KIND_NODE, NS, "s1")
        kube.create_event(ref, "MachineReleased", "again")
        kube.create_event(ref, "MachineReleased", "again")
        return uses_of(list(lab.lab.emulator.requests))


@pytest.fixture(scope="module")
def workload() -> set[Use]:
    import asyncio

    return asyncio.run(_workload())


@needs_kubectl
def test_deploy_rbac_grants_the_workload(workload: set[Use]) -> None:
    missing = {u for u in workload if not granted(u)}
    assert not missing, f"deploy/rbac does not grant:\n{table(missing)}"


@needs_kubectl
def test_every_rule_of_deploy_rbac_is_used(workload: set[Use]) -> None:
    used = {(u.group, u.resource, u.verb) for u in workload} | {
        (u.group, u.resource, u.verb) for u in session_rbac_usage()
    }
    unused = sorted(
        (g.group or "core", g.resource, g.verb)
        for g in grants()
        if (g.group, g.resource, g.verb) not in used and (g.group, g.resource, g.verb) not in NOT_REQUESTED_BUT_NEEDED
    )
    assert not unused, "deploy/rbac grants what no request needed (remove it, or justify it):\n" + "\n".join(
        f"  {g} {r} {v}" for g, r, v in unused
    )
    stale = {n for n in NOT_REQUESTED_BUT_NEEDED if not any((g.group, g.resource, g.verb) == n for g in grants())}
    assert not stale, f"allow-listed but not granted: {stale}"


@needs_kubectl
def test_cluster_wide_grants_are_only_what_spans_namespaces(workload: set[Use]) -> None:
    """Leases live in the operator's namespace, the power Jobs (and their Pods) in the namespaces it manages: Roles,
    never a ClusterRole (a Job grant across all namespaces runs any image as any ServiceAccount anywhere)."""
    for resource in ("leases", "jobs"):
        granted_here = {g for g in grants() if g.resource == resource}
        assert granted_here and not any(g.cluster_wide for g in granted_here), resource
    # The drain before a power-off reads and (forced) deletes a node's Pods, which span every namespace: only those.
    pods = {g.verb for g in grants() if g.resource == "pods" and g.cluster_wide}
    assert pods <= {"list", "delete"}, pods


def test_secrets_and_configmaps_are_never_requested(workload: set[Use]) -> None:
    asked = {u for u in workload | set(session_rbac_usage()) if (u.group, u.resource.split("/")[0]) in NEVER}
    assert not asked, f"the operator asked for:\n{table(asked)}"


@needs_kubectl
def test_deploy_rbac_never_grants_secrets() -> None:
    assert not {g for g in grants() if (g.group, g.resource.split("/")[0]) in NEVER}


@pytest.mark.rbac_session
@needs_kubectl
def test_every_request_of_the_whole_suite_is_granted() -> None:
    """Runs last (tests/conftest.py orders it): every request any test's operator code made is granted."""
    usage = session_rbac_usage()
    missing = {u: where for u, where in usage.items() if not granted(u)}
    assert not missing, "deploy/rbac does not grant what these tests' operator code requested:\n" + "\n".join(
        f"{table({u})}   (first in {where})" for u, where in sorted(missing.items())
    )
    never = {u for u in usage if (u.group, u.resource.split("/")[0]) in NEVER}
    assert not never, f"Secrets or ConfigMaps requested:\n{table(never)}"


def rbac_table() -> list[dict[str, Any]]:
    """For docs and reports: every grant with its scope."""
    return [g.__dict__ for g in sorted(grants(), key=lambda g: (g.group, g.resource, g.verb))]
