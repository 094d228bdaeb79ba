"""Workflow tasks that did not complete, read from the histories of one figure's workflows: a task Temporal timed
out (started, then nothing from the worker for the task timeout) is a worker that took work it could not do in
time; the goal is none, in every figure."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client

TIMED_OUT = EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
FAILED = EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
COMPLETED = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED


@dataclass
class TaskTrouble:
    """Per figure: workflows read, workflow tasks timed out and failed, and the workflows they happened in."""

    workflows: int = 0
    timed_out: int = 0
    failed: int = 0
    where: Counter[str] = field(default_factory=Counter)
    causes: Counter[str] = field(default_factory=Counter)  # a failed task's cause, as Temporal names it
    workers: Counter[str] = field(default_factory=Counter)  # tasks completed per worker (its identity, pid@host)

    def spread(self) -> str:
        """How the completed tasks spread over the worker processes: "pid@host 52%, ..."."""
        total = sum(self.workers.values())
        return ", ".join(f"{w} {100 * n / total:.0f}%" for w, n in self.workers.most_common()) if total else "none"

    def text(self) -> str:
        worst = ", ".join(f"{w} {n}" for w, n in self.where.most_common(3))
        why = ", ".join(f"{cause} {n}" for cause, n in self.causes.most_common())
        return (
            f"{self.timed_out} timed out, {self.failed} failed"
            + (f" ({why})" if why else "")
            + f" in {self.workflows} workflows"
            + (f" ({worst})" if worst else "")
        )


async def task_trouble(client: Client, task_queue: str) -> TaskTrouble:
    """Every run of every workflow on `task_queue` (each figure has its own), read to its last event."""
    out = TaskTrouble()
    async for wf in client.list_workflows(f"TaskQueue = '{task_queue}'"):
        out.workflows += 1
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        for e in history.events:
            if e.event_type == COMPLETED:
                out.workers[e.workflow_task_completed_event_attributes.identity] += 1
            elif e.event_type == TIMED_OUT:
                out.timed_out += 1
                out.where[wf.id] += 1
            elif e.event_type == FAILED:
                out.failed += 1
                out.where[wf.id] += 1
                cause = WorkflowTaskFailedCause.Name(e.workflow_task_failed_event_attributes.cause)
                out.causes[cause.removeprefix("WORKFLOW_TASK_FAILED_CAUSE_")] += 1
    return out
