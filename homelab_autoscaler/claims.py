"""Claims from the terminal: a list from Temporal visibility, a timeline from one claim's workflow history."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory
from temporalio.common import SearchAttributeKey

from api import contracts as c

KEY_GROUP = SearchAttributeKey.for_keyword(c.SA_GROUP)
KEY_SLOT = SearchAttributeKey.for_keyword(c.SA_SLOT)
KEY_PHASE = SearchAttributeKey.for_keyword(c.SA_PHASE)
KEY_REASON = SearchAttributeKey.for_keyword(c.SA_REASON)
KEY_ATTEMPT = SearchAttributeKey.for_int(c.SA_ATTEMPT)


@dataclass(frozen=True)
class ClaimRow:
    name: str
    group: str
    slot: str
    phase: str
    reason: str
    attempt: int
    started: datetime | None
    status: str


def visibility_query(*, group: str | None = None, slot: str | None = None, phase: str | None = None) -> str:
    """The List Filter that selects claims; values are quoted so a name cannot change the query."""
    parts = ["WorkflowType = 'NodeClaimWorkflow'"]
    for key, value in ((c.SA_GROUP, group), (c.SA_SLOT, slot), (c.SA_PHASE, phase)):
        if value:
            if "'" in value or "\\" in value:
                raise ValueError(f"{key} filter {value!r}: quotes and backslashes are not allowed")
            parts.append(f"{key} = '{value}'")
    return " AND ".join(parts)


async def list_claims(
    client: Client, *, group: str | None = None, slot: str | None = None, phase: str | None = None, limit: int = 200
) -> list[ClaimRow]:
    rows: list[ClaimRow] = []
    async for wf in client.list_workflows(visibility_query(group=group, slot=slot, phase=phase), limit=limit):
        sa = wf.typed_search_attributes
        rows.append(
            ClaimRow(
                name=wf.id.rsplit("/", 1)[-1],
                group=sa.get(KEY_GROUP) or "",
                slot=sa.get(KEY_SLOT) or "",
                phase=sa.get(KEY_PHASE) or "",
                reason="" if (sa.get(KEY_REASON) or "-") == "-" else str(sa.get(KEY_REASON)),
                attempt=sa.get(KEY_ATTEMPT) or 0,
                started=wf.start_time,
                status=wf.status.name.lower() if wf.status is not None else "",
            )
        )
    return rows


def age(since: datetime | None, now: datetime) -> str:
    """kubectl-style ages: 45s, 12m, 3h, 2d."""
    if since is None:
        return "-"
    seconds = max(0, int((now - since).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def format_rows(rows: list[ClaimRow], now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    header = ("NAME", "GROUP", "SLOT", "PHASE", "REASON", "ATTEMPT", "AGE", "WORKFLOW")
    table = [header] + [
        (r.name, r.group, r.slot, r.phase, r.reason or "-", str(r.attempt), age(r.started, now), r.status) for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table)


# --- the timeline of one claim ------------------------------------------------------------------------------
def _payload(p: Payload) -> Any:
    try:
        return json.loads(p.data)
    except ValueError:
        return p.data.decode(errors="replace")


def _summary(e: HistoryEvent) -> str:
    if e.HasField("user_metadata") and e.user_metadata.HasField("summary"):
        return str(_payload(e.user_metadata.summary))
    return ""


def _duration(d: Any) -> str:
    seconds = d.seconds + d.nanos / 1e9
    return str(timedelta(seconds=round(seconds)))


def timeline(history: WorkflowHistory) -> list[str]:
    """What happened to a claim, one line per move, Job, timer and signal, from its workflow history."""
    lines: list[str] = []
    scheduled: dict[int, str] = {}
    timers: dict[int, str] = {}
    phase = ""

    def add(e: HistoryEvent, text: str) -> None:
        lines.append(f"{e.event_time.ToDatetime():%Y-%m-%d %H:%M:%S}  {text}")

    for e in history.events:
        kind = e.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            add(e, f"started: {_summary(e) or 'claim workflow'}")
        elif kind == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
            new = str(_payload(fields[c.SA_PHASE])) if c.SA_PHASE in fields else phase
            reason = str(_payload(fields[c.SA_REASON])) if c.SA_REASON in fields else "-"
            if new != phase:
                phase = new
                add(e, f"phase {phase}" + ("" if reason in ("-", "") else f" ({reason})"))
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[e.event_id] = _summary(e) or e.activity_task_scheduled_event_attributes.activity_type.name
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            add(e, f"done: {scheduled.get(e.activity_task_completed_event_attributes.scheduled_event_id, '?')}")
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            failed = e.activity_task_failed_event_attributes
            add(e, f"FAILED: {scheduled.get(failed.scheduled_event_id, '?')}: {failed.failure.message}")
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            add(e, f"TIMED OUT: {scheduled.get(e.activity_task_timed_out_event_attributes.scheduled_event_id, '?')}")
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            add(e, f"cancelled: {scheduled.get(e.activity_task_canceled_event_attributes.scheduled_event_id, '?')}")
        elif kind == EventType.EVENT_TYPE_TIMER_STARTED:
            started = e.timer_started_event_attributes
            timers[e.event_id] = f"{_summary(e) or 'timer'} ({_duration(started.start_to_fire_timeout)})"
        elif kind == EventType.EVENT_TYPE_TIMER_FIRED:
            add(e, f"timer fired: {timers.get(e.timer_fired_event_attributes.started_event_id, '?')}")
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            add(e, f"signal: {e.workflow_execution_signaled_event_attributes.signal_name}")
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            add(e, f"update: {e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name}")
        elif kind == EventType.EVENT_TYPE_MARKER_RECORDED:
            add(e, f"marker: {e.marker_recorded_event_attributes.marker_name}")
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            add(e, "continued as new (history kept short; the claim goes on in the next run)")
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            add(e, "workflow completed: claim collected")
        elif kind in (
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
        ):
            add(e, f"workflow ended: {EventType.Name(kind).removeprefix('EVENT_TYPE_WORKFLOW_EXECUTION_').lower()}")
    return lines
