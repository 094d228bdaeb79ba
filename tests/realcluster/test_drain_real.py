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
The claim's Events are printed while blocked and after (what `kubectl describe nodeclaim` shows).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from api import names
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
    """The claim's Events as `kubectl describe nodeclaim` lists them."""
    rows = sorted(events(s, names.KIND_NODECLAIM, claim), key=lambda e: str(e.metadata.creation_timestamp))
    return "\n".join(f"  {e.type:<8} {e.reason:<20} {e.message}" for e in rows)


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
