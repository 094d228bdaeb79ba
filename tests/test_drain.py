"""The drain's Kubernetes side against the emulator: Eviction and PodDisruptionBudgets answered as the real server
answers them, and one drain round's rules (what it moves, leaves, waits for; a person's force)."""
# ruff: noqa: F811 (the fixtures of tests/test_activities.py, imported as the arguments that use them)

from __future__ import annotations

from typing import Any

import pytest
from homelab_sim import workloads
from homelab_sim.emulator import EmulatorServer

from activities import KubeActivities
from api import contracts as c
from api import names
from kube.adapter import Kube
from kube.errors import Transient
from tests.drain_objects import budget, pod
from tests.lab import homelab, one_claim, open_lab
from tests.test_activities import CRD, NS, acts, cluster, kubelet_node, put, stored  # noqa: F401 (fixtures)
from workflows.group.workflow import GroupWorkflow

Obj = dict[str, Any]
MIN = 60.0
PDB = ("policy/v1", "poddisruptionbudgets")


def pods_left(srv: EmulatorServer) -> list[str]:
    return sorted(p["metadata"]["name"] for p in srv.call(lambda e: e.objects_of("v1", "pods", NS)))


def test_a_budget_reports_the_disruption_controllers_figures_and_its_last_disruption_is_refused_with_a_429(
    emulator: EmulatorServer, kube: Kube
) -> None:
    put(emulator, "v1", "namespaces", {"metadata": {"name": NS}})
    for i in range(3):
        put(emulator, "v1", "pods", pod(f"web-{i}", "n1", NS))
    put(emulator, *PDB, budget("web", NS, minAvailable=2))
    (read,) = kube.budgets(NS)
    status = read["status"]
    assert (status["currentHealthy"], status["desiredHealthy"], status["expectedPods"]) == (3, 2, 3)
    assert status["disruptionsAllowed"] == 1 and status["observedGeneration"] == 1
    assert kube.evict_pod(NS, "web-0") is True
    with pytest.raises(Transient) as refused:
        kube.evict_pod(NS, "web-1")
    assert refused.value.status == 429 and refused.value.reason == "TooManyRequests"
    assert refused.value.causes == ("The disruption budget web needs 2 healthy pods and has 2 currently",)
    assert pods_left(emulator) == ["web-1", "web-2"]
    assert kube.evict_pod(NS, "gone") is False, "a Pod already gone is no error"


def test_an_unready_pod_goes_when_its_budget_is_healthy_and_two_budgets_are_a_500(
    emulator: EmulatorServer, kube: Kube
) -> None:
    put(emulator, "v1", "namespaces", {"metadata": {"name": NS}})
    put(emulator, "v1", "pods", pod("web-0", "n1", NS))
    put(emulator, "v1", "pods", pod("web-1", "n1", NS, ready=False))
    put(emulator, *PDB, budget("web", NS, minAvailable=1))
    assert kube.evict_pod(NS, "web-1") is True  # 1 healthy of 1 needed: the unhealthy Pod may go
    put(emulator, *PDB, budget("web-again", NS, maxUnavailable=1))
    with pytest.raises(Transient) as two:
        kube.evict_pod(NS, "web-0")
    assert two.value.status == 500 and "more than one PodDisruptionBudget" in str(two.value)


def on_worker(srv: EmulatorServer) -> None:
    """Pods of every kind on worker-1, and one elsewhere: what a round moves, leaves and waits for."""
    ds_owner = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "cni", "uid": "u1", "controller": True}]
    put(srv, "v1", "pods", pod("cni-1", "worker-1", NS, app="cni", ownerReferences=ds_owner))
    put(srv, "v1", "pods", pod("static-1", "worker-1", NS, app="s", annotations={names.ANNOTATION_MIRROR_POD: "x"}))
    done = pod("job-1", "worker-1", NS, app="job")
    done["status"]["phase"] = "Succeeded"
    put(srv, "v1", "pods", done)
    held = pod("db-1", "worker-1", NS, app="db", annotations={names.ANNOTATION_SAFE_TO_EVICT: "false"})
    put(srv, "v1", "pods", held)
    put(srv, "v1", "pods", pod("web-1", "worker-1", NS))
    put(srv, "v1", "pods", pod("free-1", "worker-1", NS, app="free"))
    put(srv, "v1", "pods", pod("web-2", "worker-2", NS))
    put(srv, *PDB, budget("web", NS, maxUnavailable=0))


def test_a_round_evicts_what_may_go_leaves_daemon_mirror_and_finished_pods_and_counts_what_blocks(
    cluster: EmulatorServer, acts: KubeActivities
) -> None:
    on_worker(cluster)
    request = c.DrainRequest(NS, "worker-1")
    first = acts.drain_slot(request)
    assert (first.left, first.evicted, first.refused, first.held, first.forced) == (3, 1, 1, 1, False)
    assert first.bound_seconds == 600, "the default bound: 10 minutes"
    assert pods_left(cluster) == ["cni-1", "db-1", "job-1", "static-1", "web-1", "web-2"]
    again = acts.drain_slot(request)
    assert (again.left, again.evicted, again.refused, again.held) == (2, 0, 1, 1) and not again.done
    # The Warning names each Pod in the way and why, on the slot (a law-3 drain has no claim).
    acts.drain_blocked(c.DrainBlocked(NS, "worker-1", "", "10m", again.left, "worker-1: drain blocked"))
    (said,) = [e for e in cluster.call(lambda e: e.objects_of("v1", "events", NS)) if e["reason"] == "DrainBlocked"]
    assert said["type"] == "Warning" and said["involvedObject"]["name"] == "worker-1"
    assert f"Pod {NS}/db-1 (annotated not to be disrupted" in said["message"]
    assert (
        f"Pod {NS}/web-1 (PodDisruptionBudget {NS}/web: 2 healthy, 2 needed, 0 disruptions allowed)" in said["message"]
    )
    assert names.ANNOTATION_FORCE_DRAIN in said["message"], "it says how a person clears it"
    assert "has waited 10m for 2 Pods: " in said["message"], said["message"]
    # One Pod left is one Pod (the real node's Event said "for 1 Pods").
    acts.drain_blocked(c.DrainBlocked(NS, "worker-1", "", "11m", 1, "worker-1: drain blocked again"))
    messages = [e["message"] for e in cluster.call(lambda e: e.objects_of("v1", "events", NS))]
    assert any("has waited 11m for 1 Pod: " in m for m in messages), messages


def test_a_group_bound_and_a_forced_drain_that_deletes_what_blocks_then_drops_its_annotation(
    cluster: EmulatorServer, acts: KubeActivities
) -> None:
    on_worker(cluster)
    group = stored(cluster, CRD, "groups", NS, "workers")
    cluster.call(
        lambda e: e.patch_object(CRD, "groups", NS, group["metadata"]["name"], {"spec": {"drainTimeout": "2m"}})
    )
    force = {"metadata": {"annotations": {names.ANNOTATION_FORCE_DRAIN: "true"}}}
    cluster.call(lambda e: e.patch_object(CRD, "nodes", NS, "worker-1", force))
    forced = acts.drain_slot(c.DrainRequest(NS, "worker-1"))
    assert forced.forced and forced.bound_seconds == 120 and forced.evicted == 3
    assert pods_left(cluster) == ["cni-1", "job-1", "static-1", "web-2"]
    assert names.ANNOTATION_FORCE_DRAIN in (stored(cluster, CRD, "nodes", NS, "worker-1")["metadata"]["annotations"])
    done = acts.drain_slot(c.DrainRequest(NS, "worker-1"))
    assert done.done
    annotations = stored(cluster, CRD, "nodes", NS, "worker-1")["metadata"].get("annotations") or {}
    assert names.ANNOTATION_FORCE_DRAIN not in annotations, "the force was for this power-off only"


def test_a_node_that_does_not_exist_is_drained(cluster: EmulatorServer, acts: KubeActivities) -> None:
    cluster.call(lambda e: e.delete_object("v1", "nodes", None, "worker-1"))
    assert acts.drain_slot(c.DrainRequest(NS, "worker-1")).done


def test_the_chaos_check_counts_a_workload_left_on_a_node_and_not_a_daemon_sets_pod(emulator: EmulatorServer) -> None:
    put(emulator, "v1", "namespaces", {"metadata": {"name": NS}})
    put(emulator, "v1", "nodes", kubelet_node("n1"))
    emulator.call(lambda e: workloads.place(e, NS, "n1", 1))
    assert emulator.call(lambda e: workloads.in_the_way(e, NS, "n1")) == [f"{workloads.WORK}-n1-1"]
    cordon = {"spec": {"unschedulable": True}}
    emulator.call(lambda e: e.patch_object("v1", "nodes", None, "n1", cordon))
    emulator.call(lambda e: workloads.place(e, NS, "n1", 2))
    assert len(pods_left(emulator)) == 2, "a cordoned Node takes no new work"
    emulator.call(lambda e: workloads.clear(e, NS, "n1"))
    assert pods_left(emulator) == []


async def test_a_scale_down_of_a_machine_with_work_on_it_starts_its_shutdown_job_only_once_the_work_has_left() -> None:
    async with open_lab({**homelab([{"name": "s1"}]), "workloads": True}) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "ready", within=3 * MIN)
        await lab.until(lambda: lab.pod(f"{workloads.WORK}-s1-1"), within=MIN, step=1, what="work placed")
        assert await lab.group().execute_update(GroupWorkflow.delete_nodes, ["s1"]) == 0
        await lab.wait_phase(name, "completed", within=5 * MIN, step=10)
        stats = lab.lab.call(lambda h: dict(h.stats))
        assert stats.get("shutdown jobs") == 1 and not stats.get(workloads.STAT), stats
