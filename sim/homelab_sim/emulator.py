"""A faithful-enough Kubernetes API server for tests and the simulator, built on kmock 0.8.

Stock ``kmock.KubernetesEmulator`` gets several semantics wrong that the operator depends on (no
resourceVersion/409, no label selectors, no ``/status`` separation, 200 instead of 201 on create,
watches without resume/timeout/410, injected errors that still apply the write — see
``/work/shared/reference/k8s-emulator.md``). ``KubeEmulator`` keeps kmock's discovery, error rendering
and ``kmock.Server`` plumbing, but serves every resource request (``/api/v1/...``, ``/apis/G/V/...``)
from its own store so those semantics are right, and so the real ``kubernetes`` client and ``kubectl``
can talk to it over HTTP.

Strict mode (the default; ``strict=False``, or ``HOMELAB_EMULATOR_STRICT=0`` for every emulator not told
otherwise, turns it off) judges every create, update and patch that arrives over HTTP as kube-apiserver does —
CRD schemas with pruning, defaulting and CEL rules, the official schemas of built-in kinds, object metadata
rules — see ``emulator_strict``. The direct helpers ``put_object`` and ``patch_object`` write to the store
as etcd would take it, past admission (``patch_object(..., admit=True)`` is judged like a client's write): that
is how a test stores an object a real server would refuse today (one an older server or schema took). Lists page with
``limit``/``continue`` and honour ``resourceVersionMatch`` (``emulator_pages``); ``kubectl get`` gets the real
table columns of the built-in kinds (``emulator_tables``), each row with the object ``includeObject`` asks for (so
``--sort-by`` works). A created Job gets the selector, template labels and defaults the Job strategy gives it
(``emulator_strategy``); ``pods/log`` serves what a simulated kubelet wrote to ``logs`` (``emulator_logs``).

Validating admission webhooks are called as kube-apiserver calls them, for writes that arrive over HTTP, and a
request's bearer token names its user (``emulator_webhooks``); nothing is authorized by it.

Not implemented (tests must not rely on these): server-side apply (``application/apply-patch+yaml``
→ 415), mutating admission, RBAC, built-in defaulting (``SetDefaults_*``) but a Job's, consistent snapshots for
continued list pages, Foreground deletion (treated as Background), GC of objects whose owners never existed, namespace
existence checks and namespace deletion cascading, controllers (no Job/Pod/Node progress), periodic bookmarks,
watch as Table, and field selectors are accepted for any dotted path (a real server allows a per-kind
list). Strategic merge patch is the approximation documented in ``emulator_patch``. kmock's reaction DSL
(``emulator['patch ...'] << 500``) does not apply to resource paths, which this class serves itself: inject
failures with ``emulator.faults`` instead (they fire before any state change).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import datetime
import json
import logging
import random
import signal
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, TypeVar

import aiohttp.web
import kmock
from kubernetes import client as k8s_client

from homelab_sim.emulator_core import KUBERNETES_VERSION
from homelab_sim.emulator_errors import ApiError
from homelab_sim.emulator_eviction import BUDGETS, budget_status, evict
from homelab_sim.emulator_logs import ContainerLogs, log_container, render_log
from homelab_sim.emulator_pages import (
    decode_continue,
    paginate,
    too_large_rv,
    validate_list_options,
)
from homelab_sim.emulator_patch import PatchError, json_patch, merge_patch, strategic_merge_patch
from homelab_sim.emulator_resources import (
    CRD_GROUP,
    CRD_VERSION,
    DEFAULT_RESOURCES,
    PODS,
    ResKey,
    ResourceSpec,
)
from homelab_sim.emulator_select import SelectorError, parse_field_selector, parse_label_selector
from homelab_sim.emulator_strategy import DEFAULT_STORED, PREPARE_FOR_CREATE
from homelab_sim.emulator_strict import Admission, strict_by_default
from homelab_sim.emulator_tables import INCLUDE_OBJECT, TABLES, crd_columns, table
from homelab_sim.emulator_webhooks import (
    ANONYMOUS,
    WEBHOOK_CONFIGURATIONS,
    Attributes,
    UserInfo,
    WebhookCall,
    call_webhooks,
    matching,
)

__all__ = [
    "CRD_GROUP",
    "CRD_VERSION",
    "DEFAULT_RESOURCES",
    "ApiError",
    "EmulatorServer",
    "Fault",
    "KubeEmulator",
    "Listener",
    "RequestInfo",
    "ResourceSpec",
    "StrictRecord",
    "UserInfo",
    "WatchEvent",
    "WebhookCall",
    "format_time",
]

T = TypeVar("T")
Listener = Callable[[str, "ResourceSpec", dict[str, Any], dict[str, Any] | None], None]
"""``listener(kind, spec, obj, old)``: told of every stored change (kind ADDED/MODIFIED/DELETED)."""
_log = logging.getLogger(__name__)
ObjKey = tuple[str | None, str]  # (namespace, name) within one resource
Obj = dict[str, Any]

_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the API server's own alphabet (no vowels)
_GENERATED_PREFIX_MAX = 58  # maxGeneratedNameLength: 63 less the 5 random characters
_WATCH_TRUE = frozenset({"true", "1", "True", "TRUE", "yes"})
# Paths under this prefix are the simulator's own controls (see `KubeEmulator.control`), not the Kubernetes API.
CONTROL_PREFIX = "/_sim/"


def format_time(moment: datetime.datetime) -> str:
    """RFC 3339 with a ``Z`` suffix, second precision, as the API server writes timestamps."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class RequestInfo:
    """One request as the emulator understood it; ``emulator.requests`` keeps them all (for RBAC checks).

    ``verb`` uses the RBAC verbs: get, list, watch, create, update, patch, delete, deletecollection
    (and the HTTP method lower-cased for non-resource paths such as discovery).
    """

    verb: str
    method: str
    path: str
    group: str | None
    version: str | None
    plural: str | None
    namespace: str | None
    name: str | None
    subresource: str | None
    params: Mapping[str, str] = field(default_factory=dict, hash=False)
    body: Any = field(default=None, hash=False, compare=False, repr=False)
    content_type: str = ""
    user: UserInfo = field(default=ANONYMOUS, hash=False, compare=False)

    @property
    def action(self) -> str:
        """Alias of ``verb`` for readers used to kmock's naming."""
        return self.verb

    @property
    def resource_key(self) -> ResKey | None:
        if self.group is None or self.version is None or self.plural is None:
            return None
        return (self.group, self.version, self.plural)


@dataclass
class Fault:
    """An injected failure or delay, checked before any state change (so a failed write changes nothing).

    ``match`` gets the ``RequestInfo``; the first matching fault fires. ``delay`` sleeps first; then the
    request fails with ``status``/``reason`` or, when ``status`` is None, proceeds normally. ``times``
    counts down and the fault is removed at zero; None fires forever.
    """

    match: Callable[[RequestInfo], bool] = lambda _info: True
    status: int | None = 500
    times: int | None = 1
    delay: float = 0.0
    reason: str = "InternalError"
    message: str = "injected fault"


@dataclass(frozen=True)
class StrictRecord:
    """What strict mode did to one write: refused it (``status`` 400/422) or pruned fields (``warnings``)."""

    verb: str
    resource: str
    namespace: str | None
    name: str
    status: int
    message: str
    warnings: tuple[str, ...] = ()
    causes: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class WatchEvent:
    """One entry of a resource's event log: the new state and, for MODIFIED, the state before."""

    rv: int
    type: str
    obj: Obj
    old: Obj | None = None


@dataclass
class _Log:
    events: deque[WatchEvent]
    dropped_upto: int = 0  # the rv of the newest event that fell out of the bounded log


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


class KubeEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with real API-server semantics for the resources it declares.

    All state changes happen synchronously on the server's event loop (no ``await`` in between), so
    requests are atomic without a lock. Direct helpers (``get_object``, ``put_object``,
    ``patch_object``, ``delete_object``, ``objects_of``) must be called on that loop too — from another
    thread use ``EmulatorServer.call``. ``listeners`` (``fn(kind, spec, obj, old)``) are called on that
    loop after every stored change, which is how simulated controllers (``sim.homelab``) react to writes.
    """

    def __init__(
        self,
        *,
        resources: Iterable[ResourceSpec] = DEFAULT_RESOURCES,
        clock: Callable[[], datetime.datetime] = _utc_now,
        event_log_size: int = 1000,
        strict: bool | None = None,
        users: Mapping[str, UserInfo] | None = None,
    ) -> None:
        super().__init__()
        self.clock = clock
        self.users: dict[str, UserInfo] = dict(users or {})  # bearer token → who sends it
        self.webhook_calls: deque[WebhookCall] = deque(maxlen=10000)
        self.strict = strict_by_default() if strict is None else strict
        self.admission = Admission()
        self.strict_log: list[StrictRecord] = []
        self._warnings: list[str] = []
        self.event_log_size = event_log_size
        self.specs: dict[ResKey, ResourceSpec] = {}
        self.store: dict[ResKey, dict[ObjKey, Obj]] = {}
        self.faults: list[Fault] = []
        self.requests: list[RequestInfo] = []
        self.listeners: list[Listener] = []
        self.compacted_below: int = 0
        self.control: dict[str, Callable[[Obj | None], Obj]] = {  # `/_sim/<name>`: the simulator's own surface
            "webhook-calls": lambda _: {"calls": [c.as_json() for c in self.webhook_calls]},
        }
        self.logs = ContainerLogs()  # containers' output, written by whoever plays their kubelet
        self._watch_epoch = 0
        self._rv = 0
        self._logs: dict[ResKey, _Log] = {}
        self._uids: dict[str, tuple[ResKey, ObjKey]] = {}
        self._orphan_on_removal: set[str] = set()
        self._wakeups: set[asyncio.Event] = set()
        self._closing = False
        self._pending: deque[tuple[str, ResourceSpec, Obj, Obj | None]] = deque()
        self._dispatching = False
        for spec in resources:
            self.declare(spec)

    # ----------------------------------------------------------------------------------------------
    # Declarations and direct state access (call on the server loop).

    def declare(self, spec: ResourceSpec) -> None:
        """Serve one more resource (also advertised in discovery)."""
        self.specs[spec.key] = spec
        self.store.setdefault(spec.key, {})
        self._logs.setdefault(spec.key, _Log(deque(maxlen=self.event_log_size)))
        self.resources[kmock.resource(spec.group, spec.version, spec.plural)] = kmock.ResourceInfo(
            kind=spec.kind,
            namespaced=spec.namespaced,
            singular=spec.singular,
            verbs=set(spec.verbs),
            shortnames=set(spec.short_names),
            categories=set(spec.categories),
            subresources={"status"} if spec.status_subresource else set(),
        )

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out (a global counter, like etcd's revision)."""
        return self._rv

    def spec_of(self, group_version: str, plural: str) -> ResourceSpec:
        group, _, version = group_version.rpartition("/")
        try:
            return self.specs[(group, version, plural)]
        except KeyError:
            raise KeyError(f"resource {plural} in {group_version!r} is not declared") from None

    def get_object(self, group_version: str, plural: str, namespace: str | None, name: str) -> Obj | None:
        """A deep copy of the stored object, or None."""
        obj = self.store[self.spec_of(group_version, plural).key].get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def objects_of(self, group_version: str, plural: str, namespace: str | None = None) -> list[Obj]:
        """Deep copies of all stored objects of a resource (optionally of one namespace), sorted."""
        items = self.store[self.spec_of(group_version, plural).key]
        return [
            copy.deepcopy(obj)
            for (ns, _), obj in sorted(items.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))
            if namespace is None or ns == namespace
        ]

    def put_object(self, group_version: str, plural: str, obj: Mapping[str, Any], namespace: str | None = None) -> Obj:
        """Seed or overwrite an object verbatim (status included), stamping missing server metadata.

        Emits ADDED or MODIFIED to watchers and bumps the resourceVersion, like a real write would. Never judged
        by strict mode: it stands for what is already in etcd, however it got there.
        """
        spec = self.spec_of(group_version, plural)
        body = copy.deepcopy(dict(obj))
        meta = body.setdefault("metadata", {})
        if spec.namespaced:
            meta["namespace"] = namespace or meta.get("namespace") or "default"
        else:
            meta.pop("namespace", None)
        key: ObjKey = (meta.get("namespace"), meta["name"])
        old = self.store[spec.key].get(key)
        if old is None:
            self._stamp(spec, body)
            return self._insert(spec, key, body)
        new_meta = body["metadata"]
        for field_name in ("uid", "creationTimestamp"):
            new_meta.setdefault(field_name, _meta(old).get(field_name))
        new_meta.setdefault("generation", _meta(old).get("generation", 1))
        body.setdefault("apiVersion", spec.api_version)
        body.setdefault("kind", spec.kind)
        return self._commit(spec, key, old, body)

    def patch_object(
        self,
        group_version: str,
        plural: str,
        namespace: str | None,
        name: str,
        patch: Mapping[str, Any],
        subresource: str | None = None,
        *,
        admit: bool = False,
    ) -> Obj:
        """Merge-patch an object as a client would (status isolation, immutable metadata, generation).

        Strict mode judges it only with ``admit=True`` (the simulated controllers' writes, as a kubelet's are
        judged); by default it stores what a test hands it, as ``put_object`` does.
        """
        spec = self.spec_of(group_version, plural)
        key: ObjKey = (namespace if spec.namespaced else None, name)
        old = self._require(spec, key)
        new = merge_patch(old, dict(patch))
        return self._write(spec, key, old, new, subresource, admit=admit)

    def delete_object(
        self, group_version: str, plural: str, namespace: str | None, name: str, orphan: bool = False
    ) -> Obj:
        """Delete as a client would: finalizers make it terminating, otherwise removed (with GC)."""
        spec = self.spec_of(group_version, plural)
        key: ObjKey = (namespace if spec.namespaced else None, name)
        return self._delete(spec, key, orphan=orphan)

    def generate_name(self, group_version: str, plural: str, namespace: str | None, prefix: str) -> str:
        """A name for ``generateName: prefix`` no object of the resource has, as the API server makes it."""
        return self._generate_name(self.spec_of(group_version, plural), namespace, prefix)

    def _generate_name(self, spec: ResourceSpec, namespace: str | None, prefix: str) -> str:
        """``SimpleNameGenerator``: the prefix cut to 58 characters, then 5 random ones (a name stays within 63)."""
        items = self.store[spec.key]
        for _ in range(16):
            name = prefix[:_GENERATED_PREFIX_MAX] + "".join(random.choices(_GENERATE_ALPHABET, k=5))
            if (namespace, name) not in items:
                return name
        raise ApiError(409, "AlreadyExists", "could not generate a unique name")

    def shutdown_watches(self) -> None:
        """End every open watch stream (used before the server stops, so shutdown never hangs)."""
        self._closing = True
        self._wake()

    def drop_watches(self) -> None:
        """End every open watch stream now, as a restarted API server or a dropped connection does; new ones
        are served as usual (clients resume from the last resourceVersion they saw)."""
        self._watch_epoch += 1
        self._wake()

    def compact(self) -> None:
        """Forget history, as etcd compaction does: a watch or list resumed from an older version gets 410."""
        self.compacted_below = self._rv

    # ----------------------------------------------------------------------------------------------
    # The core state machine (synchronous: atomic on the event loop).

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _wake(self) -> None:
        for event in self._wakeups:
            event.set()

    def _emit(self, spec: ResourceSpec, kind: str, obj: Obj, old: Obj | None = None) -> None:
        log = self._logs[spec.key]
        if log.events.maxlen is not None and len(log.events) == log.events.maxlen:
            log.dropped_upto = log.events[0].rv
        log.events.append(WatchEvent(int(_meta(obj)["resourceVersion"]), kind, copy.deepcopy(obj), old))
        self._wake()
        if self.listeners:
            self._pending.append((kind, spec, copy.deepcopy(obj), copy.deepcopy(old)))
            self._dispatch()

    def _dispatch(self) -> None:
        """Tell ``listeners`` of stored changes, in commit order, each change to every listener.

        Runs after the change is stored. A listener may write (``put_object`` …) re-entrantly: the change it
        makes is stored and logged at once, but its notification is queued behind the one being delivered,
        so every listener sees changes in resourceVersion order. The queue is drained before the outermost
        write returns, i.e. before the HTTP response that caused it. A failing listener is logged, not raised:
        the write it reacts to has already happened.
        """
        if self._dispatching:
            return
        self._dispatching = True
        try:
            while self._pending:
                kind, spec, obj, old = self._pending.popleft()
                for listener in list(self.listeners):
                    try:
                        listener(kind, spec, copy.deepcopy(obj), copy.deepcopy(old))
                    except Exception:
                        _log.exception("emulator listener %r failed on %s %s", listener, kind, spec.plural)
        finally:
            self._dispatching = False

    def _require(self, spec: ResourceSpec, key: ObjKey) -> Obj:
        obj = self.store[spec.key].get(key)
        if obj is None:
            group_plural = f"{spec.plural}.{spec.group}" if spec.group else spec.plural
            raise ApiError(
                404,
                "NotFound",
                f'{group_plural} "{key[1]}" not found',
                {"name": key[1], "group": spec.group, "kind": spec.plural},
            )
        return obj

    def _stamp(self, spec: ResourceSpec, body: Obj) -> None:
        body["apiVersion"] = spec.api_version
        body["kind"] = spec.kind
        meta = body.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", format_time(self.clock()))
        meta.setdefault("generation", 1)

    def _insert(self, spec: ResourceSpec, key: ObjKey, body: Obj) -> Obj:
        body["metadata"]["resourceVersion"] = str(self._next_rv())
        self.store[spec.key][key] = body
        self._uids[body["metadata"]["uid"]] = (spec.key, key)
        self._emit(spec, "ADDED", body)
        return copy.deepcopy(body)

    def _commit(self, spec: ResourceSpec, key: ObjKey, old: Obj, new: Obj) -> Obj:
        """Store ``new`` over ``old`` if anything changed; finish a terminating object with no finalizers."""
        new["metadata"]["resourceVersion"] = _meta(old).get("resourceVersion")
        if new == old:
            return copy.deepcopy(old)
        new["metadata"]["resourceVersion"] = str(self._next_rv())
        self.store[spec.key][key] = new
        self._emit(spec, "MODIFIED", new, copy.deepcopy(old))
        if _meta(new).get("deletionTimestamp") and not _meta(new).get("finalizers"):
            return self._remove(spec, key)
        return copy.deepcopy(new)

    def _admit(
        self,
        spec: ResourceSpec,
        verb: str,
        new: Obj,
        old: Obj | None,
        field_validation: str | None,
        subresource: str | None = None,
    ) -> Obj:
        """Strict mode's judgement of a write: the object to store (pruned, defaulted), or ApiError (400/422).

        A no-op when not strict. Every refusal and pruning is kept in ``strict_log``; the pruning warnings of
        a client's own write (not of a listener's reaction to it) go to its response's ``Warning`` headers.
        """
        if not self.strict:
            return new
        meta = _meta(new)
        where = (verb, spec.plural, meta.get("namespace"), str(meta.get("name") or meta.get("generateName") or ""))
        try:
            admitted = self.admission.admit(spec, new, old, field_validation, subresource)
        except ApiError as exc:
            causes = tuple(exc.details.get("causes") or ())
            self.strict_log.append(StrictRecord(*where, exc.status, exc.message, (), causes))
            raise
        if admitted.warnings:
            self.strict_log.append(StrictRecord(*where, 200, "unknown fields pruned", admitted.warnings))
            if not self._dispatching:
                self._warnings.extend(admitted.warnings)
        return admitted.obj

    def _read(self, spec: ResourceSpec, obj: Obj) -> Obj:
        """An object as a read returns it (strict: with the CRD's defaults, as decoding from etcd applies them)."""
        return self.admission.read(spec, obj) if self.strict else obj

    def _write(
        self,
        spec: ResourceSpec,
        key: ObjKey,
        old: Obj,
        new: object,
        subresource: str | None,
        *,
        verb: str = "patch",
        field_validation: str | None = None,
        dry_run: bool = False,
        admit: bool = True,
    ) -> Obj:
        """Apply the subresource rules and immutable metadata to a proposed new state, admit it, then commit.

        Strict: the stored object is seen as a read decodes it (with its CRD defaults), as the server decodes the
        old object from etcd, so defaulting alone never looks like a spec change (no generation bump).
        """
        if not isinstance(new, dict):
            raise ApiError(422, "Invalid", "the patched object is not a JSON object")
        stored, old = old, self._read(spec, old)
        new = copy.deepcopy(new)
        if subresource not in (None, "status") or (subresource == "status" and not spec.status_subresource):
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({subresource})")
        if subresource == "status":
            result = copy.deepcopy(old)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
            new = result
        elif spec.status_subresource:
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        meta = new.get("metadata")
        if not isinstance(meta, dict):
            meta = new["metadata"] = {}
        old_meta = _meta(old)
        for immutable in ("name", "namespace", "uid", "creationTimestamp", "deletionTimestamp"):
            if immutable in old_meta:
                meta[immutable] = old_meta[immutable]
            else:
                meta.pop(immutable, None)
        if "deletionGracePeriodSeconds" in old_meta:
            meta["deletionGracePeriodSeconds"] = old_meta["deletionGracePeriodSeconds"]
        new["apiVersion"], new["kind"] = spec.api_version, spec.kind
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if added:
                raise ApiError(
                    422,
                    "Invalid",
                    f"metadata.finalizers: Forbidden: no new finalizers can be added if the object is being"
                    f" deleted, found new finalizers {sorted(added)!r}",
                )
        if not meta.get("finalizers"):
            meta.pop("finalizers", None)
        if admit:
            new = self._admit(spec, verb, new, old, field_validation, subresource)
        meta = new["metadata"]
        generation = int(old_meta.get("generation", 1))
        strip = ("metadata", "status")
        if {k: v for k, v in new.items() if k not in strip} != {k: v for k, v in old.items() if k not in strip}:
            generation += 1
        meta["generation"] = generation
        if dry_run:
            return new
        return self._commit(spec, key, stored, new)

    def _delete(self, spec: ResourceSpec, key: ObjKey, *, orphan: bool = False) -> Obj:
        obj = self._require(spec, key)
        meta = _meta(obj)
        if meta.get("deletionTimestamp"):
            return copy.deepcopy(obj)
        if meta.get("finalizers"):
            if orphan:
                self._orphan_on_removal.add(meta["uid"])
            new = copy.deepcopy(obj)
            new["metadata"]["deletionTimestamp"] = format_time(self.clock())
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            return self._commit(spec, key, obj, new)
        if orphan:
            self._orphan_on_removal.add(meta["uid"])
        return self._remove(spec, key)

    def _remove(self, spec: ResourceSpec, key: ObjKey) -> Obj:
        """Remove for good, emit DELETED, then garbage-collect dependents (background propagation).

        A dependent is deleted once none of its owners exists any more; while some owner remains, the
        dangling reference is removed from it (as the real garbage collector does). With Orphan, the
        reference is removed and the dependent kept.
        """
        obj = self.store[spec.key].pop(key)
        uid = _meta(obj)["uid"]
        self._uids.pop(uid, None)
        if spec.key == PODS:
            self.logs.forget(uid)
        obj["metadata"]["resourceVersion"] = str(self._next_rv())
        self._emit(spec, "DELETED", obj)
        orphan = uid in self._orphan_on_removal
        self._orphan_on_removal.discard(uid)
        dependents = [
            (dep_spec, dep_key)
            for dep_spec in self.specs.values()
            for dep_key, dep in self.store[dep_spec.key].items()
            if any(ref.get("uid") == uid for ref in _meta(dep).get("ownerReferences") or [])
        ]
        for dep_spec, dep_key in dependents:
            dep = self.store[dep_spec.key].get(dep_key)
            if dep is None:  # already collected through another path
                continue
            refs = _meta(dep).get("ownerReferences") or []
            alive = [ref for ref in refs if ref.get("uid") in self._uids]
            if orphan or alive:
                new = copy.deepcopy(dep)
                kept = [ref for ref in refs if ref.get("uid") != uid]
                if kept:
                    new["metadata"]["ownerReferences"] = kept
                else:
                    new["metadata"].pop("ownerReferences", None)
                self._commit(dep_spec, dep_key, dep, new)
            else:
                self._delete(dep_spec, dep_key)
        return obj

    # ----------------------------------------------------------------------------------------------
    # HTTP.

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Serve resource paths ourselves; hand discovery and anything else to kmock."""
        body_bytes = await raw_request.read()
        parsed = _parse_path(raw_request.path)
        params = dict(raw_request.query)
        content_type = raw_request.headers.get("Content-Type", "").split(";")[0].strip().lower()
        body: Any = None
        body_error = False
        if body_bytes:
            try:
                body = json.loads(body_bytes)
            except ValueError:
                body_error = True
        verb = _verb(raw_request.method, parsed, params)
        info = RequestInfo(
            verb=verb,
            method=raw_request.method,
            path=raw_request.path,
            group=parsed[0] if parsed else None,
            version=parsed[1] if parsed else None,
            plural=parsed[2] if parsed else None,
            namespace=parsed[3] if parsed else None,
            name=parsed[4] if parsed else None,
            subresource=parsed[5] if parsed else None,
            params=params,
            body=body,
            content_type=content_type,
        )
        if raw_request.path.startswith(CONTROL_PREFIX):  # the simulator's own surface: no faults, not logged
            return self._control(raw_request.path.removeprefix(CONTROL_PREFIX), body_bytes)
        user = self._user(raw_request)
        if user is None:  # a real server refuses a token it cannot authenticate, whatever the request
            return aiohttp.web.json_response(ApiError(401, "Unauthorized", "Unauthorized").body(), status=401)
        info = replace(info, user=user)
        self.requests.append(info)
        if parsed is None:
            discovery = self._discovery(raw_request.path.rstrip("/") or "/")
            if discovery is not None and raw_request.method == "GET":
                return aiohttp.web.json_response(discovery)
            response: aiohttp.web.StreamResponse = await super().__call__(raw_request)
            return response
        try:
            await self._apply_faults(info)
            if body_error:
                raise ApiError(400, "BadRequest", "the request body is not valid JSON")
            return await self._serve(raw_request, info)
        except ApiError as exc:
            return aiohttp.web.json_response(exc.body(), status=exc.status)
        except (PatchError, SelectorError) as exc:
            status, reason = (exc.status, exc.reason) if isinstance(exc, PatchError) else (400, "BadRequest")
            return aiohttp.web.json_response(ApiError(status, reason, str(exc)).body(), status=status)

    def _user(self, raw_request: aiohttp.web.BaseRequest) -> UserInfo | None:
        """Who sends the request: its bearer token's user, anonymous without one, None for a token not known; a
        user it impersonates (`kubectl --as`, `Impersonate-User`) instead, as a real server permitting it would."""
        impersonated = raw_request.headers.get("Impersonate-User", "").strip()
        if impersonated:
            groups = tuple(raw_request.headers.getall("Impersonate-Group", ())) or ("system:authenticated",)
            return UserInfo(impersonated, groups)
        scheme, _, token = raw_request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return ANONYMOUS
        return self.users.get(token.strip())

    def _control(self, name: str, body: bytes) -> aiohttp.web.StreamResponse:
        handler = self.control.get(name)
        if handler is None:
            return aiohttp.web.json_response({"error": f"no control {name!r}"}, status=404)
        try:
            arg = json.loads(body) if body else None
            return aiohttp.web.json_response(handler(arg))
        except (ValueError, KeyError, TypeError) as exc:
            return aiohttp.web.json_response({"error": str(exc)}, status=400)

    def _discovery(self, path: str) -> Obj | None:
        """Legacy discovery documents (kubectl falls back to them from aggregated discovery).

        Served here rather than by kmock because clients ask for ``/apis/`` and ``/version/`` with a
        trailing slash, and so that the order of groups and versions is deterministic.
        """
        groups: dict[str, list[str]] = {}
        for group, version, _ in self.specs:
            if group and version not in groups.setdefault(group, []):
                groups[group].append(version)

        def group_doc(group: str) -> Obj:
            versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in groups[group]]
            return {"name": group, "versions": versions, "preferredVersion": versions[0]}

        if path == "/":
            paths = ["/api", "/api/v1", "/apis", "/version"]
            paths += [f"/apis/{g}" for g in groups] + [f"/apis/{g}/{v}" for g in groups for v in groups[g]]
            return {"paths": paths}
        if path == "/version":
            return {
                "major": "1",
                "minor": KUBERNETES_VERSION.split(".")[1],
                "gitVersion": f"v{KUBERNETES_VERSION}.0-homelab-emulator",
                "gitCommit": "0000000000000000000000000000000000000000",
                "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.23",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        if path == "/api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
            }
        if path == "/apis":
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_doc(g) for g in groups]}
        parts = path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in groups:
            return {"kind": "APIGroup", "apiVersion": "v1", **group_doc(parts[1])}
        if (len(parts) == 2 and parts[0] == "api") or (len(parts) == 3 and parts[0] == "apis"):
            group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
            specs = [s for s in self.specs.values() if (s.group, s.version) == (group, version)]
            if not specs:
                return None
            resources: list[Obj] = []
            for spec in specs:
                resources.append(
                    {
                        "name": spec.plural,
                        "singularName": spec.singular,
                        "namespaced": spec.namespaced,
                        "kind": spec.kind,
                        "verbs": sorted(spec.verbs),
                        "shortNames": list(spec.short_names),
                        "categories": list(spec.categories),
                    }
                )
                if spec.status_subresource:
                    resources.append(
                        {
                            "name": f"{spec.plural}/status",
                            "singularName": "",
                            "namespaced": spec.namespaced,
                            "kind": spec.kind,
                            "verbs": ["get", "patch", "update"],
                        }
                    )
            return {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources,
            }
        return None

    async def _apply_faults(self, info: RequestInfo) -> None:
        for fault in list(self.faults):
            if not fault.match(info):
                continue
            if fault.times is not None:
                fault.times -= 1
                if fault.times <= 0:
                    self.faults.remove(fault)
            if fault.delay:
                await asyncio.sleep(fault.delay)
            if fault.status is not None:
                raise ApiError(fault.status, fault.reason, fault.message)
            return

    async def _serve(self, raw_request: aiohttp.web.BaseRequest, info: RequestInfo) -> aiohttp.web.StreamResponse:
        self._warnings = []  # from here to the response nothing awaits, so these are this request's own
        key = info.resource_key
        spec = self.specs.get(key) if key else None
        if spec is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if spec.namespaced and info.namespace is None and info.verb not in ("list", "watch"):
            raise ApiError(404, "NotFound", f"{spec.plural} is namespaced: the URL needs a namespace")
        if not spec.namespaced and info.namespace is not None:
            raise ApiError(404, "NotFound", f"{spec.plural} is cluster-scoped: the URL must not have a namespace")
        if info.verb not in spec.verbs and info.verb in {
            "create",
            "update",
            "patch",
            "delete",
            "deletecollection",
        }:
            raise ApiError(405, "MethodNotAllowed", f"{info.verb} is not supported on {spec.plural}")
        dry_run = info.params.get("dryRun") == "All"
        key_: ObjKey = (info.namespace, info.name or "")
        if spec.key == BUDGETS and info.verb in ("get", "list", "watch"):
            self._refresh_budgets(info.namespace)  # the disruption controller, never behind a read
        if info.verb == "create" and spec.key == PODS and info.subresource == "eviction":
            return self._respond(raw_request, spec, self._evict(key_, dry_run), status=201)
        if info.verb == "watch":
            return await self._watch_stream(raw_request, spec, info)
        if info.verb == "list":
            return self._respond(raw_request, spec, self._list(spec, info), table=True)
        if info.verb == "get":
            if info.subresource == "log" and spec.key == PODS:
                return await self._serve_log(raw_request, spec, key_, info)
            if info.subresource not in (None, "status"):
                raise ApiError(404, "NotFound", f"unknown subresource {info.subresource}")
            return self._respond(raw_request, spec, copy.deepcopy(self._require(spec, key_)), table=True)
        if info.verb == "create":
            if self._webhook_configurations():
                info = await self._webhooks_on_create(spec, info, dry_run)
                self._warnings = []  # the judged dry run's; another request may have run meanwhile
            return self._respond(raw_request, spec, self._create(spec, info, dry_run), status=201)
        if info.verb in ("patch", "update"):
            if self._webhook_configurations():
                await self._webhooks_on_update(spec, key_, info, dry_run)
                self._warnings = []
            old = self._require(spec, key_)
            written = self._update(spec, key_, info, old, dry_run=dry_run)
            return self._respond(raw_request, spec, written)
        if info.verb == "delete":
            if self._webhook_configurations():
                old = self._read(spec, self._require(spec, key_))
                await self._webhooks(spec, info, "DELETE", None, old, dry_run=dry_run)
            return self._respond(raw_request, spec, self._serve_delete_one(spec, key_, info, dry_run))
        if info.verb == "deletecollection":
            items = self._list(spec, info)["items"]
            if not dry_run:
                for item in items:
                    with contextlib.suppress(ApiError):
                        self._delete(spec, (_meta(item).get("namespace"), _meta(item)["name"]))
            return self._respond(raw_request, spec, self._list_body(spec, items))
        raise ApiError(405, "MethodNotAllowed", f"{info.method} is not supported here")

    def _refresh_budgets(self, namespace: str | None) -> None:
        """Write each budget's status as the disruption controller would from the Pods now (only what changed)."""
        spec = self.specs[BUDGETS]
        pods = [p for (ns, _), p in self.store[PODS].items() if namespace is None or ns == namespace]
        for key, old in list(self.store[BUDGETS].items()):
            if namespace is not None and key[0] != namespace:
                continue
            status = budget_status(old, [p for p in pods if _meta(p).get("namespace") == key[0]])
            if old.get("status") != status:
                self._commit(spec, key, old, {**copy.deepcopy(old), "status": status})

    def _evict(self, key_: ObjKey, dry_run: bool) -> Obj:
        """POST pods/NAME/eviction: judged against the namespace's budgets, the Pod deleted when allowed."""
        pods = self.specs[PODS]
        pod = self._require(pods, key_)
        self._refresh_budgets(key_[0])
        budgets = [b for (ns, _), b in self.store[BUDGETS].items() if ns == key_[0]]

        def delete() -> None:
            if not dry_run:
                self._delete(pods, key_)

        return evict(pod, budgets, delete)

    def _update(self, spec: ResourceSpec, key_: ObjKey, info: RequestInfo, old: Obj, *, dry_run: bool) -> Obj:
        """A patch or an update of ``old``: the client's resourceVersion checked, then written (or only judged)."""
        new = self._proposed(spec, info, old)
        sent_rv = _meta(new).get("resourceVersion") if isinstance(new, dict) else None
        if sent_rv not in (None, "") and str(sent_rv) != _meta(old).get("resourceVersion"):
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {spec.plural} "{info.name}": the object has been'
                " modified; please apply your changes to the latest version and try again",
                {"name": info.name, "group": spec.group, "kind": spec.plural},
            )
        return self._write(
            spec,
            key_,
            old,
            new,
            info.subresource,
            verb=info.verb,
            field_validation=info.params.get("fieldValidation"),
            dry_run=dry_run,
        )

    # --- validating admission webhooks (``emulator_webhooks``): the only awaits of a write ---------------------
    def _webhook_configurations(self) -> list[Obj]:
        return list(self.store.get(WEBHOOK_CONFIGURATIONS, {}).values())

    async def _webhooks(
        self, spec: ResourceSpec, info: RequestInfo, operation: str, obj: Obj | None, old: Obj | None, *, dry_run: bool
    ) -> None:
        """Call the webhooks that take this write (raise the refusal), as the server does once the object is built."""
        name = str(info.name or _meta(obj or {}).get("name") or "")
        options = {"kind": f"{operation.capitalize()}Options", "apiVersion": "meta.k8s.io/v1"}
        if info.params.get("fieldValidation"):
            options["fieldValidation"] = info.params["fieldValidation"]
        attrs = Attributes(spec, info.subresource, operation, info.namespace, name, obj, old, info.user, dry_run,
                           options)  # fmt: skip
        namespace = self.store.get(("", "v1", "namespaces"), {}).get((None, info.namespace or ""))
        hooks = matching(self._webhook_configurations(), attrs, namespace)
        if hooks:
            await call_webhooks(hooks, attrs, self.webhook_calls)

    async def _webhooks_on_create(self, spec: ResourceSpec, info: RequestInfo, dry_run: bool) -> RequestInfo:
        """Judge a create by the webhooks on the object it would store; the request to create, with the name the
        judged object got (a generated name is given once, before admission)."""
        proposed = self._create(spec, info, dry_run=True)
        await self._webhooks(spec, info, "CREATE", proposed, None, dry_run=dry_run)
        if isinstance(info.body, dict) and not _meta(info.body).get("name"):
            body = copy.deepcopy(info.body)
            body.setdefault("metadata", {})["name"] = _meta(proposed)["name"]
            info = replace(info, body=body)
        return info

    async def _webhooks_on_update(self, spec: ResourceSpec, key_: ObjKey, info: RequestInfo, dry_run: bool) -> None:
        """Judge a patch or an update by the webhooks; again when the object changed while they answered (the
        server's GuaranteedUpdate runs admission inside its retry). On return the stored object is the judged one."""
        for _ in range(5):
            old = self._require(spec, key_)
            proposed = self._update(spec, key_, info, old, dry_run=True)
            await self._webhooks(spec, info, "UPDATE", proposed, self._read(spec, old), dry_run=dry_run)
            if self.store[spec.key].get(key_) is old:
                return
        raise ApiError(409, "Conflict", f'{spec.plural} "{info.name}" kept changing while the webhooks answered')

    def _respond(
        self,
        raw_request: aiohttp.web.BaseRequest,
        spec: ResourceSpec,
        payload: Obj,
        *,
        status: int = 200,
        table: bool = False,
    ) -> aiohttp.web.StreamResponse:
        if self.strict and spec.custom:
            if isinstance(payload.get("items"), list):
                payload["items"] = [self._read(spec, item) for item in payload["items"]]
            elif payload.get("kind") == spec.kind:
                payload = self._read(spec, payload)
        if table and "as=Table" in raw_request.headers.get("Accept", ""):
            payload = self._as_table(payload, spec, raw_request.query.get("includeObject") or "Metadata")
        response = aiohttp.web.json_response(payload, status=status)
        for warning in self._warnings:
            response.headers.add("Warning", "299 - " + json.dumps(warning))
        self._warnings = []
        return response

    def _as_table(self, payload: Obj, spec: ResourceSpec, include: str) -> Obj:
        """A meta.k8s.io/v1 Table for `kubectl get`: the kind's columns (``emulator_tables``); each row carries the
        object as ``includeObject`` asks (``--sort-by`` and ``-o custom-columns`` ask for the whole object)."""
        if include not in INCLUDE_OBJECT:
            raise ApiError(400, "BadRequest", f"unrecognized includeObject value: {include!r}")
        items = payload.get("items", [payload])
        for item in items:  # list items as a get returns them, so a row's object is whole
            item.setdefault("apiVersion", spec.api_version)
            item.setdefault("kind", spec.kind)
        columns = TABLES.get((spec.group, spec.kind)) if not spec.custom else None
        columns = columns or crd_columns(spec.printer_columns)
        return table(items, columns, self.clock(), str(self._rv), include=include)

    def _check_rv_param(self, spec: ResourceSpec, raw: str | None, *, watch: bool) -> int | None:
        if raw in (None, "", "0"):
            return None
        try:
            rv = int(str(raw))
        except ValueError:
            raise ApiError(400, "BadRequest", f"invalid resourceVersion {raw!r}") from None
        if rv < self.compacted_below or (watch and rv < self._logs[spec.key].dropped_upto):
            raise ApiError(410, "Expired", f"too old resource version: {rv} ({self._rv})")
        return rv

    def _matcher(self, info: RequestInfo) -> Callable[[Mapping[str, Any]], bool]:
        labels = parse_label_selector(info.params.get("labelSelector"))
        fields = parse_field_selector(info.params.get("fieldSelector"))

        def matches(obj: Mapping[str, Any]) -> bool:
            meta = _meta(obj)
            if info.namespace is not None and meta.get("namespace") != info.namespace:
                return False
            if info.name is not None and meta.get("name") != info.name:
                return False
            return labels.matches(meta.get("labels")) and fields(obj)

        return matches

    def _list_body(self, spec: ResourceSpec, items: list[Obj]) -> Obj:
        return {
            "apiVersion": spec.api_version,
            "kind": f"{spec.kind}List",
            "metadata": {"resourceVersion": str(self._rv)},
            "items": items,
        }

    def _list(self, spec: ResourceSpec, info: RequestInfo) -> Obj:
        """A list, honouring ``resourceVersionMatch`` and ``limit``/``continue`` (see ``emulator_pages``)."""
        params = info.params
        raw_rv, match, token = params.get("resourceVersion"), params.get("resourceVersionMatch"), params.get("continue")
        validate_list_options(raw_rv, match, token)
        state: Mapping[ObjKey, Obj] = self.store[spec.key]
        list_rv = self._rv
        if token:
            cursor = decode_continue(token, self.compacted_below)
            list_rv = cursor.rv
        elif match == "Exact":
            list_rv = int(str(raw_rv))
            state = self._state_at(spec, list_rv)
        elif match == "NotOlderThan":
            if int(str(raw_rv)) > self._rv:
                raise too_large_rv(int(str(raw_rv)), self._rv)
        else:
            self._check_rv_param(spec, raw_rv, watch=False)
        matches = self._matcher(info)
        items = [
            copy.deepcopy(obj)
            for (_, _), obj in sorted(state.items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))
            if matches(obj)
        ]
        page = paginate(items, _page_key, params.get("limit"), token, list_rv, ignore_limit=raw_rv == "0")
        body = self._list_body(spec, page.items)
        body["metadata"]["resourceVersion"] = str(list_rv)
        if page.next_token:
            body["metadata"]["continue"] = page.next_token
            body["metadata"]["remainingItemCount"] = page.remaining
        return body

    def _state_at(self, spec: ResourceSpec, rv: int) -> dict[ObjKey, Obj]:
        """The resource's objects as they were at ``rv``, rebuilt by undoing the newer events of its log."""
        if rv > self._rv:
            raise too_large_rv(rv, self._rv)
        log = self._logs[spec.key]
        if rv < max(self.compacted_below, log.dropped_upto):
            raise ApiError(410, "Expired", f"too old resource version: {rv} ({self._rv})")
        state = dict(self.store[spec.key])
        for event in reversed(log.events):
            if event.rv <= rv:
                break
            key: ObjKey = (_meta(event.obj).get("namespace"), _meta(event.obj)["name"])
            if event.type == "ADDED":
                state.pop(key, None)
            elif event.type == "MODIFIED" and event.old is not None:
                state[key] = event.old
            elif event.type == "DELETED":
                state[key] = event.obj
        return state

    def _create(self, spec: ResourceSpec, info: RequestInfo, dry_run: bool) -> Obj:
        if not isinstance(info.body, dict):
            raise ApiError(400, "BadRequest", "the request body must be a JSON object")
        body = copy.deepcopy(info.body)
        meta = body.get("metadata")
        if not isinstance(meta, dict):
            meta = body["metadata"] = {}
        if spec.namespaced:
            if meta.get("namespace") not in (None, "", info.namespace):
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                )
            meta["namespace"] = info.namespace
        else:
            meta.pop("namespace", None)
        for server_owned in (
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "deletionTimestamp",
            "generation",
        ):
            meta.pop(server_owned, None)
        meta.pop("deletionGracePeriodSeconds", None)
        if spec.strip_status_on_create:
            body.pop("status", None)
        if spec.key == ("", "v1", "namespaces"):
            body["status"] = {"phase": "Active"}
        items = self.store[spec.key]
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise ApiError(422, "Invalid", "metadata.name: Required value: name or generateName is required")
            meta["name"] = self._generate_name(spec, meta.get("namespace"), str(prefix))
        prepare = PREPARE_FOR_CREATE.get(spec.key)
        if prepare is not None:  # the system fields first, as the server fills them before the strategy runs
            meta["uid"] = str(uuid.uuid4())
            prepare(body)
        body = self._admit(spec, "create", body, None, info.params.get("fieldValidation"))
        if (stored_default := DEFAULT_STORED.get(spec.key)) is not None:
            stored_default(body)
        meta = body["metadata"]
        key: ObjKey = (meta.get("namespace"), meta["name"])
        if key in items:
            group_plural = f"{spec.plural}.{spec.group}" if spec.group else spec.plural
            raise ApiError(
                409,
                "AlreadyExists",
                f'{group_plural} "{meta["name"]}" already exists',
                {"name": meta["name"], "group": spec.group, "kind": spec.plural},
            )
        self._stamp(spec, body)
        if dry_run:
            return body
        return self._insert(spec, key, body)

    def _proposed(self, spec: ResourceSpec, info: RequestInfo, old: Obj) -> Any:
        if info.verb == "update":
            if not isinstance(info.body, dict):
                raise ApiError(400, "BadRequest", "the request body must be a JSON object")
            if _meta(info.body).get("name") not in (None, info.name):
                raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
            return copy.deepcopy(info.body)
        kind = info.content_type
        if kind == "application/json-patch+json":
            return json_patch(old, info.body)
        if kind == "application/merge-patch+json":
            return merge_patch(old, info.body)
        if kind == "application/strategic-merge-patch+json":
            if spec.custom:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types include:"
                    " application/json-patch+json, application/merge-patch+json,"
                    " application/apply-patch+yaml",
                )
            return strategic_merge_patch(old, info.body)
        raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {kind!r}")

    def _serve_delete_one(self, spec: ResourceSpec, key: ObjKey, info: RequestInfo, dry_run: bool) -> Obj:
        obj = self._require(spec, key)
        options = info.body if isinstance(info.body, dict) else {}
        preconditions = options.get("preconditions") or {}
        for field_name in ("uid", "resourceVersion"):
            wanted = preconditions.get(field_name)
            if wanted and wanted != _meta(obj).get(field_name):
                raise ApiError(
                    409,
                    "Conflict",
                    f"Precondition failed: {field_name} in precondition: {wanted}",
                    {"name": key[1]},
                )
        policy = info.params.get("propagationPolicy") or options.get("propagationPolicy")
        orphan = policy == "Orphan" or options.get("orphanDependents") is True
        if dry_run:
            return copy.deepcopy(obj)
        return self._delete(spec, key, orphan=orphan)

    async def _watch_stream(
        self, raw_request: aiohttp.web.BaseRequest, spec: ResourceSpec, info: RequestInfo
    ) -> aiohttp.web.StreamResponse:
        """Stream events from the bounded per-resource log (so a resume replays what happened, in order)."""
        matches = self._matcher(info)
        timeout = info.params.get("timeoutSeconds")
        deadline = time.monotonic() + float(timeout) if timeout else None
        bookmarks = info.params.get("allowWatchBookmarks") in _WATCH_TRUE
        response = aiohttp.web.StreamResponse(status=200)
        response.content_type = "application/json"
        await response.prepare(raw_request)

        async def send(kind: str, obj: Obj) -> None:
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                obj = self._read(spec, obj)
            await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        try:
            try:
                start = self._check_rv_param(spec, info.params.get("resourceVersion"), watch=True)
            except ApiError as exc:
                await send("ERROR", exc.body())
                await response.write_eof()
                return response
            initial: list[Obj] = []
            if start is None:
                start = self._rv
                initial = [
                    copy.deepcopy(obj)
                    for _, obj in sorted(self.store[spec.key].items(), key=lambda kv: (kv[0][0] or "", kv[0][1]))
                    if matches(obj)
                ]
            for obj in initial:
                await send("ADDED", obj)
            if bookmarks and info.params.get("sendInitialEvents") in _WATCH_TRUE:
                await send("BOOKMARK", self._bookmark(spec, start, initial_end=True))
            await self._stream_events(raw_request, spec, matches, start, deadline, send)
            if bookmarks and not self._closing:
                await send("BOOKMARK", self._bookmark(spec, self._rv))
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        return response

    async def _serve_log(
        self, raw_request: aiohttp.web.BaseRequest, spec: ResourceSpec, key: ObjKey, info: RequestInfo
    ) -> aiohttp.web.StreamResponse:
        """``pods/log``: the container's output as text; with ``follow``, streamed until the container ends, the
        Pod goes, or the client leaves (what the kubelet does)."""
        pod = copy.deepcopy(self._require(spec, key))
        container = log_container(pod, info.params)
        uid = str(_meta(pod).get("uid"))
        lines = self.logs.of(uid, container)
        text = render_log(lines, info.params)
        if info.params.get("follow") not in ("true", "1"):
            return aiohttp.web.Response(text=text, content_type="text/plain")
        response = aiohttp.web.StreamResponse(status=200)
        response.content_type = "text/plain"
        await response.prepare(raw_request)
        wakeup = asyncio.Event()
        self._wakeups.add(wakeup)
        rest = {k: v for k, v in info.params.items() if k not in ("tailLines", "limitBytes")}
        try:
            await response.write(text.encode())
            sent = len(lines)
            while not self._closing:
                wakeup.clear()
                current = self.store[spec.key].get(key)
                if current is None or _meta(current).get("uid") != uid:
                    break
                lines = self.logs.of(uid, container)
                if len(lines) > sent:
                    await response.write(render_log(lines[sent:], rest).encode())
                    sent = len(lines)
                if _container_ended(current, container):
                    break
                transport = raw_request.transport
                if transport is None or transport.is_closing():
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wakeup.wait(), 1.0)
            await response.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._wakeups.discard(wakeup)
        return response

    def _bookmark(self, spec: ResourceSpec, rv: int, *, initial_end: bool = False) -> Obj:
        meta: Obj = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"kind": spec.kind, "apiVersion": spec.api_version, "metadata": meta}

    async def _stream_events(
        self,
        raw_request: aiohttp.web.BaseRequest,
        spec: ResourceSpec,
        matches: Callable[[Mapping[str, Any]], bool],
        last: int,
        deadline: float | None,
        send: Callable[[str, Obj], Any],
    ) -> None:
        wakeup = asyncio.Event()
        self._wakeups.add(wakeup)
        log = self._logs[spec.key]
        epoch = self._watch_epoch
        try:
            while not self._closing and epoch == self._watch_epoch:
                wakeup.clear()
                if last < log.dropped_upto:  # this watcher fell behind the bounded log
                    await send("ERROR", ApiError(410, "Expired", f"too old resource version: {last}").body())
                    return
                pending = [event for event in log.events if event.rv > last]
                for event in pending:
                    last = event.rv
                    kind = _translate(event, matches)
                    if kind is not None:
                        await send(kind, event.obj)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return
                transport = raw_request.transport
                if transport is None or transport.is_closing():
                    return
                wait = 1.0 if remaining is None else min(1.0, remaining)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wakeup.wait(), wait)
        finally:
            self._wakeups.discard(wakeup)


def _container_ended(pod: Obj, container: str) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return any(st.get("name") == container and (st.get("state") or {}).get("terminated") for st in statuses)


def _page_key(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    return f"{meta.get('namespace') or ''}/{meta.get('name')}"


def _translate(event: WatchEvent, matches: Callable[[Mapping[str, Any]], bool]) -> str | None:
    """What a selector-filtered watcher sees: leaving the selection is DELETED, entering it is ADDED."""
    now = matches(event.obj)
    if event.type != "MODIFIED":
        return event.type if now else None
    before = event.old is not None and matches(event.old)
    if now and before:
        return "MODIFIED"
    if now:
        return "ADDED"
    if before:
        return "DELETED"
    return None


def _parse_path(path: str) -> tuple[str, str, str, str | None, str | None, str | None] | None:
    """``/api/v1/...`` or ``/apis/G/V/...`` → (group, version, plural, namespace, name, subresource).

    Discovery paths (no plural) give None. Written here because kmock's parser cannot handle
    ``/api/v1/namespaces`` (it raises) nor ``/api/v1/namespaces/NAME``.
    """
    parts = [part for part in path.split("/") if part]
    if len(parts) >= 3 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    plural = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = "/".join(rest[2:]) or None
    return group, version, plural, namespace, name, subresource


def _verb(method: str, parsed: tuple[Any, ...] | None, params: Mapping[str, str]) -> str:
    if parsed is None:
        return method.lower()
    named = parsed[4] is not None
    if method == "GET":
        if params.get("watch") in _WATCH_TRUE:
            return "watch"
        return "get" if named else "list"
    if method == "POST":
        return "create"
    if method == "PUT":
        return "update"
    if method == "PATCH":
        return "patch"
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return method.lower()


class EmulatorServer:
    """Runs a ``KubeEmulator`` on 127.0.0.1 in its own thread and event loop, for synchronous callers.

    ``with EmulatorServer() as srv: api = srv.api_client()`` — the operator's real client then talks
    HTTP to ``srv.url``. ``srv.call(fn)`` runs ``fn(emulator)`` on the server loop (the only safe place
    to touch the emulator's state) and returns its result.
    """

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        clock: Callable[[], datetime.datetime] = _utc_now,
        resources: Iterable[ResourceSpec] = DEFAULT_RESOURCES,
        event_log_size: int = 1000,
        strict: bool | None = None,
        users: Mapping[str, UserInfo] | None = None,
    ) -> None:
        self._port = port
        self._strict = strict
        self._users = dict(users or {})
        self._host = host
        self._clock = clock
        self._resources = tuple(resources)
        self._event_log_size = event_log_size
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._emulator: KubeEmulator | None = None
        self._url: str | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("the emulator server is not running")
        return self._url

    @property
    def emulator(self) -> KubeEmulator:
        if self._emulator is None:
            raise RuntimeError("the emulator server is not running")
        return self._emulator

    def start(self) -> EmulatorServer:
        self._thread = threading.Thread(target=self._run, name="kube-emulator", daemon=True)
        self._thread.start()
        if not self._ready.wait(15):
            raise RuntimeError("the emulator server did not start in 15 s")
        if self._error is not None:
            raise RuntimeError("the emulator server failed to start") from self._error
        return self

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._main())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        emulator = KubeEmulator(
            resources=self._resources,
            clock=self._clock,
            event_log_size=self._event_log_size,
            strict=self._strict,
            users=self._users,
        )
        async with emulator, kmock.Server(emulator, host=self._host, port=self._port or None) as server:
            self._emulator = emulator
            self._url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()
            emulator.shutdown_watches()
            await asyncio.sleep(0.05)

    def call(self, fn: Callable[[KubeEmulator], T], timeout: float = 10.0) -> T:
        """Run ``fn(emulator)`` on the server loop and return its result (exceptions propagate)."""

        async def run() -> T:
            return fn(self.emulator)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def configuration(self) -> k8s_client.Configuration:
        config = k8s_client.Configuration()
        config.host = self.url
        return config

    def api_client(self) -> k8s_client.ApiClient:
        """A new ``kubernetes.client.ApiClient`` pointed at this server (close it, or use ``with``)."""
        return k8s_client.ApiClient(self.configuration())

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(15)
        self._thread = None
        self._loop.close()

    def __enter__(self) -> EmulatorServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """``python -m homelab_sim.emulator --port 8001``: serve until Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--strict",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="refuse, prune and default as kube-apiserver does (default: on unless HOMELAB_EMULATOR_STRICT=0)",
    )
    args = parser.parse_args(argv)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with EmulatorServer(port=args.port, host=args.host, strict=args.strict) as srv:
        print(f"Kubernetes API emulator serving on {srv.url}", flush=True)
        print(f"  kubectl --server {srv.url} get nodeclaims -A", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while not done.wait(0.5):
                pass


if __name__ == "__main__":
    main()
