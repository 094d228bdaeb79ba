"""Settings of the `watch` role: what to watch, where to answer health probes, and how to elect a leader."""

from __future__ import annotations

import os
import socket
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import NoDecode

from homelab_autoscaler.settings import Settings


def _default_identity() -> str:
    """Host and process: unique per replica, and readable in `kubectl get lease -o yaml`."""
    return f"{socket.gethostname()}-{os.getpid()}"


class WatchSettings(Settings):
    """The watchers and the report writer. Two replicas may run; the Lease lets one of them act at a time."""

    namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="namespaces whose Groups, slots, claims and Jobs are watched; empty means every namespace",
    )
    lease_namespace: str = Field("homelab-autoscaler-system", min_length=1)
    lease_name: str = Field("homelab-autoscaler-watch", min_length=1)
    lease_duration_seconds: float = Field(15.0, gt=0, le=600, description="a silent leader is replaced after this")
    lease_renew_seconds: float = Field(5.0, gt=0, le=300, description="how often the leader renews (and others try)")
    identity: str = Field(default_factory=_default_identity, min_length=1, description="this replica's Lease holder")
    watch_window_seconds: int = Field(30, ge=1, le=600, description="the server-side timeout of one watch request")
    resync_seconds: float = Field(300.0, gt=0, description="upper bound between two passes over every report")

    @field_validator("namespaces", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        """`a,b` from a flag or HOMELAB_AUTOSCALER_NAMESPACES, like the provider reads it."""
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value
