"""The whole story on a real control plane, driven by cluster-autoscaler (`make e2e-real`).

A real kube-apiserver (RBAC, structural schemas, audit), controller-manager (Job, TTL-after-finished, garbage
collector, node-lifecycle controllers), scheduler, etcd and KWOK kubelets, built from Go modules by
tests/realcluster/build.sh; Temporal's dev server; the operator's three roles as processes, each authenticated by
the ServiceAccount token deploy/rbac binds; and cluster-autoscaler calling the provider over gRPC: the real one
(HOMELAB_CLUSTER_AUTOSCALER, or built by build.sh from the module proxy or its source tarball), started with the
flags and cloud-config deploy/cluster-autoscaler gives it (tests/realcluster/deployed.py says what the harness
changes out of cluster, and why); else the project's stand-in (tests/realcluster/standin.py). The first line of the
story names the driver; with HOMELAB_E2E_DRIVER=ca (CI) a run that cannot have the real one fails.

The steps run in order on one stack (a step that fails leaves the next ones failing fast):
1. the two `workers` machines are on when the operator starts: it adopts them; the control-plane node belongs to
   no group;
2. nothing runs on them: cluster-autoscaler finds them unneeded, taints them and calls DeleteNodes; the shutdown
   Jobs (the real Job controller makes their Pods, the scheduler binds them) power them off, the Nodes go NotReady
   and are deleted, the claims complete, and the TTL controller and the garbage collector take the Jobs and Pods;
3. over mTLS (the real driver: the user moves to deploy/overlays/homelab-mtls and deploy/cluster-autoscaler/mtls,
   with the certificates cert-manager would issue; the provider refuses plaintext from then on): a workload Pod
   that fits no Node: the scheduler marks it Unschedulable, cluster-autoscaler scales `workers` up from zero on
   the template node, a startup Job boots a machine, its Node turns Ready, the readiness gate opens and the
   workload runs there;
4. a second Pod that needs a second machine, whose BMC does not answer: the startup Job's container prints its last
   words and exits 3, the claim fails (its message and ClaimFailed Event carry the words, Ready=False the reason,
   `kubectl logs job/…` prints them, no workflow history holds them), cluster-autoscaler reads the instance's
   error, backs `workers` off and scales `spares` up instead; the second Pod runs on the spare;
5. the workload goes: both machines are scaled down and powered off, every claim ends, and cluster-autoscaler's
   status ConfigMap agrees with the claims.
After each step the claims are printed beside cluster-autoscaler's status ConfigMap (as `kubectl describe` shows
it) and its Events; with the real driver the steps also wait for the Events a user reads (ScaleDownEmpty,
TriggeredScaleUp, ScaledUpGroup, ScaleUpFailed).
The admission webhook of deploy/components/admission is registered throughout (failurePolicy Fail): in step 3 a
person's second live claim on the busy slot is refused as applied, and after the story its answers show that
nothing else was sent to it.
After the story: the driver's calls to the provider, the RBAC audit (tests/realcluster/audit.py), the
emulator-versus-real diff (tests/realcluster/replay.py) and the webhook's answers print their tables; a 403 or a
difference fails the run.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from temporalio.client import Client

from proto import externalgrpc_pb2 as pb
from proto import externalgrpc_pb2_grpc as pb_grpc
from tests.lab import history_text
from tests.realcluster import audit, replay
from tests.realcluster.cluster import Proc, wait_until
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


STORY_BUDGET = 300  # seconds: the story with the real driver, the stack's start included (issue 29)


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    began = time.monotonic()

    def make(directory: Path) -> Stack:
        s = Stack(directory, driver=os.environ.get("HOMELAB_E2E_DRIVER", "auto"))
        print(f"\nthe story is driven by {s.choose_driver()[1]}")  # its first line; fails here if CI's is missing
        # The machines of `workers` are on before the operator starts: an install must never power off a running lab.
        s.start_with_machines_on("workers")
        print(f"real cluster up in {time.monotonic() - began:.0f} s in {directory}")
        return s

    with kept(request, "homelab-realcluster-", make) as s:
        yield s
        took = time.monotonic() - began
        print(f"\nthe story took {took:.0f} s with {s.autoscaler_kind}, its start included (budget {STORY_BUDGET} s"
              f"{'' if took <= STORY_BUDGET else ': OVER'})")  # fmt: skip


@pytest.fixture(scope="module")
def events_seen() -> set[str]:
    return set()


@pytest.fixture(autouse=True)
def step_report(request: pytest.FixtureRequest, stack: Stack, events_seen: set[str]) -> Iterator[None]:
    """After each step of the story, what a user would look at beside the claims: cluster-autoscaler's status
    ConfigMap as `kubectl describe configmap cluster-autoscaler-status` shows it (its Events included), and the
    Events cluster-autoscaler wrote elsewhere since the last step (on Pods and Nodes)."""
    yield
    if request.node.name.startswith(("test_1_", "test_2_", "test_3_", "test_4_", "test_5_")):
        print(f"\n--- after {request.node.name} ---\n{step_summary(stack, events_seen)}")


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


def step_summary(s: Stack, seen: set[str]) -> str:
    """The claims, cluster-autoscaler's status ConfigMap (described, as a user reads it) and its new Events."""
    rows = ["| claim | slot | group | phase | reason |", "|---|---|---|---|---|"]
    rows += [f"| {c['metadata']['name']} | {c['spec']['node']} | {c['spec']['group']} | {phase(c)} | {reason(c)} |"
             for c in s.claims()]  # fmt: skip
    described = s.cluster.kubectl("describe", "configmap", "cluster-autoscaler-status", "-n", NS, check=False)
    fresh = [e for e in s.autoscaler_events() if e.metadata.uid not in seen]
    seen.update(e.metadata.uid for e in fresh)
    events = [f"{e.type} {e.reason} {e.involved_object.kind}/{e.involved_object.name}: {e.message} (x{e.count or 1})"
              for e in fresh if e.involved_object.kind != "ConfigMap"]  # fmt: skip
    return (
        "\n".join(rows)
        + f"\n\n$ kubectl describe configmap cluster-autoscaler-status -n {NS}\n"
        + (described.stdout or described.stderr)
        + f"\n{s.autoscaler_kind}'s Events on other objects since the last step:\n"
        + ("\n".join(events) or "(none)")
    )


def expect_event(s: Stack, reason: str, *words: str, on: str = "ConfigMap/cluster-autoscaler-status",
                 within: float = 30) -> None:  # fmt: skip
    """cluster-autoscaler's own Event of `reason` on the object `on` (Kind/name) whose message has all `words`. The
    real driver writes Events, the stand-in none (it is not asked). cluster-autoscaler sends at most one Event per
    reason and object every 5 minutes when its status ConfigMap is not in kube-system (docs/realcluster.md), so each
    check is of the first Event of its reason on its object in the story."""
    if s.autoscaler_kind != "cluster-autoscaler":
        return
    kind, _, name = on.partition("/")
    wait_until(f"cluster-autoscaler's {reason} Event on {on} naming {', '.join(words) or 'anything'}",
               lambda: [e for e in s.autoscaler_events() if e.reason == reason and e.involved_object.kind == kind
                        and e.involved_object.name == name and all(w in (e.message or "") for w in words)],
               within=within)  # fmt: skip


def summary(s: Stack) -> str:
    rows = [f"{c['metadata']['name']}={phase(c)}/{reason(c)}" for c in s.claims()]
    nodes = [n.metadata.name for n in core(s).list_node().items]
    return f"claims {rows}; nodes {nodes}"


def wait(s: Stack, what: str, check: Callable[[], Any], *, within: float, procs: list[Proc] | None = None) -> Any:
    """`wait_until` a claim's move: it fails at once when a machine's kubelet (or one of `procs`) exits unasked, and
    says how the claims and nodes stand when it gives up, not how they stood when it began."""
    return s.cluster.wait(what, check, within=within, procs=procs, now=lambda: summary(s))


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


# --- a failed boot's last words -------------------------------------------------------------------------------
LAST_WORDS = "BMC at 10.0.0.9 did not answer (IPMI timeout)"
WORDS_MARK = "; its Pod said: "  # how the claim's message and its ClaimFailed Event add the Pod's words


def first_words(slot: str) -> str:
    return f"asking the BMC at 10.0.0.9 to power {slot} on"


def check_last_words(s: Stack, claim: dict[str, Any], slot: str) -> None:
    """A failed boot read back from the real API server as a user reads it: the claim's status message and its
    ClaimFailed Event end with the Pod's last words, Ready=False carries the reason, `kubectl logs job/…` prints
    what the container printed, and no workflow history (nor any log of the operator) holds any of it."""
    name = claim["metadata"]["name"]
    message = claim["status"]["message"]
    assert message.endswith(WORDS_MARK + LAST_WORDS), message
    (ready,) = [c for c in claim["status"].get("conditions") or [] if c["type"] == "Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "StartupJobFailed"), ready
    events = core(s).list_namespaced_event(NS, field_selector=f"involvedObject.name={name},reason=ClaimFailed").items
    assert [e.message for e in events if (e.message or "").endswith(WORDS_MARK + LAST_WORDS)], [
        e.message for e in events
    ]
    batch: Any = k8s.BatchV1Api(s.cluster.admin)
    (job,) = batch.list_namespaced_job(NS, label_selector=f"infra.homecluster.dev/nodeclaim={name},type=startup").items
    logs = s.cluster.kubectl("logs", f"job/{job.metadata.name}", "-n", NS)
    assert logs.stdout == f"{first_words(slot)}\n{LAST_WORDS}\n", logs.stdout
    held, histories = asyncio.run(histories_holding(s, (LAST_WORDS, first_words(slot))))
    assert f"nodeclaim/{NS}/{name}" in histories, sorted(histories)
    logged = [f"the {role} log" for role, proc in s.roles.items() if LAST_WORDS in proc.log.read_text(errors="replace")]
    assert not held and not logged, held + logged
    print(f"\n{name}'s last words, read back: status message {message!r}; Ready=False {ready['reason']}; "
          f"ClaimFailed {events[-1].message!r}; `kubectl logs job/{job.metadata.name}`:\n{logs.stdout}"
          f"and in none of the {len(histories)} workflow histories")  # fmt: skip


async def histories_holding(s: Stack, needles: tuple[str, ...]) -> tuple[list[str], set[str]]:
    """Which workflow histories (payloads decoded) hold any of `needles`, and the ids of every workflow read."""
    client = await Client.connect(s.temporal.address)
    held: list[str] = []
    ids: set[str] = set()

    async def read() -> None:
        async for wf in client.list_workflows():
            ids.add(wf.id)
            text = history_text(await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history())
            held.extend(f"{n!r} in the history of {wf.id}" for n in needles if n in text)

    await asyncio.wait_for(read(), timeout=60)
    return held, ids


def plaintext_refused(s: Stack) -> bool:
    """A plaintext call to the provider fails (it speaks mTLS only)."""
    with grpc.insecure_channel(f"127.0.0.1:{s.provider_port}") as ch:
        try:
            pb_grpc.CloudProviderStub(ch).NodeGroups(pb.NodeGroupsRequest(), timeout=5)
        except grpc.RpcError as exc:
            return bool(exc.code() == grpc.StatusCode.UNAVAILABLE)
    return False


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
    expect_event(s, "ScaleDownEmpty", "removing empty node")
    for machine in ("machine-1", "machine-2"):
        expect_event(s, "ScaleDown", "marked the node as toBeDeleted/unschedulable", on=f"Node/{machine}")


def test_3_over_mtls_a_pending_workload_scales_a_group_up_from_zero(stack: Stack) -> None:
    s = stack
    if s.autoscaler_kind == "cluster-autoscaler":
        # The user moves to mTLS (deploy/overlays/homelab-mtls, deploy/cluster-autoscaler/mtls): from here on the
        # provider refuses plaintext and cluster-autoscaler speaks to it with the client certificate cert-manager
        # would issue, checking the provider's against the Service name of its cloud-config.
        s.switch_to_mtls()
        assert "(mTLS)" in s.roles["provider"].tail(400), s.roles["provider"].tail()
        assert plaintext_refused(s), "the provider still answers plaintext after the switch to mTLS"
        print("over mTLS from here: the provider refuses plaintext, cluster-autoscaler dials it with its certificate")
    before = s.provider_calls()
    set_workload(s, 1)
    wait_until("the scheduler to mark the workload Unschedulable",
               lambda: any(unschedulable(p) for p in workload_pods(s)), within=60)  # fmt: skip
    wait(s, "a claim in workers to be ready",
         lambda: any(phase(c) == "ready" and c["spec"]["group"] == "workers" for c in live(s)),
         within=240, procs=s.procs)  # fmt: skip
    wait_until("the workload Pod Running on a machine of workers",
               lambda: any(p.status.phase == "Running" and (p.spec.node_name or "").startswith("machine-")
                           for p in workload_pods(s)), within=120)  # fmt: skip
    startups = [r for r in s.executor.records if r.operation == "startup"]
    assert len(startups) == 1 and startups[0].outcome == "succeeded", startups
    increase = ("NodeGroupIncreaseSize", "OK")
    assert s.provider_calls()[increase] > before[increase], "the scale-up was not asked for in this step"
    (pod,) = workload_pods(s)
    expect_event(s, "TriggeredScaleUp", "{workers 0->1 (max: 2)}", on=f"Pod/{pod.metadata.name}")
    expect_event(s, "ScaledUpGroup", "workers")
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
    # The startup Job's container prints a line, then its last words (its termination message), and exits 3.
    s.executor.fail(idle, "startup", exit_code=3, message=LAST_WORDS, times=5, output=(first_words(idle),))
    set_workload(s, 2)
    wait(s, f"the claim on {idle} failed",
         lambda: any(phase(c) == "failed" for c in claims_of(s, idle)), within=240, procs=s.procs)  # fmt: skip
    (broken,) = [c for c in claims_of(s, idle) if phase(c) == "failed"]
    check_last_words(s, broken, idle)
    wait(s, "spares scaled up instead",
         lambda: any(phase(c) == "ready" for c in claims_of(s, "spare-1")), within=300,
         procs=s.procs)  # fmt: skip
    status = s.autoscaler_status()
    assert "startup-job-failed" in status, f"workers is backed off for its failed boot:\n{status}"
    expect_event(s, "ScaleUpFailed", "group workers", "startup-job-failed", broken["metadata"]["name"])
    wait_until("both workload Pods Running",
               lambda: sum(p.status.phase == "Running" for p in workload_pods(s)) == 2, within=120)  # fmt: skip
    # cluster-autoscaler's own record agrees with the claims: its per-group target is the group's live claims.
    wait(s, "the status ConfigMap's targets to match the live claims",
         lambda: status_targets(s) == live_per_group(s), within=60)  # fmt: skip
    # Backed off after the first failure: the failing slot was not asked again while the spare served.
    failed = [c for c in claims_of(s, idle) if phase(c) == "failed"]
    assert [reason(c) for c in failed] == ["StartupJobFailed"], [c.get("status") for c in failed]


def test_5_the_workload_goes_and_every_machine_is_powered_off(stack: Stack) -> None:
    s = stack
    apps: Any = k8s.AppsV1Api(s.cluster.admin)
    apps.delete_namespaced_deployment(WORKLOAD, WORKLOAD_NS)
    wait(s, "every claim ended and every machine powered off",
         lambda: not live(s) and not [n for n in ("machine-1", "machine-2", "spare-1") if s.node(n)],
         within=300, procs=s.procs)  # fmt: skip
    wait_until("cluster-autoscaler's status ConfigMap to show a target of 0 in every group",
               lambda: status_targets(s) == {"workers": 0, "spares": 0}, within=60)  # fmt: skip
    for machine in ("machine-1", "spare-1"):  # Nodes registered anew since step 2
        expect_event(s, "ScaleDown", "marked the node as toBeDeleted/unschedulable", on=f"Node/{machine}")


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
