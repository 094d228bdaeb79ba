"""The `watch` settings section: how the watchers elect a leader and how often they look again.

Which namespaces they watch is not here: that is the shared `namespaces` section, which the provider reads
with the same meaning (homelab_autoscaler/settings.py).
"""

from __future__ import annotations

import os
import socket

from pydantic import BaseModel, ConfigDict, Field

from api.addresses import check_dns_label, check_dns_subdomain, field_checks


def _default_identity() -> str:
    """Host and process: unique per replica, and readable in `kubectl get lease -o yaml`."""
    return f"{socket.gethostname()}-{os.getpid()}"


class WatchSettings(BaseModel):
    """The watchers and the report writer. Two replicas may run; the Lease lets one of them act at a time."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True)

    lease_namespace: str = Field("homelab-autoscaler-system", min_length=1, description="namespace of the Lease")
    lease_name: str = Field("homelab-autoscaler-watch", min_length=1, description="name of the Lease")
    lease_duration_seconds: float = Field(15.0, gt=0, le=600, description="a silent leader is replaced after this")
    lease_renew_seconds: float = Field(5.0, gt=0, le=300, description="how often the leader renews (and others try)")
    identity: str = Field(
        default_factory=_default_identity,
        min_length=1,
        description="this replica's name as Lease holder",
        json_schema_extra={"shown_default": "<host name>-<pid>"},
    )
    # kube.watch.WATCH_WINDOW, which says why (tests/test_leader.py holds them equal).
    watch_window_seconds: int = Field(300, ge=1, le=600, description="the server-side timeout of one watch request")
    resync_seconds: float = Field(300.0, gt=0, description="upper bound between two passes over every report")
    stuck_check_seconds: float = Field(
        60.0, ge=0, description="how often the leader looks for workflows whose task fails for good (0: never)"
    )
    stuck_after_seconds: float = Field(
        600.0, gt=0, description="a workflow whose task has failed this long is ended and taken over"
    )
    stuck_failures: int = Field(5, ge=1, description="... and at least this many times")
    # Issue 44: energy moved to joule counters; the period's Wh gauges are off by default (promtool flags the hour as
    # a unit) and can be turned on for this release only, while dashboards and alerts move.
    watt_hour_gauges: bool = Field(
        False,
        description="also serve the deprecated homelab_slot_energy_*_watt_hours gauges (this release only)",
    )

    _checked = field_checks({"lease_namespace": check_dns_label, "lease_name": check_dns_subdomain})
