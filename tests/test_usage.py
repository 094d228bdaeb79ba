"""What it saved (issue 35): each slot's seconds by usage state, boots, shutdowns and energy, counted by the report
writer, against the simulated homelab's own record of what was on (its kubelets' Ready periods, `homelab_sim.ledger`).

The clocks are the test's: one wall clock shared by the API emulator (so the homelab's ledger is written in it) and
the watchers, and the watchers' monotonic clock beside it; a wall clock that jumps moves the wall alone. The machines
are the simulated homelab's at time scale 0 (they react inside the request that moved them), so a change is seen at
the instant it happened and the sums are exact to the second. The Temporal lab at the end drives real workflows.
"""

from __future__ import annotations

import json
import re
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from homelab_sim.homelab import HomelabServer
from homelab_sim.homelab_spec import parse_homelab_spec
from pydantic import ValidationError
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from api import names
from api.names import PowerState, Report, UsageState
from api.v2alpha1 import GroupUsage, PowerDraw, SlotUsage
from domain import law, usage
from domain.timings import TIMINGS
from kube import views
from kube.adapter import Kube
from tests.lab import NS as LAB_NS
from tests.lab import REFUSALS, ClockStalled, Lab, homelab, open_lab, refusal_watching_runtime, slot
from tests.test_report import Quiet
from tests.test_watchers import MIN, drive, slot_status, wait_group_loaded
from watchers.main import Watchers
from watchers.signals import Signals
from watchers.usage import EXPORTED
from workflows.group.workflow import GroupWorkflow

NS = "lab"
CRD = names.API_VERSION
T0 = datetime(2030, 1, 1, tzinfo=UTC)
FLUSH = TIMINGS.usage_flush_interval.total_seconds()
POD = {"image": "busybox", "command": ["true"]}
DRAW = {"onWatts": 40, "offWatts": 2, "bootWattHours": 0.5}
ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "homelab-autoscaler-usage.json"


@dataclass
class Clock:
    """The test's wall clock and the watchers' monotonic one: `advance` moves both, `jump` the wall alone."""

    wall: datetime = T0
    mono: float = 10_000.0

    def now(self) -> datetime:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)
        self.mono += seconds

    def jump(self, seconds: float) -> None:
        self.wall += timedelta(seconds=seconds)


# --- the pure rules ---------------------------------------------------------------------------------------------
def test_the_usage_state_splits_time_by_the_observed_power_on_every_row_of_the_law() -> None:
    for key in law.ALL_KEYS:
        phase, marked, power, usable = key
        if power is PowerState.OFF and usable:
            continue  # not observable
        report = law.derive(law.Input(*key))
        state = usage.state_of(report, power)
        assert (state in usage.POWERED) == (power is PowerState.ON), key
        assert state == usage.state_for(phase, marked, power), key
        assert (state is UsageState.DRAINING) == (report is Report.DRAINING), key
        assert (state is UsageState.OFF) == (report is Report.OFF), key


def test_counting_moves_boots_and_shutdowns_and_never_counts_less_than_nothing() -> None:
    t = usage.start(UsageState.OFF, T0)
    t = usage.count(t, 100, UsageState.BOOTING, T0)
    t = usage.count(t, 20, UsageState.ON, T0)
    t = usage.count(t, -50, UsageState.DRAINING, T0)  # a clock that went back: nothing
    t = usage.count(t, float("nan"), UsageState.OFF, T0)
    t = usage.count(t, 30, UsageState.OFF, T0)
    assert dict(t.seconds) == {UsageState.OFF: 130, UsageState.BOOTING: 20, UsageState.ON: 0, UsageState.DRAINING: 0}
    assert (t.boots, t.shutdowns) == (1, 1)


def test_a_starting_writer_credits_one_flush_interval_at_most_and_never_a_clock_that_went_back() -> None:
    stored = usage.to_status(usage.count(usage.start(UsageState.ON, T0), 60, UsageState.ON, T0 + timedelta(60)), None)
    stored = stored.model_copy(update={"counted_to": T0 + timedelta(seconds=60)})
    quick = usage.resume(stored, UsageState.ON, T0 + timedelta(seconds=120), FLUSH)
    assert (quick.seconds[UsageState.ON], quick.unobserved) == (120, 0)
    long = usage.resume(stored, UsageState.OFF, T0 + timedelta(hours=2, seconds=60), FLUSH)
    assert long.seconds[UsageState.ON] == 60 + FLUSH and long.unobserved == 7200 - FLUSH
    assert long.shutdowns == 1, "a move seen at the start is counted"
    back = usage.resume(stored, UsageState.ON, T0, FLUSH)
    assert (back.seconds[UsageState.ON], back.unobserved) == (60, 0)
    fresh = usage.resume(None, UsageState.BOOTING, T0, FLUSH)
    assert (fresh.since, fresh.state, fresh.observed, fresh.boots) == (T0, UsageState.BOOTING, 0, 0)


def test_energy_needs_the_three_figures_and_saved_is_against_the_same_machine_always_on() -> None:
    t = usage.count(usage.start(UsageState.OFF, T0), 3 * 3600, UsageState.ON, T0)
    t = usage.count(t, 3600, UsageState.OFF, T0)  # 3 h off, then 1 h on: one boot
    found = usage.energy(t, PowerDraw.model_validate(DRAW))
    assert isinstance(found, usage.Energy)
    assert found.used_wh == pytest.approx(40 * 1 + 2 * 3 + 0.5)
    assert found.always_on_wh == pytest.approx(40 * 4)
    assert found.saved_wh == pytest.approx(160 - 46.5)
    assert usage.energy(t, None) is None
    note = usage.energy(t, PowerDraw(on_watts=40))
    assert isinstance(note, str) and "offWatts" in note and "bootWattHours" in note
    status = usage.to_status(t, PowerDraw(on_watts=40))
    assert status.energy_used_wh is None and status.energy_note == note, "never a made-up number"


def test_a_group_is_its_slots_brought_to_one_instant_and_a_current_state_counts_up_to_it() -> None:
    """Two slots counted to different moments (one on since T0+10 min, one off): the group's figures at T0+1 h are
    each slot's brought up to T0+1 h by the state it holds, summed; a slot counted later than that is not undone."""
    draw = PowerDraw.model_validate(DRAW)
    on = usage.count(usage.start(UsageState.OFF, T0), 600, UsageState.ON, T0 + timedelta(minutes=10))
    off = usage.count(usage.start(UsageState.OFF, T0), 300, UsageState.OFF, T0 + timedelta(minutes=5))
    at = T0 + timedelta(hours=1)
    group = usage.group_usage([(on, draw), (off, draw)], at)
    assert group is not None and group.counted_to == at
    slots = [usage.to_status(usage.at(t, at), draw) for t in (on, off)]
    assert [s.counted_to for s in slots] == [at, at]
    assert slots[0].on_seconds == 3000 and slots[1].off_seconds == 3600, "the current state counts up to the moment"
    for name in ("on_seconds", "off_seconds", "booting_seconds", "boots"):
        assert getattr(group, name) == sum(getattr(s, name) for s in slots), name
    for name in ("energy_used_wh", "energy_saved_wh", "energy_always_on_wh"):
        assert getattr(group, name) == pytest.approx(sum(getattr(s, name) for s in slots), abs=1e-3), name
    assert slots[0].off_percent == round(100 * 600 / 3600, 1), "a machine on since 10 min: 16.7% off, not 100%"
    assert usage.at(on, T0) is on, "a moment before the count moves nothing"
    # `describe` says the figures `kubectl get groups` shows, rounded alike (the demo once read 0.3 beside 0.279).
    said = f"{group.energy_saved_wh} Wh saved of {group.energy_always_on_wh} Wh always on ({group.energy_used_wh} Wh"
    assert said in group.summary and f"off {group.off_percent:.1f}%" in group.summary, group.summary


def test_joules_follow_the_same_rule_as_the_status_energy_and_power_is_the_declared_draw_of_the_state() -> None:
    draw = PowerDraw.model_validate(DRAW)
    t = usage.count(usage.start(UsageState.OFF, T0), 3 * 3600, UsageState.ON, T0)
    t = usage.count(t, 3600, UsageState.OFF, T0)
    found = usage.energy(t, draw)
    joules = usage.joules(draw, t.seconds, t.boots)
    assert isinstance(found, usage.Energy) and joules is not None
    assert joules == pytest.approx((found.used_wh * 3600, found.always_on_wh * 3600))
    assert usage.joules(PowerDraw(on_watts=40), t.seconds, 1) is None, "no joules from a partial draw"
    assert usage.power_watts(UsageState.ON, draw) == 40 and usage.power_watts(UsageState.DRAINING, draw) == 40
    assert usage.power_watts(UsageState.BOOTING, draw) == 2 and usage.power_watts(UsageState.OFF, draw) == 2
    assert (
        usage.power_watts(UsageState.OFF, PowerDraw(on_watts=40)) is None
        and usage.power_watts(UsageState.ON, None) is None
    )


def test_a_slots_draw_overrides_its_groups_field_by_field() -> None:
    group = PowerDraw.model_validate(DRAW)
    slot = PowerDraw(on_watts=65)
    assert usage.effective_draw(slot, group) == PowerDraw(on_watts=65, off_watts=2, boot_watt_hours=0.5)
    assert usage.effective_draw(None, group) == group
    assert usage.effective_draw(slot, None) == slot


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"onWatts": -1}, "onWatts"),
        ({"offWatts": "1.5W"}, "offWatts"),
        ({"bootWattHours": 20_000}, "bootWattHours"),
        ({"onWatts": float("inf")}, "onWatts"),
        ({"onwatts": 3}, "onwatts"),
    ],
)
def test_a_bad_draw_is_refused_naming_the_field(given: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        PowerDraw.model_validate(given)
    slot = {"group": "g", "kubernetesNodeName": "n", "startupPodSpec": POD, "shutdownPodSpec": POD}
    problem = views.slot_problem({"metadata": {"name": "s"}, "spec": {**slot, "powerDraw": given}})
    assert problem.startswith(f"spec.powerDraw.{says}"), problem


def create(url: str, plural: str, body: dict[str, Any]) -> tuple[int, str]:
    """POST an object to the API server as a person's kubectl does (as another user than the operator's, so the RBAC
    audit of the suite leaves it out); its status code and message."""
    path = f"{url}/apis/{CRD}/namespaces/{NS}/{plural}"
    headers = {"Content-Type": "application/json", "Impersonate-User": "kubernetes-admin"}
    request = urllib.request.Request(path, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, ""
    except urllib.error.HTTPError as err:
        return err.code, str(json.load(err).get("message"))


def test_the_api_server_refuses_a_bad_draw_naming_the_field(emulator: Any) -> None:
    bad = {"apiVersion": CRD, "kind": "Group", "metadata": {"name": "g", "namespace": NS}}
    emulator.call(lambda e: e.put_object("v1", "namespaces", {"metadata": {"name": NS}}))
    for draw, field in (({"onWatts": -1}, "onWatts"), ({"offWatts": "65W"}, "offWatts")):
        code, message = create(emulator.url, "groups", {**bad, "spec": {"maxSize": 1, "powerDraw": draw}})
        assert code == 422 and f"spec.powerDraw.{field}" in message, message
    assert create(emulator.url, "groups", {**bad, "spec": {"maxSize": 1, "powerDraw": DRAW}})[0] == 201
    slot = {"group": "g", "kubernetesNodeName": "s", "startupPodSpec": POD, "shutdownPodSpec": POD}
    body = {"apiVersion": CRD, "kind": "Node", "metadata": {"name": "s", "namespace": NS}}
    code, message = create(emulator.url, "nodes", {**body, "spec": {**slot, "powerDraw": {"bootWattHours": -0.5}}})
    assert code == 422 and "spec.powerDraw.bootWattHours" in message, message


# --- the writer against the simulated homelab -------------------------------------------------------------------
def lab_doc(**extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "sim.homelab-autoscaler.dev/v1",
        "kind": "Homelab",
        "namespace": NS,
        "groups": [{"name": "g", "maxSize": 5, "nodeReadinessTaints": [], "powerDraw": {"onWatts": 40, "offWatts": 2}}],
        "slots": [
            {"name": "s1", "group": "g", "powerDraw": {"onWatts": 60, "bootWattHours": 0.5}},
            {"name": "s2", "group": "g", "initiallyOn": True, "powerDraw": {"bootWattHours": 0.5}},
            {"name": "s3", "group": "g", "powerDraw": {"onWatts": 30}},  # no boot figure anywhere: hours only
        ],
        **extra,
    }


@dataclass
class Homelab:
    hl: HomelabServer
    kube: Kube
    clock: Clock
    ns: str = NS

    def watchers(self) -> Watchers:
        return Watchers(self.kube, Quiet(), namespaces=[NS], clock=self.clock.now, monotonic=self.clock.monotonic)

    def claim(self, name: str, slot: str, phase: str | None, *, marked: bool = False) -> None:
        body: dict[str, Any] = {
            "apiVersion": CRD,
            "kind": "NodeClaim",
            "metadata": {"name": name},
            "spec": {"node": slot, "group": "g", "requestedAt": self.clock.wall.strftime("%Y-%m-%dT%H:%M:%SZ")},
        }
        if phase:
            body["status"] = {"phase": phase, "attempt": 1}
            if marked:
                body["status"]["conditions"] = [{"type": "MarkedForDeletion", "status": "True", "reason": "NodeDeleted",
                                                 "lastTransitionTime": "2030-01-01T00:00:00Z"}]  # fmt: skip
        self.hl.call(lambda h: h.emulator.put_object(CRD, "nodeclaims", body, NS))

    def annotate(self, plural: str, name: str, value: str) -> None:
        patch = {"metadata": {"annotations": {names.ANNOTATION_RESET_USAGE: value}}}
        self.hl.call(lambda h: h.emulator.patch_object(CRD, plural, NS, name, patch))

    def stored(self, plural: str, name: str) -> dict[str, Any]:
        obj = self.hl.call(lambda h: h.emulator.get_object(CRD, plural, self.ns, name))
        assert obj is not None
        return dict(obj)

    def usage(self, slot: str) -> SlotUsage:
        return SlotUsage.model_validate(self.stored("nodes", slot)["status"]["usage"])

    def group_usage(self) -> GroupUsage:
        return GroupUsage.model_validate(self.stored("groups", "g")["status"]["usage"])

    def own(self, windows: dict[str, tuple[datetime, datetime]]) -> dict[str, Any]:
        """The homelab's own figures over these windows, asked over HTTP as the demo asks."""
        body = {"windows": {s: {"since": a.isoformat(), "until": b.isoformat()} for s, (a, b) in windows.items()}}
        request = urllib.request.Request(f"{self.hl.url}/_sim/usage", data=json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=5) as resp:
            found: dict[str, Any] = json.load(resp)
        return found

    def events(self, reason: str) -> list[dict[str, Any]]:
        found = self.hl.call(lambda h: h.emulator.objects_of("v1", "events", NS))
        return [e for e in found if e.get("reason") == reason]


@asynccontextmanager
async def homelab_lab(doc: dict[str, Any] | None = None) -> AsyncIterator[Homelab]:
    clock = Clock()
    with HomelabServer(parse_homelab_spec(doc or lab_doc(), "test"), time_scale=0, clock=clock.now) as hl:
        kube = Kube.connect(server=hl.url, timeout=5.0)
        try:
            yield Homelab(hl, kube, clock)
        finally:
            kube.close()


async def tick(w: Watchers, lab: Homelab, seconds: float) -> None:
    """The watchers hear what changed (at the instant it did), then `seconds` go by and they count (the tick)."""
    await w.pump()
    lab.clock.advance(seconds)
    await w.pump()
    await w.writer.count(lab.clock.now())


async def flush(w: Watchers, lab: Homelab) -> None:
    """A flush interval goes by, and every slot's figures are written."""
    await tick(w, lab, FLUSH)


def assert_match(lab: Homelab, slots: list[str], *, tolerance: float = 0.0) -> None:
    """Each slot's figures in its status equal the homelab's own over the same window (to `tolerance` seconds)."""
    found = {s: lab.usage(s) for s in slots}
    own = lab.own({s: (u.since, u.counted_to) for s, u in found.items() if u.since and u.counted_to})["slots"]
    assert len(own) == len(found), "every slot has figures"
    for name, u in found.items():
        h = own[name]
        on, off = u.on_seconds + u.draining_seconds, u.off_seconds + u.booting_seconds
        assert abs(on - h["onSeconds"]) <= tolerance, (name, u, h)
        assert abs(off - h["offSeconds"]) <= tolerance + u.unobserved_seconds, (name, u, h)
        assert (u.boots, u.shutdowns) == (h["boots"], h["shutdowns"]), (name, u, h)
        if tolerance == 0 and "energyUsedWh" in h:
            assert u.energy_used_wh == pytest.approx(h["energyUsedWh"], abs=1e-3), (name, u, h)
            assert u.energy_saved_wh == pytest.approx(h["energySavedWh"], abs=1e-3), (name, u, h)


async def a_day(w: Watchers, lab: Homelab) -> None:
    """s1 asked for, booted, ready an hour, let go; s2 (on at install, no claim) dies and is switched on by hand."""
    await tick(w, lab, 600)
    lab.claim("c1", "s1", "pending")
    await tick(w, lab, 120)
    lab.hl.power_on_by_hand("s1")  # the startup Job's work: Ready at once at time scale 0
    await tick(w, lab, 30)
    lab.claim("c1", "s1", "ready")
    await tick(w, lab, 3600)
    lab.claim("c1", "s1", "ready", marked=True)
    await tick(w, lab, 45)
    lab.hl.die("s1")
    await tick(w, lab, 900)
    lab.hl.die("s2")
    await tick(w, lab, 1200)
    lab.hl.power_on_by_hand("s2")
    await tick(w, lab, 300)


async def test_the_sums_match_the_homelabs_own_record_to_the_second() -> None:
    async with homelab_lab() as lab:
        w = lab.watchers()
        try:
            await w.pump()
            await a_day(w, lab)
            await flush(w, lab)
            assert_match(lab, ["s1", "s2", "s3"])
            s1, s2, s3 = (lab.usage(s) for s in ("s1", "s2", "s3"))
            assert (s1.boots, s1.shutdowns, s1.booting_seconds, s1.draining_seconds) == (1, 1, 120, 45)
            assert s1.on_seconds == 30 + 3600, "on from its kubelet's Ready, its claim still pending"
            assert (s2.boots, s2.shutdowns, s2.draining_seconds) == (1, 1, s2.on_seconds + s2.draining_seconds)
            assert s1.draw is not None and s1.draw.on_watts == 60 and s1.draw.off_watts == 2
            assert s3.energy_used_wh is None and s3.energy_note and "bootWattHours" in s3.energy_note
            assert s3.off_percent == 100.0 and s3.boots == 0
            # The group: its slots' figures at one instant, the energy over the two with a whole draw.
            g = lab.group_usage()
            assert g.counted_to is not None
            since = {s: lab.usage(s).since for s in ("s1", "s2", "s3")}
            total = lab.own({s: (t, g.counted_to) for s, t in since.items() if t is not None})["total"]
            assert g.on_seconds + g.draining_seconds == total["onSeconds"]
            assert g.off_seconds + g.booting_seconds == total["offSeconds"]
            assert (g.boots, g.shutdowns, g.energy_slots) == (total["boots"], total["shutdowns"], 2)
            assert g.energy_saved_wh == pytest.approx(total["energySavedWh"], abs=1e-3)
            assert g.off_percent == total["offPercent"]
            assert "Wh saved" in g.summary and "2 of 3 slots" in g.summary, g.summary
        finally:
            w.close()


async def test_a_groups_written_figures_are_its_slots_written_ones_at_its_moment_to_the_second() -> None:
    """What `kubectl get` shows adds up: each slot's status brought to the group's countedTo (domain.usage.status_at,
    as the demo does) sums to the group's status exactly, seconds and boots; energy to the Wh rounding of each."""
    async with homelab_lab() as lab:
        w = lab.watchers()
        try:
            await w.pump()
            await a_day(w, lab)
            lab.claim("c9", "s3", "pending")  # s3 moves (written at once), in fractions of a second: rounding bites
            await tick(w, lab, 0.7)
            lab.hl.power_on_by_hand("s3")
            await tick(w, lab, 0.7)
            await tick(w, lab, 170.2)  # mid-interval: the slots' statuses are behind, by different amounts
            await w.writer.group("lab", "g", lab.clock.now())
            g = lab.group_usage()
            assert g.counted_to is not None
            slots = [usage.status_at(lab.usage(s), g.counted_to) for s in ("s1", "s2", "s3")]
            assert {s.counted_to for s in slots} == {g.counted_to}
            for name in ("on_seconds", "off_seconds", "booting_seconds", "draining_seconds", "boots", "shutdowns"):
                assert getattr(g, name) == sum(getattr(s, name) for s in slots), name
            for name in ("energy_used_wh", "energy_always_on_wh", "energy_saved_wh"):  # each rounded to 1 mWh
                assert getattr(g, name) == round(sum(getattr(s, name) or 0 for s in slots), 3), name
        finally:
            w.close()


async def test_a_restarted_writer_continues_from_the_status_never_counting_an_interval_twice() -> None:
    async with homelab_lab() as lab:
        w = lab.watchers()
        await w.pump()
        await a_day(w, lab)
        w.close()
        # A quick restart, nothing moved meanwhile: the time since the last write is credited, exactly.
        lab.clock.advance(200)
        w = lab.watchers()
        await w.pump()
        await flush(w, lab)
        assert_match(lab, ["s1", "s2", "s3"])
        before = lab.usage("s2")
        # Twice more, the second time before anything was written: nothing is counted twice.
        w.close()
        w = lab.watchers()
        await w.pump()
        w.close()
        w = lab.watchers()
        await w.pump()
        await flush(w, lab)
        assert_match(lab, ["s1", "s2", "s3"])
        after = lab.usage("s2")
        assert after.on_seconds + after.draining_seconds == before.on_seconds + before.draining_seconds + FLUSH
        # A restart across a move: the move is counted (a boot), its time within one flush interval of the truth.
        w.close()
        lab.clock.advance(60)
        lab.hl.power_on_by_hand("s1")
        lab.clock.advance(60)
        w = lab.watchers()
        await w.pump()
        await flush(w, lab)
        assert_match(lab, ["s1", "s2", "s3"], tolerance=FLUSH)
        assert lab.usage("s1").boots == 2
        # A long outage: one flush interval credited, the rest unobserved, in no state.
        w.close()
        lab.clock.advance(2 * 3600)
        w = lab.watchers()
        await w.pump()
        for name in ("s1", "s2", "s3"):
            u = lab.usage(name)
            assert u.since is not None and u.counted_to is not None
            observed = u.on_seconds + u.off_seconds + u.booting_seconds + u.draining_seconds
            assert observed + u.unobserved_seconds == (u.counted_to - u.since).total_seconds(), u
            assert u.unobserved_seconds == 2 * 3600 - FLUSH, u
        w.close()


async def test_a_wall_clock_that_jumps_is_never_counted_and_never_makes_a_figure_negative() -> None:
    async with homelab_lab() as lab:
        w = lab.watchers()
        await w.pump()
        await tick(w, lab, 600)
        lab.clock.jump(-3600)  # NTP set the clock back an hour
        await tick(w, lab, 300)
        lab.clock.jump(3 * 3600)  # and forward three
        await tick(w, lab, 300)
        await flush(w, lab)
        u = lab.usage("s1")
        assert u.off_seconds == 600 + 300 + 300 + FLUSH, "only the seconds that went by are counted"
        assert u.unobserved_seconds == 0
        # Across a restart, a clock set back credits nothing; one set forward is at most one flush interval, the
        # rest unobserved (a writer that starts cannot tell a jump from an outage).
        w.close()
        lab.clock.jump(-7200)
        w = lab.watchers()
        await w.pump()
        await tick(w, lab, 10)
        await flush(w, lab)
        back = lab.usage("s1")
        assert back.off_seconds == u.off_seconds + 10 + FLUSH and back.unobserved_seconds == 0
        w.close()
        lab.clock.jump(10 * 3600)
        w = lab.watchers()
        await w.pump()
        forward = lab.usage("s1")
        assert forward.off_seconds <= back.off_seconds + FLUSH
        assert forward.unobserved_seconds >= 10 * 3600 - FLUSH
        for name in ("s1", "s2", "s3"):
            dumped = lab.usage(name).model_dump()
            assert all(v >= 0 for k, v in dumped.items() if k.endswith("seconds") or k in ("boots", "shutdowns"))
        w.close()


async def test_status_writes_are_cheap_a_quiet_slot_is_written_once_per_flush_interval() -> None:
    async with homelab_lab() as lab:
        w = lab.watchers()
        try:
            await w.pump()
            await tick(w, lab, 1)
            writes = w.writer.slot_writes
            for _ in range(120):  # an hour of ticks, nothing moving
                await tick(w, lab, TIMINGS.usage_tick.total_seconds())
            per_slot = (w.writer.slot_writes - writes) / 3
            assert 3600 / FLUSH <= per_slot <= 2 * 3600 / FLUSH, per_slot
            assert w.writer.group_writes <= 2 * 3600 / FLUSH + 2
        finally:
            w.close()


async def test_a_reset_starts_a_new_period_and_the_ended_one_is_said_in_an_event() -> None:
    async with homelab_lab() as lab:
        w = lab.watchers()
        try:
            await w.pump()
            await a_day(w, lab)
            await flush(w, lab)
            ended = lab.usage("s1")
            ahead = (lab.clock.wall + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
            lab.annotate("nodes", "s1", ahead)  # a reset at a time to come waits for it
            await tick(w, lab, 60)
            assert lab.usage("s1").since == ended.since
            await tick(w, lab, 3600)  # the tick that passes the reset's time starts the new period
            fresh = lab.usage("s1")
            assert fresh.reset_at == datetime.fromisoformat(ahead.replace("Z", "+00:00"))
            assert fresh.since == lab.clock.wall and fresh.boots == 0 and fresh.on_seconds == 0
            (said,) = lab.events("UsageReset")
            assert "the period since" in said["message"] and "Wh saved" in said["message"], said["message"]
            await tick(w, lab, 600)
            assert lab.usage("s1").off_seconds == 600
            # The Group's annotation resets every slot of the group; a value that is no time is refused, naming it.
            lab.annotate("groups", "g", "yesterday")
            await tick(w, lab, 60)
            (warned,) = lab.events("InvalidAnnotation")
            assert names.ANNOTATION_RESET_USAGE in warned["message"] and "'yesterday'" in warned["message"]
            assert lab.usage("s2").since == ended.since
            at = lab.clock.wall
            lab.annotate("groups", "g", at.strftime("%Y-%m-%dT%H:%M:%SZ"))
            await tick(w, lab, 5)
            assert {lab.usage(s).since for s in ("s1", "s2", "s3")} == {at}
            await flush(w, lab)
            assert_match(lab, ["s1", "s2", "s3"])
        finally:
            w.close()


async def test_a_replica_that_stops_leading_forgets_and_the_next_one_continues() -> None:
    async with homelab_lab() as lab:
        first = lab.watchers()
        await first.pump()
        await a_day(first, lab)
        await flush(first, lab)
        first.dispatcher.stop_acting()
        assert first.writer.usage.entries == {}
        second = lab.watchers()
        await second.pump()
        await tick(second, lab, 300)
        await flush(second, lab)
        assert_match(lab, ["s1", "s2", "s3"])
        first.close()
        second.close()


# --- /metrics and the dashboard --------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def metrics_runtime() -> Iterator[tuple[Runtime, str]]:
    port = free_port()
    config = PrometheusConfig(bind_address=f"127.0.0.1:{port}", counters_total_suffix=True, unit_suffix=True)
    runtime = Runtime(telemetry=TelemetryConfig(attach_service_name=False, metrics=config))
    yield runtime, f"http://127.0.0.1:{port}/metrics"


def scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            found[series] = float(value)
    return found


async def test_the_counters_count_what_the_status_says(metrics_runtime: tuple[Runtime, str]) -> None:
    runtime, url = metrics_runtime
    async with homelab_lab() as lab:
        w = Watchers(lab.kube, Quiet(), namespaces=[NS], clock=lab.clock.now, monotonic=lab.clock.monotonic,
                     meter=runtime.metric_meter)  # fmt: skip
        try:
            await w.pump()
            await a_day(w, lab)
            await flush(w, lab)
            got = scrape(url)
            u = lab.usage("s1")
            labels = f'group="g",kubernetes_namespace="{NS}",slot="s1"'
            for state, seconds in (("on", u.on_seconds), ("booting", u.booting_seconds), ("off", u.off_seconds)):
                assert got[f'homelab_slot_seconds_total{{{labels},state="{state}"}}'] == seconds
            assert got[f"homelab_slot_boots_total{{{labels}}}"] == u.boots == 1
            assert got[f"homelab_slot_shutdowns_total{{{labels}}}"] == u.shutdowns == 1
            assert u.energy_used_wh is not None and u.energy_always_on_wh is not None
            # Whole joules on the counters (a fraction waits for the next look); the status rounds Wh to 3 decimals.
            assert got[f"homelab_slot_energy_joules_total{{{labels}}}"] == pytest.approx(u.energy_used_wh * 3600, abs=2)
            assert got[f"homelab_slot_always_on_energy_joules_total{{{labels}}}"] == pytest.approx(
                u.energy_always_on_wh * 3600, abs=2
            )
            assert u.state is not None and u.draw is not None
            declared = u.draw.on_watts if u.state in usage.POWERED else u.draw.off_watts
            assert got[f'homelab_slot_power_watts{{{labels},source="declared"}}'] == declared
            # The period's Wh gauges are deprecated: off unless asked for (watt_hour_gauges), for this release only.
            assert not [series for series in got if "_watt_hours" in series], "served only when asked for"
        finally:
            w.close()


async def test_the_deprecated_watt_hour_gauges_are_served_when_asked_for() -> None:
    """The watch setting `watt_hour_gauges` serves the period's Wh gauges beside the joule counters for this release,
    while dashboards and alerts move (docs/upgrades.md)."""
    port = free_port()
    config = PrometheusConfig(bind_address=f"127.0.0.1:{port}", counters_total_suffix=True, unit_suffix=True)
    runtime = Runtime(telemetry=TelemetryConfig(attach_service_name=False, metrics=config))
    async with homelab_lab() as lab:
        w = Watchers(lab.kube, Quiet(), namespaces=[NS], clock=lab.clock.now, monotonic=lab.clock.monotonic,
                     meter=runtime.metric_meter, watt_hour_gauges=True)  # fmt: skip
        try:
            await w.pump()
            await a_day(w, lab)
            await flush(w, lab)
            got = scrape(f"http://127.0.0.1:{port}/metrics")
            u = lab.usage("s1")
            labels = f'group="g",kubernetes_namespace="{NS}",slot="s1"'
            assert u.energy_used_wh is not None and u.energy_always_on_wh is not None
            assert got[f"homelab_slot_energy_used_watt_hours{{{labels}}}"] == pytest.approx(u.energy_used_wh, 1e-3)
            assert got[f"homelab_slot_energy_always_on_watt_hours{{{labels}}}"] == pytest.approx(
                u.energy_always_on_wh, 1e-3
            )
            assert f"homelab_slot_energy_joules_total{{{labels}}}" in got
        finally:
            w.close()


PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
    "unless", "bool", "offset", "topk", "bottomk", "clamp_min", "clamp_max", "increase", "rate", "irate", "delta",
    "label_values", "vector", "scalar", "time", "round", "abs", "sort", "sort_desc", "last_over_time", "inf", "nan",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers outside label matchers, grouping lists, ranges and
    strings that are no function, keyword or aggregation."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"label_values\(\s*([A-Za-z_:][\w:]*)?\s*,\s*\w+\s*\)", r"\1", text)  # Grafana's: metric, label
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\$\{?\w+\}?", "", text)
    found = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        after = text[match.end() :].lstrip()
        if word in PROMQL_WORDS or after.startswith("("):
            continue
        found.add(word)
    return found


def dashboard_queries() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    queries += [v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
                for v in board["templating"]["list"] if v["type"] == "query"]  # fmt: skip
    return queries


def test_the_dashboard_imports_cleanly() -> None:
    """What Grafana's import needs: a datasource input every panel and variable uses, unique panel ids, panels on the
    24-column grid without overlap, a refId and an expression per target, every $variable defined."""
    board = json.loads(DASHBOARD.read_text())
    assert board.get("id") is None and board["uid"] and board["title"] and board["schemaVersion"] >= 36
    (source,) = board["__inputs"]
    assert (source["type"], source["pluginId"]) == ("datasource", "prometheus")
    ref = {"type": "prometheus", "uid": "${" + source["name"] + "}"}
    assert {r["id"] for r in board["__requires"]} >= {"grafana", "prometheus"}
    variables = {v["name"] for v in board["templating"]["list"]}
    for v in board["templating"]["list"]:
        if v["type"] == "query":
            assert v["datasource"] == ref, v["name"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, panel["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {panel['title']} overlaps another"
        cells |= mine
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == ref and panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["refId"] and target["expr"] and target["datasource"] == ref, panel["title"]
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
            assert target["expr"].count("{") == target["expr"].count("}"), target["expr"]
            used = set(re.findall(r"\$\{?(\w+)\}?", target["expr"])) - {"__range", "__rate_interval", "__interval"}
            assert used <= variables, (panel["title"], used - variables)


async def test_every_metric_the_dashboard_names_is_served_on_metrics(metrics_runtime: tuple[Runtime, str]) -> None:
    runtime, url = metrics_runtime
    named = set().union(*(metric_names(q) for q in dashboard_queries()))
    assert named, "the queries name metrics"
    assert named <= set(EXPORTED), named - set(EXPORTED)
    async with homelab_lab() as lab:
        w = Watchers(lab.kube, Quiet(), namespaces=[NS], clock=lab.clock.now, monotonic=lab.clock.monotonic,
                     meter=runtime.metric_meter)  # fmt: skip
        try:
            await w.pump()
            await tick(w, lab, 60)
        finally:
            w.close()
    served = {series.partition("{")[0] for series in scrape(url)}
    assert named <= served, named - served


def test_the_metric_name_reader_reads_promql() -> None:
    expr = 'sum by (group) (increase(homelab_slot_seconds_total{state=~"off|booting", group=~"$group"}[$__range]))'
    assert metric_names(expr) == {"homelab_slot_seconds_total"}
    assert metric_names("a_total / ignoring(state) b + on(slot) group_left c") == {"a_total", "b", "c"}
    assert metric_names('label_values(m_total{a=~"$a", b="x,y"}, slot)') == {"m_total"}


# --- real workflows: a worker restart, a watcher restart, a Temporal loss ---------------------------------------
async def test_the_sums_hold_through_real_workflows_restarts_and_a_temporal_loss() -> None:
    """A claim boots s1 through the group's and the claim's workflows, the worker restarts, the watchers restart,
    Temporal loses every workflow (the group takes the claim over from its resource), then s1 is scaled down: the
    figures equal the homelab's own record to the second. The test's wall clock moves beside Temporal's.

    Run once more, and only once, when its clock stalled after the time-skipping server refused a workflow task's
    completion (tests.lab.TestServerRefusals: that server strands the workflow; the real one retries the task), as
    the model counts such an example inconclusive. Any other failure, or a second one, fails the test."""
    refused_before = len(REFUSALS.seen)
    try:
        await _sums_through_restarts_and_a_loss()
    except ClockStalled:
        if len(REFUSALS.seen) <= refused_before:
            raise
        print(f"the test server refused a completion ({REFUSALS.seen[refused_before]}): once more")
        await _sums_through_restarts_and_a_loss()


async def _sums_through_restarts_and_a_loss() -> None:
    # No workflow cache: a restarted worker never meets the sticky queue the time-skipping server keeps for the old one.
    async with open_lab(homelab([slot("s1"), slot("s2")], powerDraw=DRAW), cached_workflows=0, sandboxed=False,
                        runtime=refusal_watching_runtime()) as lab:  # fmt: skip
        lab.settle_after_skip = 0.1  # see Lab.settle_after_skip: this driver signals right after every skip
        clock = Clock(wall=datetime.now(UTC).replace(microsecond=0))
        lab.lab.call(lambda h: setattr(h.emulator, "clock", clock.now))
        sims = Homelab(lab.lab, lab.kube, clock, LAB_NS)

        def start() -> Watchers:
            return Watchers(lab.kube, Signals(lab.client), namespaces=[LAB_NS], clock=clock.now,
                            monotonic=clock.monotonic)  # fmt: skip

        async def passes(seconds: float) -> None:
            await w.pump()
            clock.advance(seconds)
            await lab.advance(seconds)
            await w.pump()
            await w.writer.count(clock.now())

        w = start()
        try:
            await w.pump()
            await wait_group_loaded(lab, w)
            await passes(300)
            assert await lab.increase(1) == 1
            (claim,) = await lab.claim_names()
            booted = str((await lab.status(claim))["slot"])
            await drive(lab, w, lambda: slot_status(lab, booted).get("phase") == "ready", within=5 * MIN,
                        what="report ready")  # fmt: skip
            await passes(600)
            await lab.restart_worker()
            await passes(300)
            w.close()
            clock.advance(120)  # the watchers are down two minutes; nothing moves
            w = start()
            await w.pump()
            await passes(300)
            await lab.lose_temporal()
            w.signals = w.dispatcher.signals = Signals(lab.client)
            await w.dispatcher.refresh_groups()
            await drive(lab, w, lambda: lab_claim_live(lab, claim), within=5 * MIN, what="the claim taken over")
            await passes(600)
            await lab.group().execute_update(GroupWorkflow.delete_nodes, [booted])
            await drive(lab, w, lambda: slot_status(lab, booted).get("powerState") == "off", within=10 * MIN,
                        what="the machine off", step=30)  # fmt: skip
            await passes(900)
            clock.advance(FLUSH)
            await w.pump()
            await w.writer.count(clock.now())
            assert_match(sims, ["s1", "s2"])
            u = sims.usage(booted)
            assert (u.boots, u.shutdowns, u.unobserved_seconds) == (1, 1, 0), u
            assert u.on_seconds + u.draining_seconds == 600 + 300 + 120 + 300 + 600, u
        finally:
            w.close()


async def lab_claim_live(lab: Lab, claim: str) -> bool:
    try:
        return str((await lab.snapshot())["claims"][claim]["phase"]) == "ready"
    except Exception:
        return False
