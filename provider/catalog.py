"""The groups and slots the provider serves, read from Kubernetes and shared by every call.

cluster-autoscaler asks NodeGroupForNode once per node per loop and NodeGroups, GetOptions and pricing around
it. Watched (the process's way): the Groups and slots are listed once and then followed by watches, so a loop's
reads cost no API request and a changed object is parsed once, when it changes. Unwatched (or while a watch has
not listed yet): one listing per loop, reused for `catalog_ttl_seconds` and dropped on Refresh. The Group
resource is the authority on min/max and the autoscaler options; the group workflow on sizes and instances.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from api import names
from api.v2alpha1 import GroupSpec, Pricing
from kube import views
from kube.adapter import GROUPS, JSON, SLOTS, Kube, Resource
from kube.errors import KubeError
from kube.objects import meta, spec
from kube.watch import DELETED, SYNCED, WATCH_WINDOW, Watch
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
        # Watched: the objects as the watches last delivered them, a version bumped on every change, the
        # snapshot built from them and the version it was built at, and each slot parsed once per resourceVersion.
        self._watches: list[tuple[Watch, threading.Thread]] = []
        self._objects: dict[tuple[str, str, str], JSON] = {}
        self._synced: set[tuple[str, str]] = set()
        self._version = 0
        self._built: tuple[int, Snapshot] | None = None
        self._parsed: dict[tuple[str, str, str], SlotInfo | None] = {}
        self._mutex = threading.Lock()

    # --- watched --------------------------------------------------------------------------------------------
    def watch(self, window: int = WATCH_WINDOW) -> None:
        """Follow the Groups and slots of every served namespace, each watch on a thread of its own."""
        for ns in self.namespaces:
            for res in (GROUPS, SLOTS):
                w = Watch(self.kube, res, ns, window=window)
                thread = threading.Thread(target=self._follow, args=(w, res, ns), name=f"catalog {res.plural} {ns}")
                thread.daemon = True  # close() stops it; a daemon never holds the interpreter at exit
                self._watches.append((w, thread))
                thread.start()

    def close(self) -> None:
        """Stop the watches and wait (bounded) for their threads."""
        for w, _ in self._watches:
            w.close()
        for _, thread in self._watches:
            thread.join(timeout=5)
        self._watches.clear()

    @property
    def watched(self) -> bool:
        """Every watch has listed once (and none has died): snapshots come from what they delivered."""
        return bool(self._watches) and len(self._synced) == 2 * len(self.namespaces) == len(self._watches)

    def _follow(self, w: Watch, res: Resource, ns: str) -> None:
        try:
            self._deliver(w, res, ns)
        except Exception:  # a watch that died must not leave the catalog frozen: list per loop again instead
            log.exception("catalog watch of %s in %s stopped; listing per loop from now on", res.plural, ns)
            with self._mutex:
                self._watches = [(x, t) for x, t in self._watches if x is not w]
                self._synced.clear()

    def _deliver(self, w: Watch, res: Resource, ns: str) -> None:
        for event in w.events():
            with self._mutex:
                if event.type == SYNCED:
                    self._synced.add((res.plural, ns))
                elif event.object is not None:
                    key = (res.plural, ns, str(meta(event.object).get("name") or ""))
                    if event.type == DELETED:
                        self._objects.pop(key, None)
                    else:
                        self._objects[key] = event.object
                self._version += 1

    def _watched_snapshot(self) -> Snapshot:
        with self._mutex:
            if self._built is not None and self._built[0] == self._version:
                return self._built[1]
            version, objects = self._version, dict(self._objects)
        by_ns: dict[str, tuple[list[JSON], list[JSON]]] = {ns: ([], []) for ns in self.namespaces}
        for (plural, ns, _), obj in objects.items():
            by_ns[ns][0 if plural == GROUPS.plural else 1].append(obj)
        snap = self._assemble({ns: (g, self._slots_once(ns, sl)) for ns, (g, sl) in by_ns.items()})
        with self._mutex:
            self._built = (version, snap)
        return snap

    def _slots_once(self, ns: str, objs: list[JSON]) -> list[SlotInfo]:
        """Slots parsed once per version of each: a loop's reads re-parse nothing that did not change."""
        out: list[SlotInfo] = []
        live: set[tuple[str, str, str]] = set()
        for obj in objs:
            m = meta(obj)
            key = (ns, str(m.get("uid") or m.get("name")), str(m.get("resourceVersion") or ""))
            live.add(key)
            if key not in self._parsed:
                self._parsed[key] = self._slot(ns, obj)
            if (slot := self._parsed[key]) is not None:
                out.append(slot)
        # Versions no longer current are dropped, so the memo stays the size of the homelab.
        self._parsed = {k: v for k, v in self._parsed.items() if k[0] != ns or k in live}
        return out

    def group_id(self, namespace: str, group: str) -> str:
        """`<group>` when one namespace is served (the usual homelab), `<namespace>/<group>` otherwise."""
        return group if len(self.namespaces) == 1 else f"{namespace}/{group}"

    def invalidate(self) -> None:
        """Refresh: cluster-autoscaler starts a loop, so the next read lists afresh (watched: it is fresh)."""
        self._held = None

    async def snapshot(self) -> Snapshot:
        if self.watched:
            return self._watched_snapshot()
        async with self._lock:
            if self._held is None or self.clock() - self._taken > self.ttl:
                try:
                    self._held = await asyncio.to_thread(self._list)
                except KubeError as err:
                    raise unavailable(f"cannot list Groups and slots in {', '.join(self.namespaces)}: {err}") from err
                self._taken = self.clock()
            return self._held

    def _list(self) -> Snapshot:
        listed: dict[str, tuple[list[JSON], list[SlotInfo]]] = {}
        for ns in self.namespaces:
            raw_groups = self.kube.list_raw(GROUPS, ns)[0]
            raw_slots = self.kube.list_raw(SLOTS, ns)[0]
            listed[ns] = (raw_groups, [slot for obj in raw_slots if (slot := self._slot(ns, obj)) is not None])
        return self._assemble(listed)

    def _assemble(self, listed: Mapping[str, tuple[list[JSON], list[SlotInfo]]]) -> Snapshot:
        """Groups with their slots, in id order, from each namespace's Group objects and parsed slots."""
        groups: list[GroupInfo] = []
        for ns, (raw_groups, slots) in listed.items():
            members_of: dict[str, list[SlotInfo]] = {}
            for slot in slots:
                members_of.setdefault(slot.group, []).append(slot)
            for obj in raw_groups:
                name = meta(obj).get("name")
                if not isinstance(name, str) or not name:
                    continue
                members = tuple(sorted(members_of.get(name, []), key=lambda s: s.name))
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
