"""The usage book: each slot's tally in memory while this replica writes reports, and its /metrics counters.

The report writer looks at a slot (an event, the tick, the resync) and hands the book the slot's usage state; the
book counts the seconds its monotonic clock measured since its last look (so a wall clock that jumps moves no
second), and says when the figures are due in the slot's status: at once when something other than time changed
(a move, a boot, a reset, a draw), else once per flush interval. A replica that starts writing (a restart, a new
leader) resumes every slot from its status (`domain.usage.resume`); one that stops forgets its tallies.

Metrics (the exporter adds `_total` to counters): `homelab_slot_seconds_total{state}`, `homelab_slot_boots_total`,
`homelab_slot_shutdowns_total`, the energy counters `homelab_slot_energy_joules_total` (used) and
`homelab_slot_always_on_energy_joules_total` (what the same machine always on would have used; saved is their
difference), and the gauge `homelab_slot_power_watts{source}` (the draw now; `source="declared"`: the slot's
`powerDraw` for its state, so a measured source can sit beside it later), each labelled `kubernetes_namespace`,
`group` and `slot`, named to sit beside Kepler's `*_joules_total` and `*_watts`. The counters count what this process
observed, from zero at its start, as every Prometheus counter does; the status holds the period's sums. The period's
`homelab_slot_energy_used_watt_hours` and `homelab_slot_energy_always_on_watt_hours` gauges are deprecated: served
only with the watch setting `watt_hour_gauges`, for this release only (CHANGELOG.md, docs/upgrades.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from temporalio.common import MetricCounter, MetricGaugeFloat, MetricMeter

from api.names import UsageState
from api.v2alpha1 import GroupUsage, PowerDraw, SlotUsage
from domain import usage
from domain.timings import TIMINGS
from kube.objects import meta, spec

Key = tuple[str, str]

SECONDS = "homelab_slot_seconds"
BOOTS = "homelab_slot_boots"
SHUTDOWNS = "homelab_slot_shutdowns"
JOULES = "homelab_slot_energy_joules"
ALWAYS_ON_JOULES = "homelab_slot_always_on_energy_joules"
POWER = "homelab_slot_power_watts"
#: The period's energy in Wh: deprecated for one release (the dashboard reads the joule counters), then removed.
DEPRECATED_USED_WH = "homelab_slot_energy_used_watt_hours"
DEPRECATED_ALWAYS_ON_WH = "homelab_slot_energy_always_on_watt_hours"
#: What /metrics serves of the usage figures, as Prometheus names them (the dashboard's queries name only these).
EXPORTED = (
    f"{SECONDS}_total",
    f"{BOOTS}_total",
    f"{SHUTDOWNS}_total",
    f"{JOULES}_total",
    f"{ALWAYS_ON_JOULES}_total",
    POWER,
)
#: Where the power gauge's figure comes from: the slot's (or its Group's) `powerDraw`.
DECLARED = "declared"


@dataclass
class Entry:
    """One slot's tally as this replica counts it: the slot's uid (a slot made again starts afresh), the monotonic
    time of the tally's last look and of its last write, and the fractions of seconds not yet on the counters."""

    uid: str
    tally: usage.Tally
    draw: PowerDraw | None
    looked: float
    flushed: float
    labels: dict[str, str]
    carry: dict[UsageState, float] = field(default_factory=lambda: dict.fromkeys(UsageState, 0.0))
    joules_carry: tuple[float, float] = (0.0, 0.0)  # (used, always on): the fractions of a joule not yet counted
    reset_from: usage.Tally | None = None  # the period a reset just ended, until the write that says so lands


@dataclass
class _Meters:
    seconds: MetricCounter
    boots: MetricCounter
    shutdowns: MetricCounter
    joules: MetricCounter
    always_on_joules: MetricCounter
    power: MetricGaugeFloat
    used: MetricGaugeFloat | None
    always_on: MetricGaugeFloat | None

    @classmethod
    def of(cls, meter: MetricMeter, watt_hours: bool) -> _Meters:
        """The meters; the deprecated Wh gauges only when asked for (`watt_hour_gauges`)."""
        return cls(
            meter.create_counter(SECONDS, "seconds a slot was observed in each usage state"),
            meter.create_counter(BOOTS, "times a slot's machine was observed to come on"),
            meter.create_counter(SHUTDOWNS, "times a slot's machine was observed to go off"),
            meter.create_counter(JOULES, "energy a slot's machine used while observed, in joules, at its powerDraw"),
            meter.create_counter(ALWAYS_ON_JOULES, "energy the same machine always on would have used, in joules"),
            meter.create_gauge_float(POWER, "a slot's machine's draw now in watts (source: where the figure is from)"),
            meter.create_gauge_float(
                DEPRECATED_USED_WH, "deprecated, removed in the next release: use homelab_slot_energy_joules_total"
            )
            if watt_hours
            else None,
            meter.create_gauge_float(
                DEPRECATED_ALWAYS_ON_WH,
                "deprecated, removed in the next release: use homelab_slot_always_on_energy_joules_total",
            )
            if watt_hours
            else None,
        )


class UsageBook:
    """Every slot's tally while this replica acts (see the module docstring)."""

    def __init__(
        self,
        meter: MetricMeter | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        flush: timedelta = TIMINGS.usage_flush_interval,
        watt_hours: bool = False,
    ) -> None:
        self.monotonic = monotonic
        self.flush = flush.total_seconds()
        self.entries: dict[Key, Entry] = {}
        self.group_flushed: dict[Key, float] = {}
        self.meters = _Meters.of(meter, watt_hours) if meter is not None else None

    # --- looking -------------------------------------------------------------------------------------------------
    def look(
        self,
        key: Key,
        slot: Mapping[str, Any],
        stored: SlotUsage | None,
        state: UsageState,
        draw: PowerDraw | None,
        reset: datetime | None,
        now: datetime,
    ) -> Entry:
        """Count the slot's time up to now (its state since the last look), then its state now; a reset whose time
        has come starts a new period. A slot seen first (or made again) resumes from what its status holds."""
        mono = self.monotonic()
        uid = str(meta(slot).get("uid") or "")
        entry = self.entries.get(key)
        if entry is None or entry.uid != uid:
            tally = usage.resume(stored, state, now, self.flush)
            credited = usage.credit(stored.counted_to, now, self.flush)[0] if stored and stored.counted_to else 0.0
            labels = {"kubernetes_namespace": key[0], "group": str(spec(slot).get("group") or ""), "slot": key[1]}
            entry = Entry(uid, tally, draw, looked=mono, flushed=mono - credited, labels=labels)
            self.entries[key] = entry
            self._meter_new(entry, usage.from_status(stored))
        else:
            before = entry.tally
            entry.tally = usage.count(before, mono - entry.looked, state, now)
            entry.looked = mono
            entry.draw = draw
            self._meter(entry, before)
            entry.labels["group"] = str(spec(slot).get("group") or "")  # a slot moved to another group counts there
        if usage.reset_due(entry.tally, reset, now):
            entry.reset_from = entry.reset_from or entry.tally
            entry.tally = usage.start(state, now, reset)
        self._meter_energy(entry)
        return entry

    def status_of(self, entry: Entry) -> SlotUsage:
        return usage.to_status(entry.tally, entry.draw)

    def due(self, key: Key, stored: SlotUsage | None, *, early: bool = False) -> bool:
        """Whether the slot's figures go into its status now: something other than time changed, or a flush
        interval (half of one, `early`: the tick's pass, so flushes bunch into few passes) has gone by."""
        entry = self.entries.get(key)
        if entry is None:
            return False
        if usage.settled_part(stored) != usage.settled_part(self.status_of(entry)):
            return True
        return self.monotonic() - entry.flushed >= self.flush / (2 if early else 1)

    def flushed(self, key: Key) -> usage.Tally | None:
        """The slot's figures landed in its status; the period a reset ended, when this write said so."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        entry.flushed = self.monotonic()
        ended, entry.reset_from = entry.reset_from, None
        return ended

    # --- groups --------------------------------------------------------------------------------------------------
    def group_usage(
        self, keys: Iterable[Key], now: datetime, written: Mapping[Key, SlotUsage | None] | None = None
    ) -> GroupUsage | None:
        """The group's figures at `now`: each slot's as its status holds them (`written`) brought up to `now`, so a
        reader who sums the slots' statuses at that moment gets the group's to the second; a slot whose status is
        behind its tally by more than time (a move not written yet), or has none, counts from its tally."""
        parts = []
        for key in keys:
            entry = self.entries.get(key)
            if entry is None:
                continue
            held = (written or {}).get(key)
            if (
                held is not None
                and held.counted_to is not None
                and held.counted_to <= now
                and usage.settled_part(held) == usage.settled_part(self.status_of(entry))
                and (tally := usage.from_status(usage.status_at(held, now))) is not None
            ):
                parts.append((tally, entry.draw))
            else:
                parts.append((entry.tally, entry.draw))
        return usage.group_usage(parts, now)

    def group_due(self, group: Key, stored: GroupUsage | None, want: GroupUsage | None, *, early: bool = False) -> bool:
        if want is None:
            return False
        if usage.settled_part(stored) != usage.settled_part(want):
            return True
        last = self.group_flushed.get(group)
        return last is None or self.monotonic() - last >= self.flush / (2 if early else 1)

    def group_written(self, group: Key) -> None:
        self.group_flushed[group] = self.monotonic()

    # --- keeping ---------------------------------------------------------------------------------------------------
    def forget(self, keep: Iterable[Key] | None = None) -> None:
        """Drop every tally (this replica stopped writing: the next one resumes from the status), or those of slots
        no longer in `keep`."""
        if keep is None:
            self.entries.clear()
            self.group_flushed.clear()
            return
        kept = set(keep)
        for key in [k for k in self.entries if k not in kept]:
            del self.entries[key]

    # --- metrics -------------------------------------------------------------------------------------------------
    def _meter_new(self, entry: Entry, before: usage.Tally | None) -> None:
        """A tally resumed: every state's series exists from now on; what the resume counted is on the counters too
        (a resumed boot or the seconds credited are observations of this process's start)."""
        if self.meters is None:
            return
        for state in UsageState:
            self.meters.seconds.add(0, {**entry.labels, "state": state})
        self.meters.boots.add(0, entry.labels)
        self.meters.shutdowns.add(0, entry.labels)
        if usage.joules(entry.draw, {}, 0) is not None:
            self.meters.joules.add(0, entry.labels)
            self.meters.always_on_joules.add(0, entry.labels)
        if before is not None:
            self._meter(entry, before)

    def _meter(self, entry: Entry, before: usage.Tally) -> None:
        if self.meters is None:
            return
        self._meter_joules(entry, before)
        for state in UsageState:
            grown = entry.tally.seconds[state] - before.seconds[state] + entry.carry[state]
            whole = int(grown) if grown > 0 else 0
            entry.carry[state] = grown - whole if grown > 0 else 0.0
            if whole:
                self.meters.seconds.add(whole, {**entry.labels, "state": state})
        if entry.tally.boots > before.boots:
            self.meters.boots.add(entry.tally.boots - before.boots, entry.labels)
        if entry.tally.shutdowns > before.shutdowns:
            self.meters.shutdowns.add(entry.tally.shutdowns - before.shutdowns, entry.labels)

    def _meter_joules(self, entry: Entry, before: usage.Tally) -> None:
        """The energy of what this look counted, at the draw the slot has now, onto the joule counters (whole joules;
        the fractions wait for the next look)."""
        assert self.meters is not None
        grown = {s: max(0.0, entry.tally.seconds[s] - before.seconds[s]) for s in UsageState}
        found = usage.joules(entry.draw, grown, max(0, entry.tally.boots - before.boots))
        if found is None:
            return
        used, always_on = (found[0] + entry.joules_carry[0], found[1] + entry.joules_carry[1])
        entry.joules_carry = (used - int(used), always_on - int(always_on))
        self.meters.joules.add(int(used), entry.labels)
        self.meters.always_on_joules.add(int(always_on), entry.labels)

    def _meter_energy(self, entry: Entry) -> None:
        if self.meters is None:
            return
        watts = usage.power_watts(entry.tally.state, entry.draw)
        if watts is not None:
            self.meters.power.set(watts, {**entry.labels, "source": DECLARED})
        if self.meters.used is None or self.meters.always_on is None:
            return
        found = usage.energy(entry.tally, entry.draw)
        if isinstance(found, usage.Energy):
            self.meters.used.set(max(0.0, found.used_wh), entry.labels)
            self.meters.always_on.set(max(0.0, found.always_on_wh), entry.labels)
