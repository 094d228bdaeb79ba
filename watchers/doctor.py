"""Workflows whose task fails for good are ended on purpose, so the operator takes them over from their resources.

A workflow task that fails the same way at every try (a nondeterminism, a command the server refuses) stops its
workflow for good: Temporal tries the task again forever and nothing else of that workflow moves. A group stuck so
answers every cluster-autoscaler call with an error and never powers a machine on or off. Every workflow here is
rebuilt from Kubernetes when its run is gone (a run lost with Temporal's state is the same case, issue 32), so the
doctor ends such a run (a terminate that says why) and wakes what takes it over: a new run of the group, or the
group of the slot whose claim or release it was. A task that times out (its worker died) is not a failure here:
another worker takes it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError

from api import contracts as c
from domain.timings import TIMINGS

log = logging.getLogger(__name__)

# Causes that say nothing about the workflow's code: new events arrived, a sticky queue or a reset, a close.
BENIGN_CAUSES = frozenset(
    {
        WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND,
        WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_STICKY_TASK_QUEUE,
        WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW,
        WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_FORCE_CLOSE_COMMAND,
        WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_FAILOVER_CLOSE_COMMAND,
        WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_WORKFLOW_PAUSE_REQUESTED_BEFORE_TASK_STARTED,
    }
)
OURS = tuple(str(name) for name in c.WorkflowName)
KEY_GROUP = SearchAttributeKey.for_keyword(c.SA_GROUP)  # every workflow of ours carries its group
KEY_SLOT = SearchAttributeKey.for_keyword(c.SA_SLOT)  # a claim's and a release's slot
HISTORY_TAIL = 100  # events per page read back from the end (one page is enough unless signals pile up)
HISTORY_PAGES = 5
RPC_TIMEOUT = TIMINGS.doctor_call_timeout


@dataclass(frozen=True)
class Failures:
    """The failed tries of a workflow's task since its last completed one."""

    count: int = 0
    since: datetime | None = None  # the first of them
    cause: str = ""
    message: str = ""


def failures_since_last_completion(tail: Sequence[HistoryEvent], attempt: int) -> Failures:
    """Read the history's tail (newest first) back to the last completed task. `attempt` is the pending task's:
    a worker reports only the first failure of a task it keeps failing, the server counts the rest there."""
    count = 0
    since: datetime | None = None
    cause = message = ""
    for event in tail:
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            break
        if event.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            continue
        failed = event.workflow_task_failed_event_attributes
        if failed.cause in BENIGN_CAUSES:
            continue
        count += 1
        since = event.event_time.ToDatetime(tzinfo=UTC)
        if not cause:  # the newest says it best
            cause = WorkflowTaskFailedCause.Name(failed.cause).removeprefix("WORKFLOW_TASK_FAILED_CAUSE_")
            message = failed.failure.message
    if count:
        count += max(0, attempt - 1)
    return Failures(count, since, cause, message)


@dataclass(frozen=True)
class Stuck:
    """A run whose task has failed for good, and where it belongs."""

    workflow_id: str
    run_id: str
    kind: str  # c.WorkflowName
    namespace: str
    name: str  # the group's, claim's or slot's name, from the id
    group: str
    slot: str
    failures: Failures

    def reason(self) -> str:
        f = self.failures
        since = f.since.isoformat(timespec="seconds") if f.since else "?"
        return (
            f"its workflow task failed {f.count} times since {since} ({f.cause}: {f.message[:300]}); ended so the "
            f"operator takes it over from its resources"
        )


@dataclass
class Doctor:
    """Finds the runs on `task_queue` stuck for at least `after` and `failures` tries, and ends them."""

    client: Client
    task_queue: str = c.TASK_QUEUE
    after: timedelta = timedelta(minutes=10)
    failures: int = 5
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)

    async def examine(self, workflow_id: str) -> Failures | None:
        """The failures of the running workflow's pending task; None when it has none (or is not running)."""
        handle = self.client.get_workflow_handle(workflow_id)
        desc = await handle.describe(rpc_timeout=RPC_TIMEOUT)
        raw = desc.raw_description
        if desc.status != WorkflowExecutionStatus.RUNNING or not raw.HasField("pending_workflow_task"):
            return None
        tail: list[HistoryEvent] = []
        token = b""
        for _ in range(HISTORY_PAGES):  # back to the last completed task, or as far as the pages go
            page = await self.client.workflow_service.get_workflow_execution_history_reverse(
                GetWorkflowExecutionHistoryReverseRequest(
                    namespace=self.client.namespace,
                    execution=WorkflowExecution(workflow_id=workflow_id, run_id=desc.run_id),
                    maximum_page_size=HISTORY_TAIL,
                    next_page_token=token,
                ),
                retry=True,
                timeout=RPC_TIMEOUT,
            )
            tail += page.history.events
            token = page.next_page_token
            done = any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for e in page.history.events)
            if done or not token:
                break
        return failures_since_last_completion(tail, raw.pending_workflow_task.attempt)

    def is_stuck(self, found: Failures | None) -> bool:
        return (
            found is not None
            and found.count >= self.failures
            and found.since is not None
            and found.since <= self.clock() - self.after
        )

    async def stuck(self) -> list[Stuck]:
        """Every stuck run of ours on the task queue (a workflow that cannot be read is skipped this time)."""
        kinds = ", ".join(f"'{k}'" for k in OURS)
        query = f"TaskQueue = '{self.task_queue}' AND ExecutionStatus = 'Running' AND WorkflowType IN ({kinds})"
        found: list[Stuck] = []
        async for wf in self.client.list_workflows(query, rpc_timeout=RPC_TIMEOUT):
            try:
                failures = await self.examine(wf.id)
            except RPCError as err:
                log.info("workflow %s not examined: %s", wf.id, err)
                continue
            if failures is None or not self.is_stuck(failures):
                continue
            attrs = wf.typed_search_attributes
            namespace, name = c.workflow_id_parts(wf.id)
            # A run stuck at its first task has no search attributes yet: a group's and a release's id name them.
            group = attrs.get(KEY_GROUP) or (name if wf.workflow_type == c.WorkflowName.GROUP else "")
            slot = attrs.get(KEY_SLOT) or (name if wf.workflow_type == c.WorkflowName.RELEASE else "")
            found.append(Stuck(wf.id, wf.run_id, wf.workflow_type, namespace, name, group, slot, failures))
        return found

    async def end(self, stuck: Stuck) -> bool:
        """Terminate that run (only that run: a newer one is left alone); False when it had ended already."""
        handle = self.client.get_workflow_handle(stuck.workflow_id, run_id=stuck.run_id)
        try:
            await handle.terminate(reason=stuck.reason(), rpc_timeout=RPC_TIMEOUT)
        except RPCError as err:
            log.info("workflow %s not ended: %s", stuck.workflow_id, err)
            return False
        log.warning("workflow %s (run %s) ended: %s", stuck.workflow_id, stuck.run_id, stuck.reason())
        return True

    async def treat(self, wake: Callable[[Stuck], Awaitable[object]]) -> list[Stuck]:
        """One pass: end every stuck run, then `wake` what takes each over. The runs ended."""
        ended = [s for s in await self.stuck() if await self.end(s)]
        for stuck in ended:
            try:
                await wake(stuck)
            except Exception:  # the watchers' next event or resync wakes it instead
                log.exception("waking what takes %s over failed", stuck.workflow_id)
        return ended
