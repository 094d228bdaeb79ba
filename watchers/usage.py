"""The usage book: each slot's tally in memory while this replica writes reports, and its /metrics counters.

The report writer looks at a slot (an event, the tick, the resync) and hands the book the slot's usage state; the
book counts the seconds its monotonic clock measured since its last look (so a wall clock that jumps moves no
second), and says when the figures are due in the slot's status: at once when something other than time changed
(a move, a boot, a reset, a draw), else once per flush interval. A replica that starts writing (a restart, a new
leader) resumes every slot from its status (`domain.usage.resume`); one that stops forgets its tallies.

Metrics (the exporter adds `_total` to counters): `homelab_slot_seconds_total{state}`, `homelab_slot_boots_total`,
`homelab_slot_shutdowns_total`, and the period's `homelab_slot_energy_used_watt_hours` and
`homelab_slot_energy_always_on_watt_hours` gauges (saved is their difference; a gauge cannot go below zero), each
labelled `kubernetes_namespace`, `group` and `slot`. The counters count what this process observed, from zero at
its start, as every Prometheus counter does; the status holds the period's sums.
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
ENERGY_USED = "homelab_slot_energy_used_watt_hours"
ENERGY_ALWAYS_ON = "homelab_slot_energy_always_on_watt_hours"
#: What /metrics serves of the usage figures, as Prometheus names them (the dashboard's queries name only these).
EXPORTED = (f"{SECONDS}_total", f"{BOOTS}_total", f"{SHUTDOWNS}_total", ENERGY_USED, ENERGY_ALWAYS_ON)


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
    reset_from: usage.Tally | None = None  # the period a reset just ended, until the write that says so lands


@dataclass
class _Meters:
    seconds: MetricCounter
    boots: MetricCounter
    shutdowns: MetricCounter
    used: MetricGaugeFloat
    always_on: MetricGaugeFloat

    @classmethod
    def of(cls, meter: MetricMeter) -> _Meters:
        return cls(
            meter.create_counter(SECONDS, "seconds a slot was observed in each usage state"),
            meter.create_counter(BOOTS, "times a slot's machine was observed to come on"),
            meter.create_counter(SHUTDOWNS, "times a slot's machine was observed to go off"),
            meter.create_gauge_float(ENERGY_USED, "energy a slot's machine used in its period, in Wh"),
            meter.create_gauge_float(ENERGY_ALWAYS_ON, "energy it would have used always on in its period, in Wh"),
        )


class UsageBook:
    """Every slot's tally while this replica acts (see the module docstring)."""

    def __init__(
        self,
        meter: MetricMeter | None = None,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        flush: timedelta = TIMINGS.usage_flush_interval,
    ) -> None:
        self.monotonic = monotonic
        self.flush = flush.total_seconds()
        self.entries: dict[Key, Entry] = {}
        self.group_flushed: dict[Key, float] = {}
        self.meters = _Meters.of(meter) if meter is not None else None

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
    def group_usage(self, keys: Iterable[Key], now: datetime) -> GroupUsage | None:
        parts = [(e.tally, e.draw) for k in keys if (e := self.entries.get(k)) is not None]
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
        if before is not None:
            self._meter(entry, before)

    def _meter(self, entry: Entry, before: usage.Tally) -> None:
        if self.meters is None:
            return
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

    def _meter_energy(self, entry: Entry) -> None:
        if self.meters is None:
            return
        found = usage.energy(entry.tally, entry.draw)
        if isinstance(found, usage.Energy):
            self.meters.used.set(max(0.0, found.used_wh), entry.labels)
            self.meters.always_on.set(max(0.0, found.always_on_wh), entry.labels)
