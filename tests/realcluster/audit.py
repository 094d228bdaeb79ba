"""RBAC measured on the real authorizer: the kube-apiserver's audit log says which (verb, resource) each identity
under test used and what was answered; deploy/ says what is granted. A 403 is a failure of the story; a grant no
request used is reported (least privilege, measured rather than argued).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.realcluster.cluster import OPERATOR_USER

OPERATOR = OPERATOR_USER
AUTOSCALER = "system:serviceaccount:homelab-autoscaler-system:cluster-autoscaler"
_ROOT = Path(__file__).resolve().parents[2]


def _roles_of(kustomization: str) -> tuple[str, ...]:
    """Every file of a kustomization that holds a Role or ClusterRole: the grants are what deploy/ ships, read from
    it, so a Role added there is audited without a second list to keep."""
    here = Path(kustomization).parent
    listed = yaml.safe_load((_ROOT / kustomization).read_text())["resources"]
    return tuple(
        str(here / name)
        for name in listed
        if any(
            (doc or {}).get("kind") in ("Role", "ClusterRole")
            for doc in yaml.safe_load_all((_ROOT / here / name).read_text())
        )
    )


OPERATOR_RBAC = _roles_of("deploy/rbac/kustomization.yaml")
AUTOSCALER_RBAC = ("deploy/cluster-autoscaler/base/rbac.yaml",)


@dataclass(frozen=True)
class AuditEvent:
    """One request as the API server recorded it (stage ResponseComplete)."""

    user: str
    verb: str
    api_group: str
    resource: str  # with its subresource: "nodeclaims/status"
    namespace: str
    name: str
    code: int
    reason: str
    uri: str
    request: Any = None
    response: Any = None
    at: str = ""


def read(path: Path) -> Iterator[AuditEvent]:
    """The answered requests of an audit log (JSON lines), once each; non-resource requests are skipped."""
    seen: set[str] = set()
    with path.open() as f:
        for line in f:
            doc = json.loads(line)
            # A watch is long-running: informers' list-by-watch (client-go's WatchList) may still be open when the
            # story ends, so its ResponseStarted stage counts too, once per request.
            stage, verb = doc.get("stage"), doc.get("verb")
            if not (stage == "ResponseComplete" or (stage == "ResponseStarted" and verb == "watch")):
                continue
            if doc.get("auditID") in seen:
                continue
            seen.add(str(doc.get("auditID")))
            ref = doc.get("objectRef") or {}
            if not ref.get("resource"):
                continue
            resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            status = doc.get("responseStatus") or {}
            yield AuditEvent(
                user=str((doc.get("user") or {}).get("username", "")),
                verb=str(doc.get("verb", "")),
                api_group=str(ref.get("apiGroup") or ""),
                resource=resource,
                namespace=str(ref.get("namespace") or ""),
                name=str(ref.get("name") or ""),
                code=int(status.get("code") or 0),
                reason=str(status.get("reason") or ""),
                uri=str(doc.get("requestURI", "")),
                request=doc.get("requestObject"),
                response=doc.get("responseObject"),
                at=str(doc.get("stageTimestamp", "")),
            )


@dataclass(frozen=True)
class Rule:
    """One (apiGroup, resource, verb) a Role or ClusterRole grants, with its resourceNames if it names any."""

    source: str  # "ClusterRole/homelab-autoscaler"
    api_group: str
    resource: str
    verb: str
    names: tuple[str, ...] = ()
    namespace: str = ""  # a Role's namespace; "" for a ClusterRole


def rules_from(paths: Iterable[Path]) -> list[Rule]:
    out: list[Rule] = []
    for path in paths:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") not in ("Role", "ClusterRole"):
                continue
            meta = doc.get("metadata") or {}
            source = f"{doc['kind']}/{meta.get('name')}"
            namespace = str(meta.get("namespace") or "") if doc["kind"] == "Role" else ""
            for rule in doc.get("rules") or []:
                for group in rule.get("apiGroups") or [""]:
                    for resource in rule.get("resources") or []:
                        for verb in rule.get("verbs") or []:
                            names = tuple(rule.get("resourceNames") or ())
                            out.append(Rule(source, group, resource, verb, names, namespace))
    return out


def grants(rule: Rule, event: AuditEvent) -> bool:
    if (rule.api_group, rule.resource, rule.verb) != (event.api_group, event.resource, event.verb):
        return False
    if rule.namespace and rule.namespace != event.namespace:
        return False
    return not rule.names or event.name in rule.names


@dataclass
class Usage:
    """What one identity did, and how the authorizer and the rules answered."""

    user: str
    used: dict[tuple[str, str, str], Counter[int]]
    forbidden: list[AuditEvent]
    ungranted: list[AuditEvent]  # allowed by the server but by no rule of deploy/ (another binding gave it)
    unused: list[Rule]


def usage(events: Iterable[AuditEvent], user: str, rules: list[Rule]) -> Usage:
    used: dict[tuple[str, str, str], Counter[int]] = defaultdict(Counter)
    forbidden: list[AuditEvent] = []
    ungranted: list[AuditEvent] = []
    hit: set[Rule] = set()
    for e in events:
        if e.user != user:
            continue
        used[(e.api_group, e.resource, e.verb)][e.code] += 1
        if e.code == 403:
            forbidden.append(e)
            continue
        matching = [r for r in rules if grants(r, e)]
        hit.update(matching)
        if not matching:
            ungranted.append(e)
    unused = [r for r in rules if r not in hit]
    return Usage(user, dict(used), forbidden, ungranted, unused)


def table(u: Usage, rules: list[Rule]) -> str:
    """Used versus granted, one row per (apiGroup, resource, verb) granted or used."""
    keys = {(r.api_group, r.resource, r.verb) for r in rules} | set(u.used)
    rows = ["| apiGroup | resource | verb | granted by | requests (by status code) |", "|---|---|---|---|---|"]
    for group, resource, verb in sorted(keys, key=lambda k: (k[1], k[0], k[2])):
        by = sorted({r.source + (f" ({', '.join(r.names)})" if r.names else "")
                     for r in rules if (r.api_group, r.resource, r.verb) == (group, resource, verb)})  # fmt: skip
        codes = u.used.get((group, resource, verb))
        seen = ", ".join(f"{code}: {n}" for code, n in sorted(codes.items())) if codes else "never used"
        rows.append(f"| {group or 'core'} | {resource} | {verb} | {'; '.join(by) or 'NOT GRANTED'} | {seen} |")
    return "\n".join(rows)
