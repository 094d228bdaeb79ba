"""The gRPC server: the CloudProvider service (plus reflection) on one address, mTLS when certificates are given.

`serve(settings, provider, stop)` is the `provider` role; the composition root (`homelab_autoscaler.roles`) builds
the provider on the process's Temporal client and Kubernetes adapter. `start(...)` binds it (tests use it alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

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
# How often, at most, the certificate files are looked at for a renewal (at a new connection's handshake).
RELOAD_EVERY = 10.0


@dataclass
class Running:
    server: grpc.aio.Server
    port: int
    provider: CloudProvider


class Reloading:
    """The mTLS certificate, key and client CA, read again when their files change (a Secret volume's renewal).

    gRPC asks at each new connection's handshake; the files are looked at no more often than `every` seconds. A
    renewal applies to connections made after it; a connection in use keeps its session, so no call is lost. A file
    that cannot be read keeps what is in use (and says so once).
    """

    def __init__(
        self, settings: ProviderSettings, *, every: float = RELOAD_EVERY, clock: Callable[[], float] = time.monotonic
    ) -> None:
        assert settings.tls_cert is not None and settings.tls_key is not None and settings.tls_ca is not None
        self.files = (settings.tls_key, settings.tls_cert, settings.tls_ca)
        self.every = every
        self.clock = clock
        self.loaded = self._read()
        self.checked = clock()
        self.reloads = 0
        self._lock = threading.Lock()

    def _read(self) -> tuple[bytes, bytes, bytes]:
        key, cert, ca = (path.read_bytes() for path in self.files)
        return key, cert, ca

    def configuration(self) -> Any:
        key, cert, ca = self.loaded
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch(self) -> Any:
        """gRPC's fetcher: a new configuration when the files changed, None to keep the one in use."""
        with self._lock:
            now = self.clock()
            if now - self.checked < self.every:
                return None
            self.checked = now
            try:
                contents = self._read()
            except OSError as err:
                log.warning("provider certificate not reloaded (the one in use stays): %s", err)
                return None
            if contents == self.loaded:
                return None
            self.loaded = contents
            self.reloads += 1
        log.info("provider certificate reloaded from %s", self.files[1])
        return self.configuration()


def credentials(settings: ProviderSettings, *, every: float | None = None) -> grpc.ServerCredentials | None:
    """mTLS server credentials: a client must present a certificate signed by `tls_ca`; renewals are followed."""
    if not settings.tls:
        return None
    files = Reloading(settings, every=RELOAD_EVERY if every is None else every)
    return grpc.dynamic_ssl_server_credentials(files.configuration(), files.fetch, require_client_authentication=True)


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
