"""The scripted demo of `make run`: cluster-autoscaler's calls, made over gRPC like cluster-autoscaler makes
them, against the simulated homelab. It scales the group up by two, waits for ready, scales one node down, and
shows one failed boot (the example homelab's worker-3 has a broken wake-up), then prints each claim's page in
the Web UI. Every wait is bounded and says what it waits for."""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import grpc
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, TypedSearchAttributes

from api import contracts as c
from proto import externalgrpc_pb2 as pb
from proto import externalgrpc_pb2_grpc as pb_grpc

CALL_TIMEOUT = 5.0  # cluster-autoscaler's deadline
STATES = {1: "running", 2: "creating", 3: "deleting"}


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def ui_link(ui_url: str, namespace: str, workflow_id: str) -> str:
    return f"{ui_url}/namespaces/{namespace}/workflows/{urllib.parse.quote(workflow_id, safe='')}"


async def _until(what: str, check: Callable[[], Any], timeout: float, every: float = 1.0) -> Any:
    """Poll `check` (a coroutine function) until it returns something truthy; say what is awaited meanwhile."""
    end = time.monotonic() + timeout
    said = 0.0
    while time.monotonic() < end:
        got = await check()
        if got:
            return got
        if time.monotonic() - said > 10:
            say(f"waiting for {what} ({end - time.monotonic():.0f} s left)")
            said = time.monotonic()
        await asyncio.sleep(every)
    raise TimeoutError(f"demo: {what} did not happen within {timeout:.0f} s")


async def run_demo(provider_address: str, group: str = "workers") -> None:
    """Drive the demo's calls through the provider, as cluster-autoscaler would."""
    async with grpc.aio.insecure_channel(provider_address) as channel:
        stub = pb_grpc.CloudProviderStub(channel)

        async def instances() -> list[Any]:
            resp = await stub.NodeGroupNodes(pb.NodeGroupNodesRequest(id=group), timeout=CALL_TIMEOUT)
            return list(resp.instances)

        async def provider_up() -> bool:
            try:
                resp = await stub.NodeGroups(pb.NodeGroupsRequest(), timeout=CALL_TIMEOUT)
            except grpc.aio.AioRpcError:
                return False
            return any(g.id == group for g in resp.nodeGroups)

        await _until(f"the provider to serve node group {group}", provider_up, 60)
        say(f"IncreaseSize({group}, 2): cluster-autoscaler wants two more machines")
        await stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=group, delta=2), timeout=CALL_TIMEOUT)

        async def two_running() -> list[Any] | None:
            running = [i for i in await instances() if i.status.instanceState == 1]
            return running if len(running) >= 2 else None

        running = await _until("two machines to boot and turn ready", two_running, 180)
        say(f"ready: {', '.join(i.id for i in running)}")
        victim = running[0].id
        say(f"DeleteNodes({group}, {victim}): scale one machine down")
        node = pb.ExternalGrpcNode(providerID=victim, name=victim.rsplit("/", 1)[-1])
        await stub.NodeGroupDeleteNodes(pb.NodeGroupDeleteNodesRequest(id=group, nodes=[node]), timeout=CALL_TIMEOUT)

        async def gone() -> bool:
            return all(i.id != victim for i in await instances())

        await _until(f"{victim} to be powered off and verified off", gone, 180)
        say(f"{victim} is off; its claim completed")
        say(f"IncreaseSize({group}, 1): the free slot with the fewest boots is worker-3, whose wake-up is broken")
        await stub.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=group, delta=1), timeout=CALL_TIMEOUT)

        async def failed() -> Any:
            return next((i for i in await instances() if i.status.errorInfo.errorCode), None)

        bad = await _until("the broken machine's claim to fail", failed, 180)
        err = bad.status.errorInfo
        say(f"failed boot on {bad.id}: {err.errorCode} (class {err.instanceErrorClass}): {err.errorMessage}")


async def demo_task(client: Client, provider_address: str, ui_url: str, settings_namespace: str) -> None:
    """The demo as `dev --demo` runs it: the calls, then the UI link of every claim."""
    try:
        await run_demo(provider_address)
    except (TimeoutError, grpc.aio.AioRpcError) as err:
        say(f"stopped: {err}")
        return
    say("the claims, each with its whole history in the Web UI:")
    async for wf in client.list_workflows(f"WorkflowType = '{c.WorkflowName.CLAIM}' AND {c.SA_GROUP} = 'workers'"):
        say(f"  {wf.id}: {ui_link(ui_url, settings_namespace, wf.id)}  {_phase(wf.typed_search_attributes)}")
    say(
        f"all claims: {ui_url}/namespaces/{settings_namespace}/workflows?query="
        + urllib.parse.quote(f"WorkflowType='{c.WorkflowName.CLAIM}'")
    )
    say("serving until Ctrl-C")


def _phase(sa: TypedSearchAttributes) -> str:
    phase = sa.get(SearchAttributeKey.for_keyword(c.SA_PHASE)) or "?"
    reason = sa.get(SearchAttributeKey.for_keyword(c.SA_REASON)) or "-"
    return phase if reason == "-" else f"{phase} ({reason})"
