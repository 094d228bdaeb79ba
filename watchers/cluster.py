"""The watchers' picture of the cluster: the latest version of every object the watches delivered.

Everything here is a pure function of that picture, so which claim is live for a slot, which slot a kubelet
Node belongs to, and what the report says can be tested without a server.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from api import names
from domain import law
from kube.objects import meta, spec, status
from kube.views import claim_order

JSON = dict[str, Any]
Key = tuple[str, str]  # (namespace, name)


def key_of(obj: Mapping[str, Any]) -> Key:
    m = meta(obj)
    return (str(m.get("namespace") or ""), str(m.get("name") or ""))


def rv_int(obj: Mapping[str, Any] | None) -> int | None:
    """The resourceVersion as a number (what etcd and the emulator hand out), or None when it is not one."""
    try:
        return int(str(meta(obj).get("resourceVersion")))
    except ValueError:
        return None


def newer_or_same(new: Mapping[str, Any], held: Mapping[str, Any] | None) -> bool:
    """Whether `new` may replace `held`: a version older than the one held is a stale delivery.

    The writer's own write response and the watch event of the same write race; without this an older event
    could put back a version the writer has already moved past (and make it write again for nothing).
    """
    a, b = rv_int(new), rv_int(held)
    return held is None or a is None or b is None or a >= b


def parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def claim_phase(claim: Mapping[str, Any]) -> names.ClaimPhase:
    """A claim with no phase yet is pending (it is created without a status)."""
    return law.phase_of(status(claim).get("phase") or None)


def claim_condition(claim: Mapping[str, Any], kind: str) -> bool:
    return any(
        isinstance(c, dict) and c.get("type") == kind and c.get("status") == "True"
        for c in status(claim).get("conditions") or []
    )


@dataclass
class Cluster:
    """Latest objects by (namespace, name); kubelet Nodes by name (they are cluster-scoped). Jobs are kept only
    so that the ones that finished while no replica acted are delivered when one starts to.
    """

    groups: dict[Key, JSON] = field(default_factory=dict)
    slots: dict[Key, JSON] = field(default_factory=dict)
    claims: dict[Key, JSON] = field(default_factory=dict)
    nodes: dict[str, JSON] = field(default_factory=dict)
    jobs: dict[Key, JSON] = field(default_factory=dict)
    # Each slot's last ended claim whose resource is gone (by slot key): a claim may end and go before the slot's
    # report is written (a write refused, a pass behind its events), and the report must still say how it ended.
    departed: dict[Key, JSON] = field(default_factory=dict)

    # --- slots and their machines ------------------------------------------------------------------------
    def slot_node_name(self, slot: Mapping[str, Any]) -> str:
        return str(spec(slot).get("kubernetesNodeName") or "")

    def node_of(self, slot: Mapping[str, Any]) -> JSON | None:
        name = self.slot_node_name(slot)
        return self.nodes.get(name) if name else None

    def slots_of_node(self, node: Mapping[str, Any]) -> list[Key]:
        """The slot a kubelet Node belongs to: by the slot's kubernetesNodeName, then by the labels we stamp
        (which hold the bounded forms of the names, `names.label_value`).
        """
        name = str(meta(node).get("name") or "")
        by_name = [k for k, s in self.slots.items() if self.slot_node_name(s) == name]
        if by_name:
            return by_name
        labels = meta(node).get("labels") or {}
        slot, group = labels.get(names.LABEL_NODE), labels.get(names.LABEL_GROUP)
        if not slot:
            return []
        found = [k for k in self.slots if names.label_value(k[1]) == slot]
        if len(found) > 1 and group:  # the same slot name in two namespaces: the group label decides
            found = [k for k in found if names.label_value(str(spec(self.slots[k]).get("group") or "")) == group]
        return found

    def slots_of_group(self, namespace: str, group: str) -> list[Key]:
        return sorted(k for k, s in self.slots.items() if k[0] == namespace and spec(s).get("group") == group)

    def group_of(self, slot_key: Key) -> JSON | None:
        slot = self.slots.get(slot_key)
        if slot is None:
            return None
        return self.groups.get((slot_key[0], str(spec(slot).get("group") or "")))

    # --- claims ------------------------------------------------------------------------------------------
    def claims_of(self, slot_key: Key) -> list[JSON]:
        """Every claim resource naming the slot, oldest first."""
        ns, slot = slot_key
        found = [c for k, c in self.claims.items() if k[0] == ns and spec(c).get("node") == slot]
        return sorted(found, key=claim_order)

    def live_claim(self, slot_key: Key) -> JSON | None:
        """The claim that owns the slot: the newest live one (no phase, pending, booting, ready).

        The group enforces one live claim per slot by superseding the older ones; until that lands the newest
        is the one that owns the slot, so it is the one the watchers talk to and report.
        """
        live = [c for c in self.claims_of(slot_key) if law.is_live(status(c).get("phase") or None)]
        return live[-1] if live else None

    def newest_claim(self, slot_key: Key) -> JSON | None:
        found = self.claims_of(slot_key)
        return found[-1] if found else None

    def last_claim(self, slot_key: Key) -> JSON | None:
        """The slot's newest claim, or the last ended one whose resource is gone when no newer resource exists: what
        the slot's report says of its last claim (a group's health reads resources only, so a failure collected by
        its TTL stops troubling it)."""
        found = self.claims_of(slot_key)
        gone = self.departed.get(slot_key)
        if gone is not None:
            found = sorted([*found, gone], key=claim_order)
        return found[-1] if found else None

    def claim_departed(self, slot_key: Key, claim: JSON) -> None:
        """A claim resource was deleted: kept as its slot's last word when it had ended (a live one that vanished
        says nothing of its machine)."""
        if law.is_terminal(claim_phase(claim)):
            held = self.departed.get(slot_key)
            if held is None or claim_order(held) <= claim_order(claim):
                self.departed[slot_key] = claim

    def all_slots(self) -> Iterator[Key]:
        yield from sorted(self.slots)
