"""The emulator judged by the real server: every request the operator made during the story, as the real
kube-apiserver's audit log recorded it (method, path and query, body, status code, reason, response), is sent
again to the strict emulator, and the answers are compared.

Before each request the emulator holds the object it targets as the operator last saw it on the real server (from
the responses recorded so far), or nothing when the real server answered 404 or the request created it. A
subresource's create acts on its parent: an Eviction (POST pods/NAME/eviction) finds the Pod as the operator last
listed it, and beside it the namespace's PodDisruptionBudgets as the log last showed them. The operator need not
have read a budget to be refused by it, so with `user` the others' requests the audit policy records in full (every
write and read of budgets: the person's, the disruption controller's, the API server's own) are learned, never
replayed. The translations, the only liberties taken: a resourceVersion in a patch's body (compare-and-set) is the
emulator's current one when the real server accepted it and a stale one when it answered 409; a list or watch's
resourceVersion is dropped and a watch's timeoutSeconds is 0 (the emulator's "backlog, then end"). A difference is
a different status code or reason, or, for a write both accepted, a field the request wrote that the two servers
stored differently.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from homelab_sim.emulator import EmulatorServer

from tests.realcluster.audit import AuditEvent

Obj = dict[str, Any]
Key = tuple[str, str, str, str]  # (apiGroup, plural, namespace, name)
BUDGETS = ("policy", "poddisruptionbudgets")
# What the two servers may store differently without it being a difference: the server's own bookkeeping.
SERVER_FIELDS = frozenset({"resourceVersion", "uid", "creationTimestamp", "managedFields", "generation",
                           "deletionTimestamp", "selfLink"})  # fmt: skip


@dataclass
class Outcome:
    """One replayed request: what the real server answered, what the emulator answered, and what differs."""

    event: AuditEvent
    code: int
    reason: str
    differences: list[str] = field(default_factory=list)
    skipped: bool = False  # no pre-state known: the operator met the object in a watch event

    @property
    def shape(self) -> str:
        e = self.event
        return f"{e.verb} {e.api_group or 'core'}/{e.resource}"


def _plural(resource: str) -> tuple[str, str]:
    plural, _, sub = resource.partition("/")
    return plural, sub


def _key(e: AuditEvent) -> Key:
    return (e.api_group, _plural(e.resource)[0], e.namespace, e.name)


def _version(group: str) -> str:
    versions = {
        "": "v1",
        "batch": "v1",
        "coordination.k8s.io": "v1",
        "policy": "v1",
        "infra.homecluster.dev": "v2alpha1",
    }
    return versions[group]


def _gv(group: str) -> str:
    return f"{group}/{_version(group)}" if group else "v1"


def _is_object(doc: Any) -> bool:
    return isinstance(doc, Mapping) and doc.get("kind") not in (None, "Status") and bool(doc.get("metadata"))


def leaves(doc: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf of a JSON document with its path; lists are leaves (a merge patch replaces them whole)."""
    if isinstance(doc, Mapping) and doc:
        for k, v in doc.items():
            yield from leaves(v, (*path, str(k)))
    else:
        yield path, doc


def _absent(value: Any) -> Any:
    """An empty object or list is what one server omits and the other serializes: both mean "nothing"."""
    return None if value in ({}, []) else value


def at(doc: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(doc, Mapping):
            return None
        doc = doc.get(part)
    return doc


def written_differences(request: Any, real: Any, emulated: Any) -> list[str]:
    """Fields the request wrote that the two servers stored differently (their own bookkeeping aside)."""
    out: list[str] = []
    for path, _ in leaves(request):
        if any(p in SERVER_FIELDS for p in path):
            continue
        r, m = _absent(at(real, path)), _absent(at(emulated, path))
        if r != m:
            out.append(f"{'.'.join(path)}: real {json.dumps(r)[:80]}, emulator {json.dumps(m)[:80]}")
    return out


class Replayer:
    """Replays AuditEvents, in order, against a strict emulator that this object starts and stops."""

    def __init__(self) -> None:
        self.server = EmulatorServer(strict=True).start()
        self.known: dict[Key, Obj] = {}
        self.unknown = 0

    def close(self) -> None:
        self.server.stop()

    def __enter__(self) -> Replayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the emulator's state ----------------------------------------------------------------------------------
    def _seed(self, key: Key, obj: Obj | None) -> Obj | None:
        group, plural, namespace, name = key
        gv = _gv(group)

        def put(em: Any) -> Obj | None:
            if em.get_object(gv, plural, namespace or None, name) is not None:
                em.store[em.spec_of(gv, plural).key].pop((namespace or None, name), None)
            if obj is None:
                return None
            clean = json.loads(json.dumps(obj))
            meta = clean.setdefault("metadata", {})
            for f in ("resourceVersion", "managedFields", "deletionTimestamp"):
                meta.pop(f, None)
            meta["finalizers"] = [] if meta.get("deletionTimestamp") else meta.get("finalizers", [])
            stored: Obj = em.put_object(gv, plural, clean, namespace or None)
            return stored

        result: Obj | None = self.server.call(put)
        return result

    def _seed_budgets(self, namespace: str) -> None:
        """The namespace's PodDisruptionBudgets as the log last showed them, and no other (an eviction's judges)."""
        gv, plural = _gv(BUDGETS[0]), BUDGETS[1]
        held: list[str] = self.server.call(
            lambda em: [str(b["metadata"]["name"]) for b in em.objects_of(gv, plural, namespace)]
        )
        known = {k[3]: obj for k, obj in self.known.items() if k[:3] == (*BUDGETS, namespace)}
        for name in held:
            if name not in known:
                self._seed((*BUDGETS, namespace, name), None)
        for name, obj in known.items():
            self._seed((*BUDGETS, namespace, name), obj)

    def learn(self, e: AuditEvent) -> None:
        """Another user's request, recorded in full: the state it left is known; it is not replayed."""
        if isinstance(e.response, Mapping):
            self._learn(e)

    def _learn(self, e: AuditEvent) -> None:
        """Keep what the real server answered as the operator's latest view of each object."""
        if not isinstance(e.response, Mapping) or not 200 <= e.code < 300:
            if e.code == 404 and e.name:
                self.known.pop(_key(e), None)
            return
        if e.verb == "list":
            for item in e.response.get("items") or []:
                meta = item.get("metadata") or {}
                self.known[(e.api_group, _plural(e.resource)[0], meta.get("namespace") or "", meta.get("name", ""))] = {
                    "apiVersion": _gv(e.api_group), "kind": e.response.get("kind", "").removesuffix("List"), **item,
                }  # fmt: skip
        elif e.verb == "delete":
            self.known.pop(_key(e), None)
        elif e.verb in ("get", "create", "patch", "update") and e.response.get("kind") not in ("Status", None):
            meta = e.response.get("metadata") or {}
            key = (e.api_group, _plural(e.resource)[0], meta.get("namespace") or e.namespace, meta.get("name", e.name))
            self.known[key] = dict(e.response)

    # --- one request -------------------------------------------------------------------------------------------
    def _request(self, e: AuditEvent, body: Any, query: dict[str, list[str]]) -> tuple[int, str, Any]:
        path = urllib.parse.urlsplit(e.uri).path
        url = self.server.url + path + ("?" + urllib.parse.urlencode(query, doseq=True) if query else "")
        method = {"get": "GET", "list": "GET", "watch": "GET", "create": "POST", "patch": "PATCH", "update": "PUT",
                  "delete": "DELETE"}[e.verb]  # fmt: skip
        data = json.dumps(body).encode() if body is not None else None
        ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": ctype})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
                code = resp.status
        except urllib.error.HTTPError as err:
            raw, code = err.read(), err.code
        text = raw.decode(errors="replace").strip()
        doc: Any = None
        if text and e.verb != "watch":
            doc = json.loads(text)
        reason = str(doc.get("reason") or "") if isinstance(doc, Mapping) and doc.get("kind") == "Status" else ""
        return code, reason, doc

    def replay(self, e: AuditEvent) -> Outcome:
        key = _key(e)
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(e.uri).query)
        body = json.loads(json.dumps(e.request)) if e.request is not None else None
        if e.verb in ("list", "watch"):
            query.pop("resourceVersion", None)
            query.pop("resourceVersionMatch", None)
            if e.verb == "watch":
                query["timeoutSeconds"] = ["0"]
        elif e.verb == "create" and _plural(e.resource)[1]:
            # A subresource's create (pods/eviction) acts on its parent: there as last seen, or gone (a 404).
            before = None if e.code == 404 else self.known.get(key)
            if before is None and e.code != 404:
                self.unknown += 1
                self._learn(e)
                return Outcome(e, 0, "", skipped=True)
            self._seed(key, before)
            if e.resource == "pods/eviction":
                self._seed_budgets(e.namespace)
        elif e.verb == "create":
            name = (body or {}).get("metadata", {}).get("name") or e.name
            self._seed((key[0], key[1], key[2], name), self.known.get((key[0], key[1], key[2], name)) if e.code == 409
                       else None)  # fmt: skip
        else:
            # A read's answer is the state it read; a write's pre-state is the operator's last view of the object, or
            # (first met here, as a watch event the audit log does not carry showed it) what the write answered.
            answered = dict(e.response) if 200 <= e.code < 300 and _is_object(e.response) else None
            before = answered if e.verb == "get" else (self.known.get(key) or answered)
            if e.code != 404 and before is None:
                self.unknown += 1
                self._learn(e)
                return Outcome(e, 0, "", skipped=True)
            seeded = self._seed(key, None if e.code == 404 else before)
            # A compare-and-set: a patch's metadata.resourceVersion, a delete's preconditions.resourceVersion.
            for where in (("metadata",), ("preconditions",)):
                if at(body, (*where, "resourceVersion")) is not None and seeded is not None:
                    holder = at(body, where)
                    holder["resourceVersion"] = "1" if e.code == 409 else seeded["metadata"]["resourceVersion"]
            if isinstance(body, dict) and body.get("apiVersion") == "meta.k8s.io/__internal":
                body["apiVersion"] = "meta.k8s.io/v1"  # the audit log records the decoded options
        code, reason, doc = self._request(e, body, query)
        out = Outcome(e, code, reason)
        if code != e.code:
            out.differences.append(f"status {e.code} {e.reason} on the real server, {code} {reason} here")
        elif reason != e.reason:
            out.differences.append(f"reason {e.reason!r} on the real server, {reason!r} here")
        elif 200 <= code < 300 and e.verb in ("create", "patch", "update") and isinstance(e.response, Mapping):
            out.differences += written_differences(e.request, e.response, doc)
        self._learn(e)
        return out


def replay_all(events: Iterable[AuditEvent], user: str = "") -> list[Outcome]:
    """Replay `events` in order; with `user`, only that user's, the others' (recorded in full) learned."""
    with Replayer() as r:
        outcomes: list[Outcome] = []
        for e in events:
            if user and e.user != user:
                r.learn(e)
            else:
                outcomes.append(r.replay(e))
        return outcomes


def report(outcomes: list[Outcome]) -> tuple[str, list[str]]:
    """A table of request shapes (how many replayed, how many differed) and every distinct difference."""
    total: Counter[str] = Counter(o.shape for o in outcomes if not o.skipped)
    skipped: Counter[str] = Counter(o.shape for o in outcomes if o.skipped)
    differing: Counter[str] = Counter(o.shape for o in outcomes if o.differences)
    rows = [
        "| request | replayed | status codes (real) | differed | not replayable (no pre-state) |",
        "|---|---|---|---|---|",
    ]
    for shape in sorted(set(total) | set(skipped)):
        codes = Counter(o.event.code for o in outcomes if o.shape == shape and not o.skipped)
        seen = ", ".join(f"{c}: {n}" for c, n in sorted(codes.items()))
        rows.append(f"| {shape} | {total[shape]} | {seen} | {differing[shape]} | {skipped[shape]} |")
    distinct: dict[str, None] = {}
    for o in outcomes:
        for d in o.differences:
            distinct[f"{o.shape}: {d}"] = None
    return "\n".join(rows), list(distinct)
