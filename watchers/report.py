"""The report writer: the one writer of `Node.status` and of the observed half of `Group.status`.

A slot's report is a function of facts other writers own: the live claim (its phase from the claim resource,
its scale-down mark from the claim's workflow), and the kubelet Node (power, usability). The phase comes from
the law's `derive`, the history from `domain.history.record` (the only code that writes those fields), and
the rest from the facts as they are. Nothing reads the report to decide anything.

Writes are merge patches of the keys that changed, guarded by the slot's resourceVersion: a former leader
that still writes from an older picture gets a Conflict instead of undoing a newer report. A report that is
already right is not written at all, so a quiet cluster costs no writes.

Decisions:

* Marker conditions. `ScaleUpInFlight` is True while the live claim is pending or booting and not marked (a
  machine is being bought). `ScaleDownInFlight` is True while the live claim is marked, or while the report is
  `draining` (a machine is being let go, with or without a claim). Their clocks move only when the status
  flips.
* `lastClaim` is the newest claim resource of the slot; when no claim exists (collected by its TTL) the
  digest already on the slot is kept, which is the point of having it.
* Group health: `unknown` with no slots; a slot is in trouble when its newest claim failed or when a ready
  claim's machine is not usable (reported booting); `offline` when every slot is, `degraded` when some are,
  `healthy` otherwise.
* Usage figures (`status.usage` of slots and groups, issue 35): the writer keeps each slot's tally in memory
  (`watchers.usage.UsageBook`), counts it at every look (an event, the tick, the resync), and writes it with any
  report write, at once when something other than time changed, else once per flush interval. The group's figures
  are its slots' tallies summed at one instant, written by this writer too: one writer, the leader, for both.
* `powerOffNodePolicy: Delete`: the kubelet Node is deleted once the slot's newest claim has ended with its
  `MachineObservedOff` condition True, no claim is live and the Node is not Ready; a template of the Node
  (labels, lasting taints, capacity, allocatable) is written into `status.nodeTemplate` first, and the Node is
  deleted only after that write landed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from temporalio.common import MetricMeter

from api.names import (
    KIND_NODE,
    LABEL_GROUP,
    LABEL_NODE,
    ClaimPhase,
    ConditionType,
    EventReason,
    GroupHealth,
    PowerOffNodePolicy,
    PowerState,
    Report,
    UsageState,
    label_value,
    provider_id,
)
from api.v2alpha1 import ClaimDigest, Condition, GroupUsage, NodeStatus, NodeTemplate, SlotUsage
from domain import claims, history, law, usage
from kube import views
from kube.adapter import GROUPS, SLOTS, Kube, ObjectRef
from kube.errors import Conflict, KubeError, NotFound
from kube.objects import meta, spec, status
from kube.views import observe, readiness_taints, template_of
from watchers.cluster import (
    Cluster,
    Key,
    claim_condition,
    claim_phase,
    newer_or_same,
)
from watchers.usage import Entry, UsageBook

log = logging.getLogger(__name__)

JSON = dict[str, Any]
WRITE_ATTEMPTS = 3


@dataclass(frozen=True)
class SlotFacts:
    """Everything a slot's report is a function of (None for `last_claim`/`template`: keep what is there)."""

    live_claim: str | None
    live_phase: ClaimPhase | None
    marked: bool
    power: PowerState
    usable: bool
    last_claim: ClaimDigest | None = None
    template: NodeTemplate | None = None
    problem: str = ""  # why the slot's spec cannot power its machine (a field path, never a value)
    attempts_reset_at: datetime | None = None


# --- pure: facts to report --------------------------------------------------------------------------------
def _condition(
    held: Mapping[str, Condition], kind: ConditionType, on: bool, reason: str, message: str, now: datetime
) -> Condition:
    """A marker condition whose clock moves only when its status flips (as every Kubernetes condition)."""
    before = held.get(kind)
    state = "True" if on else "False"
    since = before.last_transition_time if before is not None and before.status == state else now
    return Condition(type=kind, status=state, reason=reason, message=message, last_transition_time=since)


def markers(facts: SlotFacts, report: Report, held: list[Condition], now: datetime) -> list[Condition]:
    """The autoscaler marker conditions (see the module docstring); other condition types are kept as held."""
    by_type = {cond.type: cond for cond in held}
    buying = facts.live_phase in law.BOOT_WINDOW and not facts.marked
    claim = facts.live_claim or ""
    up = _condition(
        by_type,
        ConditionType.SCALE_UP_IN_FLIGHT,
        buying,
        f"Claim{str(facts.live_phase).capitalize()}" if buying else "NoScaleUp",
        f"claim {claim} is {facts.live_phase}" if buying else "",
        now,
    )
    letting_go = facts.marked or report is Report.DRAINING
    if facts.marked:
        down_reason, down_message = "ClaimMarked", f"claim {claim} is marked for deletion"
    elif letting_go:
        down_reason, down_message = "MachineUnwanted", "the machine is on and no live claim wants it"
    else:
        down_reason, down_message = "NoScaleDown", ""
    down = _condition(by_type, ConditionType.SCALE_DOWN_IN_FLIGHT, letting_go, down_reason, down_message, now)
    ours = {ConditionType.SCALE_UP_IN_FLIGHT.value, ConditionType.SCALE_DOWN_IN_FLIGHT.value}
    return [cond for cond in held if cond.type not in ours] + [up, down]


def slot_conditions(
    facts: SlotFacts, report: Report, held: list[Condition], last_claim: ClaimDigest | None, now: datetime
) -> list[Condition]:
    """The marker conditions, plus whether the slot's spec is usable (Valid) and whether it can take a new claim
    (Claimable: the same rule slot choice applies), sorted by when each last changed.
    """
    conditions = markers(facts, report, held, now)
    by_type = {cond.type: cond for cond in conditions}
    valid = _condition(
        by_type, ConditionType.VALID, not facts.problem, "InvalidSpec" if facts.problem else "Valid", facts.problem, now
    )
    why = claims.claimability(last_claim, facts.attempts_reset_at, facts.problem)
    claimable = _condition(by_type, ConditionType.CLAIMABLE, why.ok, why.reason, why.message, now)
    ours = {ConditionType.VALID.value, ConditionType.CLAIMABLE.value}
    merged = [cond for cond in conditions if cond.type not in ours] + [valid, claimable]
    return sorted(merged, key=lambda cond: (cond.last_transition_time, cond.type))


def report_of(facts: SlotFacts) -> Report:
    return law.derive(law.Input(facts.live_phase, facts.marked, facts.power, facts.usable))


def slot_status(current: NodeStatus, facts: SlotFacts, now: datetime) -> NodeStatus:
    """The slot's report for these facts at `now`: the phase and its history through `history.record`."""
    report = report_of(facts)
    recorded = history.record(current, report, now)
    last_claim = facts.last_claim if facts.last_claim is not None else current.last_claim
    update: dict[str, Any] = {
        "power_state": facts.power,
        "conditions": slot_conditions(facts, report, list(current.conditions), last_claim, now),
    }
    if facts.last_claim is not None:
        update["last_claim"] = facts.last_claim
    if facts.template is not None:
        update["node_template"] = facts.template
    return recorded.model_copy(update=update)


def _dump(model: Any) -> JSON:
    doc: JSON = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    return doc


def merge_diff(have: Mapping[str, Any], want: Mapping[str, Any]) -> JSON:
    """The RFC 7386 merge patch that turns `have` into `want`: objects recurse (a merge patch merges them, so a
    key that went away must be sent as null), everything else is sent whole when it differs.
    """
    patch: JSON = {}
    for key in sorted(set(have) | set(want)):
        old, new = have.get(key), want.get(key)
        if old == new:
            continue
        if key not in want:
            patch[key] = None
        elif isinstance(old, dict) and isinstance(new, dict):
            patch[key] = merge_diff(old, new)
        else:
            patch[key] = new
    return patch


def status_patch(current: Any, desired: Any) -> JSON:
    """The merge patch from one status model to another (empty when the report is already right)."""
    return merge_diff(_dump(current), _dump(desired))


def parse_status(raw: Mapping[str, Any] | None) -> NodeStatus:
    """The slot's report as stored; an unreadable one starts over rather than stopping every future report."""
    try:
        return NodeStatus.model_validate(status(raw))
    except ValidationError as exc:
        log.warning("slot %s: unreadable status replaced: %s", meta(raw).get("name"), exc.errors()[:1])
        return NodeStatus()


def digest_of(claim: Mapping[str, Any]) -> ClaimDigest | None:
    """Node.status.lastClaim from a claim resource (None when the resource does not fit the schema)."""
    sp, st = spec(claim), status(claim)
    doc = {
        "name": meta(claim).get("name"),
        "phase": str(claim_phase(claim)),
        "attempt": st.get("attempt"),
        "call": sp.get("call"),
        "group": sp.get("group"),
        "reason": st.get("reason") or None,
        "requestedAt": sp.get("requestedAt"),
        "deadlineAt": sp.get("deadlineAt"),
        "finishedAt": st.get("finishedAt"),
        "message": st.get("message") or None,
    }
    try:
        return ClaimDigest.model_validate(doc)
    except ValidationError:
        log.warning("claim %s: digest skipped, the claim does not fit the schema", doc["name"])
        return None


def node_template(node: Mapping[str, Any], taints: list[JSON], now: datetime) -> NodeTemplate | None:
    """The lasting shape of a kubelet Node (see `activities.kube_activities.template_of`) as a status field."""
    snap = template_of(node, taints, now)
    try:
        return NodeTemplate.model_validate(
            {
                "labels": meta(snap).get("labels") or {},
                "taints": spec(snap).get("taints") or [],
                "capacity": status(snap).get("capacity") or {},
                "allocatable": status(snap).get("allocatable") or {},
                "takenAt": now,
            }
        )
    except ValidationError as exc:
        log.warning("Node %s: no template kept: %s", meta(node).get("name"), exc.errors()[:1])
        return None


def group_conditions(group: Mapping[str, Any] | None, health: GroupHealth, why: list[str], now: datetime) -> list[JSON]:
    """Valid (the spec can be used, else the field and value that cannot) and Healthy (else which slots, why)."""
    try:
        held = {
            cond.type: cond for cond in (Condition.model_validate(x) for x in status(group).get("conditions") or [])
        }
    except ValidationError:
        held = {}
    found = views.group_spec(group)
    problem = found if isinstance(found, str) else ""
    valid = _condition(held, ConditionType.VALID, not problem, "InvalidSpec" if problem else "Valid", problem, now)
    healthy = _condition(
        held,
        ConditionType.GROUP_HEALTHY,
        health in (GroupHealth.HEALTHY, GroupHealth.UNKNOWN),
        str(health).capitalize(),
        "; ".join(why),
        now,
    )
    ordered = sorted([valid, healthy], key=lambda cond: (cond.last_transition_time, cond.type))
    return [_dump(cond) for cond in ordered]


def group_health(troubled: list[bool]) -> GroupHealth:
    if not troubled:
        return GroupHealth.UNKNOWN
    if all(troubled):
        return GroupHealth.OFFLINE
    return GroupHealth.DEGRADED if any(troubled) else GroupHealth.HEALTHY


# --- the writer -------------------------------------------------------------------------------------------
class ReportWriter:
    """Writes slot and group reports from a `Cluster` picture; `slot_writes`/`group_writes` count the writes.

    It reads the cluster only, never a workflow: a claim's scale-down mark is on its resource (the claim's
    MarkedForDeletion condition, or its deletionTimestamp), so a report costs no Temporal round trip per claim.
    """

    def __init__(
        self,
        kube: Kube,
        cluster: Cluster,
        *,
        meter: MetricMeter | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        watt_hours: bool = False,
    ) -> None:
        self.kube = kube
        self.cluster = cluster
        self.slot_writes = 0
        self.group_writes = 0
        self.deleted_nodes: list[str] = []
        self.warned: set[tuple[str, str, str, str]] = set()  # (kind, namespace, uid, generation) already warned
        self.usage = UsageBook(meter, monotonic=monotonic, watt_hours=watt_hours)

    async def _io(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The adapter is synchronous: run it off the event loop, so signals and workflows keep moving."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    # --- slots -------------------------------------------------------------------------------------------
    async def facts(self, key: Key, now: datetime) -> tuple[SlotFacts, JSON | None, bool]:
        """The slot's facts, the kubelet Node they were read from, and whether that Node is due for deletion."""
        cl = self.cluster
        slot = cl.slots[key]
        group = cl.group_of(key)
        node = cl.node_of(slot)
        taints = readiness_taints(group)
        seen = observe(node, taints, now)
        live = cl.live_claim(key)
        marked = False
        if live is not None:
            marked = bool(meta(live).get("deletionTimestamp")) or _condition_true(live, "MarkedForDeletion")
        newest = cl.last_claim(key)
        policy = spec(group).get("powerOffNodePolicy") or PowerOffNodePolicy.DELETE
        delete_node = (
            policy == PowerOffNodePolicy.DELETE
            and node is not None
            and live is None
            and newest is not None
            and law.is_terminal(claim_phase(newest))
            and claim_condition(newest, ConditionType.MACHINE_OBSERVED_OFF)
            and seen.power == PowerState.OFF
            and law.kubelet_silent(node)
        )
        facts = SlotFacts(
            live_claim=None if live is None else str(meta(live).get("name")),
            live_phase=None if live is None else claim_phase(live),
            marked=marked,
            power=PowerState(seen.power),
            usable=seen.usable,
            last_claim=None if newest is None else digest_of(newest),
            template=node_template(node, taints, now) if delete_node and node is not None else None,
            problem=views.slot_problem(slot),
            attempts_reset_at=views.attempts_reset_at(slot),
        )
        return facts, node, delete_node

    async def slot(self, key: Key, now: datetime, *, flush_early: bool = False) -> bool:
        """Bring one slot's report up to date; True when something was written. A slot being deleted is left.

        An API failure leaves the report for the next pass (every event and the resync bring one): one line in
        the log, never an exception out of the watchers. `flush_early`: the tick's pass, which writes usage figures
        half a flush interval old, so the flushes of many slots bunch into few passes.
        """
        try:
            return await self._slot(key, now, flush_early)
        except KubeError as err:
            log.warning("slot %s/%s: report not written this time: %s", key[0], key[1], err)
            return False

    async def _slot(self, key: Key, now: datetime, flush_early: bool = False) -> bool:
        for _ in range(WRITE_ATTEMPTS):
            raw = self.cluster.slots.get(key)
            if raw is None or meta(raw).get("deletionTimestamp"):
                return False
            facts, node, delete_node = await self.facts(key, now)
            if node is not None:
                await self._stamp_identity(key, raw, node)
            current = parse_status(raw)
            desired = slot_status(current, facts, now)
            entry = self.look(key, raw, usage.state_of(report_of(facts), facts.power), current.usage, now)
            if status_patch(current, desired) or self.usage.due(key, current.usage, early=flush_early):
                desired = desired.model_copy(update={"usage": self.usage.status_of(entry)})
            patch = status_patch(current, desired)
            if not patch:
                return False
            try:
                written = await self._io(
                    self.kube.patch_slot_status,
                    key[0],
                    key[1],
                    patch,
                    resource_version=str(meta(raw).get("resourceVersion") or "") or None,
                )
            except Conflict:
                await self._reread(key)
                continue
            except NotFound:
                self.cluster.slots.pop(key, None)
                return False
            self.slot_writes += 1
            self._remember_slot(key, _dump(written))
            if "usage" in patch:
                await self._usage_written(key, raw, now)
            if delete_node and node is not None:
                await self._delete_node(node)
            return True
        log.warning("slot %s/%s: report not written, it kept changing under the writer", *key)
        return False

    # --- usage figures -----------------------------------------------------------------------------------
    def look(self, key: Key, slot: JSON, state: UsageState, stored: SlotUsage | None, now: datetime) -> Entry:
        """Count the slot's time up to now in the usage book (`stored`: its figures as the status holds them), with
        its draw and reset request as the slot and its Group say them now."""
        group = self.cluster.group_of(key)
        draw = usage.effective_draw(views.power_draw(slot), views.power_draw(group))
        asked = [when for when in (views.usage_reset(slot)[0], views.usage_reset(group)[0]) if when is not None]
        return self.usage.look(key, slot, stored, state, draw, max(asked, default=None), now)

    async def _usage_written(self, key: Key, slot: JSON, now: datetime) -> None:
        """The figures landed: a period a reset ended is said in an Event on the slot (its figures are not lost)."""
        ended = self.usage.flushed(key)
        entry = self.usage.entries.get(key)
        if ended is None or entry is None:
            return
        m = meta(slot)
        ref = ObjectRef(KIND_NODE, key[0], key[1], str(m.get("uid") or ""))
        message = usage.reset_message(ended, entry.draw, entry.tally)
        try:
            await self._io(self.kube.create_event, ref, EventReason.USAGE_RESET, message, warning=False, now=now)
        except KubeError as err:
            log.warning("slot %s/%s: UsageReset Event not written: %s", key[0], key[1], err)

    async def count(self, now: datetime) -> int:
        """The tick: every slot's time counted (so the /metrics counters lag by one tick at most), and the usage
        figures written where they are due; the number of writes."""
        written = 0
        keys = [k for k in self.cluster.all_slots() if not meta(self.cluster.slots[k]).get("deletionTimestamp")]
        self.usage.forget(keep=keys)
        for key in keys:
            slot = self.cluster.slots.get(key)  # a slot deleted while an earlier one was written is skipped
            if slot is None:
                continue
            stored = stored_usage(slot)  # the figures only: the tick parses no history
            self.look(key, slot, self.usage_state(key, slot), stored, now)
            if self.usage.due(key, stored, early=True):
                written += await self.slot(key, now, flush_early=True)
        for (namespace, name), raw in sorted(self.cluster.groups.items()):
            figures = self._group_figures(self.cluster.slots_of_group(namespace, name), now)
            held = _group_usage(status(raw).get("usage"))
            if self.usage.group_due((namespace, name), held, figures, early=True):  # else no facts are read
                written += await self.group(namespace, name, now, flush_early=True)
        return written

    def _group_figures(self, keys: Iterable[Key], now: datetime) -> GroupUsage | None:
        """The group's usage at `now` from its slots' figures as written (`UsageBook.group_usage`)."""
        keys = list(keys)
        return self.usage.group_usage(keys, now, {k: stored_usage(self.cluster.slots.get(k)) for k in keys})

    def usage_state(self, key: Key, slot: JSON) -> UsageState:
        """The slot's usage state from the picture, without the rest of its facts (the tick looks at every slot)."""
        cl = self.cluster
        live = cl.live_claim(key)
        marked = live is not None and (
            bool(meta(live).get("deletionTimestamp")) or _condition_true(live, "MarkedForDeletion")
        )
        power = law.power_of(cl.node_of(slot))
        return usage.state_for(None if live is None else claim_phase(live), marked, power)

    async def warn_annotation(self, kind: str, obj: Mapping[str, Any], now: datetime) -> bool:
        """A reset-usage annotation that is no time: one Warning Event per value, naming the annotation."""
        problem = views.usage_reset(obj)[1]
        if not problem:
            return False
        return await self.warn_invalid(kind, obj, problem, now, reason=EventReason.INVALID_ANNOTATION, version=problem)

    def _remember_slot(self, key: Key, obj: JSON) -> None:
        if newer_or_same(obj, self.cluster.slots.get(key)):
            self.cluster.slots[key] = obj

    async def _reread(self, key: Key) -> None:
        try:
            self.cluster.slots[key] = await self._io(self.kube.get_raw, SLOTS, key[0], key[1])
        except NotFound:
            self.cluster.slots.pop(key, None)

    async def _stamp_identity(self, key: Key, slot: JSON, node: JSON) -> None:
        """Label the kubelet Node with its group and slot, and give it our providerID when it has none."""
        group = str(spec(slot).get("group") or "")
        labels = meta(node).get("labels") or {}
        stamped = labels.get(LABEL_GROUP) == label_value(group) and labels.get(LABEL_NODE) == label_value(key[1])
        if stamped and spec(node).get("providerID"):
            return
        name = str(meta(node).get("name"))
        try:
            stamped = await self._io(
                self.kube.stamp_slot_identity,
                name,
                group=group,
                slot=key[1],
                provider_id=str(spec(slot).get("providerID") or provider_id(key[0], key[1])),
            )
        except NotFound:
            return
        if newer_or_same(stamped, self.cluster.nodes.get(name)):
            self.cluster.nodes[name] = stamped

    async def warn_invalid(
        self,
        kind: str,
        obj: Mapping[str, Any],
        problem: str,
        now: datetime,
        *,
        reason: EventReason = EventReason.INVALID_SPEC,
        version: str = "",
    ) -> bool:
        """One Warning Event per version of an object the operator cannot use, naming the field (never a pod
        spec's value): the object is skipped everywhere, and this is how its owner hears why. True when sent.
        `version` says what a new version is when it is not the spec's generation (an annotation's value).
        """
        m = meta(obj)
        which = version or str(m.get("generation") or "")
        ident = (kind, str(m.get("namespace") or ""), str(m.get("uid") or ""), which)
        if not problem or ident in self.warned:
            return False
        self.warned.add(ident)
        ref = ObjectRef(kind, ident[1], str(m.get("name") or ""), ident[2])
        try:
            await self._io(self.kube.create_event, ref, reason, problem, warning=True, now=now)
        except KubeError as err:
            self.warned.discard(ident)
            log.warning("%s %s/%s: Warning Event not written: %s", kind, ident[1], ref.name, err)
            return False
        said = "cannot be used" if reason is EventReason.INVALID_SPEC else "is refused"
        log.warning("%s %s/%s %s: %s", kind, ident[1], ref.name, said, problem)
        return True

    async def _delete_node(self, node: JSON) -> None:
        """powerOffNodePolicy Delete: the machine is verified off and its template is kept; the Node goes.

        Only the Node as read: a kubelet that re-posted it since (a machine switched on again) keeps it, since a
        running kubelet does not register a deleted Node again and its machine would be lost to the cluster.
        """
        name = str(meta(node).get("name"))
        if not await self._io(self.kube.delete_node, name, str(meta(node).get("resourceVersion") or "") or None):
            return
        self.cluster.nodes.pop(name, None)
        self.deleted_nodes.append(name)
        log.info("deleted kubelet Node %s: its machine was verified off (powerOffNodePolicy Delete)", name)

    # --- groups ------------------------------------------------------------------------------------------
    async def group(self, namespace: str, name: str, now: datetime, *, flush_early: bool = False) -> bool:
        """The observed half of Group.status (slots, on, off, health, conditions, usage); True when it was written.

        An API failure leaves it for the next pass, like a slot's report.
        """
        try:
            return await self._group(namespace, name, now, flush_early)
        except KubeError as err:
            log.warning("group %s/%s: report not written this time: %s", namespace, name, err)
            return False

    async def _group(self, namespace: str, name: str, now: datetime, flush_early: bool = False) -> bool:
        for _ in range(WRITE_ATTEMPTS):
            raw = self.cluster.groups.get((namespace, name))
            if raw is None or meta(raw).get("deletionTimestamp"):
                return False
            want, keys = await self._group_counts(namespace, name, now)
            have = status(raw)
            patch = {k: v for k, v in want.items() if k not in have or have[k] != v}
            figures = self._group_figures(keys, now)
            stored = _group_usage(have.get("usage"))
            due = self.usage.group_due((namespace, name), stored, figures, early=flush_early)
            if figures is not None and (patch or due):
                diff = merge_diff(have.get("usage") or {}, _dump(figures))
                if diff:
                    patch["usage"] = diff
            if not patch:
                return False
            try:
                written = await self._io(
                    self.kube.patch_group_status,
                    namespace,
                    name,
                    patch,
                    resource_version=str(meta(raw).get("resourceVersion") or "") or None,
                )
            except Conflict:
                try:
                    self.cluster.groups[(namespace, name)] = await self._io(self.kube.get_raw, GROUPS, namespace, name)
                except NotFound:
                    self.cluster.groups.pop((namespace, name), None)
                continue
            except NotFound:
                self.cluster.groups.pop((namespace, name), None)
                return False
            self.group_writes += 1
            if "usage" in patch:
                self.usage.group_written((namespace, name))
            obj = _dump(written)
            if newer_or_same(obj, self.cluster.groups.get((namespace, name))):
                self.cluster.groups[(namespace, name)] = obj
            return True
        return False

    async def _group_counts(self, namespace: str, name: str, now: datetime) -> tuple[JSON, list[Key]]:
        keys = [
            k
            for k in self.cluster.slots_of_group(namespace, name)
            if not meta(self.cluster.slots[k]).get("deletionTimestamp")
        ]
        on = 0
        troubled: list[bool] = []
        why: list[str] = []
        for key in keys:
            facts, _, _ = await self.facts(key, now)
            slot = self.cluster.slots.get(key) or {}
            self.look(key, slot, usage.state_of(report_of(facts), facts.power), stored_usage(slot), now)
            on += facts.power == PowerState.ON
            newest = self.cluster.newest_claim(key)
            failed = newest is not None and claim_phase(newest) == ClaimPhase.FAILED
            stuck = facts.live_phase == ClaimPhase.READY and report_of(facts) is not Report.READY and not facts.marked
            troubled.append(failed or stuck)
            if failed and newest is not None:
                why.append(f"{key[1]}: claim {meta(newest).get('name')} failed ({status(newest).get('reason')})")
            elif stuck:
                why.append(f"{key[1]}: ready claim, but the node is not usable")
        raw = self.cluster.groups.get((namespace, name))
        health = group_health(troubled)
        counts = {
            "slots": len(keys),
            "on": on,
            "off": len(keys) - on,
            "health": str(health),
            "conditions": group_conditions(raw, health, why, now),
        }
        return counts, keys

    # --- every report ------------------------------------------------------------------------------------
    async def everything(self, now: datetime) -> int:
        """Every slot and group report (the expiry pass and the resync); the number of writes."""
        written = 0
        for key in list(self.cluster.all_slots()):
            written += await self.slot(key, now)
        for namespace, name in sorted(self.cluster.groups):
            written += await self.group(namespace, name, now)
        return written

    def next_expiry(self) -> datetime | None:
        """When the oldest history row of any slot leaves its window: the expiry pass is due then."""
        due = [history.next_expiry(parse_status(s)) for s in self.cluster.slots.values()]
        found = [d for d in due if d is not None]
        return min(found) if found else None


def stored_usage(slot: Mapping[str, Any] | None) -> SlotUsage | None:
    """A slot's usage figures as its status holds them (None when absent or unreadable: they start over)."""
    return views.model_or_none(SlotUsage, status(slot).get("usage"))


def _group_usage(raw: Any) -> GroupUsage | None:
    """The group's usage figures as stored (None when absent or unreadable: they are written again whole)."""
    return views.model_or_none(GroupUsage, raw)


def _condition_true(obj: Mapping[str, Any], kind: str) -> bool:
    """A claim's condition, as its workflow projected it."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(cd.get("type") == kind and cd.get("status") == "True" for cd in conditions)
