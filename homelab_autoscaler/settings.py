"""The operator's settings, grouped by concern into sections, and a command's settings: the sections it takes.

A section is a pydantic model of one concern (reaching Temporal, the provider's server, the watchers' Lease...);
each field's alias (else its name) is the setting's name: the flag `--<name>`, the environment variable
`HOMELAB_AUTOSCALER_<NAME>` and the config file's key `<name>`, one meaning each across every command. A
command fills only the sections its roles read (`homelab_autoscaler.commands.COMMANDS`), so `claims list` offers no
worker setting and a role cannot read a setting its command never took. Owners keep their own section
(`kube/settings.py`, `provider/settings.py`, `watchers/settings.py`, `admission/settings.py`); the rest are here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from admission.settings import WebhookSettings
from api.addresses import (
    check_connect_address,
    check_dns_label,
    check_host,
    check_host_port,
    check_ip,
    check_new_file,
    check_token,
    each,
    field_checks,
)
from api.contracts import TASK_QUEUE
from kube.settings import KubeSettings
from provider.settings import DEFAULT_NAMESPACE, Names, ProviderSettings
from watchers.settings import WatchSettings

ROOT = Path(__file__).resolve().parent.parent

SECTION_CONFIG = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True)


class TemporalSettings(BaseModel):
    """How a process reaches Temporal: the frontend, the namespace, and TLS/mTLS or an API key."""

    model_config = SECTION_CONFIG

    address: str = Field(
        "127.0.0.1:7233", min_length=1, alias="temporal_address", description="host:port of the Temporal frontend"
    )
    namespace: str = Field("default", min_length=1, alias="temporal_namespace", description="the Temporal namespace")
    tls_ca: Path | None = Field(
        None, alias="temporal_tls_ca", description="CA bundle that signs the Temporal frontend's certificate"
    )
    tls_cert: Path | None = Field(None, alias="temporal_tls_cert", description="client certificate for mTLS")
    tls_key: Path | None = Field(None, alias="temporal_tls_key", description="client key for mTLS")
    tls_server_name: str | None = Field(
        None, alias="temporal_tls_server_name", description="name to verify in the frontend's certificate"
    )
    api_key: str | None = Field(
        None, alias="temporal_api_key", description="API key for Temporal Cloud or a gateway (implies TLS)"
    )

    _checked = field_checks({"address": check_connect_address, "tls_server_name": check_host, "api_key": check_token})

    @model_validator(mode="after")
    def _tls_files(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("temporal_tls_cert and temporal_tls_key go together (mTLS needs both)")
        for name, path in (
            ("temporal_tls_ca", self.tls_ca),
            ("temporal_tls_cert", self.tls_cert),
            ("temporal_tls_key", self.tls_key),
        ):
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: {path} is not a readable file")
        return self


class QueueSettings(BaseModel):
    """The task queue of the operator's workflows: the worker polls it, the provider and watchers start on it."""

    model_config = SECTION_CONFIG

    task_queue: str = Field(TASK_QUEUE, min_length=1, description="Temporal task queue of every workflow and activity")


class MetricsSettings(BaseModel):
    """The Prometheus endpoint of the process (the Temporal SDK's and the operator's metrics)."""

    model_config = SECTION_CONFIG

    address: str | None = Field(
        "127.0.0.1:9464",
        alias="metrics_address",
        description="IP:port of the Prometheus /metrics endpoint (empty to disable)",
    )

    # the SDK's exporter binds a socket address: an IP, not a host name ("" turns metrics off)
    _checked = field_checks({"address": lambda value: value and check_host_port(value, ip_only=True)})


class HealthSettings(BaseModel):
    """The /healthz and /readyz endpoints a kubelet probes."""

    model_config = SECTION_CONFIG

    host: str = Field("127.0.0.1", alias="health_host", description="address of the /healthz and /readyz endpoints")
    port: int = Field(
        8081, ge=0, le=65535, alias="health_port", description="port of the health endpoints (0 picks a free one)"
    )

    _checked = field_checks({"host": lambda value: value and check_host(value)})  # "": every interface


class LoggingSettings(BaseModel):
    """What the process logs, and in which form."""

    model_config = SECTION_CONFIG

    level: str = Field(
        "INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$", alias="log_level", description="DEBUG, INFO, WARNING or ERROR"
    )
    format: str = Field(
        "text", pattern="^(text|json)$", alias="log_format", description="plain text or one JSON object per line"
    )


class WorkerSettings(BaseModel):
    """The Temporal worker: every workflow and activity of the operator."""

    model_config = SECTION_CONFIG

    activity_threads: int = Field(16, ge=1, le=256, description="activities run at once (the Kubernetes client blocks)")
    task_pollers: int = Field(
        10,
        ge=1,
        le=500,
        description="polls held at once for workflow tasks, and as many for activity tasks (the most, when Temporal "
        "scales them)",
    )
    poller_autoscaling: bool = Field(
        False,
        description="let Temporal scale the polls between 1 and --task-pollers (its scaler costs ~9 CPU s/h at rest)",
    )
    workflow_task_slots: int = Field(
        8,
        ge=1,
        le=500,
        description="workflow tasks run at once (more than the interpreter keeps up with time out in Temporal)",
    )
    cached_workflows: int = Field(
        300,
        ge=1,
        le=100_000,
        description="workflows kept in memory between their tasks (one evicted replays its history at its next task; "
        "at least 1: the Kubernetes calls are local activities, which need it)",
    )


class NamespaceSettings(BaseModel):
    """Which Kubernetes namespaces the operator manages: the provider serves their Groups to cluster-autoscaler,
    the watchers watch their Groups, slots, claims and Jobs. One meaning for both, so a Group is either managed
    whole or not at all."""

    model_config = SECTION_CONFIG

    namespaces: Names = Field(
        default_factory=lambda: [DEFAULT_NAMESPACE],
        min_length=1,
        description="namespaces whose Groups, slots and claims the operator manages (comma-separated)",
        json_schema_extra={"shown_default": DEFAULT_NAMESPACE},
    )

    _checked = field_checks({"namespaces": each(check_dns_label)})


class DevSettings(BaseModel):
    """`dev`: the embedded Temporal dev server with its Web UI and, with --simulate, the simulated homelab."""

    model_config = SECTION_CONFIG

    temporal_ip: str = Field("127.0.0.1", description="address the embedded Temporal server binds")
    temporal_port: int = Field(7233, ge=1, le=65535, description="frontend port of the embedded Temporal server")
    ui_port: int = Field(8233, ge=1, le=65535, description="port of the Temporal Web UI")
    temporal_db: Path | None = Field(
        None,
        description="SQLite file of the embedded server (default: temporal.db, or temporal-simulated.db, deleted "
        "at start, with --simulate, in ~/.local/state/homelab-autoscaler)",
    )
    simulate: bool = Field(False, description="serve an emulated API server with the simulated homelab")
    homelab: Path | None = Field(
        None,
        description="the simulated homelab's YAML file (default: the one homelab_sim ships, "
        "deploy/examples/homelab.yaml)",
    )
    kube_port: int = Field(8001, ge=0, le=65535, description="port of the emulated API server (with --simulate)")
    time_scale: float = Field(1.0, ge=0, description="multiply the simulated machines' delays (0: instant)")
    demo: bool = Field(False, description="run the scripted demo once everything is up")

    # `temporal server start-dev --ip` binds an address, not a name
    _checked = field_checks({"temporal_ip": check_ip, "temporal_db": check_new_file})


S = TypeVar("S", bound=BaseModel)


class Settings(BaseModel):
    """A command's settings: the sections it takes, each validated once; the sections it does not take are None.

    The field order is the order of the sections in `--help` and in docs/configuration.md.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    temporal: TemporalSettings | None = Field(None, title="Temporal")
    queue: QueueSettings | None = Field(None, title="Task queue")
    kube: KubeSettings | None = Field(None, title="Kubernetes")
    namespaces: NamespaceSettings | None = Field(None, title="Namespaces")
    worker: WorkerSettings | None = Field(None, title="Worker")
    provider: ProviderSettings | None = Field(None, title="Provider (cluster-autoscaler's externalgrpc server)")
    webhook: WebhookSettings | None = Field(None, title="Admission webhook (the API server's check of NodeClaims)")
    watch: WatchSettings | None = Field(None, title="Watchers")
    dev: DevSettings | None = Field(None, title="Development server")
    health: HealthSettings | None = Field(None, title="Health endpoints")
    metrics: MetricsSettings | None = Field(None, title="Metrics")
    logging: LoggingSettings | None = Field(None, title="Logging")

    def section(self, kind: type[S]) -> S:
        """The section of type `kind`; a command whose roles read it has always taken it (a bug otherwise)."""
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, kind):
                return value
        raise LookupError(f"this command takes no {kind.__name__} section")

    def has(self, kind: type[BaseModel]) -> bool:
        return any(isinstance(getattr(self, name), kind) for name in type(self).model_fields)


def _model_of(annotation: object) -> type[BaseModel]:
    """The section model of a `Settings` field annotated `Model | None`."""
    (model,) = [a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
    return model


#: Section name → its model, in the order of `Settings`.
SECTIONS: dict[str, type[BaseModel]] = {name: _model_of(f.annotation) for name, f in Settings.model_fields.items()}
