"""The operator's own metrics, recorded through Temporal's workflow meter: replay never counts twice, and they
are exported on the same Prometheus endpoint as the SDK's metrics.

The SDK labels every workflow metric with `namespace`: that is the *Temporal* namespace. The Kubernetes namespace
of the claim, slot or group is `kubernetes_namespace`.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

TIME_TO_READY = "homelab_claim_time_to_ready"
# Boots take seconds to many minutes: the buckets (seconds) span a warm wake-on-LAN to a slow BMC and firmware.
TIME_TO_READY_BUCKETS = [5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0, 900.0, 1800.0]


def claim_moved(namespace: str, group: str, phase: str, reason: str) -> None:
    workflow.metric_meter().create_counter("homelab_claim_moves", "claim moves by group, phase and reason").add(
        1, {"kubernetes_namespace": namespace, "group": group, "phase": phase, "reason": reason or "-"}
    )


def claim_ready_after(namespace: str, group: str, elapsed: timedelta) -> None:
    workflow.metric_meter().create_histogram_timedelta(
        TIME_TO_READY, "time from a claim's request to its ready move", "duration"
    ).record(elapsed, {"kubernetes_namespace": namespace, "group": group})


def job_finished(namespace: str, job_type: str, outcome: str) -> None:
    workflow.metric_meter().create_counter("homelab_jobs", "lifecycle Jobs by type and outcome").add(
        1, {"kubernetes_namespace": namespace, "type": job_type, "outcome": outcome}
    )


def group_claims(namespace: str, group: str, counts: dict[str, int]) -> None:
    gauge = workflow.metric_meter().create_gauge("homelab_claims", "claims the group tracks, by phase")
    for phase, count in counts.items():
        gauge.set(count, {"kubernetes_namespace": namespace, "group": group, "phase": phase})
