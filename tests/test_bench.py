"""`make bench` at its smallest sizes: every figure runs end to end and has a numeric ratio. A benchmark, not a
timed test: no absolute time is asserted."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload, Payloads, SearchAttributes
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import (
    HistoryEvent,
    UpsertWorkflowSearchAttributesEventAttributes,
    WorkflowExecutionSignaledEventAttributes,
    WorkflowTaskStartedEventAttributes,
)

from bench.moves import moves
from bench.procs import ROOT
from bench.stages import Stages

ROWS = (
    "P1 reaction",  # twice: vs signal → handled, vs two trivial activities
    "P2 burst, IncreaseSize → all 2 ready (instant machines), one worker",
    "P2 burst, IncreaseSize → all 2 ready (instant machines), two worker",
    "P2 burst of 2 with two worker processes vs one",
    "P2 operator memory",
    "P3 NodeGroups after Refresh",
    "P3 NodeGroupTargetSize",
    "P3 NodeGroupNodes",
    "P3 Refresh",
    "P4 workflow tasks per boot",
    "P4 workflow tasks per lifecycle",
    "P4 history events",
    "P4 replay of a lifecycle",
    "P4 replay of the same history without the sandbox",
    "P4 API writes per claim phase move",
    "P4 API writes in an idle minute",
    "P1 staggered",
    "P2 Temporal server CPU per claim",
    "P5 idle footprint",
    "P5 operator RSS at rest",
    "P5 operator CPU at rest",
    "P5 where the operator's CPU goes",
    "P5 where the operator's memory goes",
    "Workflow tasks timed out",
)


@pytest.mark.timeout(240)  # ~1 min on an idle 2-core box; other sessions' load can double it
@pytest.mark.long
@pytest.mark.system
def test_bench_prints_every_figure_with_a_numeric_ratio(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = [sys.executable, "-m", "bench", "--p1-claims", "2", "--p2-slots", "2", "--p3-groups", "2",
            "--p3-slots", "2", "--p3-calls", "5", "--idle-seconds", "6", "--p1-boot-spread", "1,3",
            "--p5-slots", "2", "--p5-goal-seconds", "6", "--json", str(out)]  # fmt: skip
    with subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        try:
            stdout, _ = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            proc.terminate()  # the bench stops every process it started on SIGTERM
            stdout, _ = proc.communicate(timeout=60)
            raise AssertionError(f"the bench did not finish within 150 s:\n{stdout[-3000:]}") from None
    assert proc.returncode == 0, stdout[-5000:]
    table = [line for line in stdout.splitlines() if line.startswith(("| P", "| Workflow"))]
    for name in ROWS:
        rows = [line for line in table if line.startswith(f"| {name}")]
        assert len(rows) == (2 if name in ("P1 reaction", "P1 staggered") else 1), (name, stdout)
        for row in rows:
            ratio = row.split(" | ")[3]
            assert math.isfinite(float(ratio)) and float(ratio) >= 0, row
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == len(ROWS) + 2
    assert all(math.isfinite(r["ratio"]) for r in doc["rows"])
    assert {
        "temporal dev server",
        "operator (p1)",
        "operator (p2)",
        "worker 2 (p2w2)",
        "operator (p3)",
        "operator (p4)",
    } <= set(doc["peak_rss_mb"])
    assert all(mb > 0 for mb in doc["peak_rss_mb"].values()), doc["peak_rss_mb"]
    (stages,) = [n for n in doc["notes"] if n.startswith("p1 stages:")]
    assert "workflow task scheduled → started p50" in stages, stages
    (spread,) = [n for n in doc["notes"] if n.startswith("p2w2: workflow tasks by worker process:")]
    assert spread.count("%") >= 1, spread  # the tasks by worker identity (at 2 slots one may take them all)


def _event(event_id: int, kind: EventType.ValueType, at: float, **attrs: Any) -> HistoryEvent:
    event = HistoryEvent(event_id=event_id, event_type=kind, **attrs)
    event.event_time.FromNanoseconds(int(at * 1e9))
    return event


def _scheduled(event_id: int, at: float) -> HistoryEvent:
    return _event(event_id, EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, at)


def _started(event_id: int, at: float, scheduled: int) -> HistoryEvent:
    attrs = WorkflowTaskStartedEventAttributes(scheduled_event_id=scheduled)
    return _event(
        event_id, EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED, at, workflow_task_started_event_attributes=attrs
    )


def _signalled(event_id: int, at: float, name: str, data: dict[str, Any]) -> HistoryEvent:
    payload = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(data).encode())
    attrs = WorkflowExecutionSignaledEventAttributes(signal_name=name, input=Payloads(payloads=[payload]))
    kind = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    return _event(event_id, kind, at, workflow_execution_signaled_event_attributes=attrs)


def test_p1_stages_read_the_watchers_lag_and_the_workers_queue_from_a_history() -> None:
    """The breakdown that found P1's two regressions (watch events held back 30 s; tasks queued on five polls)."""
    events = [
        _scheduled(1, 99.0),  # before the Job completed: not counted
        _started(2, 99.5, scheduled=1),
        _signalled(3, 100.5, "observe", {"gate_open": False}),
        _signalled(4, 101.0, "job_finished", {"job": "j"}),
        _scheduled(5, 101.0),
        _started(6, 103.0, scheduled=5),
        _signalled(7, 104.0, "observe", {"gate_open": True}),
        _signalled(8, 105.0, "observe", {"gate_open": True}),
    ]
    stages = Stages()
    stages.take(events, node_ready=102.0, job_complete=100.0)
    assert stages.ready_told == [2.0] and stages.job_told == [1.0] and stages.task_waits == [2.0]
    assert "Ready → claim told p50 2.00 s" in stages.note(), stages.note()
    stages.take(events[:2], node_ready=102.0, job_complete=None)  # never told, no Job on record: nothing added
    assert (len(stages.ready_told), len(stages.job_told)) == (1, 1)


def _completed(event_id: int) -> HistoryEvent:
    return _event(event_id, EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED, float(event_id))


def _upsert(event_id: int, phase: str | None) -> HistoryEvent:
    """A search attribute upsert: a claim's move (`phase`), or a patch's TemporalChangeVersion (None)."""
    fields = {} if phase is None else {"ClaimPhase": Payload(data=json.dumps(phase).encode())}
    attrs = UpsertWorkflowSearchAttributesEventAttributes(search_attributes=SearchAttributes(indexed_fields=fields))
    kind = EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    return _event(event_id, kind, float(event_id), upsert_workflow_search_attributes_event_attributes=attrs)


def test_tasks_per_move_are_counted_up_to_the_task_that_made_each_move() -> None:
    """P4's task count: the first task makes pending and booting, the ready move takes two more, the close one."""
    events = [
        _completed(1), _upsert(2, None), _upsert(3, "pending"), _upsert(4, "booting"), _upsert(5, "booting"),
        _completed(6), _completed(7), _upsert(8, "ready"),
        _completed(9), _upsert(10, "completed"),
        _completed(11),
    ]  # fmt: skip
    counted = moves(events)
    assert counted.tasks == [("pending", 1), ("booting", 0), ("ready", 2), ("completed", 1)]
    assert (counted.upto("ready"), counted.upto("failed"), counted.total, counted.after) == (3, 5, 5, 1)
    assert counted.events == len(events) and "→ready 2" in counted.text()
