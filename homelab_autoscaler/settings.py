"""Settings from flags, HOMELAB_AUTOSCALER_* environment variables and an optional file, validated once."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from api.contracts import TASK_QUEUE


class Settings(BaseSettings):
    """What every role needs to reach Temporal and Kubernetes."""

    model_config = SettingsConfigDict(env_prefix="HOMELAB_AUTOSCALER_", extra="forbid")

    temporal_address: str = Field("127.0.0.1:7233", description="host:port of the Temporal frontend")
    temporal_namespace: str = Field("default", min_length=1)
    temporal_tls_ca: Path | None = Field(None, description="CA bundle that signs the Temporal frontend's certificate")
    temporal_tls_cert: Path | None = Field(None, description="client certificate for mTLS to Temporal")
    temporal_tls_key: Path | None = Field(None, description="client key for mTLS to Temporal")
    temporal_tls_server_name: str | None = None
    temporal_api_key: str | None = Field(None, description="API key for Temporal Cloud or a gateway (implies TLS)")
    metrics_address: str | None = Field(
        "127.0.0.1:9464", description="host:port of the Prometheus /metrics endpoint (empty to disable)"
    )
    task_queue: str = Field(TASK_QUEUE, min_length=1)
    kube_server: str | None = Field(None, description="API server URL (the emulator); else in-cluster or kubeconfig")
    kubeconfig: Path | None = None
    kube_context: str | None = None
    kube_timeout_seconds: float = Field(10.0, gt=0, le=120)
    activity_threads: int = Field(16, ge=1, le=256)
    health_host: str = Field("127.0.0.1", description="address of the /healthz and /readyz endpoints")
    health_port: int = Field(8081, ge=0, le=65535, description="port of the health endpoints (0 picks a free one)")
    log_level: str = Field("INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$")
    log_format: str = Field("text", pattern="^(text|json)$", description="plain text or one JSON object per line")

    @model_validator(mode="after")
    def _tls_pairs(self) -> Settings:
        if (self.temporal_tls_cert is None) != (self.temporal_tls_key is None):
            raise ValueError("temporal_tls_cert and temporal_tls_key go together (mTLS needs both)")
        for name in ("temporal_tls_ca", "temporal_tls_cert", "temporal_tls_key"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: {path} is not a readable file")
        return self


S = TypeVar("S", bound=Settings)


def load_settings(cls: type[S], flags: dict[str, Any], config_file: Path | None = None) -> S:
    """Flags over HOMELAB_AUTOSCALER_* over the optional YAML file over the defaults, validated once."""
    if config_file is not None and not config_file.is_file():
        raise ValueError(f"config file {config_file} does not exist")

    class FromFile(cls):  # type: ignore[valid-type,misc]
        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
            if config_file is not None:
                sources += (YamlConfigSettingsSource(settings_cls, yaml_file=config_file),)
            return sources

    FromFile.__name__ = cls.__name__
    return FromFile(**flags)
