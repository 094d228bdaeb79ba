"""The whole story on a real control plane, driven by cluster-autoscaler (`make e2e-real`).

A real kube-apiserver (RBAC, structural schemas, audit), controller-manager (Job, TTL-after-finished, garbage
collector, node-lifecycle controllers), scheduler, etcd and KWOK kubelets, built from Go modules by
tests/realcluster/build.sh; Temporal's dev server; the operator's three roles as processes, each authenticated by
the ServiceAccount token deploy/rbac binds; and cluster-autoscaler calling the provider over gRPC: the real one
when it can be had (HOMELAB_CLUSTER_AUTOSCALER, or built into the cache), else the project's stand-in
(tests/realcluster/standin.py), which is said in the first line of the run.

The steps run in order on one stack (a step that fails leaves the next ones failing fast):
1. the two `workers` machines are on when the operator starts: it adopts them; the control-plane node belongs to
   no group;
2. nothing runs on them: cluster-autoscaler finds them unneeded, taints them and calls DeleteNodes; the shutdown
   Jobs (the real Job controller makes their Pods, the scheduler binds them) power them off, the Nodes go NotReady
   and are deleted, the claims complete, and the TTL controller and the garbage collector take the Jobs and Pods;
3. a workload Pod that fits no Node: the scheduler marks it Unschedulable, cluster-autoscaler scales `workers` up
   from zero on the template node, a startup Job boots a machine, its Node turns Ready, the readiness gate opens
   and the workload runs there;
4. a second Pod that needs a second machine, whose BMC does not answer: the startup Job fails with exit code 3,
   the claim fails, cluster-autoscaler reads the instance's error, backs `workers` off and scales `spares` up
   instead; the second Pod runs on the spare;
5. the workload goes: both machines are scaled down and powered off, every claim ends, and cluster-autoscaler's
   status ConfigMap agrees with the claims.
The admission webhook of deploy/components/admission is registered throughout (failurePolicy Fail): in step 3 a
person's second live claim on the busy slot is refused as applied, and after the story its answers show that
nothing else was sent to it.
After the story: the driver's calls to the provider, the RBAC audit (tests/realcluster/audit.py), the
emulator-versus-real diff (tests/realcluster/replay.py) and the webhook's answers print their tables; a 403 or a
difference fails the run.
"""

from __future__ import annotations

import functools
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from proto import externalgrpc_pb2 as pb
from proto import externalgrpc_pb2_grpc as pb_grpc
from tests.realcluster import audit, replay
from tests.realcluster.cluster import wait_until
from tests.realcluster.stack import (
    CONTROL_PLANE,
    DEPLOY,
    MACHINE_LABEL,
    NS,
    Stack,
    hand_claim,
    kept,
    phase,
    seed_refusal,
)

ROOT = DEPLOY.parent

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(900)]

WORKLOAD_NS = "default"
WORKLOAD = "needs-a-machine"
MANAGED = "app.kubernetes.io/managed-by=homelab-autoscaler"


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    began = time.monotonic()

    def make(directory: Path) -> Stack:
        # The machines of `workers` are on before the operator starts: an install must never power off a running lab.
        s = Stack(directory, driver=os.environ.get("HOMELAB_E2E_DRIVER", "auto")).start_with_machines_on("workers")
        print(f"\nreal cluster up in {time.monotonic() - began:.0f} s in {directory}; driven by {s.autoscaler_note}")
        return s

    with kept(request, "homelab-realcluster-", make) as s:
        yield s


# --- reading ----------------------------------------------------------------------------------------------------
def reason(claim: dict[str, Any]) -> str:
    return str((claim.get("status") or {}).get("reason") or "")


def claims_of(s: Stack, slot: str) -> list[dict[str, Any]]:
    return [c for c in s.claims() if c["spec"]["node"] == slot]


def adopted(s: Stack, slot: str) -> bool:
    return any(phase(c) == "ready" and reason(c) == "Adopted" for c in claims_of(s, slot))


def core(s: Stack) -> Any:
    return k8s.CoreV1Api(s.cluster.admin)


def live(s: Stack) -> list[dict[str, Any]]:
    return [c for c in s.claims() if phase(c) in ("", "pending", "booting", "ready")]


def summary(s: Stack) -> str:
    rows = [f"{c['metadata']['name']}={phase(c)}/{reason(c)}" for c in s.claims()]
    nodes = [n.metadata.name for n in core(s).list_node().items]
    return f"claims {rows}; nodes {nodes}"


def live_per_group(s: Stack) -> dict[str, int]:
    counts = {g.name: 0 for g in s.homelab.groups}
    for c in live(s):
        counts[c["spec"]["group"]] += 1
    return counts


def status_targets(s: Stack) -> dict[str, int]:
    """Each group's `cloudProviderTarget` in cluster-autoscaler's status ConfigMap."""
    doc = yaml.safe_load(s.autoscaler_status() or "{}") or {}
    return {g["name"]: int(g["health"]["cloudProviderTarget"]) for g in doc.get("nodeGroups") or []}


def power_pods(s: Stack) -> list[Any]:
    return list(core(s).list_namespaced_pod(NS, label_selector=MANAGED).items)


def power_jobs(s: Stack) -> list[Any]:
    batch: Any = k8s.BatchV1Api(s.cluster.admin)
    return list(batch.list_namespaced_job(NS, label_selector=MANAGED).items)


def workload_pods(s: Stack) -> list[Any]:
    return list(core(s).list_namespaced_pod(WORKLOAD_NS, label_selector=f"app={WORKLOAD}").items)


def unschedulable(pod: Any) -> bool:
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
               for c in pod.status.conditions or [])  # fmt: skip


def group_for_node(s: Stack, node: str, provider_id: str = "") -> str:
    with grpc.insecure_channel(f"127.0.0.1:{s.provider_port}") as ch:
        stub = pb_grpc.CloudProviderStub(ch)
        resp = stub.NodeGroupForNode(
            pb.NodeGroupForNodeRequest(node=pb.ExternalGrpcNode(name=node, providerID=provider_id)), timeout=5
        )
    return str(resp.nodeGroup.id)


def set_workload(s: Stack, replicas: int) -> None:
    """A Deployment whose Pods fit only a machine, one per machine (3 of a machine's 4 CPUs each)."""
    apps: Any = k8s.AppsV1Api(s.cluster.admin)
    body = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": WORKLOAD, "namespace": WORKLOAD_NS},
        "spec": {
            "replicas": replicas, "selector": {"matchLabels": {"app": WORKLOAD}},
            "template": {
                "metadata": {"labels": {"app": WORKLOAD}},
                "spec": {
                    "nodeSelector": {MACHINE_LABEL: "true"},
                    "containers": [{"name": "app", "image": "registry.homelab.test/app:1.0",
                                    "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}}],
                },
            },
        },
    }  # fmt: skip
    try:
        apps.create_namespaced_deployment(WORKLOAD_NS, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        apps.patch_namespaced_deployment_scale(WORKLOAD, WORKLOAD_NS, {"spec": {"replicas": replicas}})


# --- the story ----------------------------------------------------------------------------------------------------
def test_1_machines_on_at_install_are_adopted_and_the_control_plane_is_no_groups(stack: Stack) -> None:
    s = stack
    for slot in s.homelab.slots_of("workers"):
        wait_until(f"{slot.name}'s machine adopted (a claim ready, reason Adopted)",
                   functools.partial(adopted, s, slot.name), within=90)  # fmt: skip
    assert claims_of(s, "spare-1") == [], "a machine that is off gets no claim"
    assert group_for_node(s, CONTROL_PLANE) == "", "the control-plane node belongs to no group"
    assert group_for_node(s, "machine-1", "kwok://machine-1") == "workers"


def test_2_idle_machines_are_scaled_down_to_zero_and_their_jobs_collected(stack: Stack) -> None:
    s = stack
    wait_until("both adopted claims completed (scaled down, powered off)",
               lambda: not live(s) and all(phase(c) == "completed" for c in s.claims()), within=240,
               procs=s.procs)  # fmt: skip
    wait_until("the powered-off machines' Nodes deleted (powerOffNodePolicy Delete)",
               lambda: not [n for n in ("machine-1", "machine-2") if s.node(n)], within=60)  # fmt: skip
    shutdowns = [r for r in s.executor.records if r.operation == "shutdown" and r.outcome == "succeeded"]
    assert {r.slot for r in shutdowns} == {"machine-1", "machine-2"}, s.executor.records
    # ttlSecondsAfterFinished (30 s in the slots' pod specs) is the TTL controller's; the Pods go with their Job.
    wait_until("the TTL controller to delete the finished shutdown Jobs and the garbage collector their Pods",
               lambda: not power_jobs(s) and not power_pods(s), within=120)  # fmt: skip


def test_3_a_pending_workload_scales_a_group_up_from_zero(stack: Stack) -> None:
    s = stack
    set_workload(s, 1)
    wait_until("the scheduler to mark the workload Unschedulable",
               lambda: any(unschedulable(p) for p in workload_pods(s)), within=60)  # fmt: skip
    wait_until(f"a claim in workers to be ready ({summary(s)})",
               lambda: any(phase(c) == "ready" and c["spec"]["group"] == "workers" for c in live(s)),
               within=240, procs=s.procs)  # fmt: skip
    wait_until("the workload Pod Running on a machine of workers",
               lambda: any(p.status.phase == "Running" and (p.spec.node_name or "").startswith("machine-")
                           for p in workload_pods(s)), within=120)  # fmt: skip
    startups = [r for r in s.executor.records if r.operation == "startup"]
    assert len(startups) == 1 and startups[0].outcome == "succeeded", startups
    # The admission belt (deploy/components/admission): a person's second live claim on that machine's slot is
    # refused as it is applied, naming the slot and its claim; one on a free slot passes (a dry run: not stored).
    (owner,) = [c for c in live(s) if c["spec"]["group"] == "workers"]
    slot, name = owner["spec"]["node"], owner["metadata"]["name"]
    done = s.cluster.kubectl("apply", "-f", "-", input=hand_claim("by-hand", slot), check=False)
    assert done.returncode == 1, done.stdout
    assert done.stderr == (
        f'Error from server (Forbidden): error when creating "STDIN": {seed_refusal("by-hand", slot, name, "ready")}\n'
    )
    free = s.cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=hand_claim("by-hand", "spare-1"))
    assert "created (server dry run)" in free.stdout


def test_4_a_machine_that_never_boots_backs_its_group_off_and_another_group_serves(stack: Stack) -> None:
    s = stack
    busy = {c["spec"]["node"] for c in live(s)}
    (idle,) = [slot.name for slot in s.homelab.slots_of("workers") if slot.name not in busy]
    s.executor.fail(idle, "startup", exit_code=3, message="BMC at 10.0.0.9 did not answer (IPMI timeout)", times=5)
    set_workload(s, 2)
    wait_until(f"the claim on {idle} failed ({summary(s)})",
               lambda: any(phase(c) == "failed" for c in claims_of(s, idle)), within=240, procs=s.procs)  # fmt: skip
    wait_until(f"spares scaled up instead ({summary(s)})",
               lambda: any(phase(c) == "ready" for c in claims_of(s, "spare-1")), within=300,
               procs=s.procs)  # fmt: skip
    status = s.autoscaler_status()
    assert "startup-job-failed" in status, f"workers is backed off for its failed boot:\n{status}"
    wait_until("both workload Pods Running",
               lambda: sum(p.status.phase == "Running" for p in workload_pods(s)) == 2, within=120)  # fmt: skip
    # cluster-autoscaler's own record agrees with the claims: its per-group target is the group's live claims.
    wait_until(f"the status ConfigMap's targets to match the live claims ({summary(s)})",
               lambda: status_targets(s) == live_per_group(s), within=60)  # fmt: skip
    # Backed off after the first failure: the failing slot was not asked again while the spare served.
    failed = [c for c in claims_of(s, idle) if phase(c) == "failed"]
    assert [reason(c) for c in failed] == ["StartupJobFailed"], [c.get("status") for c in failed]


def test_5_the_workload_goes_and_every_machine_is_powered_off(stack: Stack) -> None:
    s = stack
    apps: Any = k8s.AppsV1Api(s.cluster.admin)
    apps.delete_namespaced_deployment(WORKLOAD, WORKLOAD_NS)
    wait_until(f"every claim ended and every machine powered off ({summary(s)})",
               lambda: not live(s) and not [n for n in ("machine-1", "machine-2", "spare-1") if s.node(n)],
               within=300, procs=s.procs)  # fmt: skip
    wait_until("cluster-autoscaler's status ConfigMap to show a target of 0 in every group",
               lambda: status_targets(s) == {"workers": 0, "spares": 0}, within=60)  # fmt: skip


# --- what the story measured ------------------------------------------------------------------------------------
def test_6_the_drivers_calls_to_the_provider(stack: Stack) -> None:
    """What the driver asked of the provider in the whole story: the stand-in's calls are compared with the real
    cluster-autoscaler's in docs/realcluster.md."""
    calls = stack.provider_calls()
    rows = ["| method | code | calls |", "|---|---|---|"]
    rows += [f"| {m} | {c} | {n} |" for (m, c), n in sorted(calls.items())]
    print(f"\n{stack.autoscaler_kind}'s calls to the provider during the story:\n" + "\n".join(rows))
    for method in ("Refresh", "NodeGroups", "NodeGroupForNode", "NodeGroupIncreaseSize", "NodeGroupDeleteNodes",
                   "NodeGroupTemplateNodeInfo", "NodeGroupNodes", "NodeGroupTargetSize"):  # fmt: skip
        assert any(m == method for m, _ in calls), f"the story never called {method}"
    assert not [k for k in calls if k[1] not in ("OK", "RESOURCE_EXHAUSTED", "UNIMPLEMENTED")], calls


# --- ---------------------------------------------------------------------------------
def test_7_rbac_from_deploy_was_enough_and_every_grant_is_accounted_for(stack: Stack) -> None:
    """RBAC on the real authorizer: the (verb, resource) pairs each identity used, beside what deploy/ grants."""
    events = list(audit.read(stack.cluster.audit_log))
    failures = []
    for title, user, files in (
        ("the operator", audit.OPERATOR, audit.OPERATOR_RBAC),
        (f"cluster-autoscaler ({stack.autoscaler_kind})", audit.AUTOSCALER, audit.AUTOSCALER_RBAC),
    ):
        rules = audit.rules_from(ROOT / f for f in files)
        used = audit.usage(events, user, rules)
        print(f"\nRBAC of {title}, used versus granted ({', '.join(files)}):\n{audit.table(used, rules)}")
        print(f"{len(used.forbidden)} requests refused (403); {len(used.unused)} grants never used")
        failures += [f"{title}: 403 on {e.verb} {e.uri}" for e in used.forbidden]
        failures += [f"{title}: {e.verb} {e.uri} allowed by no rule of deploy/" for e in used.ungranted]
    assert not failures, "\n".join(failures)


def test_8_the_emulator_answers_the_operators_requests_as_the_real_server_did(stack: Stack) -> None:
    """Every request of the operator during the story, replayed against the strict emulator (replay.py)."""
    events = [e for e in audit.read(stack.cluster.audit_log) if e.user == audit.OPERATOR]
    outcomes = replay.replay_all(events)
    table, differences = replay.report(outcomes)
    print(f"\nthe operator's {len(outcomes)} requests, replayed against the strict emulator:\n{table}")
    print(f"{len(differences)} distinct differences" + "".join(f"\n- {d}" for d in differences))
    assert differences == [], "the emulator answers differently from the real server (docs/realcluster.md)"


def test_9_the_admission_webhook_was_sent_only_the_hand_written_claims(stack: Stack) -> None:
    """The operator's every NodeClaim write passed through with the webhook registered (failurePolicy Fail): its
    user is never sent, so the webhook answered the person's two claims of step 3 and nothing else."""
    reviews = stack.admission_reviews()
    writes = [e for e in audit.read(stack.cluster.audit_log) if e.user == audit.OPERATOR
              and e.resource.startswith("nodeclaims") and e.verb in ("create", "patch", "delete")]  # fmt: skip
    codes = Counter(e.code for e in writes)
    print(f"\nthe admission webhook's answers during the story: {dict(sorted(reviews.items()))}; the operator's "
          f"{len(writes)} NodeClaim writes answered {dict(sorted(codes.items()))}")  # fmt: skip
    assert reviews == {"refused": 1, "allowed": 1}, reviews
    # a compare-and-set may meet 409 (a newer write landed); admission's refusal is 403, a failed call 500
    assert writes and not [e for e in writes if e.code == 403 or e.reason == "InternalError"], codes
