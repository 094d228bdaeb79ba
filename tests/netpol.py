"""NetworkPolicy's semantics (networking.k8s.io/v1), as the API documents them, for reading a rendered install's
doors without a cluster: which Pod may open a connection to which Pod or address on which port. The real engine on
the real node is the judge (tests/realcluster); this is the fast loop that reads every overlay and the chart.

A connection is allowed when the source may send it (no policy isolates it for egress, or one of those that do
allows it) and the destination may take it (likewise for ingress). An address outside the cluster is never
isolated; an ipBlock matches addresses, not Pods (what most engines do for Pod IPs is implementation-defined, so a
door is never reckoned open to a Pod through an ipBlock).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: Mapping[str, str]
    namespace_labels: Mapping[str, str] = field(default_factory=dict)

    def ns_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace, **self.namespace_labels}


@dataclass(frozen=True)
class Address:
    ip: str


Endpoint = Pod | Address


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A label selector: matchLabels and matchExpressions (In, NotIn, Exists, DoesNotExist); {} selects all."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }.get(op)
        if ok is None:
            raise ValueError(f"matchExpressions: unknown operator {op!r}")
        if not ok:
            return False
    return True


def _peer_matches(peer: Mapping[str, Any], policy_ns: str, who: Endpoint) -> bool:
    if "ipBlock" in peer:
        if not isinstance(who, Address):
            return False
        ip = ipaddress.ip_address(who.ip)
        block = peer["ipBlock"]
        net = ipaddress.ip_network(block["cidr"])
        if ip.version != net.version or ip not in net:
            return False
        return not any(ip in ipaddress.ip_network(x) for x in block.get("except") or []
                       if ipaddress.ip_network(x).version == ip.version)  # fmt: skip
    if not isinstance(who, Pod):
        return False
    if "namespaceSelector" in peer:
        if not selects(peer["namespaceSelector"], who.ns_labels()):
            return False
    elif who.namespace != policy_ns:
        return False
    return "podSelector" not in peer or selects(peer["podSelector"], who.labels)


def _port_matches(ports: list[Mapping[str, Any]] | None, port: int, protocol: str) -> bool:
    if not ports:
        return True
    for p in ports:
        if p.get("protocol", "TCP") != protocol:
            continue
        if "port" not in p:
            return True
        if not isinstance(p["port"], int):
            raise ValueError(f"a named port ({p['port']!r}) needs the Pod's ports: name it by number here")
        if p["port"] <= port <= p.get("endPort", p["port"]):
            return True
    return False


def _types(policy: Mapping[str, Any]) -> list[str]:
    spec = policy["spec"]
    return spec.get("policyTypes") or (["Ingress", "Egress"] if "egress" in spec else ["Ingress"])


def _selecting(policies: Iterable[Mapping[str, Any]], pod: Pod, kind: str) -> list[Mapping[str, Any]]:
    return [p for p in policies
            if p["metadata"].get("namespace", pod.namespace) == pod.namespace
            and selects(p["spec"].get("podSelector"), pod.labels) and kind in _types(p)]  # fmt: skip


def _allowed(policies: Sequence[Mapping[str, Any]], owner: Pod, kind: str, other: Endpoint, port: int,
             protocol: str) -> bool:  # fmt: skip
    mine = _selecting(policies, owner, kind)
    if not mine:
        return True  # not isolated in that direction
    key, peers_key = ("ingress", "from") if kind == "Ingress" else ("egress", "to")
    for p in mine:
        ns = p["metadata"].get("namespace", owner.namespace)
        for rule in p["spec"].get(key) or []:
            peers = rule.get(peers_key)
            if (not peers or any(_peer_matches(x, ns, other) for x in peers)) and _port_matches(
                rule.get("ports"), port, protocol
            ):
                return True
    return False


def allowed(
    policies: Sequence[Mapping[str, Any]], src: Endpoint, dst: Endpoint, port: int, protocol: str = "TCP"
) -> bool:
    """Whether `src` may open a connection to `dst` on `port` under `policies`."""
    out = not isinstance(src, Pod) or _allowed(policies, src, "Egress", dst, port, protocol)
    into = not isinstance(dst, Pod) or _allowed(policies, dst, "Ingress", src, port, protocol)
    return out and into


def isolated(policies: Sequence[Mapping[str, Any]], pod: Pod) -> set[str]:
    """The directions in which some policy isolates `pod`."""
    return {kind for kind in ("Ingress", "Egress") if _selecting(policies, pod, kind)}
