"""Readiness means able to work: a role whose Temporal or API server cannot be reached says so on `/readyz`, and
the provider answers UNAVAILABLE (with a message that says why) instead of a timeout or an internal error.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import grpc
import pytest
from homelab_sim.emulator import EmulatorServer
from temporalio.client import Client

from homelab_autoscaler.health import HealthServer, Probe, Reachability
from homelab_autoscaler.temporal import DATA_CONVERTER
from kube.adapter import Kube
from proto import externalgrpc_pb2 as pb
from proto import externalgrpc_pb2_grpc as pb_grpc
from provider.server import start
from provider.service import CloudProvider
from provider.settings import ProviderSettings


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def get(port: int, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}{path}") as resp:
        return resp.status, await resp.text()


async def test_a_reachability_follows_its_dependency_both_ways() -> None:
    up = True

    async def ping() -> None:
        if not up:
            raise ConnectionRefusedError("connection refused")

    reach = Reachability("the thing", ping, timeout=0.5)
    assert await reach.check_once() and reach.describe() == ""
    up = False
    assert not await reach.check_once()
    assert reach.describe().startswith("the thing unreachable for 0 s: connection refused")
    up = True
    assert await reach.check_once() and reach.describe() == ""


async def test_a_ping_that_hangs_is_unreachable() -> None:
    async def hang() -> None:
        await asyncio.sleep(10)

    reach = Reachability("slow", hang, timeout=0.1)
    assert not await reach.check_once()
    assert "slow unreachable" in reach.describe()


async def test_readyz_lists_every_failing_probe_and_healthz_stays_up() -> None:
    health = HealthServer("127.0.0.1", 0)
    state = {"temporal": "", "api": "the API server unreachable for 3 s: refused"}
    health.add(Probe("temporal", lambda: state["temporal"]))
    health.add(Probe("api", lambda: state["api"]))
    port = await health.start()
    try:
        assert await get(port, "/healthz") == (200, "ok\n")
        status, text = await get(port, "/readyz")
        assert status == 503 and text == "api: the API server unreachable for 3 s: refused\n"
        state["api"] = ""
        assert await get(port, "/readyz") == (200, "ok\n")
    finally:
        await health.stop()


async def raw(port: int, request: bytes) -> bytes:
    """What the server sends back for `request` sent as is (then our side closed), until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        writer.write_eof()
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


async def test_the_health_server_answers_what_a_prober_sends_and_refuses_the_rest() -> None:
    """Its own small HTTP server (no aiohttp): HEAD has no body, a query string is ignored, another path is 404,
    another method 405, and a request line that is not HTTP a 400; each answer closes the connection."""
    health = HealthServer("127.0.0.1", 0, alive=lambda: "")
    port = await health.start()
    try:
        answer = await raw(port, b"GET /healthz?verbose=1 HTTP/1.1\r\nHost: x\r\nUser-Agent: kube-probe/1.35\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nok\n"), answer
        assert b"Content-Length: 3\r\n" in answer and b"Connection: close\r\n" in answer
        head = await raw(port, b"HEAD /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n"), head
        assert (await raw(port, b"GET /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404 ")
        assert (await raw(port, b"POST /readyz HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405 ")
        assert (await raw(port, b"nonsense\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
        assert (await raw(port, b"GET /healthz HTTP/1.1\r\n")).startswith(b"HTTP/1.1 400 ")  # closed mid-head
        assert await get(port, "/healthz") == (200, "ok\n")  # and a real client still gets its answer
    finally:
        await health.stop()


async def test_temporal_down_is_unreachable_and_the_provider_says_unavailable(emulator: EmulatorServer) -> None:
    port = closed_port()
    client = await Client.connect(f"127.0.0.1:{port}", data_converter=DATA_CONVERTER, lazy=True)
    temporal = Reachability(f"Temporal at 127.0.0.1:{port}", lambda: client.service_client.check_health(), timeout=0.5)
    assert not await temporal.check_once()
    kube = Kube.connect(server=emulator.url, timeout=2.0)
    emulator.call(lambda e: e.put_object("infra.homecluster.dev/v2alpha1", "groups", _group(), "homelab"))
    settings = ProviderSettings(address="127.0.0.1:0", rpc_timeout_seconds=1.0)
    built = CloudProvider.build(settings, client, kube, namespaces=["homelab"], temporal_unreachable=temporal.describe)
    up = await start(settings, built)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{up.port}") as channel:
            stub = pb_grpc.CloudProviderStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id="g"), timeout=4)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE, err.value.details()
            assert "Temporal at" in (err.value.details() or "") and "unreachable" in (err.value.details() or "")
            # What needs no Temporal still answers: the Groups come from the API server.
            groups = await stub.NodeGroups(pb.NodeGroupsRequest(), timeout=4)
            assert [g.id for g in groups.nodeGroups] == ["g"]
    finally:
        await up.server.stop(0)
        kube.close()


def _group() -> dict[str, Any]:
    return {
        "apiVersion": "infra.homecluster.dev/v2alpha1",
        "kind": "Group",
        "metadata": {"name": "g", "namespace": "homelab"},
        "spec": {"maxSize": 2},
    }
