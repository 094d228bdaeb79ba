"""The scripted demo of `make run`: cluster-autoscaler's calls, made over gRPC like cluster-autoscaler makes
them, against the simulated homelab. It scales the group up by two, waits for ready, scales one node down, and
shows one failed boot (the example homelab's worker-3 has a broken wake-up), then prints each claim's page in
the Web UI and what the machines' time off saved: the operator's usage figures beside the simulated homelab's own
record over the same windows, and `kubectl get groups` as the API server's Table has it. Every wait is bounded and
says what it waits for."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import grpc
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, TypedSearchAttributes

from api import contracts as c
from api import names
from api.v2alpha1 import GroupUsage, SlotUsage
from domain import usage
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
        said = names.error_class_words(err.instanceErrorClass)
        say(f"failed boot on {bad.id}: {err.errorCode} ({said}): {err.errorMessage}")


async def demo_task(
    client: Client,
    provider_address: str,
    ui_url: str,
    settings_namespace: str,
    kube_url: str | None = None,
    namespace: str = "homelab-autoscaler-system",
) -> None:
    """The demo as `dev --demo` runs it: the calls, then the UI link of every claim, then (on the simulated homelab,
    `kube_url`) what the time off saved."""
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
    if kube_url is not None:
        try:
            await what_it_saved(kube_url, namespace, "workers")
        except (OSError, ValueError, KeyError, TimeoutError) as err:
            say(f"the usage figures could not be read: {err}")
    say("serving until Ctrl-C")


def _phase(sa: TypedSearchAttributes) -> str:
    phase = sa.get(SearchAttributeKey.for_keyword(c.SA_PHASE)) or "?"
    reason = sa.get(SearchAttributeKey.for_keyword(c.SA_REASON)) or "-"
    return phase if reason == "-" else f"{phase} ({reason})"


# --- what it saved -----------------------------------------------------------------------------------------------
HTTP_TIMEOUT = 5.0
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def _http(url: str, body: Any = None, accept: str = "application/json") -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Accept": accept, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as resp:
        return json.load(resp)


def _crd_path(kube_url: str, namespace: str, plural: str, name: str = "") -> str:
    return f"{kube_url}/apis/{names.API_VERSION}/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")


def _wh(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


async def what_it_saved(kube_url: str, namespace: str, group: str) -> None:
    """The group's usage figures as written with the demo's last move (the failed boot makes the group degraded),
    each slot's and the group's beside the simulated homelab's own record over the same window, then `kubectl get
    groups` as the API server's Table prints it."""

    async def written() -> dict[str, Any] | None:
        obj = await asyncio.to_thread(_http, _crd_path(kube_url, namespace, names.PLURAL_GROUPS, group))
        held = obj.get("status") or {}
        return obj if held.get("usage") and held.get("health") == "degraded" else None

    await _until(f"group {group}'s usage figures to be written", written, 30)

    async def slot_figures() -> dict[str, SlotUsage]:
        listed = await asyncio.to_thread(_http, _crd_path(kube_url, namespace, names.PLURAL_NODES))
        return {
            item["metadata"]["name"]: SlotUsage.model_validate(item["status"]["usage"])
            for item in listed["items"]
            if item["spec"].get("group") == group and (item.get("status") or {}).get("usage")
        }

    async def snapshot() -> tuple[GroupUsage, dict[str, SlotUsage]] | None:
        """The group's figures and its slots' as the writer summed them: no slot written between the two reads."""
        before = await slot_figures()
        obj = await written()
        after = await slot_figures()
        if obj is None or before != after:
            return None
        return GroupUsage.model_validate(obj["status"]["usage"]), after

    total, slots = await _until(f"group {group}'s and its slots' figures to hold still", snapshot, 30)
    assert total.counted_to is not None
    at = total.counted_to
    # Every slot brought up to the group's moment: the slots' rows then add up to the group's (domain.usage.at).
    slots = {name: usage.status_at(u, at) for name, u in slots.items()}
    windows = {name: {"since": u.since.isoformat(), "until": at.isoformat()} for name, u in slots.items() if u.since}
    answer = await asyncio.to_thread(_http, f"{kube_url}/_sim/usage", {"windows": windows})
    own, own_total = answer["slots"], answer["total"]
    say("what it saved: the operator's usage figures (status.usage, counted from watch events) beside the simulated")
    say("homelab's own record of its kubelets' Ready periods, over the same windows, every figure counted to one")
    say(f"moment, {at:%H:%M:%S} UTC (each slot's written figures brought up to it): operator (homelab)")
    say(f"  {'slot':<10} {'on s':>14} {'off+booting s':>16} {'boots':>7} {'off%':>13} {'saved Wh':>16}")
    for name, u in sorted(slots.items()):
        h = own[name]
        say(
            f"  {name:<10} {u.on_seconds + u.draining_seconds:>6} ({h['onSeconds']:>5.0f}) "
            f"{u.off_seconds + u.booting_seconds:>7} ({h['offSeconds']:>6.0f}) {u.boots:>2} ({h['boots']:>2}) "
            f"{u.off_percent or 0:>5.1f} ({h['offPercent'] or 0:>5.1f}) "
            f"{_wh(u.energy_saved_wh):>7} ({_wh(h.get('energySavedWh')):>6})"
        )
    saved = [u.energy_saved_wh for u in slots.values() if u.energy_saved_wh is not None]
    say(
        f"  {'sum':<10} {sum(u.on_seconds + u.draining_seconds for u in slots.values()):>6} {'':>7} "
        f"{sum(u.off_seconds + u.booting_seconds for u in slots.values()):>7} {'':>8} "
        f"{sum(u.boots for u in slots.values()):>2} {'':>4} {'':>13} {_wh(sum(saved) if saved else None):>7}"
    )
    say(
        f"  group {group}, {total.since:%H:%M:%S} to {at:%H:%M:%S} UTC: "
        f"{total.on_seconds + total.draining_seconds} s on, {total.off_seconds + total.booting_seconds} s off, "
        f"off {total.off_percent or 0:.1f}% ({own_total['offPercent'] or 0:.1f}%), "
        f"saved {_wh(total.energy_saved_wh)} Wh ({_wh(own_total.get('energySavedWh'))} Wh), "
        f"used {_wh(total.energy_used_wh)} Wh ({_wh(own_total.get('energyUsedWh'))} Wh), "
        f"{total.boots} boots ({own_total['boots']})"
    )
    say(f"  kubectl describe group {group}: {total.summary}")
    table = await asyncio.to_thread(_http, _crd_path(kube_url, namespace, names.PLURAL_GROUPS), accept=TABLE)
    say(f"kubectl get groups -n {namespace}:")
    for line in _table_lines(table):
        say(f"  {line}")


def _table_lines(table: dict[str, Any]) -> list[str]:
    """A meta.k8s.io Table as kubectl prints it: the priority-0 columns, upper-cased headers, padded by three."""
    shown = [i for i, col in enumerate(table["columnDefinitions"]) if not col.get("priority")]
    header = ["NAME" if table["columnDefinitions"][i]["name"] == "Name" else
              table["columnDefinitions"][i]["name"].upper() for i in shown]  # fmt: skip
    rows = [[_cell(row["cells"][i]) for i in shown] for row in table["rows"]]
    widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(shown))]
    return ["   ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in [header, *rows]]


def _cell(value: Any) -> str:
    if value is None:
        return "<none>"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
