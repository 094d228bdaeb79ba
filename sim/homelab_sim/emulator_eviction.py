"""The Eviction subresource and PodDisruptionBudgets of the emulated API server, as the real ones answer.

The disruption controller is modelled as one that is never behind: a budget's status (currentHealthy,
desiredHealthy, expectedPods, disruptionsAllowed, the DisruptionAllowed condition) is recomputed from the Pods
before every read of budgets and every eviction. The expected count is the number of Pods the budget selects (the
real controller asks their controllers' scale, which is the same at rest). An eviction follows
`pkg/registry/core/pod/storage/eviction.go`: a Pod that is not running (or already terminating) goes without a
budget check; a Pod under two budgets is a 500; a budget with no disruption left is a 429 whose cause names it; an
unhealthy Pod goes when its budget is healthy (the default `IfHealthyBudget`). The emulated kubelet stops a
deleted Pod at once, so an evicted Pod is gone when the answer comes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from api.selectors import selects
from homelab_sim.emulator_errors import ApiError

Obj = dict[str, Any]

BUDGETS = ("policy", "v1", "poddisruptionbudgets")
REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."
TWO_BUDGETS = "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def ready(pod: Mapping[str, Any]) -> bool:
    """Healthy as the disruption controller counts it: Ready, and not being deleted."""
    if _meta(pod).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _scaled(value: int | str, total: int, *, round_up: bool) -> int:
    if isinstance(value, int):
        return value
    if not value.endswith("%"):
        raise ApiError(422, "Invalid", f"invalid value {value!r}: an integer or a percentage")
    share = int(value[:-1]) * total / 100
    return math.ceil(share) if round_up else math.floor(share)


def budget_status(budget: Mapping[str, Any], pods: list[Obj]) -> Obj:
    """What the disruption controller writes for `budget`, given the namespace's Pods."""
    spec = budget.get("spec") or {}
    selected = [p for p in pods if selects(spec.get("selector"), (_meta(p).get("labels") or {}))]
    expected = len(selected)
    healthy = sum(1 for p in selected if ready(p))
    if spec.get("minAvailable") is not None:
        desired = _scaled(spec["minAvailable"], expected, round_up=True)
    elif spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected, round_up=True))
    else:  # neither: nothing may be disrupted beyond what is already unhealthy
        desired = expected
    allowed = max(0, healthy - desired)
    return {
        "observedGeneration": _meta(budget).get("generation", 1),
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "disruptionsAllowed": allowed,
        "conditions": [
            {
                "type": "DisruptionAllowed",
                "status": "True" if allowed > 0 else "False",
                "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
                "message": "",
                "observedGeneration": _meta(budget).get("generation", 1),
                "lastTransitionTime": "1970-01-01T00:00:00Z",
            }
        ],
    }


def evict(
    pod: Mapping[str, Any],
    budgets: list[Obj],
    delete: Callable[[], None],
) -> Obj:
    """Judge an eviction of `pod` under its namespace's `budgets` (their status fresh); delete it when allowed.

    Returns the 201 Status body; raises the real server's refusals.
    """
    phase = (pod.get("status") or {}).get("phase")
    if _meta(pod).get("deletionTimestamp") or phase in ("Pending", "Succeeded", "Failed"):
        delete()
        return success()
    labels = _meta(pod).get("labels") or {}
    mine = [b for b in budgets if selects((b.get("spec") or {}).get("selector"), labels)]
    if len(mine) > 1:
        raise ApiError(500, "InternalError", TWO_BUDGETS)
    if not mine:
        delete()
        return success()
    budget = mine[0]
    status = budget.get("status") or {}
    policy = (budget.get("spec") or {}).get("unhealthyPodEvictionPolicy") or "IfHealthyBudget"
    if not ready(pod) and (
        policy == "AlwaysAllow" or status.get("currentHealthy", 0) >= status.get("desiredHealthy", 0)
    ):
        delete()
        return success()
    if int(status.get("disruptionsAllowed", 0)) <= 0:
        raise ApiError(
            429,
            "TooManyRequests",
            REFUSED,
            {
                "causes": [
                    {
                        "reason": "DisruptionBudget",
                        "message": f"The disruption budget {_meta(budget).get('name')} needs "
                        f"{status.get('desiredHealthy', 0)} healthy pods and has "
                        f"{status.get('currentHealthy', 0)} currently",
                    }
                ]
            },
        )
    delete()
    return success()


def success() -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
