"""The groups and slots the provider serves, read from Kubernetes and shared by every call for a moment.

cluster-autoscaler asks NodeGroupForNode once per node per loop and NodeGroups, GetOptions and pricing
around it; one listing per loop (reused for `catalog_ttl_seconds`, dropped on Refresh) keeps the API server
out of the hot path. The Group resource is the authority on min/max and the autoscaler options; the group
workflow is the authority on sizes and instances (see `provider.temporal`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from api import names
from api.v2alpha1 import GroupSpec, Pricing
from kube import views
from kube.adapter import GROUPS, SLOTS, Kube
from kube.errors import KubeError
from kube.objects import meta, spec
from provider.errors import unavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlotInfo:
    """One slot as the provider matches nodes to it: every name cluster-autoscaler may call it by."""

    namespace: str
    name: str
    group: str
    node_name: str
    provider_id: str  # spec.providerID, else homelab://<namespace>/<slot>
    pricing: Pricing | None

    def known_as(self, ident: str) -> bool:
        return bool(ident) and ident in (self.provider_id, self.node_name, self.name)


@dataclass(frozen=True)
class GroupInfo:
    """One Group resource, its node-group id, and its slots."""

    id: str
    namespace: str
    name: str
    spec: GroupSpec
    slots: tuple[SlotInfo, ...]

    def slot_for(self, provider_id: str, name: str, labels: Mapping[str, str]) -> SlotInfo | None:
        """The slot a node (real or fake) belongs to: by providerID, then by name, then by the slot label."""
        for ident in (provider_id, name):
            for slot in self.slots:
                if slot.known_as(ident):
                    return slot
        if labels.get(names.LABEL_GROUP) == names.label_value(self.name):  # labels hold bounded names
            for slot in self.slots:
                if labels.get(names.LABEL_NODE) == names.label_value(slot.name):
                    return slot
        return None


@dataclass(frozen=True)
class Snapshot:
    groups: tuple[GroupInfo, ...]

    def by_id(self, group_id: str) -> GroupInfo | None:
        for g in self.groups:
            if g.id == group_id or f"{g.namespace}/{g.name}" == group_id:
                return g
        return None


class Catalog:
    """Lists Groups and slots of the served namespaces; one listing at a time, reused for `ttl` seconds."""

    def __init__(
        self,
        kube: Kube,
        namespaces: Iterable[str],
        *,
        ttl: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.namespaces = tuple(dict.fromkeys(namespaces))
        self.ttl = ttl
        self.clock = clock
        self._held: Snapshot | None = None
        self._taken = 0.0
        self._lock = asyncio.Lock()
        self._warned: set[tuple[str, ...]] = set()

    def group_id(self, namespace: str, group: str) -> str:
        """`<group>` when one namespace is served (the usual homelab), `<namespace>/<group>` otherwise."""
        return group if len(self.namespaces) == 1 else f"{namespace}/{group}"

    def invalidate(self) -> None:
        """Refresh: cluster-autoscaler starts a loop, so the next read lists afresh."""
        self._held = None

    async def snapshot(self) -> Snapshot:
        async with self._lock:
            if self._held is None or self.clock() - self._taken > self.ttl:
                try:
                    self._held = await asyncio.to_thread(self._list)
                except KubeError as err:
                    raise unavailable(f"cannot list Groups and slots in {', '.join(self.namespaces)}: {err}") from err
                self._taken = self.clock()
            return self._held

    def _list(self) -> Snapshot:
        groups: list[GroupInfo] = []
        for ns in self.namespaces:
            raw_groups = self.kube.list_raw(GROUPS, ns)[0]
            raw_slots = self.kube.list_raw(SLOTS, ns)[0]
            slots = [slot for obj in raw_slots if (slot := self._slot(ns, obj)) is not None]
            for obj in raw_groups:
                name = meta(obj).get("name")
                if not isinstance(name, str) or not name:
                    continue
                members = tuple(sorted((s for s in slots if s.group == name), key=lambda s: s.name))
                groups.append(GroupInfo(self.group_id(ns, name), ns, name, self._group_spec(ns, obj), members))
        return Snapshot(tuple(sorted(groups, key=lambda g: g.id)))

    def _slot(self, ns: str, obj: Mapping[str, Any]) -> SlotInfo | None:
        """A slot by its identity alone: one whose pod spec is wrong is still a machine of its group (its node
        must still be matched), and the group workflow keeps it out of slot choice.
        """
        name, sp = meta(obj).get("name"), spec(obj)
        group, node_name = sp.get("group"), sp.get("kubernetesNodeName")
        if not all(isinstance(v, str) and v for v in (name, group, node_name)):
            problem = views.slot_problem(obj) or "spec.group and spec.kubernetesNodeName are required"
            self._warn("slot", ns, obj, problem)
            return None
        pricing: Pricing | None = None
        if sp.get("pricing") is not None:
            try:
                pricing = Pricing.model_validate(sp["pricing"])
            except ValidationError as err:
                self._warn("slot", ns, obj, views.problem_of(err, "spec.pricing"))
        provider_id = sp.get("providerID")
        return SlotInfo(
            namespace=ns,
            name=str(name),
            group=str(group),
            node_name=str(node_name),
            provider_id=provider_id
            if isinstance(provider_id, str) and provider_id
            else names.provider_id(ns, str(name)),
            pricing=pricing,
        )

    def _group_spec(self, ns: str, obj: Mapping[str, Any]) -> GroupSpec:
        """The Group's spec; one that does not fit is served with its bounds alone (its workflow refuses to grow it
        and says why), so its nodes stay matched to it.
        """
        found = views.group_spec(obj)
        if isinstance(found, GroupSpec):
            return found
        self._warn("Group", ns, obj, found)
        bounds = {k: v for k in ("minSize", "maxSize") if isinstance(v := spec(obj).get(k), int) and v >= 0}
        try:
            return GroupSpec.model_validate(bounds if "maxSize" in bounds else {"maxSize": 0})
        except ValidationError:
            return GroupSpec.model_validate({"maxSize": 0})

    def _warn(self, kind: str, ns: str, obj: Mapping[str, Any], problem: str) -> None:
        """Once per version of an object: what is wrong, by field (never a pod spec's value)."""
        m = meta(obj)
        key = (kind, ns, str(m.get("name")), str(m.get("uid")), str(m.get("generation")))
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s %s/%s: %s", kind, ns, m.get("name"), problem)
