"""What a slot's machine did, counted: seconds by usage state, boots and shutdowns, and energy when its draw is known.

Pure arithmetic on a `Tally` (floats, in memory); the watchers' report writer keeps one per slot, advances it by the
seconds its monotonic clock measured between two looks, and writes it to the slot's status (`SlotUsage`, whole
seconds) and the group's (`GroupUsage`). Nothing decides from these figures: they are outputs for people.

Decisions:

* The state is the report and the observed power (`state_of`): `on` and `draining` are the time the kubelet was
  Ready, `off` and `booting` the rest, so "on" here is what the cluster can know of a machine's power. A boot's own
  draw before its kubelet is Ready is the slot's `bootWattHours`, not an estimate of its seconds.
* A boot is a move from observed off to observed on, a shutdown the reverse, whatever the claim (a machine switched
  on by hand and let go again is one of each). The first look at a slot counts neither: nothing says what was before.
* A writer that starts (a restart, a new leader) resumes from what the status holds (`resume`): the time since its
  `countedTo` is credited to the state written then, up to `credit_limit` (one flush interval: any change the writer
  before saw was written at once, so until it stopped the state was the one written); past that, the time is
  `unobserved`. A wall clock that went back credits nothing.
* Energy (`energy`): used = onWatts x hours observed on + offWatts x hours observed off + bootWattHours x boots; the
  same machine always on would have used onWatts x hours observed; saved is the difference. Unobserved time is in
  neither. Without all three figures no energy is reported, and `energyNote` says which is missing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from api.names import ClaimPhase, PowerState, Report, UsageState
from api.v2alpha1 import DrawFigures, GroupUsage, PowerDraw, SlotUsage
from domain import law

HOUR = 3600.0
# The states in which the kubelet was Ready: the machine was observed on.
POWERED: frozenset[UsageState] = frozenset({UsageState.ON, UsageState.DRAINING})


def state_of(report: Report, power: PowerState) -> UsageState:
    """The usage state of a slot whose report is `report` and whose machine is observed `power`."""
    if report is Report.DRAINING:
        return UsageState.DRAINING
    if report is Report.OFF:
        return UsageState.OFF
    return UsageState.ON if power is PowerState.ON else UsageState.BOOTING


def state_for(phase: ClaimPhase | None, marked: bool, power: PowerState) -> UsageState:
    """The usage state from the law's inputs (usability only moves a slot observed on between ready and booting)."""
    report = law.derive(law.Input(phase, marked, power, power is PowerState.ON))
    return state_of(report, power)


def _zeros() -> dict[UsageState, float]:
    return dict.fromkeys(UsageState, 0.0)


@dataclass(frozen=True)
class Tally:
    """One slot's figures for a period: `seconds` by state up to `counted_to`, where the slot was in `state`."""

    since: datetime
    counted_to: datetime
    state: UsageState
    seconds: Mapping[UsageState, float] = field(default_factory=_zeros)
    unobserved: float = 0.0
    boots: int = 0
    shutdowns: int = 0
    reset_at: datetime | None = None

    @property
    def observed(self) -> float:
        return sum(self.seconds.values())

    def seconds_in(self, states: Iterable[UsageState]) -> float:
        return sum(self.seconds[s] for s in states)


def start(state: UsageState, now: datetime, reset_at: datetime | None = None) -> Tally:
    """A new period at `now`, the slot in `state`."""
    return Tally(since=now, counted_to=now, state=state, reset_at=reset_at)


def count(tally: Tally, seconds: float, state: UsageState, now: datetime) -> Tally:
    """`seconds` more of the state the slot was in (never fewer than none), then its state at `now`: a move between
    observed off and observed on is a boot or a shutdown."""
    spent = dict(tally.seconds)
    spent[tally.state] += max(0.0, seconds) if math.isfinite(seconds) else 0.0
    was_on, is_on = tally.state in POWERED, state in POWERED
    return replace(
        tally,
        seconds=spent,
        counted_to=now,
        state=state,
        boots=tally.boots + int(is_on and not was_on),
        shutdowns=tally.shutdowns + int(was_on and not is_on),
    )


def credit(counted_to: datetime, now: datetime, limit: float) -> tuple[float, float]:
    """The seconds since `counted_to` a starting writer credits to the state held then, and those nobody observed."""
    gap = (now - counted_to).total_seconds()
    if gap <= 0:
        return 0.0, 0.0
    return min(gap, limit), max(0.0, gap - limit)


def from_status(stored: SlotUsage | None) -> Tally | None:
    """The tally a status holds, or None when it holds none that can be continued."""
    if stored is None or stored.since is None or stored.counted_to is None or stored.state is None:
        return None
    seconds = {
        UsageState.ON: float(stored.on_seconds),
        UsageState.OFF: float(stored.off_seconds),
        UsageState.BOOTING: float(stored.booting_seconds),
        UsageState.DRAINING: float(stored.draining_seconds),
    }
    return Tally(
        since=stored.since,
        counted_to=stored.counted_to,
        state=stored.state,
        seconds=seconds,
        unobserved=float(stored.unobserved_seconds),
        boots=stored.boots,
        shutdowns=stored.shutdowns,
        reset_at=stored.reset_at,
    )


def resume(stored: SlotUsage | None, state: UsageState, now: datetime, credit_limit: float) -> Tally:
    """The tally a starting writer continues from the status (see the module docstring), now in `state`."""
    held = from_status(stored)
    if held is None:
        return start(state, now, stored.reset_at if stored is not None else None)
    credited, unseen = credit(held.counted_to, now, credit_limit)
    return count(replace(held, unobserved=held.unobserved + unseen), credited, state, now)


def reset_due(tally: Tally, requested: datetime | None, now: datetime) -> bool:
    """Whether a reset request (the newest reset-usage time of the slot and its Group) starts a new period now: one
    newer than the request this period began with, whose time has come."""
    if requested is None or requested > now:
        return False
    return tally.reset_at is None or requested > tally.reset_at


# --- energy ------------------------------------------------------------------------------------------------------
def effective_draw(slot: PowerDraw | None, group: PowerDraw | None) -> PowerDraw | None:
    """The slot's draw over its Group's, field by field (None when neither says anything)."""
    if slot is None:
        return group
    return slot.over(group)


@dataclass(frozen=True)
class Energy:
    used_wh: float
    always_on_wh: float

    @property
    def saved_wh(self) -> float:
        return self.always_on_wh - self.used_wh


def energy(tally: Tally, draw: PowerDraw | None) -> Energy | str | None:
    """The period's energy at this draw; a note naming what is missing when the draw is partial; None without one."""
    if draw is None:
        return None
    missing = draw.missing()
    if missing:
        return f"energy needs {', '.join(missing)} on the slot or its Group's powerDraw (0 is a figure too)"
    assert draw.on_watts is not None and draw.off_watts is not None and draw.boot_watt_hours is not None
    on = tally.seconds_in(POWERED) / HOUR
    off = tally.seconds_in(set(UsageState) - POWERED) / HOUR
    used = draw.on_watts * on + draw.off_watts * off + draw.boot_watt_hours * tally.boots
    return Energy(used_wh=used, always_on_wh=draw.on_watts * (on + off))


JOULES_PER_WH = 3600.0


def joules(draw: PowerDraw | None, grown: Mapping[UsageState, float], boots: int) -> tuple[float, float] | None:
    """The energy, in joules, of `grown` more seconds by state and `boots` more boots at this draw: (used, what
    always on would have used), the same rule as `energy`; None without a whole draw."""
    if draw is None or draw.missing():
        return None
    assert draw.on_watts is not None and draw.off_watts is not None and draw.boot_watt_hours is not None
    on = sum(v for s, v in grown.items() if s in POWERED)
    off = sum(v for s, v in grown.items() if s not in POWERED)
    used = draw.on_watts * on + draw.off_watts * off + draw.boot_watt_hours * JOULES_PER_WH * boots
    return used, draw.on_watts * (on + off)


def power_watts(state: UsageState, draw: PowerDraw | None) -> float | None:
    """The draw the slot's declared figures give for its state now (`onWatts` observed on, `offWatts` otherwise: a
    boot's own draw is a lump per boot, as in `energy`); None when the figure for the state is not declared."""
    if draw is None:
        return None
    return draw.on_watts if state in POWERED else draw.off_watts


def at(tally: Tally, now: datetime) -> Tally:
    """The tally brought up to `now`: the wall-clock time since it was counted goes to the state it holds (a machine's
    current state counts up to the moment its figures are read); nothing when `now` is not later."""
    gap = (now - tally.counted_to).total_seconds()
    if gap <= 0:
        return tally
    return count(tally, gap, tally.state, now)


def off_percent(seconds: Mapping[UsageState, float]) -> float | None:
    """The share of the observed time spent with the kubelet not Ready, in percent (None before any time)."""
    observed = sum(seconds.values())
    if observed <= 0:
        return None
    off = sum(v for s, v in seconds.items() if s not in POWERED)
    return round(100.0 * off / observed, 1)


def _wh(value: float) -> float:
    return round(value, 3)


def _figures(seconds: Mapping[UsageState, float], unobserved: float) -> dict[str, object]:
    return {
        "on_seconds": round(seconds[UsageState.ON]),
        "off_seconds": round(seconds[UsageState.OFF]),
        "booting_seconds": round(seconds[UsageState.BOOTING]),
        "draining_seconds": round(seconds[UsageState.DRAINING]),
        "unobserved_seconds": round(unobserved),
        "off_percent": off_percent(seconds),
    }


def to_status(tally: Tally, draw: PowerDraw | None) -> SlotUsage:
    """The slot's `status.usage` for this tally and draw."""
    found = energy(tally, draw)
    doc: dict[str, object] = {
        "since": tally.since,
        "counted_to": tally.counted_to,
        "state": tally.state,
        "reset_at": tally.reset_at,
        "boots": tally.boots,
        "shutdowns": tally.shutdowns,
        **_figures(tally.seconds, tally.unobserved),
    }
    if draw is not None:
        doc["draw"] = DrawFigures(
            on_watts=draw.on_watts, off_watts=draw.off_watts, boot_watt_hours=draw.boot_watt_hours
        )
    if isinstance(found, Energy):
        doc |= {
            "energy_used_wh": _wh(found.used_wh),
            "energy_always_on_wh": _wh(found.always_on_wh),
            "energy_saved_wh": _wh(found.saved_wh),
        }
    elif isinstance(found, str):
        doc["energy_note"] = found
    return SlotUsage.model_validate(doc)


# What a slot's usage write must not wait for a flush to say: everything but the figures time moves on.
MOVING = frozenset(
    {
        "counted_to",
        "on_seconds",
        "off_seconds",
        "booting_seconds",
        "draining_seconds",
        "unobserved_seconds",
        "off_percent",
        "energy_used_wh",
        "energy_always_on_wh",
        "energy_saved_wh",
    }
)


def status_at(stored: SlotUsage, now: datetime) -> SlotUsage:
    """A slot's `status.usage` as a reader brings it up to `now` (its state then counts up to `now`, at the draw it
    was written with): what the demo and a sum over slots show, so figures counted to different moments add up."""
    tally = from_status(stored)
    if tally is None:
        return stored
    held = stored.draw
    draw = (
        None
        if held is None
        else PowerDraw(on_watts=held.on_watts, off_watts=held.off_watts, boot_watt_hours=held.boot_watt_hours)
    )
    moved = at(tally, now)
    # Whole seconds, as a status holds them, before the energy: the figures shown are the ones the energy is of.
    whole = replace(moved, seconds={s: float(round(v)) for s, v in moved.seconds.items()})
    return to_status(whole, draw)


def settled_part(usage: SlotUsage | GroupUsage | None) -> dict[str, object] | None:
    """The fields of a usage that change only with an event (a move, a boot, a reset, a draw): a difference there is
    written at once; the rest waits for the flush interval."""
    if usage is None:
        return None
    return usage.model_dump(exclude=set(MOVING) | {"summary"}, mode="json")


# --- the group ---------------------------------------------------------------------------------------------------
def _hours(seconds: float) -> str:
    return f"{seconds / HOUR:.2f} h"


def group_usage(parts: Iterable[tuple[Tally, PowerDraw | None]], now: datetime) -> GroupUsage | None:
    """The group's figures: its slots' tallies, each brought up to `now` (`at`), summed at that one instant (None for
    a group with no slot counted)."""
    tallies = [(at(tally, now), draw) for tally, draw in parts]
    if not tallies:
        return None
    seconds = _zeros()
    unobserved = 0.0
    used = always_on = saved = 0.0  # each slot's as its status rounds it: the group's figure is their sum, exactly
    with_energy = 0
    for tally, draw in tallies:
        for state, value in tally.seconds.items():
            seconds[state] += value
        unobserved += tally.unobserved
        found = energy(tally, draw)
        if isinstance(found, Energy):
            with_energy += 1
            used += _wh(found.used_wh)
            always_on += _wh(found.always_on_wh)
            saved += _wh(found.saved_wh)
    since = min(t.since for t, _ in tallies)
    boots = sum(t.boots for t, _ in tallies)
    shutdowns = sum(t.shutdowns for t, _ in tallies)
    doc: dict[str, object] = {
        "since": since,
        "counted_to": now,
        "boots": boots,
        "shutdowns": shutdowns,
        "energy_slots": with_energy,
        **_figures(seconds, unobserved),
    }
    if with_energy:
        doc |= {
            "energy_used_wh": _wh(used),
            "energy_always_on_wh": _wh(always_on),
            "energy_saved_wh": _wh(saved),
        }
    share = off_percent(seconds)
    said = [
        f"off {share if share is not None else 0:.1f}% of {_hours(sum(seconds.values()))} observed on "
        f"{len(tallies)} slot{'s' if len(tallies) != 1 else ''} from {since:%Y-%m-%dT%H:%M:%SZ} to "
        f"{now:%Y-%m-%dT%H:%M:%SZ}",
        f"{boots} boot{'s' if boots != 1 else ''}, {shutdowns} shutdown{'s' if shutdowns != 1 else ''}",
    ]
    if with_energy:
        said.append(
            # The figures as the status holds them, so `describe` says what `kubectl get groups` shows.
            f"{_wh(saved)} Wh saved of {_wh(always_on)} Wh always on ({_wh(used)} Wh used; "
            f"{with_energy} of {len(tallies)} slots have a whole powerDraw)"
        )
    else:
        said.append("no slot has a whole powerDraw: hours only")
    if unobserved >= 1:
        said.append(f"{_hours(unobserved)} unobserved")
    doc["summary"] = "; ".join(said)
    return GroupUsage.model_validate(doc)


def reset_message(ended: Tally, draw: PowerDraw | None, now: Tally) -> str:
    """What the UsageReset Event says: the new period's start and request, and the figures of the one it ended."""
    share = off_percent(ended.seconds)
    said = (
        f"usage figures start a new period at {now.since:%Y-%m-%dT%H:%M:%SZ} (reset-usage "
        f"{now.reset_at:%Y-%m-%dT%H:%M:%SZ}); the period since {ended.since:%Y-%m-%dT%H:%M:%SZ}: "
        f"off {share if share is not None else 0:.1f}% of {_hours(ended.observed)} observed, "
        f"{ended.boots} boots, {ended.shutdowns} shutdowns"
    )
    found = energy(ended, draw)
    if isinstance(found, Energy):
        said += f", {found.used_wh:.1f} Wh used, {found.saved_wh:.1f} Wh saved"
    return said
