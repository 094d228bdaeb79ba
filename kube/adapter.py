"""Exactly the Kubernetes calls the operator makes, over the official client, with typed results and errors.

Every call has a timeout. Creates use deterministic names and return the existing object on AlreadyExists, so a
retried activity never makes a second one. Writes are merge patches of owned fields; the few list fields that
need a read first (taints, finalizers) are written as compare-and-set on the resourceVersion.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, ValidationError

from api import names
from api.v2alpha1 import Group, Node, NodeClaim
from kube.errors import Conflict, Gone, Invalid, KubeError, NotFound, Transient, from_api_exception
from kube.settings import KubeSettings
from kube.views import JobCause, job_cause, job_pod_selector

log = logging.getLogger(__name__)

JSON = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
# Deletes let the garbage collector remove dependents (a Job's Pods) after the object itself is gone.
BACKGROUND = {"propagationPolicy": "Background"}
DEFAULT_TIMEOUT = 10.0
CAS_ATTEMPTS = 5
# Objects per list page: a list follows `continue` until the server has sent everything, so a big namespace costs
# several bounded responses instead of one unbounded one.
LIST_PAGE_LIMIT = 500

M = TypeVar("M", Group, Node, NodeClaim)


@dataclass(frozen=True)
class Resource:
    """One resource type the operator touches: enough to build its URL and parse its objects."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def custom(self) -> bool:
        return self.group == names.GROUP

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None, name: str = "", sub: str = "") -> str:
        """The REST path of the collection (all namespaces when namespace is None), an object, or a subresource."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        scope = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        return f"{base}{scope}/{self.plural}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")


GROUPS = Resource(names.GROUP, names.VERSION, names.PLURAL_GROUPS, names.KIND_GROUP, True)
SLOTS = Resource(names.GROUP, names.VERSION, names.PLURAL_NODES, names.KIND_NODE, True)
CLAIMS = Resource(names.GROUP, names.VERSION, names.PLURAL_NODECLAIMS, names.KIND_NODECLAIM, True)
KUBELET_NODES = Resource("", "v1", "nodes", "Node", False)
JOBS = Resource("batch", "v1", "jobs", "Job", True)
PODS = Resource("", "v1", "pods", "Pod", True)
RESOURCES: dict[type[BaseModel], Resource] = {Group: GROUPS, Node: SLOTS, NodeClaim: CLAIMS}
EVENTS = Resource("", "v1", "events", "Event", True)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease", True)
BUDGETS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True)


@dataclass(frozen=True)
class ObjectRef:
    """What an Event is about: the regarding object of the Event."""

    kind: str
    namespace: str
    name: str
    uid: str = ""
    api_version: str = names.API_VERSION


def _now() -> datetime:
    return datetime.now(UTC)


def rfc3339(when: datetime) -> str:
    """Kubernetes timestamps: UTC, second precision, a literal Z."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _body(resp: Any) -> Any:
    """The JSON document of a response read with `_preload_content=False`."""
    data = resp.data if hasattr(resp, "data") else resp.read()
    if not data:
        return None
    return json.loads(data)


def _same_status(stored: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    """A stored claim status holds `wanted` (a merge patch's None is a field left out; the revision aside)."""
    kept = {k: v for k, v in stored.items() if k != "revision" and v is not None}
    return kept == {k: v for k, v in wanted.items() if v is not None}


def _taint_key(t: Mapping[str, Any]) -> tuple[str, str]:
    return (str(t.get("key", "")), str(t.get("effect", "")))


def _parse(model: type[M], obj: JSON) -> M:
    """Validate an API object into its model; an object our schema refuses is a typed `Invalid`, naming it.

    A caller deciding on retries must not meet a bare pydantic error: retrying cannot fix a stored object.
    """
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        meta = obj.get("metadata") or {}
        where = f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("namespace") else str(meta.get("name"))
        errors = exc.errors()
        first: Mapping[str, Any] = errors[0] if errors else {}
        loc = ".".join(str(part) for part in first.get("loc", ()))
        message = f"{model.__name__} {where} does not fit the v2alpha1 schema at {loc}: {first.get('msg', exc)}"
        raise Invalid(message) from exc


def config_problem(settings: KubeSettings) -> str:
    """Why no adapter can be built from `settings` ("" when one can): a kubeconfig that does not load, or lacks
    the context named. Read before a command starts anything; no request is made."""
    if settings.server:
        return ""
    if settings.kubeconfig is None and k8s_config.incluster_config.SERVICE_HOST_ENV_NAME in os.environ:
        return ""
    where = (
        f"kubeconfig {settings.kubeconfig}" if settings.kubeconfig else "the kubeconfig ($KUBECONFIG or ~/.kube/config)"
    )
    if settings.context:
        where += f", kube_context {settings.context}"
    try:
        k8s_config.load_kube_config(
            config_file=str(settings.kubeconfig) if settings.kubeconfig else None,
            context=settings.context,
            client_configuration=k8s.Configuration(),
        )
    except Exception as err:  # the loader raises ConfigException, OSError, YAML and type errors alike
        said = " ".join(str(err).split()) or type(err).__name__
        return f"{where}: {said} (kube_server names an API server instead)"
    return ""


class Kube:
    """The adapter: one instance per process, safe to share between threads (the client pools connections)."""

    def __init__(self, api_client: k8s.ApiClient, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.api_client = api_client
        self.timeout = timeout

    # --- construction ----------------------------------------------------------------------------------
    @classmethod
    def connect(
        cls,
        *,
        server: str | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Kube:
        """A server URL (emulator, tests), else in-cluster service account when present, else a kubeconfig."""
        configuration = k8s.Configuration()
        if server:
            configuration.host = server.rstrip("/")
        elif kubeconfig is None and k8s_config.incluster_config.SERVICE_HOST_ENV_NAME in os.environ:
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
        return cls(k8s.ApiClient(configuration), timeout=timeout)

    @classmethod
    def for_settings(cls, settings: KubeSettings, *, timeout: float | None = None) -> Kube:
        """From the `kube` settings section (server, kubeconfig, context, timeout)."""
        return cls.connect(
            server=settings.server,
            kubeconfig=str(settings.kubeconfig) if settings.kubeconfig else None,
            context=settings.context,
            timeout=timeout if timeout is not None else settings.timeout_seconds,
        )

    def ping(self, timeout: float) -> None:
        """One cheap request (the server's version) that raises unless the API server answers within `timeout`."""
        self._open("read the API server's version", "GET", "/version", timeout=timeout).read()

    def close(self) -> None:
        self.api_client.close()

    # --- plumbing --------------------------------------------------------------------------------------
    def _send(
        self,
        what: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
    ) -> JSON:
        """One request to a resource path, its JSON body on the wire exactly as built; its JSON answer; a typed error.

        Every resource goes through here by its path (`Resource.path`), so no method differs by kind. The typed
        client methods (`create_namespaced_lease`, ...) would first coerce a dict into their model and serialise
        that again, which rewrites values: a Lease's MicroTime with zero microseconds loses its fraction, which
        the API server refuses (RFC3339Micro).
        """
        response = self._open(what, method, path, body, content_type=content_type, query=query, timeout=self.timeout)
        try:
            response.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Transient(f"{what}: {type(exc).__name__}: {exc}") from exc
        doc = _body(response)
        return doc if isinstance(doc, dict) else {}  # every answer here is an object; an empty body is none

    def _open(
        self,
        what: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
        timeout: float | tuple[float, float],
    ) -> Any:
        """Send a request and return the response unread (a watch streams it); a non-2xx status is a typed error."""
        request = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list((query or {}).items()),
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api_client.call_api(*request, _request_timeout=timeout)
            if not 200 <= response.status <= 299:
                response.read()
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise Transient(f"{what}: {type(exc).__name__}: {exc}") from exc
        if not 200 <= response.status <= 299:
            raise from_api_exception(ApiException(http_resp=response), what)
        return response

    def _get(self, res: Resource, namespace: str | None, name: str) -> JSON:
        what = f"get {res.kind} {namespace}/{name}" if namespace else f"get {res.kind} {name}"
        return self._send(what, "GET", res.path(namespace, name))

    def list_raw(
        self, res: Resource, namespace: str | None = None, selector: str | None = None, fields: str | None = None
    ) -> tuple[list[JSON], str]:
        """Objects of a resource (all namespaces when namespace is None) and the list's resourceVersion.

        Asked for in pages of `LIST_PAGE_LIMIT`, following `metadata.continue` until the server has sent them all;
        every page of one list carries the first page's resourceVersion (a consistent snapshot). A continue token
        the server has expired (410) costs one list of everything in a single response, as client-go's pager does.
        """
        what = f"list {res.plural}" + (f" in {namespace}" if namespace else "")
        kw: dict[str, str] = {"limit": str(LIST_PAGE_LIMIT)}
        if selector:
            kw["labelSelector"] = selector
        if fields:
            kw["fieldSelector"] = fields
        items: list[JSON] = []
        doc = self._list_page(what, res, namespace, kw)
        while True:
            items += list(doc.get("items") or [])
            token = str((doc.get("metadata") or {}).get("continue") or "")
            if not token:
                break
            try:
                doc = self._list_page(what, res, namespace, {**kw, "continue": token})
            except Gone:
                log.info("%s: the continue token expired; listing everything at once", what)
                items = []
                doc = self._list_page(what, res, namespace, {k: v for k, v in kw.items() if k != "limit"})
        for item in items:  # list items carry no kind; fill it so they parse like a get
            item.setdefault("kind", res.kind)
            item.setdefault("apiVersion", res.api_version)
        return items, str((doc.get("metadata") or {}).get("resourceVersion") or "")

    def _list_page(self, what: str, res: Resource, namespace: str | None, query: dict[str, str]) -> JSON:
        """One list request (one page when `query` has a limit) as the API returns it."""
        return self._send(what, "GET", res.path(namespace), query=query)

    def open_watch(
        self,
        res: Resource,
        namespace: str | None,
        selector: str | None,
        resource_version: str,
        timeout_seconds: int,
    ) -> Any:
        """A raw watch stream (an urllib3 response); `kube.watch.Watch` reads it."""
        query = {"watch": "true", "timeoutSeconds": str(timeout_seconds), "allowWatchBookmarks": "true"}
        if resource_version:
            query["resourceVersion"] = resource_version
        if selector:
            query["labelSelector"] = selector
        timeout = (self.timeout, timeout_seconds + self.timeout)
        return self._open(f"watch {res.plural}", "GET", res.path(namespace), query=query, timeout=timeout).response

    def _patch(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        status: bool = False,
        content_type: str = MERGE_PATCH,
    ) -> JSON:
        sub = "/status" if status else ""
        what = f"patch {res.kind}{sub} {namespace + '/' if namespace else ''}{name}"
        path = res.path(namespace, name, "status" if status else "")
        return self._send(what, "PATCH", path, body, content_type=content_type)

    def _cas(
        self,
        res: Resource,
        namespace: str | None,
        name: str,
        change: Callable[[JSON], JSON | None],
        *,
        status: bool = False,
    ) -> JSON:
        """Compare-and-set: read, compute a merge patch from the object, write it guarded by the resourceVersion.

        `change` returns None when the object already holds what is wanted (then nothing is written). A write that
        arrives late (its client gave up, the server took it anyway) finds the object moved on and is refused,
        instead of putting back an older state.
        """
        for _ in range(CAS_ATTEMPTS):
            obj = self._get(res, namespace, name)
            patch = change(obj)
            if patch is None:
                return obj
            patch.setdefault("metadata", {})["resourceVersion"] = obj["metadata"]["resourceVersion"]
            try:
                return self._patch(res, namespace, name, patch, status=status)
            except Conflict:
                continue
        raise Conflict(f"{res.kind} {name}: still conflicting after {CAS_ATTEMPTS} compare-and-set attempts")

    # --- the three resources ---------------------------------------------------------------------------
    def patch_raw(
        self, res: Resource, namespace: str | None, name: str, patch: Mapping[str, Any], *, status: bool = False
    ) -> JSON:
        """Merge-patch one object (its `/status` when `status`); the result as the API returns it."""
        return self._patch(res, namespace, name, dict(patch), status=status)

    def create_raw(self, res: Resource, namespace: str | None, body: Mapping[str, Any]) -> JSON:
        """Create one object as given; `AlreadyExists` when its name is taken."""
        name = (body.get("metadata") or {}).get("name", "")
        what = f"create {res.kind} {namespace + '/' if namespace else ''}{name}"
        return self._send(what, "POST", res.path(namespace), dict(body))

    def get_raw(self, res: Resource, namespace: str | None, name: str) -> JSON:
        """One object as the API returns it (camelCase JSON): for readers that must survive a malformed field."""
        return self._get(res, namespace, name)

    def get(self, model: type[M], namespace: str, name: str) -> M:
        """A group, slot or claim, parsed (`Invalid`, naming it, when it does not fit the schema)."""
        return _parse(model, self._get(RESOURCES[model], namespace, name))

    def items(self, model: type[M], namespace: str | None = None, selector: str | None = None) -> list[M]:
        """The groups, slots or claims of a namespace (all when None), parsed."""
        return [_parse(model, o) for o in self.list_raw(RESOURCES[model], namespace, selector)[0]]

    def get_claim(self, namespace: str, name: str) -> NodeClaim:
        return _parse(NodeClaim, self._get(CLAIMS, namespace, name))

    def create_claim(self, claim: NodeClaim) -> NodeClaim:
        """Create a claim under its deterministic name; a retry gets the claim that is already there."""
        ns, name = claim.metadata.namespace, claim.metadata.name
        if not ns or not name:
            raise KubeError("create NodeClaim: metadata.namespace and metadata.name are required")
        body = claim.model_dump(by_alias=True, exclude_none=True, mode="json")
        body.pop("status", None)
        try:
            created = self._send(f"create NodeClaim {ns}/{name}", "POST", CLAIMS.path(ns), body)
        except KubeError as exc:
            if exc.status == 409 and exc.reason == "AlreadyExists":
                return self.get_claim(ns, name)
            raise
        return _parse(NodeClaim, created)

    def delete_claim(self, namespace: str, name: str) -> bool:
        """Delete a claim (its finalizer, if any, holds it until released); False when it was already gone."""
        try:
            self._send(f"delete NodeClaim {namespace}/{name}", "DELETE", CLAIMS.path(namespace, name), query=BACKGROUND)
        except NotFound:
            return False
        return True

    def patch_slot_status(
        self, namespace: str, name: str, status: Mapping[str, Any], *, resource_version: str | None = None
    ) -> Node:
        """Merge-patch a slot's /status; with `resource_version`, only over that version (else `Conflict`)."""
        body: JSON = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return _parse(Node, self._patch(SLOTS, namespace, name, body, status=True))

    def patch_group_status(
        self, namespace: str, name: str, status: Mapping[str, Any], *, resource_version: str | None = None
    ) -> Group:
        """Merge-patch a Group's /status; with `resource_version`, only over that version (else `Conflict`)."""
        body: JSON = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return _parse(Group, self._patch(GROUPS, namespace, name, body, status=True))

    def add_claim_finalizer(self, namespace: str, name: str, finalizer: str = names.FINALIZER_CLAIM) -> None:
        """Idempotent: a claim that already carries the finalizer is not written."""

        def change(obj: JSON) -> JSON | None:
            meta = obj.get("metadata") or {}
            current = list(meta.get("finalizers") or [])
            if finalizer in current:
                return None
            if meta.get("deletionTimestamp"):
                # What the API server answers too (422): retrying cannot add a finalizer to a terminating object.
                raise Invalid(f"NodeClaim {namespace}/{name} is being deleted; no finalizer can be added", status=422)
            return {"metadata": {"finalizers": [*current, finalizer]}}

        self._cas(CLAIMS, namespace, name, change)

    def remove_claim_finalizer(self, namespace: str, name: str, finalizer: str = names.FINALIZER_CLAIM) -> None:
        """Idempotent: a claim without the finalizer, or already gone, is left alone."""

        def change(obj: JSON) -> JSON | None:
            current = list((obj.get("metadata") or {}).get("finalizers") or [])
            if finalizer not in current:
                return None
            return {"metadata": {"finalizers": [f for f in current if f != finalizer]}}

        try:
            self._cas(CLAIMS, namespace, name, change)
        except NotFound:
            return

    # --- kubelet Nodes ---------------------------------------------------------------------------------
    def get_node(self, name: str) -> JSON | None:
        """The kubelet's Node as the API returns it (camelCase), or None when it does not exist."""
        try:
            return self._get(KUBELET_NODES, None, name)
        except NotFound:
            return None

    def list_nodes(self, selector: str | None = None) -> list[JSON]:
        return self.list_raw(KUBELET_NODES, None, selector)[0]

    def cordon(self, name: str) -> JSON:
        return self._set_unschedulable(name, True)

    def uncordon(self, name: str) -> JSON:
        return self._set_unschedulable(name, None)

    def _set_unschedulable(self, name: str, value: bool | None) -> JSON:
        """Cordon or uncordon by compare-and-set: a late uncordon never undoes a newer cordon (or the reverse)."""

        def change(obj: JSON) -> JSON | None:
            held = (obj.get("spec") or {}).get("unschedulable") or None
            return None if held == value else {"spec": {"unschedulable": value}}

        return self._cas(KUBELET_NODES, None, name, change)

    def project_claim_status(
        self, namespace: str, name: str, status: Mapping[str, Any], revision: int, *, above_held: bool = False
    ) -> tuple[JSON, int]:
        """Write a claim's status numbered `revision`; the object as written and the revision it holds now.

        Its workflow numbers every projection, so a retried or late-arriving write can never put back an older
        claim state: a stored revision at or past this one is not overwritten. With `above_held` (a run that
        records one projection at a time) a stored revision at or past this one can only be another run's (a lost
        one's record, or its write that landed late): this write lands above it instead. A stored revision equal to
        this one holding the same status is this write, landed on an earlier try.
        """
        landed = revision

        def change(obj: JSON) -> JSON | None:
            nonlocal landed
            stored = obj.get("status") or {}
            held = stored.get("revision")
            if not isinstance(held, int) or held < revision:
                landed = revision
            elif held == revision and _same_status(stored, status):
                landed = revision
                return None
            elif not above_held:
                landed = held
                return None
            else:
                landed = held + 1
            return {"status": {**dict(status), "revision": landed}}

        written = self._cas(CLAIMS, namespace, name, change, status=True)
        return written, landed

    def carry_identity(
        self,
        namespace: str,
        name: str,
        *,
        labels: Mapping[str, str],
        owner: Mapping[str, Any] | None,
        deadline_at: str | None,
    ) -> JSON:
        """Give a claim what the group's claims carry, where it lacks it: `labels` (set to these values), `owner` (a
        non-controller reference, added unless one of that uid is there) and `spec.deadlineAt` (only when it has
        none). One compare-and-set write, none when nothing is missing; other labels and owners are kept."""

        def change(obj: JSON) -> JSON | None:
            meta = obj.get("metadata") or {}
            patch: JSON = {}
            held = meta.get("labels") or {}
            if any(held.get(key) != value for key, value in labels.items()):
                patch.setdefault("metadata", {})["labels"] = dict(labels)
            refs = [dict(ref) for ref in meta.get("ownerReferences") or []]
            if owner is not None and not any(ref.get("uid") == owner.get("uid") for ref in refs):
                patch.setdefault("metadata", {})["ownerReferences"] = [*refs, dict(owner)]
            if deadline_at and not (obj.get("spec") or {}).get("deadlineAt"):
                patch["spec"] = {"deadlineAt": deadline_at}
            return patch or None

        return self._cas(CLAIMS, namespace, name, change)

    def stamp_taints(self, name: str, taints: Iterable[Mapping[str, Any]]) -> JSON:
        """Add taints (matched by key and effect); the ones already there are kept as they are."""
        wanted = [dict(t) for t in taints]

        def change(obj: JSON) -> JSON | None:
            current = list((obj.get("spec") or {}).get("taints") or [])
            have = {_taint_key(t) for t in current}
            missing = [t for t in wanted if _taint_key(t) not in have]
            if not missing:
                return None
            return {"spec": {"taints": current + missing}}

        return self._cas(KUBELET_NODES, None, name, change)

    def remove_taints(self, name: str, taints: Iterable[Mapping[str, Any]]) -> JSON:
        """Remove taints by key and effect (a taint given without an effect matches every effect of its key)."""
        drop = [(str(t.get("key", "")), t.get("effect")) for t in taints]

        def matches(t: Mapping[str, Any]) -> bool:
            return any(t.get("key") == k and (e is None or t.get("effect") == e) for k, e in drop)

        def change(obj: JSON) -> JSON | None:
            current = list((obj.get("spec") or {}).get("taints") or [])
            kept = [t for t in current if not matches(t)]
            if len(kept) == len(current):
                return None
            return {"spec": {"taints": kept or None}}

        return self._cas(KUBELET_NODES, None, name, change)

    def stamp_slot_identity(self, name: str, *, group: str, slot: str, provider_id: str) -> JSON:
        """Label the kubelet Node with its group and slot (as label values, bounded to 63 characters); set
        providerID only where it is empty (it is immutable).
        """
        wanted = {names.LABEL_GROUP: names.label_value(group), names.LABEL_NODE: names.label_value(slot)}

        def change(obj: JSON) -> JSON | None:
            labels = (obj.get("metadata") or {}).get("labels") or {}
            patch: JSON = {}
            if any(labels.get(key) != value for key, value in wanted.items()):
                patch["metadata"] = {"labels": dict(wanted)}
            if not (obj.get("spec") or {}).get("providerID"):
                patch["spec"] = {"providerID": provider_id}
            return patch or None

        return self._cas(KUBELET_NODES, None, name, change)

    def delete_node(self, name: str, resource_version: str | None = None) -> bool:
        """Delete a kubelet Node object (only that version of it, when given); False when gone or changed."""
        options = {"preconditions": {"resourceVersion": resource_version}} if resource_version else None
        try:
            self._send(f"delete Node {name}", "DELETE", KUBELET_NODES.path(None, name), options)
        except (NotFound, Conflict):
            return False
        return True

    # --- the drain before a power-off ------------------------------------------------------------------
    def pods_on_node(self, node: str) -> list[JSON]:
        """Every Pod bound to the kubelet Node `node`, in every namespace (one list by field selector)."""
        return self.list_raw(PODS, None, fields=f"spec.nodeName={node}")[0]

    def evict_pod(self, namespace: str, name: str) -> bool:
        """Ask the Eviction API (policy/v1) to remove a Pod; False when it is already gone. A budget's refusal is
        the server's 429, raised as `Transient` with the budget's words in `causes`."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        try:
            self._send(f"evict Pod {namespace}/{name}", "POST", PODS.path(namespace, name, "eviction"), body)
        except NotFound:
            return False
        return True

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete a Pod with its own grace period (a person forced the drain); False when it is already gone."""
        try:
            self._send(f"delete Pod {namespace}/{name}", "DELETE", PODS.path(namespace, name))
        except NotFound:
            return False
        return True

    def budgets(self, namespace: str) -> list[JSON]:
        """The PodDisruptionBudgets of a namespace, with the disruption controller's status."""
        return self.list_raw(BUDGETS, namespace)[0]

    # --- Jobs ------------------------------------------------------------------------------------------
    def create_job(self, namespace: str, body: Mapping[str, Any]) -> JSON:
        """Create a Job under its deterministic name; a retry gets the Job that is already there."""
        name = str((body.get("metadata") or {}).get("name") or "")
        if not name:
            raise KubeError("create Job: metadata.name is required (lifecycle Jobs have deterministic names)")
        try:
            return self._send(f"create Job {namespace}/{name}", "POST", JOBS.path(namespace), dict(body))
        except KubeError as exc:
            if exc.status == 409 and exc.reason == "AlreadyExists":
                return self._get(JOBS, namespace, name)
            raise

    def get_job(self, namespace: str, name: str) -> JSON | None:
        try:
            return self._get(JOBS, namespace, name)
        except NotFound:
            return None

    def job_cause(self, namespace: str, name: str) -> JobCause:
        """Why the Job `name` failed: its Pods, listed by the Job's own selector, read by `views.job_cause` (exit
        code, reason, the termination message trimmed), or what happened when none says it (no Job, no Pod, a Pod
        that never ended, the Job's activeDeadlineSeconds). Two requests: the Job, then its Pods."""
        job = self.get_job(namespace, name)
        if job is None:
            return job_cause(None, [])
        pods, _ = self.list_raw(PODS, namespace, job_pod_selector(job))
        return job_cause(job, pods)

    # --- Events ----------------------------------------------------------------------------------------
    def create_event(
        self,
        regarding: ObjectRef,
        reason: str,
        message: str,
        *,
        warning: bool = False,
        now: datetime | None = None,
        occurrence: datetime | None = None,
        fact: str = "",
    ) -> JSON:
        """Record an Event under a deterministic name; a repeat of the same name bumps the count of the one Event.

        Without `occurrence`, repeats of (object, reason, message) are one Event. With it (a stable moment, such as
        an activity's first scheduling), each occurrence is its own Event named `<object>.<hex nanoseconds>…` like
        client-go names them, so `kubectl get events` lists an object's story in order; a retry of the same
        occurrence finds its Event.

        With `fact` (what the Event says, when more than one run may say it: a spent streak, a scale-down's start),
        an Event of the object with this reason that carries the same fact (an annotation) is that Event already:
        it is returned and nothing is written. The name stays the occurrence's, so the story keeps its order.
        """
        if fact and regarding.uid:
            said = self._event_of_fact(regarding, reason, fact)
            if said is not None:
                return said
        when = rfc3339(now or _now())
        digest = hashlib.sha256(f"{regarding.kind}|{regarding.uid}|{reason}|{message}".encode()).hexdigest()[:10]
        if occurrence is None:
            suffix = f".{digest}"
        else:
            nanos = int(occurrence.timestamp()) * 1_000_000_000 + occurrence.microsecond * 1_000
            suffix = f".{nanos:016x}.{digest[:6]}"
        # An Event's name is a DNS subdomain (≤ 253): a long object name is bounded before the suffix.
        name = names.bounded(regarding.name, names.NAME_MAX - len(suffix)) + suffix
        metadata: JSON = {"name": name, "namespace": regarding.namespace}
        if fact:
            metadata["annotations"] = {names.ANNOTATION_EVENT_FACT: fact}
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": metadata,
            "involvedObject": {
                "apiVersion": regarding.api_version,
                "kind": regarding.kind,
                "name": regarding.name,
                "namespace": regarding.namespace,
                **({"uid": regarding.uid} if regarding.uid else {}),
            },
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "count": 1,
            "firstTimestamp": when,
            "lastTimestamp": when,
            "source": {"component": names.MANAGED_BY},
            "reportingComponent": names.MANAGED_BY,
        }
        what = f"create Event {regarding.namespace}/{name}"
        try:
            return self._send(what, "POST", EVENTS.path(regarding.namespace), body)
        except KubeError as exc:
            if not (exc.status == 409 and exc.reason == "AlreadyExists"):
                raise
        # A repeat: bump the count guarded by the resourceVersion, so two writers never lose an increment.
        for _ in range(CAS_ATTEMPTS):
            existing = self._get(EVENTS, regarding.namespace, name)
            patch = {
                "metadata": {"resourceVersion": (existing.get("metadata") or {}).get("resourceVersion")},
                "count": int(existing.get("count") or 1) + 1,
                "lastTimestamp": when,
            }
            try:
                return self._patch(EVENTS, regarding.namespace, name, patch)
            except Conflict:
                continue
        raise Conflict(f"{what}: still conflicting after {CAS_ATTEMPTS} attempts to bump the count")

    def _event_of_fact(self, regarding: ObjectRef, reason: str, fact: str) -> JSON | None:
        """The object's Event with this reason that says `fact` (its annotation), if one was recorded. A list no
        retry can fix (an install whose RBAC lacks `events list`) finds none: the fact may be said twice, the Event
        is never held back."""
        selected = f"involvedObject.uid={regarding.uid},reason={reason}"
        try:
            events = self.list_raw(EVENTS, regarding.namespace, fields=selected)[0]
        except KubeError as exc:
            if exc.retryable:
                raise
            log.info(
                "%s of %s %s: Events not looked up (%s); it may be said again",
                reason,
                regarding.kind,
                regarding.name,
                exc,
            )
            return None
        for event in events:
            annotations = (event.get("metadata") or {}).get("annotations") or {}
            if annotations.get(names.ANNOTATION_EVENT_FACT) == fact:
                return event
        return None

    # --- Leases (leader election) ------------------------------------------------------------------------
    def get_lease(self, namespace: str, name: str) -> JSON | None:
        """A coordination.k8s.io/v1 Lease as the API returns it, or None when there is none."""
        try:
            return self._get(LEASES, namespace, name)
        except NotFound:
            return None

    def create_lease(self, namespace: str, name: str, spec: Mapping[str, Any]) -> JSON | None:
        """Create a Lease; None when one already exists (another replica was first: the caller re-reads it).

        The body is sent as given (see `_send`): its MicroTimes keep their six fraction digits.
        """
        body: JSON = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": dict(spec),
        }
        try:
            return self._send(
                f"create Lease {namespace}/{name}",
                "POST",
                LEASES.path(namespace),
                body,
            )
        except KubeError as exc:
            if exc.status == 409 and exc.reason == "AlreadyExists":
                return None
            raise

    def patch_lease(self, namespace: str, name: str, spec: Mapping[str, Any], resource_version: str) -> JSON:
        """Merge-patch a Lease's spec guarded by `resource_version` (compare-and-set): a replica that read an
        older Lease gets `Conflict` instead of overwriting the holder that renewed in between. Sent as given.
        """
        patch: JSON = {"metadata": {"resourceVersion": resource_version}, "spec": dict(spec)}
        return self._send(
            f"patch Lease {namespace}/{name}",
            "PATCH",
            LEASES.path(namespace, name),
            patch,
            content_type=MERGE_PATCH,
        )
