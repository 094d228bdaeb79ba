"""The `watch` role: five watches, one dispatcher, the report writer and a Lease, as one object.

`Watchers` is the whole role as one object. `pump()` drives it deterministically (every source drained in
a fixed order, events handled until nothing new arrives), which is what tests and the initial sync use;
`run(stop)` is the process: a thread per watch feeding one asyncio queue, the Lease ticking, and the expiry
pass scheduled at the history's next expiry (bounded by the resync interval).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from temporalio.client import Client, RPCTimeoutOrCancelledError
from temporalio.common import MetricMeter
from temporalio.service import RPCError

from api import contracts as c
from api.contracts import TASK_QUEUE
from api.names import KIND_GROUP, KIND_NODE, KIND_NODECLAIM, EventReason
from domain.timings import TIMINGS
from kube.adapter import CLAIMS, GROUPS, JOBS, KUBELET_NODES, SLOTS, Kube, ObjectRef, Resource
from kube.errors import KubeError
from kube.objects import meta, spec
from kube.watch import WATCH_WINDOW
from watchers.cluster import Cluster
from watchers.dispatch import Dispatcher
from watchers.doctor import Doctor, Stuck
from watchers.leader import LeaderElector
from watchers.report import ReportWriter
from watchers.settings import WatchSettings
from watchers.signals import Signals, SignalSink
from watchers.sources import Source, Tagged

log = logging.getLogger(__name__)

# The order of the initial sync: what a slot's observation depends on is in the picture before the Nodes.
ORDER: tuple[Resource, ...] = (GROUPS, SLOTS, CLAIMS, KUBELET_NODES, JOBS)
PUMP_ROUNDS = 20


def utc_now() -> datetime:
    return datetime.now(UTC)


class Watchers:
    """The watchers of some namespaces (all when none are given); `elector` None means always the leader."""

    def __init__(
        self,
        kube: Kube,
        signals: SignalSink,
        *,
        namespaces: tuple[str, ...] | list[str] = (),
        elector: LeaderElector | None = None,
        clock: Callable[[], datetime] = utc_now,
        monotonic: Callable[[], float] = time.monotonic,
        window: int = WATCH_WINDOW,
        resync: timedelta = timedelta(minutes=5),
        coalesce: timedelta = TIMINGS.report_coalesce,
        meter: MetricMeter | None = None,
        doctor: Doctor | None = None,
        doctor_every: timedelta = timedelta(minutes=1),
        watt_hour_gauges: bool = False,
    ) -> None:
        self.kube = kube
        self.doctor = doctor
        self.doctor_every = doctor_every
        self.coalesce = coalesce
        self.signals = signals
        self.elector = elector
        self.clock = clock
        self.monotonic = monotonic
        self.resync = resync
        self.cluster = Cluster()
        self.writer = ReportWriter(kube, self.cluster, meter=meter, monotonic=monotonic, watt_hours=watt_hour_gauges)
        self.dispatcher = Dispatcher(self.cluster, signals, self.writer, clock=clock)
        spaces: list[str | None] = list(namespaces) or [None]
        self.sources: list[Source] = []
        for res in ORDER:
            for ns in [None] if not res.namespaced else spaces:
                self.sources.append(Source(kube, res, ns, window=window))
        self._threads: list[threading.Thread] = []

    # --- state -------------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Every watch has listed once: the picture covers the whole cluster."""
        return all(s.synced for s in self.sources)

    @property
    def leading(self) -> bool:
        return self.elector is None or self.elector.leading

    def alive(self) -> bool:
        return not self._threads or all(t.is_alive() for t in self._threads)

    def not_ready(self) -> str:
        """The readiness probe: "" once every watch has listed, else which have not."""
        waiting = [s.name for s in self.sources if not s.synced]
        return f"not listed yet: {', '.join(waiting)}" if waiting else ""

    async def lead(self, now: datetime | None = None) -> bool:
        """Tick the Lease (when there is one) and start or stop acting accordingly; True while acting."""
        if self.elector is not None:
            await asyncio.to_thread(self.elector.tick, now or self.clock())
        should = self.ready and self.leading
        if should and not self.dispatcher.acting:
            await self.dispatcher.start_acting()
        elif not should and self.dispatcher.acting:
            self.dispatcher.stop_acting()
        return self.dispatcher.acting

    async def stop_leading(self, now: datetime | None = None) -> None:
        """Stop acting and release the Lease, so another replica takes over at its next tick."""
        self.dispatcher.stop_acting()
        if self.elector is not None:
            await asyncio.to_thread(self.elector.release, now or self.clock())

    # --- deterministic driving ---------------------------------------------------------------------------
    async def handle(self, tagged: Tagged) -> None:
        await self.dispatcher.handle(tagged.source.resource, tagged.event, relisting=tagged.relisting)

    async def pump(self, *, until_ready: bool = False) -> int:
        """Drain every watch in order and handle what came, until a round brings nothing; the events handled.

        A write made while handling (a report, a stamp) comes back as an event of its own, hence the rounds.
        `until_ready` stops as soon as every watch has listed once (the process's initial sync): a busy cluster
        brings something every round, and the rounds would keep the watch threads from starting.
        """
        total = 0
        for _ in range(PUMP_ROUNDS):
            batch: list[Tagged] = []
            for source in self.sources:
                batch += await asyncio.to_thread(source.drain)
            for tagged in batch:
                await self.handle(tagged)
            total += len(batch)
            if not self.dispatcher.acting:
                await self.lead()
            if not batch or (until_ready and self.ready):
                break
        await self.dispatcher.refuse_homeless()
        return total

    # --- the process -------------------------------------------------------------------------------------
    def _start_threads(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Tagged]) -> None:
        def emit(tagged: Tagged) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, tagged)

        for source in self.sources:
            thread = threading.Thread(target=source.run, args=(emit,), name=f"watch {source.name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    async def _consume(self, queue: asyncio.Queue[Tagged]) -> None:
        while True:
            tagged = await queue.get()
            try:
                await self.handle(tagged)
            except Exception:  # one bad event must not stop the watchers; the resync repairs what it missed
                log.exception("handling %s %s failed", tagged.event.type, tagged.source.name)

    async def _leadership(self, every: float, stopping: asyncio.Event) -> None:
        """Tick the Lease until `stopping`; it ends between ticks, never inside one. A tick is a thread that a
        cancel does not stop: one left running past the release read the Lease free and took it again."""
        while not stopping.is_set():
            try:
                await self.lead()
            except Exception:
                log.exception("leader election tick failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), every)

    async def _write_reports(self, dirty: asyncio.Event) -> None:
        """The reports the events made dirty, written after the signals those events sent, coalesced per slot and
        over `coalesce`: the changes of one move (a phase, its Job, the machine's power) make one write."""
        while True:
            await dirty.wait()
            await asyncio.sleep(self.coalesce.total_seconds())
            try:
                await self.dispatcher.write_reports()
            except Exception:  # a report left behind is written by the next event or the resync
                log.exception("report pass failed")

    async def _expiry(self) -> None:
        """The history's expiry pass, due when the oldest row leaves its window, and a periodic resync; between
        them, the usage tick (every slot's time counted, the figures written where due)."""
        full_at = self.monotonic() + self.resync.total_seconds()
        while True:
            now = self.clock()
            due = self.writer.next_expiry()
            # At least a second: a follower does not prune, so a past expiry must not make this spin.
            wait = min(self.resync, TIMINGS.usage_tick)
            if due is not None:
                wait = min(wait, max(due - now, timedelta(seconds=1)))
            await asyncio.sleep(wait.total_seconds())
            if not self.dispatcher.acting:
                continue
            now = self.clock()
            full = self.monotonic() >= full_at or (due is not None and now >= due)
            try:
                if full:
                    full_at = self.monotonic() + self.resync.total_seconds()
                    await self.writer.everything(now)
                await self.writer.count(now)
            except Exception:
                log.exception("report pass failed")

    async def _refuse_homeless(self) -> None:
        """Claims no group can take are failed when their grace has passed: woken by a new one, or the earliest due
        (bounded by the resync interval)."""
        noted = self.dispatcher.homeless_noted
        while True:
            due = self.dispatcher.next_homeless()
            wait = self.resync if due is None else min(self.resync, max(due - self.clock(), timedelta(seconds=5)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(noted.wait(), wait.total_seconds())
            noted.clear()
            try:
                await self.dispatcher.refuse_homeless()
            except Exception:  # the next pass tries again
                log.exception("failing the claims no group can take failed")

    async def _doctor_rounds(self) -> None:
        """The leader's pass over stuck workflows (watchers.doctor), every `doctor_every`."""
        assert self.doctor is not None
        while True:
            await asyncio.sleep(self.doctor_every.total_seconds())
            if not self.dispatcher.acting:
                continue
            try:
                await self.doctor.treat(self.take_over)
            except (RPCError, RPCTimeoutOrCancelledError) as err:  # Temporal away: one line, the next pass looks again
                log.warning("the pass over stuck workflows stopped: Temporal did not answer: %s", err)
            except Exception:  # a bug: its traceback
                log.exception("the pass over stuck workflows failed")

    async def take_over(self, stuck: Stuck) -> None:
        """Wake what takes an ended run over, and say so on its object: a group's next run starts at once (and
        reads its claims); a claim's or a release's slot is observed again, which reaches its group, whose reload
        takes the claim over or books the release again."""
        ns, group, slot = stuck.namespace, stuck.group, stuck.slot
        if stuck.kind == c.WorkflowName.GROUP:
            obj, kind = self.cluster.groups.get((ns, group)), KIND_GROUP
            await self.signals.group(ns, group, c.GroupSignal.REFRESH, start=obj is not None)
        else:
            if stuck.kind == c.WorkflowName.CLAIM:
                obj, kind = self.cluster.claims.get((ns, stuck.name)), KIND_NODECLAIM
                # A run stuck at its first task has no search attributes yet: its resource names its slot.
                slot = slot or str(spec(obj or {}).get("node") or "")
            else:
                obj, kind = self.cluster.slots.get((ns, slot)), KIND_NODE
            group = group or str(spec(self.cluster.slots.get((ns, slot)) or {}).get("group") or "")
            if (ns, slot) in self.cluster.slots:
                await self.dispatcher.observe((ns, slot), force=True)
            else:
                await self.signals.group(ns, group, c.GroupSignal.REFRESH, start=False)
        if obj is None:
            return
        m = meta(obj)
        ref = ObjectRef(kind, ns, str(m.get("name") or ""), str(m.get("uid") or ""))
        message = f"workflow {stuck.workflow_id}: {stuck.reason()}"
        try:
            await asyncio.to_thread(self.kube.create_event, ref, EventReason.WORKFLOW_STUCK, message, warning=True)
        except KubeError as err:
            log.warning("%s %s/%s: WorkflowStuck Event not written: %s", kind, ns, ref.name, err)

    async def run(self, stop: asyncio.Event, *, renew_every: float = 5.0) -> None:
        """Run until `stop` is set; then stop acting, release the Lease and close the watches."""
        # The process's way from the first event on: signals beside the events, reports coalesced by their task.
        dirty = self.dispatcher.defer_reports()
        self.dispatcher.send_concurrently()
        await self.pump(until_ready=True)  # the initial sync, in a fixed order; the threads carry on from there
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Tagged] = asyncio.Queue()
        self._start_threads(loop, queue)
        stopping = asyncio.Event()
        lease = asyncio.create_task(self._leadership(renew_every, stopping), name="lease")
        tasks = [
            asyncio.create_task(self._consume(queue), name="watch events"),
            asyncio.create_task(self._write_reports(dirty), name="reports"),
            asyncio.create_task(self._expiry(), name="report expiry"),
            asyncio.create_task(self._refuse_homeless(), name="claims no group takes"),
        ]
        if self.doctor is not None:
            tasks.append(asyncio.create_task(self._doctor_rounds(), name="stuck workflows"))
        try:
            await stop.wait()
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.dispatcher.settle(), 5)  # signals in flight land before the stop
            # The Lease's last tick ends first: after it nothing here takes the Lease or starts acting again.
            stopping.set()
            bound = 2 * self.kube.timeout + 1  # a tick is at most a read and a write, each with its timeout
            try:
                await asyncio.wait_for(lease, bound)
            except Exception:
                log.warning("the Lease's last tick did not end within %.0f s; releasing anyway", bound)
            self.dispatcher.stop_acting()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self.stop_leading()
            self.close()

    def close(self) -> None:
        """Close every watch and wait (bounded) for its thread."""
        for source in self.sources:
            source.close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()


def build_watchers(
    settings: WatchSettings,
    client: Client,
    kube: Kube,
    *,
    namespaces: Sequence[str],
    task_queue: str = TASK_QUEUE,
    meter: MetricMeter | None = None,
) -> Watchers:
    """The `watch` role as the composition root hands it its client and adapter: watches of `namespaces`,
    signals (and workflow starts on `task_queue`), the Lease, and the meter of the process's /metrics."""
    elector = LeaderElector(
        kube,
        settings.lease_namespace,
        settings.lease_name,
        settings.identity,
        timedelta(seconds=settings.lease_duration_seconds),
    )
    doctor = None
    if settings.stuck_check_seconds > 0:
        doctor = Doctor(
            client,
            task_queue,
            after=timedelta(seconds=settings.stuck_after_seconds),
            failures=settings.stuck_failures,
        )
    return Watchers(
        kube,
        Signals(client, task_queue),
        namespaces=list(namespaces),
        elector=elector,
        window=settings.watch_window_seconds,
        resync=timedelta(seconds=settings.resync_seconds),
        meter=meter,
        doctor=doctor,
        doctor_every=timedelta(seconds=settings.stuck_check_seconds),
        watt_hour_gauges=settings.watt_hour_gauges,
    )
