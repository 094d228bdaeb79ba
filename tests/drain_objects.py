"""Pods and PodDisruptionBudgets as a drain meets them, for the emulator-backed tests of the drain."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]


def pod(name: str, node: str, namespace: str, *, app: str = "web", ready: bool = True, **meta: Any) -> Obj:
    """A Running Pod bound to `node` (Ready unless told), labelled app=<app>; `meta` adds metadata fields."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": app}, **meta},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def budget(name: str, namespace: str, *, app: str = "web", **spec: Any) -> Obj:
    """A policy/v1 PodDisruptionBudget over app=<app> (minAvailable or maxUnavailable in `spec`)."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "generation": 1},
        "spec": {"selector": {"matchLabels": {"app": app}}, **spec},
    }
