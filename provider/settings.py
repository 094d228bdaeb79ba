"""The provider's settings: where it listens, how it is secured, which groups it serves, what it answers.

They extend the shared `Settings` (Temporal and Kubernetes), so one environment (`HOMELAB_AUTOSCALER_*`) or
one set of flags configures every role. Transport safety is checked here, at construction, so a provider that
would accept unauthenticated scale-ups from the network never starts.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Self

from pydantic import Field, model_validator
from pydantic_settings import NoDecode

from homelab_autoscaler.settings import Settings

DEFAULT_ADDRESS = "127.0.0.1:8086"
DEFAULT_NAMESPACE = "homelab-autoscaler-system"
# The label NVIDIA's GPU feature discovery puts on a node with the GPU's product name.
DEFAULT_GPU_LABEL = "nvidia.com/gpu.product"


def _split(value: object) -> object:
    """Accept `a,b` from an environment variable or a flag as well as a real list."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def host_of(address: str) -> str:
    """The host part of a gRPC listen address (`host:port`, `[v6]:port`, `:port`); "" means every interface."""
    if address.startswith("unix:"):
        return "unix"
    if address.startswith("["):
        return address[1 : address.index("]")] if "]" in address else address
    host, _, _port = address.rpartition(":")
    return host


def is_loopback(address: str) -> bool:
    """True when only this machine can connect: a loopback IP, `localhost`, or a unix socket."""
    host = host_of(address)
    if host in ("unix", "localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ProviderSettings(Settings):
    """Everything `homelab-autoscaler provider` needs on top of reaching Temporal and Kubernetes."""

    provider_address: str = Field(DEFAULT_ADDRESS, min_length=1, description="host:port the gRPC server listens on")
    tls_cert: Path | None = Field(None, description="server certificate (PEM); with tls_key and tls_ca: mTLS")
    tls_key: Path | None = Field(None, description="server private key (PEM)")
    tls_ca: Path | None = Field(None, description="CA bundle (PEM) that must have signed every client certificate")
    insecure: bool = Field(False, description="allow plaintext on a non-loopback address (trusted networks only)")
    namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: [DEFAULT_NAMESPACE],
        min_length=1,
        description="namespaces whose Groups are served (comma-separated in the environment)",
    )
    gpu_label: str = Field(DEFAULT_GPU_LABEL, min_length=1, description="node label whose value is the GPU type")
    gpu_types: Annotated[list[str], NoDecode] = Field(default_factory=list, description="GPU types offered")
    pricing_window_seconds: float = Field(
        3600.0, gt=0, description="period priced when cluster-autoscaler sends no start/end timestamps"
    )
    rpc_timeout_seconds: float = Field(
        4.0, gt=0, le=30, description="budget of one call, well inside cluster-autoscaler's 5 s gRPC deadline"
    )
    catalog_ttl_seconds: float = Field(
        2.0, ge=0, description="how long a listing of Groups and slots is reused between Refresh calls"
    )

    @model_validator(mode="before")
    @classmethod
    def _lists(cls, data: object) -> object:
        if isinstance(data, dict):
            for key in ("namespaces", "gpu_types"):
                if key in data:
                    data[key] = _split(data[key])
        return data

    @model_validator(mode="after")
    def _transport(self) -> Self:
        given = [p is not None for p in (self.tls_cert, self.tls_key, self.tls_ca)]
        if any(given) and not all(given):
            raise ValueError(
                "tls_cert, tls_key and tls_ca go together: cluster-autoscaler speaks mTLS or plaintext, nothing between"
            )
        if not self.tls and not self.insecure and not is_loopback(self.provider_address):
            raise ValueError(
                f"refusing to serve plaintext on {self.provider_address}: anyone who can reach it can power machines "
                "on and off. Give --tls-cert/--tls-key/--tls-ca, listen on 127.0.0.1, or pass --insecure"
            )
        return self

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None
