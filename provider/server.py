"""The gRPC server: the CloudProvider service (plus reflection) on one address, mTLS when certificates are given.

`serve(settings, provider, stop)` is the `provider` role; the composition root (`homelab_autoscaler.roles`) builds
the provider on the process's Temporal client and Kubernetes adapter. `start(...)` binds it (tests use it alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from grpc_reflection.v1alpha import reflection

from proto import externalgrpc_pb2 as pb
from provider.service import CloudProvider, method_handlers
from provider.settings import ProviderSettings

log = logging.getLogger(__name__)

SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["CloudProvider"].full_name
# cluster-autoscaler sends small messages; a bound stops a hostile one from costing memory.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
GRACE_SECONDS = 5.0


@dataclass
class Running:
    server: grpc.aio.Server
    port: int
    provider: CloudProvider


def credentials(settings: ProviderSettings) -> grpc.ServerCredentials | None:
    """mTLS server credentials: a client must present a certificate signed by `tls_ca`."""
    if not settings.tls:
        return None
    assert settings.tls_cert is not None and settings.tls_key is not None and settings.tls_ca is not None
    return grpc.ssl_server_credentials(
        [(settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())],
        root_certificates=settings.tls_ca.read_bytes(),
        require_client_auth=True,
    )


async def start(settings: ProviderSettings, provider: CloudProvider) -> Running:
    """Bind and start the server; the port is the one bound (useful with `:0`)."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # gRPC shares a port between processes by default (SO_REUSEPORT): a second provider on the same
            # address would silently take half of cluster-autoscaler's calls. A busy port is an error instead.
            ("grpc.so_reuseport", 0),
        ]
    )
    handlers = method_handlers(provider)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
    reflection.enable_server_reflection((SERVICE_NAME, reflection.SERVICE_NAME), server)
    creds = credentials(settings)
    address = settings.address
    port = server.add_secure_port(address, creds) if creds else server.add_insecure_port(address)
    if not port and not address.startswith("unix:"):
        raise OSError(f"cannot listen on {address}")
    await server.start()
    log.info(
        "provider serving %s on %s (%s), groups of %s",
        SERVICE_NAME,
        address if port == 0 else f"{address.rpartition(':')[0]}:{port}",
        "mTLS" if creds else "plaintext",
        ", ".join(provider.catalog.namespaces),
    )
    return Running(server, port, provider)


@contextlib.asynccontextmanager
async def running(settings: ProviderSettings, provider: CloudProvider) -> AsyncIterator[Running]:
    """The server for the span of a `with`, stopped gracefully (in-flight calls get `GRACE_SECONDS`)."""
    up = await start(settings, provider)
    try:
        yield up
    finally:
        await up.server.stop(GRACE_SECONDS)


async def serve(settings: ProviderSettings, provider: CloudProvider, stop: asyncio.Event) -> None:
    """The `provider` role: serve until `stop` (the composition root hands it the provider, built on its client)."""
    async with running(settings, provider):
        await stop.wait()
