"""The claims commands' pure parts: the visibility filter and the timeline read from recorded histories."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory

from homelab_autoscaler.claims import ClaimRow, age, format_rows, timeline, visibility_query

HISTORIES = Path(__file__).parent / "histories"


def claim_history(prefix: str) -> WorkflowHistory:
    for f in sorted(HISTORIES.glob(f"{prefix}-*.json")):
        h = WorkflowHistory.from_json(f.stem, f.read_text())
        if h.events[0].workflow_execution_started_event_attributes.workflow_type.name == "NodeClaimWorkflow":
            return h
    raise AssertionError(f"no claim history recorded for {prefix}")


def test_timeline_of_a_scale_down_reads_as_the_claims_story() -> None:
    lines = timeline(claim_history("scale_down_ready"))
    text = "\n".join(lines)
    order = ["started: claim", "phase pending", "phase booting", "phase ready", "signal: mark_for_deletion",
             "cordon the node", "shutdown Job", "phase completed (NodeDeleted)"]  # fmt: skip
    positions = [next(i for i, line in enumerate(lines) if step in line) for step in order]
    assert positions == sorted(positions), text
    assert "timer fired: startup Job" in text


def test_timeline_names_the_timers_of_a_readiness_gate_timeout() -> None:
    text = "\n".join(timeline(claim_history("readiness_gate_times_out")))
    assert "timer fired: readiness gate" in text
    assert "phase failed (ReadinessGateTimeout)" in text


def test_visibility_query_filters_and_refuses_quotes() -> None:
    assert visibility_query() == "WorkflowType = 'NodeClaimWorkflow'"
    q = visibility_query(group="g", slot="s1", phase="ready")
    assert q == (
        "WorkflowType = 'NodeClaimWorkflow' AND HomelabGroup = 'g' AND HomelabSlot = 's1' AND ClaimPhase = 'ready'"
    )
    with pytest.raises(ValueError, match="HomelabGroup"):
        visibility_query(group="g' OR 1=1")


def test_rows_and_ages() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert [age(now - timedelta(seconds=s), now) for s in (5, 120, 7200, 200000)] == ["5s", "2m", "2h", "2d"]
    rows = [ClaimRow("s1-abc", "g", "s1", "ready", "", 1, now - timedelta(minutes=3), "running")]
    out = format_rows(rows, now).splitlines()
    assert out[0].split() == ["NAME", "GROUP", "SLOT", "PHASE", "REASON", "ATTEMPT", "AGE", "WORKFLOW"]
    assert out[1].split() == ["s1-abc", "g", "s1", "ready", "-", "1", "3m", "running"]
