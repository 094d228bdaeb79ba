"""The floors: what the same Temporal server does for trivial workflows in the same run, and a trivial gRPC echo."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import grpc
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from bench.procs import bounded, free_port
from bench.trivial import FLOOR_QUEUE, OneActivity, SignalTwoActivities, noop
from homelab_autoscaler.settings import WorkerSettings
from homelab_autoscaler.temporal import DATA_CONVERTER, STICKY_WAIT, pollers, sandbox_runner


def _seconds(event: HistoryEvent) -> float:
    return float(event.event_time.seconds) + event.event_time.nanos / 1e9


@asynccontextmanager
async def floor_worker(client: Client) -> AsyncIterator[Worker]:
    """A worker for the trivial workflows, in this process, on its own task queue (sandboxed, and polling, as the
    operator's)."""
    tuning = WorkerSettings()
    worker = Worker(
        client,
        task_queue=FLOOR_QUEUE,
        workflows=[OneActivity, SignalTwoActivities],
        activities=[noop],
        max_concurrent_workflow_tasks=tuning.workflow_task_slots,
        sticky_queue_schedule_to_start_timeout=STICKY_WAIT,
        workflow_task_poller_behavior=pollers(tuning.task_pollers, autoscaling=tuning.poller_autoscaling),
        activity_task_poller_behavior=pollers(tuning.task_pollers, autoscaling=tuning.poller_autoscaling),
    )
    async with worker:
        yield worker


async def one_activity_burst(client: Client, n: int, timeout: float) -> tuple[float, str]:
    """N one-activity workflows started at once and all completed: the seconds it took, and one workflow id."""
    run = uuid.uuid4().hex[:8]
    began = time.monotonic()
    handles = await bounded(
        asyncio.gather(
            *(
                client.start_workflow(OneActivity.run, i, id=f"floor-one-{run}-{i}", task_queue=FLOOR_QUEUE)
                for i in range(n)
            )
        ),
        timeout=timeout,
        what=f"{n} trivial workflows to start",
    )
    await bounded(
        asyncio.gather(*(h.result() for h in handles)), timeout=timeout, what=f"{n} trivial workflows to complete"
    )
    return time.monotonic() - began, handles[0].id


async def replay_seconds(
    client: Client, workflow_id: str, workflows: Sequence[type], times: int = 10, *, sandboxed: bool = True
) -> float:
    """The mean time to replay a workflow's (last run's) history in this process, sandboxed as the operator's
    worker does: what a workflow evicted from the cache costs at its next task. Unsandboxed, what the code costs
    without the sandbox building the workflow's modules afresh for the run (the share the sandbox adds)."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    runner = sandbox_runner() if sandboxed else UnsandboxedWorkflowRunner()
    replayer = Replayer(workflows=workflows, workflow_runner=runner, data_converter=DATA_CONVERTER)
    await replayer.replay_workflow(history)  # the first replay imports the workflow's modules
    began = time.perf_counter()
    for _ in range(times):
        await replayer.replay_workflow(history)
    return (time.perf_counter() - began) / times


async def history_events(client: Client, workflow_id: str) -> list[HistoryEvent]:
    """The events of every run of a workflow, oldest run first (a continued-as-new claim counts all its runs)."""
    runs = []
    async for wf in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        runs.append(list(history.events))
    runs.sort(key=lambda events: _seconds(events[0]) if events else 0.0)
    return [e for events in runs for e in events]


async def history_length(client: Client, workflow_id: str) -> int:
    """Events in every run of a workflow."""
    return len(await history_events(client, workflow_id))


async def signal_latencies(client: Client, n: int, timeout: float) -> tuple[list[float], list[float]]:
    """N workflows each waiting for a signal, all signalled at once: per workflow, seconds from sending the signal
    to the workflow task that handled it completing, and to its second trivial activity completing."""
    run = uuid.uuid4().hex[:8]
    handles = await bounded(
        asyncio.gather(
            *(
                client.start_workflow(SignalTwoActivities.run, id=f"floor-sig-{run}-{i}", task_queue=FLOOR_QUEUE)
                for i in range(n)
            )
        ),
        timeout=timeout,
        what=f"{n} signal workflows to start",
    )
    # Every one waiting (its first task done) before any signal goes, as a booting claim is.
    await bounded(
        asyncio.gather(*(h.query(SignalTwoActivities.waiting) for h in handles)),
        timeout=timeout,
        what=f"{n} signal workflows to answer a query (their first task done)",
    )
    sent: dict[str, float] = {}

    async def send(handle: WorkflowHandle[SignalTwoActivities, int]) -> None:
        sent[handle.id] = time.time()
        await handle.signal(SignalTwoActivities.go)

    await bounded(asyncio.gather(*(send(h) for h in handles)), timeout=timeout, what=f"{n} signals to be accepted")
    await bounded(
        asyncio.gather(*(h.result() for h in handles)), timeout=timeout, what=f"{n} signal workflows to complete"
    )
    handled, done = [], []
    for h in handles:
        events = (await h.fetch_history()).events
        signalled = next(
            i for i, e in enumerate(events) if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        )
        task_done = next(e for e in events[signalled:] if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
        last_activity = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED][-1]
        handled.append(_seconds(task_done) - sent[h.id])
        done.append(_seconds(last_activity) - sent[h.id])
    return handled, done


@asynccontextmanager
async def echo_server() -> AsyncIterator[int]:
    """A gRPC server with one unary method that answers its request bytes: the floor of any gRPC call here."""

    async def echo(request: bytes, context: object) -> bytes:
        return request

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler("bench.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)})
    server.add_generic_rpc_handlers((handler,))
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(grace=1)


async def echo_latencies(port: int, calls: int) -> list[float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary("/bench.Echo/Echo")
        await call(b"warm", timeout=5)
        out = []
        for i in range(calls):
            began = time.perf_counter()
            await call(b"x" * (i % 64), timeout=5)
            out.append(time.perf_counter() - began)
        return out
