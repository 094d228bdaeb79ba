"""Settings from flags, HOMELAB_AUTOSCALER_* environment variables and an optional file, validated once."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from api.contracts import TASK_QUEUE


class Settings(BaseSettings):
    """What every role needs to reach Temporal and Kubernetes."""

    model_config = SettingsConfigDict(env_prefix="HOMELAB_AUTOSCALER_", extra="forbid")

    temporal_address: str = Field("127.0.0.1:7233", description="host:port of the Temporal frontend")
    temporal_namespace: str = Field("default", min_length=1)
    task_queue: str = Field(TASK_QUEUE, min_length=1)
    kube_server: str | None = Field(None, description="API server URL (the emulator); else in-cluster or kubeconfig")
    kubeconfig: Path | None = None
    kube_context: str | None = None
    kube_timeout_seconds: float = Field(10.0, gt=0, le=120)
    activity_threads: int = Field(16, ge=1, le=256)
    log_level: str = Field("INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$")
