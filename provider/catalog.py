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
from typing import TypeVar

from pydantic import ValidationError

from api import names
from api.v2alpha1 import Group, GroupSpec, Node, Pricing
from kube.adapter import GROUPS, SLOTS, Kube
from kube.errors import KubeError
from provider.errors import unavailable

log = logging.getLogger(__name__)
M = TypeVar("M", Group, Node)


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
        if labels.get(names.LABEL_GROUP) == self.name:
            for slot in self.slots:
                if labels.get(names.LABEL_NODE) == slot.name:
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
            slots: list[SlotInfo] = []
            for obj in raw_slots:
                slot = _parse(Node, obj)
                if slot is None or slot.metadata.name is None:
                    continue
                slots.append(
                    SlotInfo(
                        namespace=ns,
                        name=slot.metadata.name,
                        group=slot.spec.group,
                        node_name=slot.spec.kubernetes_node_name,
                        provider_id=slot.spec.provider_id or names.provider_id(ns, slot.metadata.name),
                        pricing=slot.spec.pricing,
                    )
                )
            for obj in raw_groups:
                group = _parse(Group, obj)
                if group is None or group.metadata.name is None:
                    continue
                name = group.metadata.name
                members = tuple(sorted((s for s in slots if s.group == name), key=lambda s: s.name))
                groups.append(GroupInfo(self.group_id(ns, name), ns, name, group.spec, members))
        return Snapshot(tuple(sorted(groups, key=lambda g: g.id)))


def _parse(model: type[M], obj: dict[str, object]) -> M | None:
    """One malformed resource is logged and skipped; it must not take every other group down with it."""
    try:
        return model.model_validate(obj)
    except ValidationError as err:
        meta = obj.get("metadata")
        where = meta.get("name") if isinstance(meta, dict) else "?"
        log.warning("skipping %s %s: it does not fit the v2alpha1 schema: %s", model.__name__, where, err.errors()[:1])
        return None
