"""The Kubernetes side of the drain before a power-off: one round of evictions, and the words of a blocked drain.

A round is short and idempotent (one list, then one call per Pod, within a time budget): the waiting between
rounds and the bound are the workflow's timers, so a lost worker costs a round, never the drain. What a round
returns is counts; the names of the Pods and budgets in the way are read again by `blocked_words` when a Warning
says them, so none lands in a workflow history.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from api import contracts as c
from api.selectors import selects
from domain.drain import PodFate, fate
from kube.adapter import Kube
from kube.errors import Forbidden, Transient

log = logging.getLogger(__name__)

JSON = Mapping[str, Any]

# A round stops sending evictions after this long (the rest wait for the next round): with one call in flight,
# still inside the read timeout.
ROUND_BUDGET_SECONDS = 4.0
# How many Pods a Warning names before it says "and N more" (an Event's message is bounded).
NAMED_AT_MOST = 8


def _ref(pod: JSON) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def drain_round(kube: Kube, node: str, *, forced: bool, bound_seconds: int) -> c.DrainRound:
    """Evict (or, forced, delete) what may leave the node now and count what is still on it.

    A Pod the Eviction API refuses (its budget's 429, a 403 or a server error for that one Pod) is counted as
    refused and asked again next round; a Pod already terminating is waited for; a held Pod is left alone unless
    a person forced the drain. Each Pod keeps its own terminationGracePeriodSeconds (no grace is sent).
    """
    started = time.monotonic()
    left = evicted = refused = held = 0
    for pod in kube.pods_on_node(node):
        what = fate(pod)
        if what is PodFate.SKIP:
            continue
        left += 1
        if what is PodFate.GONE or time.monotonic() - started > ROUND_BUDGET_SECONDS:
            continue
        namespace, name = _ref(pod)
        if forced:
            kube.delete_pod(namespace, name)
            evicted += 1
            continue
        if what is PodFate.HELD:
            held += 1
            continue
        try:
            kube.evict_pod(namespace, name)
            evicted += 1
        except (Transient, Forbidden) as exc:  # a budget's 429 (or one Pod's trouble): next round asks again
            log.info("drain of node %s: %s", node, exc)
            refused += 1
    return c.DrainRound(
        left=left, evicted=evicted, refused=refused, held=held, forced=forced, bound_seconds=bound_seconds
    )


def _budget_words(budget: JSON) -> str:
    meta, status = budget.get("metadata") or {}, budget.get("status") or {}
    return (
        f"PodDisruptionBudget {meta.get('namespace')}/{meta.get('name')}: "
        f"{status.get('currentHealthy', '?')} healthy, {status.get('desiredHealthy', '?')} needed, "
        f"{status.get('disruptionsAllowed', '?')} disruptions allowed"
    )


def _why(pod: JSON, budgets: Sequence[JSON]) -> str:
    what = fate(pod)
    if what is PodFate.HELD:
        return "annotated not to be disrupted (safe-to-evict: false or do-not-disrupt: true)"
    if what is PodFate.GONE:
        return "terminating"
    labels = (pod.get("metadata") or {}).get("labels") or {}
    mine = [b for b in budgets if selects((b.get("spec") or {}).get("selector"), labels)]
    return "; ".join(_budget_words(b) for b in mine) or "waiting for its eviction"


def blocked_words(kube: Kube, node: str) -> str:
    """Which Pods keep the drain of `node` from finishing, and why (the budget and its figures, or the annotation)."""
    pods = [p for p in kube.pods_on_node(node) if fate(p) is not PodFate.SKIP]
    budgets: dict[str, list[dict[str, Any]]] = {}
    said: list[str] = []
    for pod in pods[:NAMED_AT_MOST]:
        namespace, name = _ref(pod)
        if namespace not in budgets:
            budgets[namespace] = kube.budgets(namespace)
        said.append(f"Pod {namespace}/{name} ({_why(pod, budgets[namespace])})")
    more = len(pods) - len(said)
    return "; ".join(said) + (f"; and {more} more" if more > 0 else "")
