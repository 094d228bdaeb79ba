"""A frontend that wants TLS, or a client certificate, and a client that has neither: the operator says so in one
line, naming the flags to give, against a real TLS listener that requires a client certificate (the real Temporal
frontend on the real node: tests/realcluster/test_pods.py, the temporal-cluster overlay)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from homelab_autoscaler import pki
from homelab_autoscaler.settings import TemporalSettings
from homelab_autoscaler.temporal import TemporalUnreachable, connect, tls_hint

NOW = dt.datetime.now(dt.UTC)


@pytest.fixture
async def mtls_listener(tmp_path: Path) -> AsyncIterator[tuple[int, Path]]:
    """A TLS listener on the loopback that requires a client certificate of its CA (and answers nothing else)."""
    ca = pki.new_ca("frontend-ca", NOW)
    served = pki.issue(ca, "localhost", dns_names=["localhost"], now=NOW)
    for name, data in (("tls.crt", served.cert), ("tls.key", served.key), ("ca.crt", ca.cert)):
        (tmp_path / name).write_bytes(data)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    context.load_verify_locations(tmp_path / "ca.crt")
    context.verify_mode = ssl.CERT_REQUIRED
    context.set_alpn_protocols(["h2"])

    async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, TimeoutError, ssl.SSLError):
            await asyncio.wait_for(reader.read(1024), 10)
        writer.close()

    server = await asyncio.start_server(session, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1], tmp_path / "ca.crt"
    finally:
        server.close()
        await server.wait_closed()


async def refusal(settings: TemporalSettings) -> TemporalUnreachable:
    with pytest.raises(TemporalUnreachable) as caught:
        await asyncio.wait_for(connect(settings), 20)
    return caught.value


async def test_a_plaintext_client_is_told_the_frontend_may_want_tls(mtls_listener: tuple[int, Path]) -> None:
    port, _ = mtls_listener
    err = await refusal(TemporalSettings(temporal_address=f"127.0.0.1:{port}"))
    line = str(err)
    assert "\n" not in line and f"cannot reach Temporal at 127.0.0.1:{port}" in line
    assert "--temporal-tls-ca" in line and "--temporal-tls-cert" in line and "make run" not in line, line
    assert "transport error" not in err.reason, err.reason  # the innermost reason, not the wrapper's


async def test_a_tls_client_without_a_certificate_is_told_to_give_one(mtls_listener: tuple[int, Path]) -> None:
    port, ca = mtls_listener
    err = await refusal(TemporalSettings(temporal_address=f"localhost:{port}", temporal_tls_ca=ca))
    line = str(err)
    assert "\n" not in line and "without a client certificate" in line and "--temporal-tls-cert" in line, line


def test_an_unreachable_temporal_is_asked_about_not_about_tls() -> None:
    refused = (
        'Failed client connect: Status { code: Unavailable, message: "tcp connect error", source: '
        'Some(tonic::transport::Error(Transport, ConnectError("tcp connect error", Os { code: 111, kind: '
        'ConnectionRefused, message: "Connection refused" }))) }'
    )
    assert tls_hint(refused, TemporalSettings(temporal_address="127.0.0.1:7233")) == ""
    line = str(TemporalUnreachable("127.0.0.1:7233", refused))
    assert "Is it running" in line and "tcp connect error" in line, line
