"""Leader election over a Lease (time is an argument), two watch replicas of which one writes, the health
endpoints, and the threaded process path against the API emulator.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from homelab_sim.emulator import EmulatorServer

from api import contracts as c
from homelab_autoscaler.health import HealthServer, Probe
from kube.adapter import Kube
from tests.test_report import NS, Quiet, World
from watchers.leader import LeaderElector
from watchers.main import Watchers
from watchers.settings import WatchSettings

T0 = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=15)


def elector(kube: Kube, who: str) -> LeaderElector:
    return LeaderElector(kube, NS, "watch", who, LEASE)


def test_lease_times_keep_six_fraction_digits_at_whole_seconds(emulator: EmulatorServer, kube: Kube) -> None:
    """metav1.MicroTime is RFC3339Micro: the strict API server refuses a Lease whose renewTime or acquireTime
    lacks the six fraction digits (400, as kube-apiserver's decoder does). Whole-second clocks are where a
    serialiser drops them (the typed client re-serialising the body as a V1Lease did), so every Lease write is
    made at whole seconds here and must land, with the bytes the elector built.
    """
    assert emulator.emulator.strict
    a, b = elector(kube, "a"), elector(kube, "b")
    assert a.tick(T0), "create"
    assert a.tick(T0 + timedelta(seconds=5)), "renew"
    a.release(T0 + timedelta(seconds=6))
    assert b.tick(T0 + timedelta(seconds=7)), "take over a released Lease"
    lease = kube.get_lease(NS, "watch")
    assert lease is not None
    assert lease["spec"]["renewTime"] == "2030-01-01T00:00:07.000000Z"
    assert lease["spec"]["acquireTime"] == "2030-01-01T00:00:07.000000Z"
    writes = [r for r in emulator.emulator.requests if r.plural == "leases" and r.verb in ("create", "patch")]
    assert len(writes) == 4
    sent = [w.body["spec"]["renewTime"] for w in writes]
    assert sent == [f"2030-01-01T00:00:0{s}.000000Z" for s in (0, 5, 6, 7)]
    assert [r for r in emulator.emulator.strict_log if r.resource == "leases"] == []


def test_one_leader_renews_and_a_follower_waits(kube: Kube) -> None:
    a, b = elector(kube, "a"), elector(kube, "b")
    assert a.tick(T0)
    assert not b.tick(T0 + timedelta(seconds=1))
    for s in range(5, 60, 5):  # a keeps renewing: b never gets it, however long it waits
        assert a.tick(T0 + timedelta(seconds=s))
        assert not b.tick(T0 + timedelta(seconds=s + 1))
    lease = kube.get_lease(NS, "watch")
    assert lease is not None and lease["spec"]["holderIdentity"] == "a"


def test_a_leader_renews_with_one_write_and_still_sees_a_takeover(emulator: EmulatorServer, kube: Kube) -> None:
    """An idle leader's renewal is one guarded write, not a read and a write (issue 34's idle cost); a write by
    anyone else changes the version, so the next renewal reads the Lease again and yields to a live new holder."""
    a, b = elector(kube, "a"), elector(kube, "b")
    assert a.tick(T0)
    seen = len(emulator.emulator.requests)
    for s in (5, 10, 15):
        assert a.tick(T0 + timedelta(seconds=s))
    renewals = [r.verb for r in emulator.emulator.requests[seen:] if r.plural == "leases"]
    assert renewals == ["patch", "patch", "patch"], renewals
    # Someone else's write lands (a hand edit that keeps the holder): the renewal re-reads and goes on.
    lease = kube.get_lease(NS, "watch")
    assert lease is not None
    kube.patch_lease(NS, "watch", {"leaseDurationSeconds": 15}, lease["metadata"]["resourceVersion"])
    assert a.tick(T0 + timedelta(seconds=20)), "still the holder after a write that left it the holder"
    # a is cut off past the Lease's duration, b takes over: a's guarded renewal conflicts, it reads, it yields.
    assert b.tick(T0 + timedelta(seconds=36))
    assert not a.tick(T0 + timedelta(seconds=37)), "a renewal guarded by an old version never takes it back"
    lease = kube.get_lease(NS, "watch")
    assert lease is not None and lease["spec"]["holderIdentity"] == "b"
    # The Lease deleted under its holder: the guarded renewal finds nothing, and the tick creates it again at once.
    assert b.tick(T0 + timedelta(seconds=40))
    emulator.emulator.delete_object("coordination.k8s.io/v1", "leases", NS, "watch")
    assert b.tick(T0 + timedelta(seconds=45)), "a deleted Lease is created again by the holder's next tick"
    lease = kube.get_lease(NS, "watch")
    assert lease is not None and lease["spec"]["holderIdentity"] == "b"


def test_hand_over_when_the_leader_stops(kube: Kube) -> None:
    a, b = elector(kube, "a"), elector(kube, "b")
    assert a.tick(T0)
    a.release(T0 + timedelta(seconds=2))
    assert not a.leading
    assert b.tick(T0 + timedelta(seconds=3)), "a released Lease is taken at the follower's next tick"
    assert not a.tick(T0 + timedelta(seconds=4))
    lease = kube.get_lease(NS, "watch")
    assert lease is not None and lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 0, "a release is not a takeover of a live holder"


class RenewedMeanwhile(Kube):
    """The adapter, but the holder's own renewal (another thread) lands right after each of the next reads."""

    def __init__(self, kube: Kube, races: int) -> None:
        super().__init__(kube.api_client, timeout=kube.timeout)
        self.races = races
        self.renewer = elector(kube, "a")

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        lease = super().get_lease(namespace, name)
        if self.races and lease is not None:
            self.races -= 1
            self.renewer.leading = True
            assert self.renewer.tick(T0 + timedelta(seconds=1)), "the renewal in between"
        return lease


def test_a_release_racing_a_renewal_still_releases(kube: Kube) -> None:
    """Stop while the renew thread's last write is in flight: the release reads again instead of leaving the
    Lease held for a whole duration (a Conflict on the first try)."""
    a = elector(kube, "a")
    assert a.tick(T0)
    racing = LeaderElector(RenewedMeanwhile(kube, races=2), NS, "watch", "a", LEASE)
    racing.leading = True
    racing.release(T0 + timedelta(seconds=2))
    lease = kube.get_lease(NS, "watch")
    assert lease is not None and not lease["spec"].get("holderIdentity"), "released after two conflicts"


def test_take_over_after_the_lease_duration_when_the_leader_vanishes(kube: Kube) -> None:
    a, b = elector(kube, "a"), elector(kube, "b")
    assert a.tick(T0)
    # a stops without releasing (killed): b waits out the duration, then takes over.
    assert not b.tick(T0 + LEASE)
    assert b.tick(T0 + LEASE + timedelta(seconds=1))
    lease = kube.get_lease(NS, "watch")
    assert lease is not None and lease["spec"]["leaseTransitions"] == 1
    assert not a.tick(T0 + LEASE + timedelta(seconds=2)), "the old leader comes back as a follower"


def test_a_leader_cut_off_stops_acting_before_the_lease_expires(emulator: EmulatorServer, kube: Kube) -> None:
    from homelab_sim.emulator import Fault

    a = elector(kube, "a")
    assert a.tick(T0)
    emulator.emulator.faults.append(Fault(match=lambda r: r.plural == "leases", status=503, times=None))
    assert a.tick(T0 + timedelta(seconds=5)), "one failed renewal inside the renew deadline keeps it"
    assert not a.tick(T0 + a.renew_deadline + timedelta(seconds=1)), "past the renew deadline it stops"


async def test_two_replicas_only_the_leader_writes_and_signals(emulator: EmulatorServer, kube: Kube) -> None:
    """Two replicas on one cluster: the follower keeps its picture and neither writes nor signals."""
    world = World(emulator)
    world.slot("s1")
    world.kubelet("s1", "off")
    one, two = Quiet(), Quiet()
    first = Watchers(kube, one, namespaces=[NS], elector=elector(kube, "first"))
    second = Watchers(kube, two, namespaces=[NS], elector=elector(kube, "second"))
    await first.pump()
    await second.pump()
    assert first.dispatcher.acting and not second.dispatcher.acting
    assert first.writer.slot_writes == 1 and one.count(c.GroupSignal.REFRESH) == 1
    world.kubelet("s1", "on")
    await second.pump()
    await first.pump()
    assert second.writer.slot_writes == 0 and two.sent == []
    assert first.writer.slot_writes == 2
    # The leader stops: it releases the Lease; the follower takes over and catches up with every report.
    await first.stop_leading()
    world.kubelet("s1", "off")
    assert await second.lead()
    assert second.writer.slot_writes == 1, "the new leader's first pass brings every report up to date"
    assert two.count(c.GroupSignal.REFRESH) == 1 and two.count(c.GroupSignal.OBSERVE_SLOT) == 1
    assert World(emulator).status("s1")["powerState"] == "off"
    # Should the old one come back, it is a follower now: it keeps its picture fresh and writes nothing.
    world.kubelet("s1", "on")
    await first.pump()
    assert not first.dispatcher.acting and first.writer.slot_writes == 2


async def test_health_endpoints(emulator: EmulatorServer, kube: Kube) -> None:
    World(emulator).slot("s1")
    w = Watchers(kube, Quiet(), namespaces=[NS])
    health = HealthServer("127.0.0.1", 0, alive=lambda: "" if w.alive() else "stopped")
    health.add(Probe("watches", w.not_ready))
    port = await health.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                assert resp.status == 200
            async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
                assert resp.status == 503, "not ready before every watch listed"
                assert "watches: not listed yet" in await resp.text()
            await w.pump()
            async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
                assert resp.status == 200
    finally:
        await health.stop()


async def test_the_process_path_with_threads_reports_a_change(emulator: EmulatorServer, kube: Kube) -> None:
    world = World(emulator)
    world.slot("s1")
    w = Watchers(kube, Quiet(), namespaces=[NS], elector=elector(kube, "solo"), window=2)
    stop = asyncio.Event()
    task = asyncio.create_task(w.run(stop, renew_every=0.2))
    try:
        deadline = time.monotonic() + 10
        while not (w.dispatcher.acting and world.status("s1").get("phase") == "off"):
            assert time.monotonic() < deadline, "the first report of s1 within 10 s of start"
            await asyncio.sleep(0.05)
        world.kubelet("s1", "on")
        while world.status("s1").get("powerState") != "on":
            assert time.monotonic() < deadline, "the report of s1 followed its kubelet within 10 s"
            await asyncio.sleep(0.05)
        assert w.alive()
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    lease = kube.get_lease(NS, "watch")
    assert lease is not None and not lease["spec"].get("holderIdentity"), "released on stop"


class SlowToLetGo(Kube):
    """The adapter, but the release's write returns only after `linger` seconds (a slow API server's answer)."""

    def __init__(self, kube: Kube, linger: float) -> None:
        super().__init__(kube.api_client, timeout=kube.timeout)
        self.linger = linger

    def patch_lease(self, namespace: str, name: str, spec: Mapping[str, Any], resource_version: str) -> Any:
        out = super().patch_lease(namespace, name, spec, resource_version)
        if "holderIdentity" in spec and spec["holderIdentity"] is None:
            time.sleep(self.linger)
        return out


async def test_the_process_stops_ticking_the_lease_before_it_releases_it(emulator: EmulatorServer, kube: Kube) -> None:
    """CI once found the Lease held after a clean stop: the renew loop, still running while the release was on its
    way, read the Lease free and took it again. Here the release's answer is slow and the loop ticks every 10 ms,
    so a loop still running at the release always takes the Lease back."""
    World(emulator).slot("s1")
    slow = SlowToLetGo(kube, linger=0.5)
    w = Watchers(kube, Quiet(), namespaces=[NS], elector=LeaderElector(slow, NS, "watch", "solo", LEASE), window=2)
    stop = asyncio.Event()
    task = asyncio.create_task(w.run(stop, renew_every=0.01))
    deadline = time.monotonic() + 10
    while not w.dispatcher.acting:
        assert time.monotonic() < deadline, "leading within 10 s of start"
        await asyncio.sleep(0.02)
    stop.set()
    await asyncio.wait_for(task, 15)
    await asyncio.sleep(0.1)  # a tick that outlived the stop would have written by now
    lease = kube.get_lease(NS, "watch")
    assert lease is not None and not lease["spec"].get("holderIdentity"), "released on stop, and not taken again"


async def test_the_process_hands_over_to_its_watch_threads_after_one_listing_however_busy_the_cluster(
    emulator: EmulatorServer, kube: Kube
) -> None:
    """The initial sync used to go on round after round while each round brought events: in a burst of 200 boots
    it held every watch event (and so every job_finished and Ready) back by 30 s before the threads took over.
    Here the cluster changes at every drain; the process path lists each watch once, then the threads carry on.
    """
    world = World(emulator)
    world.slot("s1")
    w = Watchers(kube, Quiet(), namespaces=[NS], window=2)
    drains: list[str] = []
    beat = itertools.count()

    def busy(source: Any, drain: Any) -> Any:
        def drain_and_change() -> Any:
            drains.append(source.name)
            world.kubelet("s1", "on" if next(beat) % 2 else "off")  # the next round always has something
            return drain()

        return drain_and_change

    for source in w.sources:
        source.drain = busy(source, source.drain)  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(w.run(stop, renew_every=0.2))
    try:
        deadline = time.monotonic() + 10
        while not (w.dispatcher.acting and w._threads):
            assert time.monotonic() < deadline, "acting, with the watch threads started, within 10 s"
            await asyncio.sleep(0.05)
        assert sorted(drains) == sorted(s.name for s in w.sources), "every watch listed once, then the threads"
        world.kubelet("s1", "on")
        while world.status("s1").get("powerState") != "on":
            assert time.monotonic() < deadline, "the threads follow the kubelet within 10 s"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(task, 15)
    # Tests still step through `pump()` until the cluster is quiet: there, the rounds go on.
    quiet = Watchers(kube, Quiet(), namespaces=[NS])
    drains.clear()
    for source in quiet.sources:
        source.drain = busy(source, source.drain)  # type: ignore[method-assign]
    await quiet.pump()
    assert len(drains) > len(quiet.sources)


def test_settings_defaults_and_environment(monkeypatch: object) -> None:
    s = WatchSettings(lease_duration_seconds=30)
    assert s.lease_duration_seconds == 30 and s.lease_name == "homelab-autoscaler-watch" and s.identity


def test_the_watch_window_setting_defaults_to_the_watches_own() -> None:
    """The settings module stays free of the Kubernetes client's import, so it repeats the number."""
    from kube.watch import WATCH_WINDOW

    assert WatchSettings().watch_window_seconds == WATCH_WINDOW
