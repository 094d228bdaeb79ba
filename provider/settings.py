"""The `provider` settings section: where the provider listens, how it is secured, what it answers.

Transport safety is checked here, at construction, so a provider that would accept unauthenticated scale-ups
from the network never starts. Which namespaces' Groups it serves is the shared `namespaces` section
(homelab_autoscaler/settings.py), which the watchers read with the same meaning.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from api.addresses import check_file, check_host_port, check_label_key, check_label_value, each, field_checks

DEFAULT_ADDRESS = "127.0.0.1:8086"
DEFAULT_NAMESPACE = "homelab-autoscaler-system"
# The label NVIDIA's GPU feature discovery puts on a node with the GPU's product name.
DEFAULT_GPU_LABEL = "nvidia.com/gpu.product"


def comma_separated(value: object) -> object:
    """`a,b` as a list: how a list setting is written in a flag, an environment variable or the config file
    (a YAML list is taken as it is). The one splitter of every list setting."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


#: A list setting: `a,b` in a flag or a variable, a list or `a,b` in the config file.
Names = Annotated[list[str], BeforeValidator(comma_separated)]


def host_of(address: str) -> str:
    """The host part of a gRPC listen address (`host:port`, `[v6]:port`, `:port`); "" means every interface."""
    if address.startswith("unix:"):
        return "unix"
    if address.startswith("["):
        return address[1 : address.index("]")] if "]" in address else address
    host, _, _port = address.rpartition(":")
    return host


def check_listen_address(address: str) -> str:
    """What the gRPC server can listen on: `host:port`, `[v6]:port`, `:port` (every interface) or `unix:path`."""
    if not address.startswith("unix:"):
        check_host_port(address, empty_host=True)
    return address


def is_loopback(address: str) -> bool:
    """True when only this machine can connect: a loopback IP, `localhost`, or a unix socket."""
    host = host_of(address)
    if host in ("unix", "localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ProviderSettings(BaseModel):
    """The externalgrpc server cluster-autoscaler calls: its address, its mTLS, and what it answers."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True)

    address: str = Field(
        DEFAULT_ADDRESS, min_length=1, alias="provider_address", description="host:port the gRPC server listens on"
    )
    tls_cert: Path | None = Field(None, description="server certificate (PEM); with tls_key and tls_ca: mTLS")
    tls_key: Path | None = Field(None, description="server private key (PEM)")
    tls_ca: Path | None = Field(None, description="CA bundle (PEM) that must have signed every client certificate")
    insecure: bool = Field(False, description="allow plaintext on a non-loopback address (trusted networks only)")
    gpu_label: str = Field(DEFAULT_GPU_LABEL, min_length=1, description="node label whose value is the GPU type")
    gpu_types: Names = Field(default_factory=list, description="GPU types offered (comma-separated)")
    pricing_window_seconds: float = Field(
        3600.0, gt=0, description="period priced when cluster-autoscaler sends no start/end timestamps"
    )
    rpc_timeout_seconds: float = Field(
        4.0, gt=0, le=30, description="budget of one call, well inside cluster-autoscaler's 5 s gRPC deadline"
    )
    catalog_ttl_seconds: float = Field(
        2.0,
        ge=0,
        description="how long a listing of Groups and slots, and a group workflow's answers, are reused between "
        "Refresh calls (a write to a group drops its answers at once)",
    )

    _checked = field_checks(
        {
            "address": check_listen_address,
            "tls_cert": check_file,
            "tls_key": check_file,
            "tls_ca": check_file,
            "gpu_label": check_label_key,
            "gpu_types": each(check_label_value),
        }
    )

    @model_validator(mode="after")
    def _transport(self) -> Self:
        given = [p is not None for p in (self.tls_cert, self.tls_key, self.tls_ca)]
        if any(given) and not all(given):
            raise ValueError(
                "tls_cert, tls_key and tls_ca go together: cluster-autoscaler speaks mTLS or plaintext, nothing between"
            )
        if not self.tls and not self.insecure and not is_loopback(self.address):
            raise ValueError(
                f"refusing to serve plaintext on {self.address}: anyone who can reach it can power machines "
                "on and off. Give --tls-cert/--tls-key/--tls-ca, listen on 127.0.0.1, or pass --insecure"
            )
        return self

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None
