"""The simulated homelab's own record of what was on: each machine's kubelet-Ready periods, on the emulator's clock.

The operator can only know a machine's power through its kubelet (Ready=True is on), so this is the record its usage
figures are judged against: seconds Ready and not Ready over a window, the boots (a Ready period that began in it),
the shutdowns (one that ended in it), and the energy the machine's own draw (the homelab file's `powerDraw`, the
slot's over its group's) makes of them, computed here on its own, not with the operator's code.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from api.v2alpha1 import PowerDraw

HOUR = 3600.0


@dataclass
class Period:
    start: datetime.datetime
    end: datetime.datetime | None = None

    def overlap(self, since: datetime.datetime, until: datetime.datetime) -> float:
        end = self.end if self.end is not None else until
        return max(0.0, (min(end, until) - max(self.start, since)).total_seconds())


@dataclass
class ReadyLedger:
    """Every machine's Ready periods, oldest first; the last one open while the machine is Ready."""

    periods: dict[str, list[Period]] = field(default_factory=dict)

    def ready(self, slot: str, at: datetime.datetime) -> None:
        held = self.periods.setdefault(slot, [])
        if not held or held[-1].end is not None:
            held.append(Period(at))

    def not_ready(self, slot: str, at: datetime.datetime) -> None:
        held = self.periods.get(slot) or []
        if held and held[-1].end is None:
            held[-1].end = at

    def figures(
        self, slot: str, since: datetime.datetime, until: datetime.datetime, draw: PowerDraw | None
    ) -> dict[str, Any]:
        """The machine's figures over [since, until], named as the operator's `status.usage` names them."""
        held = self.periods.get(slot) or []
        window = max(0.0, (until - since).total_seconds())
        on = sum(p.overlap(since, until) for p in held)
        boots = sum(1 for p in held if since < p.start <= until)
        shutdowns = sum(1 for p in held if p.end is not None and since < p.end <= until)
        found: dict[str, Any] = {
            "since": since.isoformat(),
            "until": until.isoformat(),
            "onSeconds": on,
            "offSeconds": window - on,
            "boots": boots,
            "shutdowns": shutdowns,
            "offPercent": round(100.0 * (window - on) / window, 1) if window else None,
        }
        if draw is not None and not draw.missing():
            assert draw.on_watts is not None and draw.off_watts is not None and draw.boot_watt_hours is not None
            used = (draw.on_watts * on + draw.off_watts * (window - on)) / HOUR + draw.boot_watt_hours * boots
            always_on = draw.on_watts * window / HOUR
            found |= {"energyUsedWh": used, "energyAlwaysOnWh": always_on, "energySavedWh": always_on - used}
        return found


def total(figures: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of several machines summed (a group's), energy over those that have it."""
    out: dict[str, Any] = {
        key: sum(f[key] for f in figures) for key in ("onSeconds", "offSeconds", "boots", "shutdowns")
    }
    window = out["onSeconds"] + out["offSeconds"]
    out["offPercent"] = round(100.0 * out["offSeconds"] / window, 1) if window else None
    priced = [f for f in figures if "energyUsedWh" in f]
    if priced:
        for key in ("energyUsedWh", "energyAlwaysOnWh", "energySavedWh"):
            out[key] = sum(f[key] for f in priced)
    out["energySlots"] = len(priced)
    return out
