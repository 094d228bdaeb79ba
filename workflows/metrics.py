"""The operator's own metrics, recorded through Temporal's workflow meter: replay never counts twice, and they
are exported on the same Prometheus endpoint as the SDK's metrics."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow


def claim_moved(group: str, phase: str, reason: str) -> None:
    workflow.metric_meter().create_counter("homelab_claim_moves", "claim moves by group, phase and reason").add(
        1, {"group": group, "phase": phase, "reason": reason or "-"}
    )


def claim_ready_after(group: str, elapsed: timedelta) -> None:
    workflow.metric_meter().create_histogram_timedelta(
        "homelab_claim_time_to_ready", "time from a claim's request to its ready move", "duration"
    ).record(elapsed, {"group": group})


def job_finished(job_type: str, outcome: str) -> None:
    workflow.metric_meter().create_counter("homelab_jobs", "lifecycle Jobs by type and outcome").add(
        1, {"type": job_type, "outcome": outcome}
    )


def group_claims(group: str, counts: dict[str, int]) -> None:
    gauge = workflow.metric_meter().create_gauge("homelab_claims", "claims by group and phase")
    for phase, count in counts.items():
        gauge.set(count, {"group": group, "phase": phase})
