"""Where P1's time goes, read from the claims' own histories: how late the watchers told each claim what the
cluster did, and how long its workflow tasks waited for the worker. Those two found the P1 regressions (an
initial sync that held every watch event back; five task polls for 200 claims); the bench prints them beside P1.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from api import contracts as c
from bench.report import ms, percentile


def _seconds(event: HistoryEvent) -> float:
    return float(event.event_time.seconds) + event.event_time.nanos / 1e9


@dataclass
class Stages:
    """Seconds per claim: Ready stored → the claim told its gate is open; Job complete stored → the claim told
    its Job finished; and every workflow task's wait from scheduled to started (after the Job completed)."""

    ready_told: list[float] = field(default_factory=list)
    job_told: list[float] = field(default_factory=list)
    task_waits: list[float] = field(default_factory=list)

    def take(self, events: list[HistoryEvent], node_ready: float, job_complete: float | None) -> None:
        scheduled: dict[int, float] = {}
        told = job = None
        for e in events:
            at = _seconds(e)
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
                scheduled[e.event_id] = at
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
                since = scheduled.get(e.workflow_task_started_event_attributes.scheduled_event_id)
                if since is not None and job_complete is not None and since >= job_complete:
                    self.task_waits.append(at - since)
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
                attrs = e.workflow_execution_signaled_event_attributes
                if attrs.signal_name == c.ClaimSignal.OBSERVE and told is None and _gate_open(attrs.input.payloads):
                    told = at - node_ready
                elif attrs.signal_name == c.ClaimSignal.JOB_FINISHED and job is None and job_complete is not None:
                    job = at - job_complete
        if told is not None:
            self.ready_told.append(told)
        if job is not None:
            self.job_told.append(job)

    def note(self) -> str:
        def spread(values: list[float]) -> str:
            if not values:
                return "none on record"
            return f"p50 {ms(percentile(values, 50))}, p99 {ms(percentile(values, 99))} (n={len(values)})"

        return (
            f"p1 stages: Ready → claim told {spread(self.ready_told)}; Job complete → claim told "
            f"{spread(self.job_told)}; workflow task scheduled → started {spread(self.task_waits)}"
        )


def _gate_open(payloads: Sequence[Payload]) -> bool:
    """Whether an observation signal's argument says the readiness gate is open (the converter writes JSON)."""
    if not payloads:
        return False
    try:
        return bool(json.loads(payloads[0].data).get("gate_open"))
    except (ValueError, AttributeError):
        return False


async def p1_stages(client: Client, namespace: str, ready: dict[str, float], jobs: dict[str, float | None]) -> Stages:
    """`ready` and `jobs`: per claim, when its Node turned Ready and when its startup Job completed (stored)."""
    stages = Stages()
    for claim, node_ready in ready.items():
        history = await client.get_workflow_handle(c.claim_workflow_id(namespace, claim)).fetch_history()
        stages.take(list(history.events), node_ready, jobs.get(claim))
    return stages
