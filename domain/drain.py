"""Which Pods a drain before a power-off moves, leaves, or must wait for: cluster-autoscaler's rules, so a user
learns one set. Pure functions over the Pods as the API server returns them."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from api import names

JSON = Mapping[str, Any]


class PodFate(StrEnum):
    """What the drain does with one Pod on the node."""

    SKIP = "skip"  # a DaemonSet's, a mirror, or finished: it does not keep the machine on
    GONE = "gone"  # already terminating: waited for, nothing to send
    HELD = "held"  # annotated not to be disrupted: blocks the power-off until it leaves or a person forces it
    EVICT = "evict"  # asked to leave through the Eviction API (its budget may refuse)


def _meta(pod: JSON) -> JSON:
    return pod.get("metadata") or {}


def daemon_set_pod(pod: JSON) -> bool:
    """A DaemonSet's Pod would be put back on the node at once; the drain leaves it, as `kubectl drain` does."""
    owners = _meta(pod).get("ownerReferences") or []
    return any(o.get("kind") == "DaemonSet" and o.get("controller") for o in owners if isinstance(o, Mapping))


def held(pod: JSON) -> bool:
    """Annotated by its owner not to be moved: cluster-autoscaler's and karpenter's words for it."""
    annotations = _meta(pod).get("annotations") or {}
    return (
        str(annotations.get(names.ANNOTATION_SAFE_TO_EVICT, "")).lower() == "false"
        or str(annotations.get(names.ANNOTATION_DO_NOT_DISRUPT, "")).lower() == "true"
    )


def fate(pod: JSON) -> PodFate:
    """What the drain does with this Pod (the first rule that applies)."""
    meta = _meta(pod)
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Succeeded", "Failed") or names.ANNOTATION_MIRROR_POD in (meta.get("annotations") or {}):
        return PodFate.SKIP
    if daemon_set_pod(pod):
        return PodFate.SKIP
    if meta.get("deletionTimestamp"):
        return PodFate.GONE
    if held(pod):
        return PodFate.HELD
    return PodFate.EVICT


def forced(*annotation_maps: Mapping[str, str] | None) -> bool:
    """A person's force annotation on the slot or its claim."""
    return any(str((m or {}).get(names.ANNOTATION_FORCE_DRAIN, "")).lower() == "true" for m in annotation_maps)
