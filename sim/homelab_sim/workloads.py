"""Work on the simulated machines, for the chaos suite's drain check: a usable Node gets a workload Pod (under a
PodDisruptionBudget that spares one) and a DaemonSet's Pod, as a scheduler and a DaemonSet controller would put
them there; a shutdown Job that starts while anything but the DaemonSet's Pod is still on its node is counted."""

from __future__ import annotations

from typing import Any

from homelab_sim.emulator import KubeEmulator

Obj = dict[str, Any]
_PODS = ("v1", "pods")
_BUDGETS = ("policy/v1", "poddisruptionbudgets")
WORK = "chaos-work"
STAT = "pods other than a DaemonSet's on a node when its shutdown Job started"


def _pod(name: str, namespace: str, node: str, app: str, owners: list[Obj]) -> Obj:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}, "ownerReferences": owners},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def place(emulator: KubeEmulator, namespace: str, node: str, boot: int) -> None:
    """A usable, uncordoned Node takes one workload Pod and one DaemonSet Pod (the budget made once)."""
    found = emulator.get_object("v1", "nodes", None, node)
    if found is None or (found.get("spec") or {}).get("unschedulable"):
        return
    if emulator.get_object(*_BUDGETS, namespace, WORK) is None:
        budget = {"metadata": {"name": WORK}, "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": WORK}}}}
        emulator.put_object(*_BUDGETS, budget, namespace)
    daemon = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "agent", "controller": True}]
    emulator.put_object(*_PODS, _pod(f"{WORK}-{node}-{boot}", namespace, node, WORK, []), namespace)
    emulator.put_object(*_PODS, _pod(f"agent-{node}-{boot}", namespace, node, "agent", daemon), namespace)


def in_the_way(emulator: KubeEmulator, namespace: str, node: str) -> list[str]:
    """The Pods on `node` that a drain should have moved: not a DaemonSet's, not finished."""
    return [
        p["metadata"]["name"]
        for p in emulator.objects_of(*_PODS, namespace)
        if (p.get("spec") or {}).get("nodeName") == node
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and not any(o.get("kind") == "DaemonSet" for o in p["metadata"].get("ownerReferences") or [])
    ]


def clear(emulator: KubeEmulator, namespace: str, node: str) -> None:
    """A machine that went off takes its Pods with it (its DaemonSet's, and whatever was left on it)."""
    for p in emulator.objects_of(*_PODS, namespace):
        if (p.get("spec") or {}).get("nodeName") == node and p["metadata"]["name"].startswith(("agent-", f"{WORK}-")):
            emulator.delete_object(*_PODS, namespace, p["metadata"]["name"])
