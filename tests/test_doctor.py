"""Workflows whose task fails for good are ended and taken over (watchers.doctor): what counts as stuck, a real
stuck run on a dev server, and what the watchers wake and say once one is ended.

Found by issue 34's worker-kill schedule: a group's task was refused at every try (`BadCancelTimerAttributes`, a
timer its history never started) after a worker died, and the group answered every cluster-autoscaler call with an
error from then on.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from homelab_sim.emulator import EmulatorServer
from temporalio import workflow
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowExecutionStatus
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from api import contracts as c
from api.names import EventReason
from homelab_autoscaler.temporal import search_attribute_flags
from kube.adapter import Kube
from tests.procs import BIN
from tests.test_report import NS, Quiet, World
from watchers.doctor import Doctor, Failures, Stuck, failures_since_last_completion
from watchers.main import Watchers
from watchers.settings import WatchSettings

T0 = datetime(2030, 1, 1, tzinfo=UTC)
UNHANDLED = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_WORKFLOW_WORKER_UNHANDLED_FAILURE
BAD_CANCEL = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_BAD_CANCEL_TIMER_ATTRIBUTES
UNHANDLED_COMMAND = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND


def event(kind: EventType.ValueType, second: int = 0, cause: int = 0, message: str = "") -> HistoryEvent:
    e = HistoryEvent(event_type=kind)
    e.event_time.FromDatetime(T0 + timedelta(seconds=second))
    if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
        e.workflow_task_failed_event_attributes.cause = cause  # type: ignore[assignment]
        e.workflow_task_failed_event_attributes.failure.message = message
    return e


def failed(second: int, cause: int = BAD_CANCEL, message: str = "refused") -> HistoryEvent:
    return event(EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED, second, cause, message)


def test_only_failures_since_the_last_completed_task_count_and_not_the_benign_ones() -> None:
    """Newest first, as the reverse history reads: a completed task ends the count; a timeout (a dead worker), a
    signal and a failure for new events (UNHANDLED_COMMAND) are no failure of the code; the pending task's attempt
    adds the tries a worker did not report."""
    completed = event(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, 0)
    tail = [
        failed(40, message="TimerID: 27"),
        event(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED, 35),
        failed(30, UNHANDLED_COMMAND),
        event(EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT, 25),
        failed(20),
        completed,
        failed(-10),  # before the last completion: forgiven
    ]
    found = failures_since_last_completion(tail, attempt=1)
    assert found == Failures(2, T0 + timedelta(seconds=20), "BAD_CANCEL_TIMER_ATTRIBUTES", "TimerID: 27")
    assert failures_since_last_completion(tail, attempt=4).count == 5, "three unreported tries of the last task"
    assert failures_since_last_completion([completed, failed(-10)], attempt=3) == Failures(), "healthy since"
    timeouts = [event(EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT, s) for s in range(5)]
    assert failures_since_last_completion(timeouts, attempt=1).count == 0, "a dead worker is not a stuck workflow"


def test_stuck_means_enough_failures_for_long_enough() -> None:
    doctor = Doctor(None, after=timedelta(minutes=10), failures=5, clock=lambda: T0 + timedelta(minutes=10))  # type: ignore[arg-type]
    assert doctor.is_stuck(Failures(5, T0, "X", ""))
    assert not doctor.is_stuck(Failures(4, T0, "X", "")), "too few"
    assert not doctor.is_stuck(Failures(9, T0 + timedelta(seconds=1), "X", "")), "not long enough"
    assert not doctor.is_stuck(None) and not doctor.is_stuck(Failures())


KEY_GROUP = SearchAttributeKey.for_keyword(c.SA_GROUP)


@workflow.defn(name=c.WorkflowName.GROUP)
class Poisonable:
    """A stand-in with the group's type name: a "poison" signal fails its task at every try, as a code that
    replays differently does."""

    def __init__(self) -> None:
        self.done = False

    @workflow.run
    async def run(self, group: str) -> None:
        workflow.upsert_search_attributes([KEY_GROUP.value_set(group)])
        await workflow.wait_condition(lambda: self.done)

    @workflow.signal(name=c.GroupSignal.REFRESH)  # a name from the table; its argument is this stand-in's own
    def poke(self, what: str) -> None:
        if what == "poison":
            raise RuntimeError("poisoned: this task fails at every try")
        self.done = what == "done"


@pytest.mark.long
async def test_a_run_whose_task_fails_at_every_try_is_ended_and_its_group_woken() -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"), dev_server_extra_args=search_attribute_flags()
    )
    queue = f"doctor-{uuid.uuid4().hex[:8]}"
    try:
        client = env.client
        async with Worker(
            client, task_queue=queue, workflows=[Poisonable], workflow_runner=UnsandboxedWorkflowRunner()
        ):
            sick = await client.start_workflow(Poisonable.run, "sick", id=f"group/{NS}/sick", task_queue=queue)
            well = await client.start_workflow(Poisonable.run, "well", id=f"group/{NS}/well", task_queue=queue)
            await sick.signal(Poisonable.poke, "poison")
            await well.signal(Poisonable.poke, "fine")
            for _ in range(150):  # words pile up while it fails: each is a task of its own that fails again
                await sick.signal(Poisonable.poke, "noise")
            patient = Doctor(client, queue, after=timedelta(hours=1), failures=2)
            doctor = Doctor(client, queue, after=timedelta(0), failures=2)
            deadline = time.monotonic() + 60
            while not (stuck := await doctor.stuck()):
                assert time.monotonic() < deadline, "the poisoned run found stuck within 60 s"
                await asyncio.sleep(0.5)
            assert [s.workflow_id for s in stuck] == [f"group/{NS}/sick"], stuck
            (found,) = stuck
            assert (found.kind, found.namespace, found.group) == (c.WorkflowName.GROUP, NS, "sick"), "named by its id"
            assert found.failures.count >= 2 and "poisoned" in found.failures.message, found.failures
            assert await patient.stuck() == [], "failing for less than `after` is not stuck yet"
            woken: list[Stuck] = []

            async def wake(s: Stuck) -> None:
                woken.append(s)

            assert [s.workflow_id for s in await doctor.treat(wake)] == [sick.id]
            assert [(s.workflow_id, s.run_id) for s in woken] == [(sick.id, found.run_id)]
            desc = await sick.describe()
            assert desc.status == WorkflowExecutionStatus.TERMINATED
            assert (await well.describe()).status == WorkflowExecutionStatus.RUNNING, "the healthy run goes on"
            terminated = [e async for e in sick.fetch_history_events()][-1]
            reason = terminated.workflow_execution_terminated_event_attributes.reason
            assert "failed" in reason and "takes it over" in reason and "poisoned" in reason, reason
            assert await doctor.treat(wake) == [] and len(woken) == 1, "an ended run is not ended twice"
            await well.signal(Poisonable.poke, "done")
            await well.result()
    finally:
        await env.shutdown()


async def test_the_watchers_wake_what_takes_an_ended_run_over_and_say_so_on_its_object(
    emulator: EmulatorServer, kube: Kube
) -> None:
    world = World(emulator)
    world.slot("s1")
    world.kubelet("s1", "on")
    world.claim("c1", "s1", "ready")
    sink = Quiet()
    w = Watchers(kube, sink, namespaces=[NS])
    await w.pump()
    sink.sent.clear()
    failures = Failures(5, T0, "BAD_CANCEL_TIMER_ATTRIBUTES", "TimerID: 27")
    group = Stuck(c.group_workflow_id(NS, "g"), "r1", c.WorkflowName.GROUP, NS, "g", "g", "", failures)
    await w.take_over(group)
    assert sink.sent == [(c.group_workflow_id(NS, "g"), c.GroupSignal.REFRESH)], "a new run of the group, at once"
    claim = Stuck(c.claim_workflow_id(NS, "c1"), "r2", c.WorkflowName.CLAIM, NS, "c1", "g", "s1", failures)
    await w.take_over(claim)
    assert sink.sent[1:] == [(c.claim_workflow_id(NS, "c1"), c.ClaimSignal.OBSERVE)], "the slot observed again"
    said = {
        (e["involvedObject"]["kind"], e["involvedObject"]["name"]): e["message"]
        for e in emulator.call(lambda e: e.objects_of("v1", "events", NS))
        if e["reason"] == EventReason.WORKFLOW_STUCK
    }
    assert set(said) == {("Group", "g"), ("NodeClaim", "c1")}, said
    assert all("TimerID: 27" in m and "takes it over" in m for m in said.values()), said


def test_the_leader_looks_for_stuck_workflows_every_minute_unless_told_never() -> None:
    from watchers.main import build_watchers

    on = build_watchers(WatchSettings(), None, None, namespaces=[NS])  # type: ignore[arg-type]
    assert on.doctor is not None and on.doctor_every == timedelta(minutes=1)
    assert (on.doctor.after, on.doctor.failures) == (timedelta(minutes=10), 5)
    off = build_watchers(WatchSettings(stuck_check_seconds=0), None, None, namespaces=[NS])  # type: ignore[arg-type]
    assert off.doctor is None


async def test_a_pass_while_temporal_is_away_is_one_line(
    emulator: EmulatorServer, kube: Kube, caplog: pytest.LogCaptureFixture
) -> None:
    """make chaos counts a traceback in a role's log as a bug: Temporal away is expected, and says so in one line."""
    World(emulator)
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=str(BIN / "temporal"))
    away = env.client
    await env.shutdown()  # connected once, then gone: what a Temporal restart looks like to the watchers
    w = Watchers(kube, Quiet(), namespaces=[NS], doctor=Doctor(away), doctor_every=timedelta(milliseconds=50))
    await w.pump()
    assert w.dispatcher.acting
    caplog.set_level("WARNING", logger="watchers.main")
    rounds = asyncio.create_task(w._doctor_rounds())
    try:
        deadline = time.monotonic() + 20
        while not [r for r in caplog.records if "stuck workflows stopped" in r.getMessage()]:
            assert time.monotonic() < deadline, "a pass within 20 s (the client tries a call again for a while)"
            await asyncio.sleep(0.05)
    finally:
        rounds.cancel()
    said = [r for r in caplog.records if r.name == "watchers.main"]
    assert said and all(r.exc_info is None and "Temporal did not answer" in r.getMessage() for r in said), said
