"""The watchers' process path sends signals beside the next events: in order per key, bounded, and an
observation that did not land is sent again by the next event (its debounce entry is dropped)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from api import contracts as c
from kube.adapter import CLAIMS, Kube
from kube.watch import WatchEvent
from watchers.cluster import Cluster
from watchers.dispatch import Dispatcher
from watchers.report import ReportWriter

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def dispatcher(kube: Kube) -> Dispatcher:
    cluster = Cluster()
    return Dispatcher(cluster, _Refusing(), ReportWriter(kube, cluster), clock=lambda: T0)


class _Refusing:
    """Delivers nothing (no workflow runs): every signal answers False."""

    async def claim(self, namespace: str, claim: str, signal: c.ClaimSignal, arg: object = None) -> bool:
        return False

    async def release(self, namespace: str, slot: str, signal: c.ReleaseSignal, arg: object = None) -> bool:
        return False

    async def group(
        self, namespace: str, group: str, signal: c.GroupSignal, arg: object = None, *, start: bool = True
    ) -> bool:
        return False

    async def claim_running(self, namespace: str, claim: str) -> bool:
        return False

    async def start_claim(self, seed: c.ClaimSeed) -> bool:
        return False

    def count(self, signal: str | None = None, workflow_id: str | None = None) -> int:
        return 0


async def test_sends_for_one_key_run_in_order_and_different_keys_at_once(kube: Kube) -> None:
    d = dispatcher(kube)
    d.send_concurrently(limit=4)
    log: list[str] = []
    gate = asyncio.Event()

    def send(tag: str, wait: bool = False) -> Callable[[], Awaitable[None]]:
        async def go() -> None:
            log.append(f"{tag} start")
            if wait:
                await gate.wait()
            log.append(f"{tag} end")

        return go

    d._spawn(("ns", "a"), send("a1", wait=True))
    d._spawn(("ns", "a"), send("a2"))
    d._spawn(("ns", "b"), send("b1"))
    await asyncio.sleep(0.05)
    assert "b1 end" in log and "a2 start" not in log, "b went beside a; a2 waits for a1"
    gate.set()
    await d.settle()
    assert log.index("a1 end") < log.index("a2 start")
    assert not d._chains


async def test_an_observation_that_did_not_land_is_sent_again(kube: Kube) -> None:
    d = dispatcher(kube)
    obs = c.Observation(power="on", usable=True, exists=True, gate_open=True, observed_at=T0)
    key = ("ns", "s1")
    target = c.claim_workflow_id("ns", "claim-1")
    d.sent[key] = (target, obs)  # what `observe` books before a concurrent send
    assert not await d._deliver(key, "claim-1", "g", obs, target)
    assert key not in d.sent, "the next event with the same facts is not debounced away"


class _Slow(_Refusing):
    """`claim_running` answers only when let (a Temporal that answers late); records what was asked and sent."""

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.asked: list[str] = []
        self.groups: list[tuple[str, str]] = []
        self.marks: list[str] = []

    async def claim_running(self, namespace: str, claim: str) -> bool:
        self.asked.append(claim)
        await self.answer.wait()
        return False

    async def claim(self, namespace: str, claim: str, signal: c.ClaimSignal, arg: object = None) -> bool:
        if signal == c.ClaimSignal.MARK_FOR_DELETION:
            self.marks.append(claim)
        return False

    async def group(
        self, namespace: str, group: str, signal: c.GroupSignal, arg: object = None, *, start: bool = True
    ) -> bool:
        self.groups.append((group, str(signal)))
        return False


async def test_a_new_claim_is_checked_for_its_workflow_beside_the_next_events_not_in_line(kube: Kube) -> None:
    """Each new claim asks Temporal whether a workflow runs it; asked in line, a burst of claims queued every
    watch event behind one round trip each. The process asks beside the events, and still takes an unrun claim
    over (its group reloads) once the answer comes."""
    signals = _Slow()
    cluster = Cluster()
    d = Dispatcher(cluster, signals, ReportWriter(kube, cluster), clock=lambda: T0)
    d.send_concurrently(limit=4)
    d.defer_reports()
    d.acting = True
    cluster.groups[("ns", "g")] = {"metadata": {"name": "g", "namespace": "ns"}, "spec": {"maxSize": 3}}

    def claim(name: str, **extra: object) -> WatchEvent:
        meta = {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": "1", **extra}
        spec = {"node": f"s-{name}", "group": "g", "requestedAt": "2030-01-01T00:00:00Z"}
        return WatchEvent("ADDED", {"kind": "NodeClaim", "metadata": meta, "spec": spec})

    for i in range(3):
        await asyncio.wait_for(d.handle(CLAIMS, claim(f"c{i}")), 1)  # would hang in line: nobody answers yet
    await asyncio.wait_for(d.handle(CLAIMS, claim("gone", deletionTimestamp="2030-01-01T00:00:01Z")), 1)
    await asyncio.sleep(0.05)
    assert sorted(signals.asked) == ["c0", "c1", "c2"] and signals.groups == []
    assert signals.marks == ["gone"], "a hand delete is told at once, beside the questions in flight"
    signals.answer.set()
    await asyncio.wait_for(d.settle(), 5)
    assert signals.groups == [("g", str(c.GroupSignal.REFRESH))] * 3, "each unrun claim makes its group reload"
