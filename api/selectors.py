"""A metav1.LabelSelector matched against labels: how a PodDisruptionBudget picks its Pods (the operator names
the budget in a blocked drain's Warning; the emulator judges evictions with it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """True when `selector` selects `labels`; in policy/v1 an empty selector selects every Pod, a missing one none."""
    if selector is None:
        return False
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key", ""), expr.get("operator", ""), list(expr.get("values") or [])
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True
