"""P5's floors and breakdown: where an idle operator's memory goes, measured in fresh interpreters.

`layers()` imports each layer in the operator's order (Python itself, the Temporal client, its worker, the Kubernetes
client, our roles) in one fresh interpreter, and each alone in another (the layer's floor). `python -m bench.idle
ADDRESS QUEUE POLLS SLOTS fixed|autoscaling` is a bare Temporal worker (one trivial workflow and activity, polling
as the operator's does) until SIGTERM: the least a process that is a Temporal worker costs at rest. `python -m
bench.idle grpc` is an idle gRPC server (grpc.aio, as the provider's) until SIGTERM: what serving cluster-autoscaler
costs at rest before any code of ours.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from dataclasses import dataclass

# The operator's imports in the order `homelab-autoscaler run` meets them: each layer's modules on top of the last.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Python", ()),
    ("Temporal client", ("temporalio.client",)),
    ("Temporal worker", ("temporalio.worker",)),
    ("Kubernetes client", ("kubernetes.client", "kubernetes.config")),
    ("our roles", ("homelab_autoscaler.cli", "homelab_autoscaler.roles")),
)
IMPORT_TIMEOUT = 120.0
# Run with `python -c`: it imports nothing of its own before it reads the bare interpreter's size (asyncio alone,
# with the ssl it loads, is 10 MB), then each group of modules given (a JSON list of lists), printing the size after
# each group.
MEASURE = """
import sys
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))
sizes = [rss()]
import importlib, json
for group in json.loads(sys.argv[1]):
    for module in group:
        importlib.import_module(module)
    sizes.append(rss())
print(json.dumps(sizes))
"""


@dataclass(frozen=True)
class Layer:
    name: str
    total_mb: float  # the process's RSS once this layer and every layer before it are imported
    added_mb: float  # what this layer added on top of the ones before it
    alone_mb: float  # a fresh interpreter that imports only this layer (its floor)


def _sizes(groups: list[tuple[str, ...]]) -> list[float]:
    """A fresh interpreter's RSS before any import, then after each group of modules, in MB."""
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps(groups)],
        capture_output=True,
        text=True,
        timeout=IMPORT_TIMEOUT,
        check=True,
    )
    return [float(x) for x in json.loads(out.stdout.strip().splitlines()[-1])]


def layers() -> list[Layer]:
    """Each layer's share, from one fresh interpreter importing them in order, and its floor from one importing it
    alone (a layer's share is below its floor by what it shares with the layers before it)."""
    totals = _sizes([modules for _, modules in LAYERS[1:]])
    found, before = [], 0.0
    for (name, modules), total in zip(LAYERS, totals, strict=True):
        alone = _sizes([modules])[-1]
        found.append(Layer(name, total, total - before, alone))
        before = total
    return found


async def _bare_worker(address: str, queue: str, polls: int, slots: int, autoscaling: bool) -> None:
    """Temporal's own imports only (no module of ours: `homelab_autoscaler.temporal` would bring the workflows and
    the API models), with the operator's task slots and polls (as `homelab_autoscaler.temporal.pollers` builds them)."""
    from temporalio.client import Client
    from temporalio.worker import PollerBehaviorAutoscaling, PollerBehaviorSimpleMaximum, Worker

    from bench.trivial import OneActivity, noop

    polling = (
        PollerBehaviorAutoscaling(minimum=1, maximum=polls, initial=min(5, polls))
        if autoscaling
        else PollerBehaviorSimpleMaximum(polls)
    )
    client = await Client.connect(address)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    async with Worker(
        client,
        task_queue=queue,
        workflows=[OneActivity],
        activities=[noop],
        max_concurrent_workflow_tasks=slots,
        workflow_task_poller_behavior=polling,
        activity_task_poller_behavior=polling,
    ):
        print("polling", flush=True)
        await stop.wait()


async def _idle_grpc_server() -> None:
    """A grpc.aio server on a loopback port with no service and no client: grpcio's own threads at rest."""
    import grpc

    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    server = grpc.aio.server()
    server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print("serving", flush=True)
    await stop.wait()
    await server.stop(None)


def main(argv: list[str]) -> int:
    if argv == ["grpc"]:
        asyncio.run(_idle_grpc_server())
        return 0
    if len(argv) != 5 or argv[4] not in ("fixed", "autoscaling"):
        print(
            "python -m bench.idle ADDRESS QUEUE POLLS SLOTS fixed|autoscaling: a bare Temporal worker until SIGTERM\n"
            "python -m bench.idle grpc: an idle gRPC server until SIGTERM",
            file=sys.stderr,
        )
        return 2
    address, queue, polls, slots, mode = argv
    asyncio.run(_bare_worker(address, queue, int(polls), int(slots), mode == "autoscaling"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
