"""A client moved onto a new connection (homelab_autoscaler.temporal.adopt_connection, the Worker's `client` setter):
once the old connection is gone for good, the client's calls and the worker's polls go on over the new one. This
holds the SDK to what a certificate renewal relies on (homelab_autoscaler/renewal.py)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from homelab_autoscaler.temporal import adopt_connection
from tests.procs import BIN


@workflow.defn
class Echo:
    @workflow.run
    async def run(self, word: str) -> str:
        return word


class Proxy:
    """A TCP relay on the loopback to the Temporal frontend; `close()` ends it and every connection through it."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> Proxy:
        self.server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers += [writer, up_writer]

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()


@pytest.fixture
async def frontend() -> AsyncIterator[tuple[str, int]]:
    env = await WorkflowEnvironment.start_local(dev_server_existing_path=str(BIN / "temporal"))
    try:
        host, port = env.client.service_client.config.target_host.rsplit(":", 1)
        yield host, int(port)
    finally:
        await env.shutdown()


async def test_the_client_and_the_worker_go_on_over_the_new_connection_once_the_old_is_gone(
    frontend: tuple[str, int],
) -> None:
    old, new = await Proxy(*frontend).start(), await Proxy(*frontend).start()
    client = await Client.connect(f"127.0.0.1:{old.port}")
    queue = f"reconnect-{uuid.uuid4().hex[:8]}"
    # Unsandboxed: the workflow is this module's, which the sandbox would import again with the harness's imports.
    async with Worker(
        client, task_queue=queue, workflows=[Echo], workflow_runner=UnsandboxedWorkflowRunner()
    ) as worker:
        assert await client.execute_workflow(Echo.run, "before", id=f"{queue}-1", task_queue=queue) == "before"
        fresh = await Client.connect(f"127.0.0.1:{new.port}")
        adopt_connection(client, fresh)
        worker.client = client
        assert client.service_client is fresh.service_client
        await old.close()  # the old connection, and any way back to it, gone
        done = client.execute_workflow(Echo.run, "after", id=f"{queue}-2", task_queue=queue)
        assert await asyncio.wait_for(done, timeout=30) == "after"
    await new.close()
