"""Claims from the terminal: a list from Temporal visibility, and one claim as a person reads it in ten seconds:
its moves in time order without the workflow's internal lines, then what it waits for now. A client of
Temporal only: nothing here binds a port."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowHistory,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
)
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError, RPCStatusCode

from api import contracts as c
from homelab_autoscaler.errors import UserError
from homelab_autoscaler.settings import TemporalSettings
from homelab_autoscaler.temporal import connect

KEY_GROUP = SearchAttributeKey.for_keyword(c.SA_GROUP)
KEY_SLOT = SearchAttributeKey.for_keyword(c.SA_SLOT)
KEY_PHASE = SearchAttributeKey.for_keyword(c.SA_PHASE)
KEY_REASON = SearchAttributeKey.for_keyword(c.SA_REASON)
KEY_ATTEMPT = SearchAttributeKey.for_int(c.SA_ATTEMPT)
# The query every Temporal workflow answers with its current details (what the Web UI shows).
METADATA_QUERY = "__temporal_workflow_metadata"
QUERY_TIMEOUT = timedelta(seconds=5)


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
    parts = [f"WorkflowType = '{c.WorkflowName.CLAIM}'"]
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
# Activities that only read, polled at every timer: what they found shows as the next move, never by itself.
READS = {c.Act.OBSERVE_SLOT, c.Act.READ_JOB, c.Act.READ_JOB_EXIT}


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
    return short(timedelta(seconds=round(d.seconds + d.nanos / 1e9)))


def short(span: timedelta) -> str:
    """30s, 4m, 1m30s, 2h5m: how long, as a person says it."""
    seconds = max(0, int(span.total_seconds()))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "", f"{seconds}s" if seconds else ""]
    return "".join(parts) or "0s"


def _at(e: HistoryEvent) -> datetime:
    return e.event_time.ToDatetime().replace(tzinfo=UTC)


@dataclass(frozen=True)
class Entry:
    """One line of the timeline; entries of equal `key` in a row are told once, with how many and until when."""

    at: datetime
    text: str
    key: str = ""


LOCAL_ACTIVITY_MARKER = "core_local_activity"


def local_activity_type(e: HistoryEvent) -> str | None:
    """The call a local activity's marker records (the Kubernetes calls), or None for any other
    event."""
    if e.event_type != EventType.EVENT_TYPE_MARKER_RECORDED:
        return None
    attrs = e.marker_recorded_event_attributes
    if attrs.marker_name != LOCAL_ACTIVITY_MARKER or "data" not in attrs.details:
        return None
    try:
        return str(json.loads(attrs.details["data"].payloads[0].data).get("activity_type") or "")
    except (ValueError, IndexError, AttributeError):
        return ""


def _activity_text(kind: str, summary: str) -> str | None:
    """What a completed activity says to a person, or None when it says nothing new: reads, and projections of
    a move the phase line already tells. A projection that records an Event (`ShutdownNotObserved`) says it."""
    if kind in READS:
        return None
    if kind == "record_claim" and summary.startswith("record "):
        word = summary.split(" ")[1]
        return f"event: {word}" if word[:1].isupper() else None
    return f"done: {summary or kind}"


def entries(history: WorkflowHistory, *, first_run: bool = True) -> list[Entry]:
    """The story of one run of a claim's workflow, without its internal lines (patch markers, reads,
    projections, cancelled timers, continue-as-new)."""
    out: list[Entry] = []
    scheduled: dict[int, tuple[str, str]] = {}
    timers: dict[int, str] = {}
    phase = ""

    def add(e: HistoryEvent, text: str, key: str = "") -> None:
        out.append(Entry(_at(e), text, key or text))

    for e in history.events:
        kind = e.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            if first_run:
                add(e, f"started: {_summary(e) or 'claim workflow'}")
        elif kind == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
            new = str(_payload(fields[c.SA_PHASE])) if c.SA_PHASE in fields else phase
            reason = str(_payload(fields[c.SA_REASON])) if c.SA_REASON in fields else "-"
            if new != phase:
                phase = new
                add(e, f"phase {phase}" + ("" if reason in ("-", "") else f" ({reason})"))
        elif (local := local_activity_type(e)) is not None:
            marker = e.marker_recorded_event_attributes
            if marker.HasField("failure"):
                add(e, f"FAILED: {_summary(e) or local}: {marker.failure.message}")
            elif text := _activity_text(local, _summary(e) or local):
                add(e, text)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = e.activity_task_scheduled_event_attributes
            scheduled[e.event_id] = (attrs.activity_type.name, _summary(e) or attrs.activity_type.name)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            activity, summary = scheduled.get(e.activity_task_completed_event_attributes.scheduled_event_id, ("", "?"))
            text = _activity_text(activity, summary)
            if text:
                add(e, text)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
            failed = e.activity_task_failed_event_attributes
            _, summary = scheduled.get(failed.scheduled_event_id, ("", "?"))
            add(e, f"FAILED: {summary}: {failed.failure.message}")
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            _, summary = scheduled.get(e.activity_task_timed_out_event_attributes.scheduled_event_id, ("", "?"))
            add(e, f"TIMED OUT: {summary}")
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            _, summary = scheduled.get(e.activity_task_canceled_event_attributes.scheduled_event_id, ("", "?"))
            add(e, f"cancelled: {summary}")
        elif kind == EventType.EVENT_TYPE_TIMER_STARTED:
            started = e.timer_started_event_attributes
            timers[e.event_id] = f"{_summary(e) or 'timer'} ({_duration(started.start_to_fire_timeout)})"
        elif kind == EventType.EVENT_TYPE_TIMER_FIRED:
            add(e, f"timer fired: {timers.get(e.timer_fired_event_attributes.started_event_id, '?')}")
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            name = e.workflow_execution_signaled_event_attributes.signal_name
            if name == c.ClaimSignal.OBSERVE:
                add(e, "observation", c.ClaimSignal.OBSERVE)
            else:
                add(e, f"signal: {name}")
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            add(e, f"update: {e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name}")
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            add(e, "closed: completed")
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
            failure = e.workflow_execution_failed_event_attributes.failure
            reason = failure.application_failure_info.type if failure.HasField("application_failure_info") else ""
            said = failure.message.removeprefix(f"{reason}: ") if reason else failure.message  # the reason leads it
            add(e, f"closed: failed{f' ({reason})' if reason else ''}: {said}")
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
            add(e, f"closed: terminated by hand: {e.workflow_execution_terminated_event_attributes.reason or '-'}")
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT:
            add(e, "closed: timed out")
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED:
            add(e, "closed: cancelled")
    return out


def timeline(histories: WorkflowHistory | Sequence[WorkflowHistory]) -> list[str]:
    """What happened to a claim, in time order, one line per move, Job, timer and signal; a repetition (a poll)
    is one line saying how many and until when, and so are the watchers' observations of one phase (at the
    first). `histories` are the runs, oldest first."""
    runs = [histories] if isinstance(histories, WorkflowHistory) else list(histories)
    merged = sorted(
        (entry for i, run in enumerate(runs) for entry in entries(run, first_run=i == 0)), key=lambda x: x.at
    )
    groups: list[tuple[Entry, int, datetime]] = []
    observed: int | None = None  # the line counting this phase's observations
    for entry in merged:
        if entry.text.startswith(("phase ", "closed: ")):
            observed = None
        if entry.key == c.ClaimSignal.OBSERVE and observed is not None:
            first, count, _ = groups[observed]
            groups[observed] = (first, count + 1, entry.at)
        elif groups and groups[-1][0].key == entry.key:
            first, count, _ = groups[-1]
            groups[-1] = (first, count + 1, entry.at)
        else:
            groups.append((entry, 1, entry.at))
        if entry.key == c.ClaimSignal.OBSERVE and observed is None:
            observed = len(groups) - 1
    lines: list[str] = []
    day = ""
    for first, count, last in groups:
        if f"{first.at:%Y-%m-%d}" != day:
            day = f"{first.at:%Y-%m-%d}"
            lines.append(f"{day} (UTC)")
        if first.key == c.ClaimSignal.OBSERVE:
            text = f"{count} observation{'s' if count > 1 else ''}"
        else:
            text = first.text if count == 1 else f"{first.text} ×{count}"
        until = f" (until {last:%H:%M:%S})" if count > 1 and last != first.at else ""
        lines.append(f"  {first.at:%H:%M:%S}  {text}{until}")
    return lines


def pending_timers(history: WorkflowHistory, now: datetime) -> list[str]:
    """The timers of the run that have neither fired nor been cancelled: what the claim waits for, and until."""
    started: dict[int, tuple[str, datetime]] = {}
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            attrs = e.timer_started_event_attributes
            timeout = attrs.start_to_fire_timeout
            fires = _at(e) + timedelta(seconds=timeout.seconds + timeout.nanos / 1e9)
            started[e.event_id] = (f"{_summary(e) or 'timer'} ({_duration(timeout)})", fires)
        elif e.event_type == EventType.EVENT_TYPE_TIMER_FIRED:
            started.pop(e.timer_fired_event_attributes.started_event_id, None)
        elif e.event_type == EventType.EVENT_TYPE_TIMER_CANCELED:
            started.pop(e.timer_canceled_event_attributes.started_event_id, None)
    return [
        f"timer {what} fires at {fires:%H:%M:%S} UTC (in {short(fires - now)})"
        for what, fires in sorted(started.values(), key=lambda x: x[1])
    ]


def pending_activities(description: WorkflowExecutionDescription) -> list[str]:
    """Activities in flight (a write being retried says its attempt and last failure)."""
    lines = []
    for a in description.raw_description.pending_activities:
        line = f"running: {a.activity_type.name} (attempt {a.attempt}"
        if a.HasField("last_failure") and a.last_failure.message:
            line += f"; last failure: {a.last_failure.message}"
        lines.append(line + ")")
    return lines


# --- the commands ----------------------------------------------------------------------------------------------
async def claim_runs(client: Client, workflow_id: str, limit: int = 50) -> list[WorkflowHistory]:
    """Every run of a claim's workflow (a claim that continued as new has several), oldest first."""
    runs = [await client.get_workflow_handle(workflow_id).fetch_history()]
    while len(runs) < limit:
        previous = runs[0].events[0].workflow_execution_started_event_attributes.continued_execution_run_id
        if not previous:
            break
        runs.insert(0, await client.get_workflow_handle(workflow_id, run_id=previous).fetch_history())
    return runs


async def current_details(handle: WorkflowHandle[Any, Any]) -> str:
    """What the claim says it waits for now (its workflow's current details), or why nobody said."""
    try:
        meta = await handle.query(METADATA_QUERY, result_type=WorkflowMetadata, rpc_timeout=QUERY_TIMEOUT)
    except (RPCError, WorkflowQueryFailedError, WorkflowQueryRejectedError) as err:
        return f"(no answer from a worker: is the operator running? {err})"
    return str(meta.current_details).replace("**", "") or "(nothing said)"


async def show(client: Client, namespace: str, name: str, now: datetime | None = None) -> list[str]:
    """`claims show`: a header, the timeline, then what the claim waits for now (or how it ended)."""
    workflow_id = c.claim_workflow_id(namespace, name)
    handle = client.get_workflow_handle(workflow_id)
    try:
        description = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise UserError(
                f"no claim {name} in namespace {namespace} (no workflow {workflow_id} in Temporal namespace "
                f"{client.namespace}); `homelab-autoscaler claims list` lists the claims"
            ) from None
        raise
    runs = await claim_runs(client, workflow_id)
    sa = description.typed_search_attributes
    status = description.status.name.lower() if description.status is not None else "unknown"
    reason = sa.get(KEY_REASON) or "-"
    head = f"claim {name} ({namespace}): {sa.get(KEY_PHASE) or '?'}" + ("" if reason == "-" else f" ({reason})")
    lines = [f"{head}, attempt {sa.get(KEY_ATTEMPT) or '?'}, workflow {status}", *timeline(runs)]
    if description.status == WorkflowExecutionStatus.RUNNING:
        now = now or datetime.now(UTC)
        lines.append("now:")
        lines.append(f"  waiting: {await current_details(handle)}")
        lines += [f"  {line}" for line in pending_timers(runs[-1], now) + pending_activities(description)]
    return lines


def claim_named(name: str, namespace: str) -> tuple[str, str]:
    """(namespace, claim) from what a person gives: a claim's name, or its workflow id as the demo, the Web UI
    and `claims list` show it (`nodeclaim/<namespace>/<claim>`), whose namespace wins over --namespace."""
    if "/" not in name:
        return namespace, name
    parts = name.split("/")
    if len(parts) == 3 and all(parts) and c.claim_workflow_id(parts[1], parts[2]) == name:
        return parts[1], parts[2]
    raise UserError(
        f"{name} is no claim: give its name (worker-1-a1b2c3) or its workflow id (nodeclaim/<namespace>/<name>)"
    )


async def list_command(temporal: TemporalSettings, *, group: str | None, slot: str | None, phase: str | None) -> int:
    client = await connect(temporal)
    print(format_rows(await list_claims(client, group=group, slot=slot, phase=phase)))
    return 0


async def show_command(temporal: TemporalSettings, *, name: str, namespace: str) -> int:
    namespace, name = claim_named(name, namespace)
    client = await connect(temporal)
    print("\n".join(await show(client, namespace, name)))
    return 0


async def reset_command(temporal: TemporalSettings, *, name: str, namespace: str) -> int:
    namespace, name = claim_named(name, namespace)
    client = await connect(temporal)
    handle = client.get_workflow_handle(c.claim_workflow_id(namespace, name))
    try:
        before = await handle.execute_update(c.ClaimUpdate.RESET_SHUTDOWN_STREAK, result_type=int)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise UserError(f"no open claim {name} in namespace {namespace}: `claims list` lists the claims") from None
        raise
    print(f"claim {name}: shutdown streak reset (it had {before} attempts); the scale-down fires again now")
    return 0
