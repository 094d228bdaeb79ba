"""The drain before dark on the real control plane (`make e2e-real`): the real Eviction API and disruption
controller, KWOK kubelets, the Deployment controller and the scheduler.

Two machines of `workers` are on when the operator starts (adopted). Each gets a Deployment's Pod that fills it
(3 of its 4 CPUs, so no autoscaler finds it unneeded). Then a person deletes each machine's claim by hand:
1. `guarded`, under a PodDisruptionBudget with maxUnavailable 0: the drain is refused (429), no shutdown Job is
   made, one DrainBlocked Warning says which Pod and budget; the budget relaxed, the Pod is evicted and the power-off
   follows, the Pod gone from the node before the shutdown Job exists;
   The worker is killed (-9) while the drain is blocked: the new one resumes it (still no Job, nothing said twice);
2. `held`, annotated `karpenter.sh/do-not-disrupt: "true"`: blocked likewise; its annotation swapped for
   cluster-autoscaler's `safe-to-evict: "false"`, still blocked a round later; until the claim is annotated
   `infra.homecluster.dev/force-drain=true`.
`kubectl describe nodeclaim` is printed while blocked and after.
3. Law 3: the first machine again, no claim wanting it. With the operator's worker stopped (no workflow acts, as
   during a take-over), a person switches it on and a Deployment's Pod that prefers it (preferred node affinity, 3
   CPUs) is scheduled there; the spare is switched on too (a slot never claimed: adopted), with room. The worker
   started again, law 3 cordons the machine, evicts the Pod and powers the machine off. What is observed, and how:
   one watch of every Pod orders the Pods' changes as the server stored them: the Pod terminating, then deleted,
   and its replacement Running and Ready on the spare (the real scheduler's choice), all before the shutdown Job's
   Pod is created, so before it starts (the Job object itself is not in that order: the audit log shows the
   operator's one Eviction of the Pod answered 201 before its POST of the shutdown Job). The machine ends off: the
   executor played the shutdown Pod, the Node is not Ready, the slot says MachineReleased.
4. Every request of the operator in this module, replayed against the strict emulator (replay.py), the budgets as
   the real server held them: no difference.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from api import names
from tests.realcluster import audit, replay
from tests.realcluster.cluster import wait_until
from tests.realcluster.stack import NS, Stack, kept, phase

pytestmark = [pytest.mark.realcluster, pytest.mark.timeout(600)]

WORKLOAD_NS = "default"
BOUND = "15s"  # the Group's drainTimeout here: the Warning comes after it


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Iterator[Stack]:
    def make(directory: Any) -> Stack:
        s = Stack(directory, driver="auto")
        s.start_with_machines_on("workers")
        return s

    with kept(request, "homelab-drain-", make) as s:
        yield s


def slot_pods(s: Stack, node: str) -> list[Any]:
    core: Any = k8s.CoreV1Api(s.cluster.admin)
    pods = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    return [
        p for p in pods
        if p.metadata.namespace == WORKLOAD_NS and p.metadata.deletion_timestamp is None
        and p.status.phase not in ("Succeeded", "Failed")
    ]  # fmt: skip


def shutdown_jobs(s: Stack, slot: str) -> list[Any]:
    batch: Any = k8s.BatchV1Api(s.cluster.admin)
    jobs = batch.list_namespaced_job(NS, label_selector=f"{names.LABEL_NODE}={slot}").items
    return [j for j in jobs if (j.metadata.labels or {}).get(names.LABEL_JOB_TYPE) == "shutdown"]


def claim_of(s: Stack, slot: str) -> dict[str, Any] | None:
    live = [c for c in s.claims() if c["spec"]["node"] == slot and phase(c) == "ready"]
    return live[0] if live else None


def events(s: Stack, kind: str, name: str) -> list[Any]:
    found = k8s.CoreV1Api(s.cluster.admin).list_namespaced_event(NS, field_selector=f"involvedObject.name={name}")
    return [e for e in found.items if e.involved_object.kind == kind]


def describe(s: Stack, claim: str) -> str:
    """What a person reads: `kubectl describe nodeclaim` by the server's own kubectl (status, conditions, Events).
    A claim deleted by hand is let go once its terminal record is written; then its Events are what is left."""
    shown = s.cluster.kubectl("describe", "nodeclaim", claim, "-n", NS, timeout=30, check=False)
    if shown.returncode == 0:
        return shown.stdout
    assert "NotFound" in shown.stderr, shown.stderr
    selector = f"involvedObject.kind={names.KIND_NODECLAIM},involvedObject.name={claim}"
    left = s.cluster.kubectl("get", "events", "-n", NS, "--field-selector", selector, "--sort-by=.lastTimestamp")
    asked = f"$ kubectl describe nodeclaim {claim}\n{shown.stderr}"
    return f"{asked}$ kubectl get events --field-selector {selector}\n{left.stdout}"


def workload(s: Stack, name: str, node: str, annotations: dict[str, str]) -> None:
    apps: Any = k8s.AppsV1Api(s.cluster.admin)
    apps.create_namespaced_deployment(WORKLOAD_NS, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {
            "replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": annotations},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{"name": "app", "image": "registry.homelab.test/app:1.0",
                                    "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}}],
                },
            },
        },
    })  # fmt: skip


def delete_claim(s: Stack, claim: str) -> None:
    api: Any = k8s.CustomObjectsApi(s.cluster.admin)
    api.delete_namespaced_custom_object("infra.homecluster.dev", "v2alpha1", NS, "nodeclaims", claim)


def gone_or_done(s: Stack, claim: str) -> bool:
    return not [c for c in s.claims() if c["metadata"]["name"] == claim and phase(c) not in ("completed",)]


def power_off_follows_only_once_drained(s: Stack, slot: str, claim: str, within: float) -> None:
    """Poll until the claim ends; whenever a shutdown Job is seen, no workload Pod may be on the node any more."""
    end = time.monotonic() + within
    while not gone_or_done(s, claim):
        if shutdown_jobs(s, slot):
            assert not slot_pods(s, slot), f"a shutdown Job for {slot} while Pods are on it"
        assert time.monotonic() < end, f"claim {claim} did not end within {within} s"
        time.sleep(0.5)


def delete_until_blocked(s: Stack, slot: str) -> str:
    """Delete the slot's ready claim as a person would, and wait for the Warning that its drain is blocked."""
    found = claim_of(s, slot)
    assert found is not None, f"no ready claim on {slot}: {[c['metadata']['name'] for c in s.claims()]}"
    claim = str(found["metadata"]["name"])
    delete_claim(s, claim)

    def blocked() -> bool:
        return any(e.reason == "DrainBlocked" for e in events(s, names.KIND_NODECLAIM, claim))

    wait_until("the DrainBlocked Warning", blocked, within=90)
    return claim


@pytest.fixture(scope="module")
def placed(stack: Stack) -> tuple[str, str]:
    s = stack
    api: Any = k8s.CustomObjectsApi(s.cluster.admin)
    api.patch_namespaced_custom_object(
        "infra.homecluster.dev", "v2alpha1", NS, "groups", "workers", {"spec": {"drainTimeout": BOUND}}
    )
    first, second = (slot.name for slot in s.homelab.slots_of("workers"))
    policy: Any = k8s.PolicyV1Api(s.cluster.admin)
    policy.create_namespaced_pod_disruption_budget(WORKLOAD_NS, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guarded"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "guarded"}}},
    })  # fmt: skip
    workload(s, "guarded", first, {})
    workload(s, "held", second, {names.ANNOTATION_DO_NOT_DISRUPT: "true"})
    for node in (first, second):

        def running(node: str = node) -> bool:
            return any(p.status.phase == "Running" for p in slot_pods(s, node))

        wait_until(f"a Running workload Pod on {node}", running, within=60)
    return first, second


def test_1_a_budget_that_refuses_delays_the_power_off_says_why_once_and_the_power_off_follows_once_relaxed(
    stack: Stack, placed: tuple[str, str]
) -> None:
    s, slot = stack, placed[0]
    claim = delete_until_blocked(s, slot)
    time.sleep(10)  # the drain goes on: still no Job, one Warning, the machine on
    assert not shutdown_jobs(s, slot) and slot_pods(s, slot) and s.node_ready(slot)
    said = [e for e in events(s, names.KIND_NODECLAIM, claim) if e.reason == "DrainBlocked"]
    assert len(said) == 1 and said[0].type == "Warning", said
    assert f"PodDisruptionBudget {WORKLOAD_NS}/guarded" in said[0].message, said[0].message
    assert [e for e in events(s, names.KIND_NODE, slot) if e.reason == "DrainBlocked"], "the slot says it too"
    print(f"\n--- claim {claim} while blocked ---\n{describe(s, claim)}")
    # The worker killed mid-drain (-9, as a node's crash would): the new one resumes the drain, never skips it, and
    # says nothing twice.
    worker = s.roles["worker"]
    assert worker.popen is not None
    os.kill(worker.popen.pid, signal.SIGKILL)
    worker.popen.wait(10)
    s.restart_role("worker")
    time.sleep(15)
    assert not shutdown_jobs(s, slot) and slot_pods(s, slot) and s.node_ready(slot), "a drain skipped by a new worker"
    said = [e for e in events(s, names.KIND_NODECLAIM, claim) if e.reason == "DrainBlocked"]
    assert len(said) == 1 and (said[0].count or 1) == 1, [(e.message, e.count) for e in said]
    k8s.PolicyV1Api(s.cluster.admin).patch_namespaced_pod_disruption_budget(
        "guarded", WORKLOAD_NS, {"spec": {"maxUnavailable": 1}}
    )
    power_off_follows_only_once_drained(s, slot, claim, within=180)
    print(f"\n--- claim {claim} after ---\n{describe(s, claim)}")
    assert shutdown_jobs(s, slot), "the power-off followed"


def test_2_a_do_not_disrupt_pod_blocks_the_power_off_until_the_force_annotation(
    stack: Stack, placed: tuple[str, str]
) -> None:
    s, slot = stack, placed[1]
    claim = delete_until_blocked(s, slot)
    assert not shutdown_jobs(s, slot) and slot_pods(s, slot)
    # cluster-autoscaler's own word blocks alone: the Pod's do-not-disrupt swapped for safe-to-evict "false", and a
    # round later (rounds are at most a minute apart) the Pod is still there and no shutdown Job exists.
    (pod,) = slot_pods(s, slot)
    swap = {
        "metadata": {"annotations": {names.ANNOTATION_DO_NOT_DISRUPT: None, names.ANNOTATION_SAFE_TO_EVICT: "false"}}
    }
    k8s.CoreV1Api(s.cluster.admin).patch_namespaced_pod(pod.metadata.name, WORKLOAD_NS, swap)
    time.sleep(75)
    assert not shutdown_jobs(s, slot) and [p.metadata.name for p in slot_pods(s, slot)] == [pod.metadata.name]
    api: Any = k8s.CustomObjectsApi(s.cluster.admin)
    force = {"metadata": {"annotations": {names.ANNOTATION_FORCE_DRAIN: "true"}}}
    try:
        api.patch_namespaced_custom_object("infra.homecluster.dev", "v2alpha1", NS, "nodeclaims", claim, force)
    except ApiException as exc:
        raise AssertionError(f"annotate {claim}: {exc}") from exc
    power_off_follows_only_once_drained(s, slot, claim, within=180)
    assert shutdown_jobs(s, slot)


# --- law 3: a machine on that no claim wants, with a Deployment's Pod on it --------------------------------------
@dataclass(frozen=True)
class PodEvent:
    """One Pod event as the watch delivered it."""

    kind: str  # ADDED, MODIFIED, DELETED
    namespace: str
    name: str
    node: str
    phase: str
    ready: bool
    terminating: bool
    labels: dict[str, str]

    def __str__(self) -> str:
        state = "terminating" if self.terminating else f"{self.phase}{', Ready' if self.ready else ''}"
        return f"{self.kind:<8} {self.namespace}/{self.name} on {self.node or '(unscheduled)'}: {state}"


class PodWatch:
    """Every Pod event of the cluster between `start()` and `stop()`, in the order of one watch resumed from its last
    resourceVersion: the API server's watch cache sends a resource's events in the order they were written, so an
    index here orders two Pods' changes (a workload's and a power Job's) as the server stored them. Each connection
    is bounded (5 s); a watch that fails (410 Gone, a broken connection) ends the recording and says so in `errors`.
    """

    def __init__(self, s: Stack) -> None:
        self.core: Any = k8s.CoreV1Api(s.cluster.admin)
        self.events: list[PodEvent] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PodWatch:
        version = str(self.core.list_pod_for_all_namespaces(_request_timeout=10).metadata.resource_version)
        self._thread = threading.Thread(target=self._run, args=(version,), name="pod-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(20)
            assert not self._thread.is_alive(), "the Pod watch did not end within 20 s of being told to"

    def _run(self, version: str) -> None:
        while not self._stop.is_set():
            try:
                stream = k8s_watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces, resource_version=version, timeout_seconds=5,
                    _request_timeout=15, deserialize=False,
                )  # fmt: skip
                for raw in stream:
                    event = json.loads(raw) if isinstance(raw, str) else raw
                    obj = event["object"]
                    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
                    version = str(meta["resourceVersion"])
                    conditions = status.get("conditions") or []
                    self.events.append(PodEvent(
                        kind=str(event["type"]), namespace=str(meta.get("namespace", "")), name=str(meta["name"]),
                        node=str(spec.get("nodeName") or ""), phase=str(status.get("phase") or ""),
                        ready=any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions),
                        terminating=bool(meta.get("deletionTimestamp")), labels=dict(meta.get("labels") or {}),
                    ))  # fmt: skip
            except Exception as exc:  # a harness thread reports, never dies silently
                self.errors.append(f"the Pod watch from resourceVersion {version} failed: {exc!r}")
                return


def first(events: list[PodEvent], what: str, check: Callable[[PodEvent], bool]) -> int:
    """The index of the first event that passes `check`; fails naming `what` and what the watch saw."""
    for i, e in enumerate(events):
        if check(e):
            return i
    seen = "\n".join(f"  {i:>4} {e}" for i, e in enumerate(events) if e.namespace in (NS, WORKLOAD_NS))
    raise AssertionError(f"the Pod watch never saw {what}; it saw:\n{seen}")


def clear_workloads(s: Stack) -> None:
    """The first cases' Deployments and budget go, and their Pods with them (they wait, pending, for machines now
    off, and would take the room of the next workload on the machine that comes on)."""
    apps: Any = k8s.AppsV1Api(s.cluster.admin)
    core: Any = k8s.CoreV1Api(s.cluster.admin)
    for name in ("guarded", "held"):
        with absent_ok():
            apps.delete_namespaced_deployment(name, WORKLOAD_NS, propagation_policy="Foreground")
    with absent_ok():
        k8s.PolicyV1Api(s.cluster.admin).delete_namespaced_pod_disruption_budget("guarded", WORKLOAD_NS)

    def gone() -> bool:
        left = core.list_namespaced_pod(WORKLOAD_NS).items
        return not apps.list_namespaced_deployment(WORKLOAD_NS).items and not left

    wait_until(f"the first cases' Deployments and Pods to be gone from {WORKLOAD_NS}", gone, within=90)


@contextlib.contextmanager
def absent_ok() -> Iterator[None]:
    """A 404 is no failure: what is to be deleted may be gone already."""
    try:
        yield
    except ApiException as exc:
        if exc.status != 404:
            raise


def movable_workload(s: Stack, name: str, node: str) -> None:
    """A Deployment's Pod that prefers `node` (preferred node affinity) but may run on any machine with room: where
    it runs after an eviction is the real scheduler's choice."""
    apps: Any = k8s.AppsV1Api(s.cluster.admin)
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}
    apps.create_namespaced_deployment(WORKLOAD_NS, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {
            "replicas": 1, "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                        {"weight": 100, "preference": term}]}},
                    "containers": [{"name": "app", "image": "registry.homelab.test/app:1.0",
                                    "resources": {"requests": {"cpu": "3", "memory": "1Gi"}}}],
                },
            },
        },
    })  # fmt: skip


def said_count(s: Stack, slot: str, reason: str) -> int:
    """How many times the slot said `reason` (an Event repeated is one object with a count)."""
    return sum(e.count or 1 for e in events(s, names.KIND_NODE, slot) if e.reason == reason)


def law3_shutdown_jobs(events: list[audit.AuditEvent], slot: str) -> list[int]:
    """Indexes of the operator's accepted creates of a law-3 shutdown Job for `slot` (the slot's alone: no claim)."""
    out = []
    for i, e in enumerate(events):
        labels = ((e.request or {}).get("metadata") or {}).get("labels") or {}
        if (
            (e.user, e.verb, e.resource, e.code) == (audit.OPERATOR, "create", "jobs", 201)
            and labels.get(names.LABEL_JOB_TYPE) == "shutdown"
            and labels.get(names.LABEL_NODE) == slot
            and names.LABEL_NODECLAIM not in labels
        ):
            out.append(i)
    return out


def test_3_law_3_drains_a_machine_switched_on_by_hand_and_its_pod_runs_elsewhere_before_the_power_off(
    stack: Stack, placed: tuple[str, str]
) -> None:
    s, slot = stack, placed[0]
    spare = s.homelab.slots_of("spares")[0].name
    clear_workloads(s)
    # The first case's power-off deleted the Node (powerOffNodePolicy Delete): the machine comes back uncordoned.
    wait_until(f"the Node of {slot} to be deleted after the first case", lambda: s.node(slot) is None, within=120)
    # The worker is stopped, so no workflow of the operator acts while a person switches the machine on and the
    # scheduler puts a Pod on it (with it running, law 3 would cordon the node within a second of its coming up).
    worker = s.roles["worker"]
    worker.stop()
    s.executor.power_on(slot)
    wait_until(f"{slot}, switched on by hand, Ready", lambda: s.node_ready(slot), within=60)
    movable_workload(s, "moved", slot)

    def running_on(node: str) -> list[Any]:
        return [p for p in slot_pods(s, node) if p.metadata.labels.get("app") == "moved"
                and p.status.phase == "Running"]  # fmt: skip

    (pod,) = wait_until(f"the Deployment's Pod Running on {slot}", lambda: running_on(slot), within=60)
    moved = str(pod.metadata.name)
    # Room elsewhere: the spare, switched on too (a slot never claimed: the operator adopts it, a ready claim).
    s.executor.power_on(spare)
    wait_until(f"{spare}, switched on by hand, Ready", lambda: s.node_ready(spare), within=60)
    shutdowns = len([r for r in s.executor.records if r.slot == slot and r.operation == "shutdown"])
    released = said_count(s, slot, names.EventReason.MACHINE_RELEASED)
    pods = PodWatch(s).start()
    try:
        s.restart_role("worker")

        def off() -> bool:
            played = [r for r in s.executor.records if r.slot == slot and r.operation == "shutdown"]
            return (len(played) > shutdowns and played[-1].outcome == "succeeded" and not s.node_ready(slot)
                    and said_count(s, slot, names.EventReason.MACHINE_RELEASED) > released)  # fmt: skip

        wait_until(f"{slot} powered off by law 3 (its shutdown Pod played, MachineReleased said)", off, within=180)
    finally:
        pods.stop()
    assert not pods.errors, pods.errors
    ev = pods.events

    def shutdown_pod(e: PodEvent) -> bool:
        return (
            e.namespace == NS
            and e.labels.get(names.LABEL_JOB_TYPE) == "shutdown"
            and e.labels.get(names.LABEL_NODE) == slot
        )

    created = first(ev, f"the shutdown Job's Pod for {slot}", shutdown_pod)
    started = first(ev, "the shutdown Job's Pod Running", lambda e: shutdown_pod(e) and e.phase == "Running")
    evicted = first(ev, f"{moved} terminating on {slot}", lambda e: e.name == moved and e.terminating)
    gone = first(ev, f"{moved} deleted", lambda e: e.name == moved and e.kind == "DELETED")
    elsewhere = first(ev, "the Deployment's new Pod Running and Ready on another node", lambda e: (
        e.labels.get("app") == "moved" and e.name != moved and e.node not in ("", slot) and e.phase == "Running"
        and e.ready and not e.terminating))  # fmt: skip
    marks = {evicted: "evicted (terminating)", gone: "gone", elsewhere: "new Pod Running elsewhere",
             created: "shutdown Job's Pod created", started: "shutdown Job's Pod Running"}  # fmt: skip
    print(f"\n--- law 3 on {slot}: the Pod watch, in the server's order ---")
    for i, e in enumerate(ev):
        if e.namespace == WORKLOAD_NS or shutdown_pod(e):
            print(f"  {i:>4} {e}" + (f"   <- {marks[i]}" if i in marks else ""))
    assert evicted <= gone < created, f"{moved} was still on {slot} when the shutdown Job's Pod was created"
    # Running elsewhere before the shutdown Job's Pod starts (the power-off is its script), as issue 41 words it: the
    # drain waits for the evicted Pod to be gone; starting its replacement is the ReplicaSet's part.
    assert created <= started and elsewhere < started, "the Deployment's Pod was not Running elsewhere in time"
    assert ev[elsewhere].node == spare, f"rescheduled onto {ev[elsewhere].node}, not the spare with room"
    # Through the Eviction API, answered before the operator asked for the shutdown Job.
    logged = list(audit.read(s.cluster.audit_log))
    evictions = [i for i, e in enumerate(logged)
                 if e.user == audit.OPERATOR and e.resource == "pods/eviction" and e.name == moved]  # fmt: skip
    jobs = law3_shutdown_jobs(logged, slot)
    assert evictions and jobs, f"evictions of {moved} {evictions}, law-3 shutdown Jobs of {slot} {jobs}"
    assert [logged[i].code for i in evictions] == [201] and evictions[0] < jobs[0], [logged[i].code for i in evictions]
    # The machine is off, the workload runs on, and the spare (adopted) is left alone.
    assert [p.metadata.name for p in running_on(spare)] == [ev[elsewhere].name]
    adopted = [c for c in s.claims() if c["spec"]["node"] == spare and phase(c) == "ready"]
    assert adopted and not shutdown_jobs(s, spare), (adopted, shutdown_jobs(s, spare))


def test_4_the_emulator_answers_the_drains_requests_as_the_real_server_did(stack: Stack) -> None:
    """Every request of the operator in this module (its Eviction POSTs refused 429 and accepted 201, its Pod lists,
    budget reads, cordons, forced deletes, shutdown Jobs), replayed against the strict emulator (replay.py), the
    budgets as the real server held them learned from the others' requests."""
    events = list(audit.read(stack.cluster.audit_log))
    outcomes = replay.replay_all(events, user=audit.OPERATOR)
    table, differences = replay.report(outcomes)
    print(f"\nthe operator's {len(outcomes)} requests, replayed against the strict emulator:\n{table}")
    print(f"{len(differences)} distinct differences" + "".join(f"\n- {d}" for d in differences))
    judged = Counter((o.shape, o.event.code) for o in outcomes if not o.skipped)
    drain = [("create core/pods/eviction", 429), ("create core/pods/eviction", 201),
             ("list policy/poddisruptionbudgets", 200), ("list core/pods", 200), ("patch core/nodes", 200),
             ("delete core/pods", 200)]  # fmt: skip
    missing = [k for k in drain if not judged[k]]
    assert not missing, f"the drain's requests were not all replayed: {missing}"
    assert differences == [], "the emulator answers differently from the real server (docs/realcluster.md)"
