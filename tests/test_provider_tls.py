"""The provider's mTLS follows a renewal of its mounted Secret: a rotation mid-run loses no call.

The certificates are the `certs` step's own (homelab_autoscaler/pki.py), renewed as it renews them, CA included: the
trust bundle then holds the old CA and the new, so cluster-autoscaler's certificate of the old CA is still accepted
while a new connection is served the new certificate.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import socket
import ssl
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from homelab_autoscaler import pki
from proto import externalgrpc_pb2 as pb
from proto import externalgrpc_pb2_grpc as pb_grpc
from provider import server as provider_server
from provider.service import CloudProvider
from provider.settings import ProviderSettings
from tests.lab import NS, homelab, open_lab
from tests.test_provider import CA_DEADLINE, provider_settings, slot

NAMES = ("localhost",)


def write(directory: Path, pair: pki.Issued, trust: bytes) -> None:
    """As the kubelet renews a Secret volume: every file replaced at once (here: each by an atomic rename)."""
    for name, data in (("tls.key", pair.key), ("tls.crt", pair.cert), ("ca.crt", trust)):
        part = directory / f".{name}.new"
        part.write_bytes(data)
        part.replace(directory / name)


def served_serial(port: int, client: pki.Issued, trust: bytes, tmp: Path) -> int:
    """The serial of the certificate a new connection is served (a handshake with a client certificate)."""
    (tmp / "c.crt").write_bytes(client.cert)
    (tmp / "c.key").write_bytes(client.key)
    context = ssl.create_default_context(cadata=trust.decode())
    context.load_cert_chain(tmp / "c.crt", tmp / "c.key")
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


def channel_credentials(client: pki.Issued, trust: bytes) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=trust, private_key=client.key, certificate_chain=client.cert)


async def test_a_rotation_mid_run_loses_no_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provider_server, "RELOAD_EVERY", 0.0)  # look at the files at every handshake
    now = dt.datetime.now(dt.UTC)
    old_ca = pki.new_ca("old-ca", now)
    old_server = pki.issue(old_ca, "provider", dns_names=NAMES, now=now)
    old_client = pki.issue(old_ca, "cluster-autoscaler", usage=pki.Usage.CLIENT, now=now)
    certs = tmp_path / "tls"
    certs.mkdir()
    write(certs, old_server, old_ca.cert)
    tls = {"tls_cert": certs / "tls.crt", "tls_key": certs / "tls.key", "tls_ca": certs / "ca.crt"}
    async with open_lab(homelab([slot("s1")])) as lab:
        settings = provider_settings(lab, **tls)
        up = await provider_server.start(settings, CloudProvider.build(settings, lab.client, lab.kube, namespaces=[NS]))
        target = f"localhost:{up.port}"
        calls: list[str] = []
        stop = asyncio.Event()

        async def keep_calling(fresh_channels: bool) -> None:
            """cluster-autoscaler's loop: a long-lived channel, or (a restart's) a new channel each call."""
            creds = channel_credentials(old_client, old_ca.cert)
            async with grpc.aio.secure_channel(target, creds) as kept:
                while not stop.is_set():
                    if fresh_channels:
                        async with grpc.aio.secure_channel(target, creds) as channel:
                            reply = await pb_grpc.CloudProviderStub(channel).NodeGroups(
                                pb.NodeGroupsRequest(), timeout=CA_DEADLINE
                            )
                    else:
                        reply = await pb_grpc.CloudProviderStub(kept).NodeGroups(
                            pb.NodeGroupsRequest(), timeout=CA_DEADLINE
                        )
                    calls.append(",".join(g.id for g in reply.nodeGroups))
                    await asyncio.sleep(0.02)

        try:
            callers = [asyncio.create_task(keep_calling(fresh)) for fresh in (False, True)]
            await asyncio.sleep(1.0)
            before = len(calls)
            assert served_serial(up.port, old_client, old_ca.cert, tmp_path) == pki.load(old_server.cert).serial_number
            # The step renews the server certificate, and the CA with it: the new CA joins the trust bundle at
            # once, the old one keeps signing (cluster-autoscaler read its bundle at start: certs.CertSetup._signer).
            new_ca = pki.new_ca("new-ca", now)
            trust = pki.bundle([new_ca.cert, old_ca.cert], now)
            new_server = pki.issue(old_ca, "provider", dns_names=NAMES, now=now)
            write(certs, new_server, trust)
            await asyncio.sleep(1.5)
            stop.set()
            await asyncio.gather(*callers)  # a failed call raises here
            assert len(calls) > before + 10 and set(calls) == {"g"}, calls[-5:]
            # A new connection is served the new certificate, and clients of either CA are accepted.
            new_client = pki.issue(new_ca, "cluster-autoscaler", usage=pki.Usage.CLIENT, now=now)
            for client in (old_client, new_client):
                assert served_serial(up.port, client, old_ca.cert, tmp_path) == pki.load(new_server.cert).serial_number
            async with grpc.aio.secure_channel(target, channel_credentials(new_client, trust)) as channel:
                reply = await pb_grpc.CloudProviderStub(channel).NodeGroups(pb.NodeGroupsRequest(), timeout=CA_DEADLINE)
                assert [g.id for g in reply.nodeGroups] == ["g"]
            # A client of a CA outside the bundle is still refused.
            stranger = pki.new_ca("stranger", now)
            rogue = pki.issue(stranger, "rogue", usage=pki.Usage.CLIENT, now=now)
            async with grpc.aio.secure_channel(target, channel_credentials(rogue, trust)) as channel:
                with pytest.raises(grpc.aio.AioRpcError):
                    await pb_grpc.CloudProviderStub(channel).NodeGroups(pb.NodeGroupsRequest(), timeout=CA_DEADLINE)
            print(f"\n{len(calls)} calls, {len(calls) - before} of them across the rotation: none lost")
        finally:
            stop.set()
            await up.server.stop(1)


def test_a_file_that_cannot_be_read_keeps_the_certificate_in_use(tmp_path: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    ca = pki.new_ca("ca", now)
    write(tmp_path, pki.issue(ca, "provider", dns_names=NAMES, now=now), ca.cert)
    settings = ProviderSettings(
        address="127.0.0.1:0", tls_cert=tmp_path / "tls.crt", tls_key=tmp_path / "tls.key", tls_ca=tmp_path / "ca.crt"
    )
    ticks = iter(range(0, 1000, 100))
    files = provider_server.Reloading(settings, every=10, clock=lambda: float(next(ticks)))
    assert files.fetch() is None  # unchanged
    (tmp_path / "tls.crt").unlink()
    assert files.fetch() is None and files.reloads == 0  # unreadable: the one in use stays
    write(tmp_path, pki.issue(ca, "provider", dns_names=NAMES, now=now), ca.cert)
    assert files.fetch() is not None and files.reloads == 1
