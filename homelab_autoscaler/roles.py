"""The composition root: the one module that connects to Temporal and Kubernetes and hands the roles what they
need (`Process`), and `dev`, which adds the embedded Temporal server and the simulated homelab.

Each role takes the process's client and adapter, one stop event and the health server, so a SIGTERM stops every
role and then the process, in that order, with nothing left running; `/readyz` fails while Temporal or the API
server cannot be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar, cast

from pydantic import Field
from temporalio.client import Client

from activities import KubeActivities
from homelab_autoscaler.health import PING_TIMEOUT, HealthServer, Probe, Reachability
from homelab_autoscaler.settings import Settings
from homelab_autoscaler.temporal import build_worker, connect, missing_search_attributes
from kube.adapter import Kube
from provider.server import serve as serve_provider
from provider.service import CloudProvider
from provider.settings import ProviderSettings
from watchers.main import build_watchers
from watchers.settings import WatchSettings

log = logging.getLogger("homelab_autoscaler")

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_HOMELAB = ROOT / "deploy" / "examples" / "homelab.yaml"


class RunSettings(ProviderSettings, WatchSettings):
    """`run`: the worker, the provider and the watchers in one process (the homelab default)."""


class DevSettings(RunSettings):
    """`dev`: an embedded Temporal dev server with its Web UI, then everything of `run`."""

    temporal_ip: str = Field("127.0.0.1", description="address the embedded Temporal server binds")
    temporal_port: int = Field(7233, ge=1, le=65535, description="frontend port of the embedded Temporal server")
    ui_port: int = Field(8233, ge=1, le=65535, description="port of the Temporal Web UI")
    temporal_db: Path | None = Field(None, description="SQLite file of the embedded server (default: state dir)")
    simulate: bool = Field(False, description="serve an emulated API server with the simulated homelab")
    homelab: Path = Field(DEFAULT_HOMELAB, description="the simulated homelab's YAML file")
    kube_port: int = Field(8001, ge=0, le=65535, description="port of the emulated API server (with --simulate)")
    time_scale: float = Field(1.0, ge=0, description="multiply the simulated machines' delays (0: instant)")
    demo: bool = Field(False, description="run the scripted demo once everything is up")


# --- logging -----------------------------------------------------------------------------------------------
class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the claim, slot and group (and Temporal's ids) when a record has them."""

    KEYS = ("claim", "slot", "group", "temporal_workflow", "temporal_activity")

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in self.KEYS:
            value = getattr(record, key, None)
            if value is not None:
                doc[key] = value
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class ClaimContext(logging.Filter):
    """Name the claim, slot and group on a record from the Temporal workflow it came from (workflow ids say them)."""

    PREFIXES: ClassVar[dict[str, str]] = {"nodeclaim": "claim", "group": "group", "release": "slot"}

    def filter(self, record: logging.LogRecord) -> bool:
        info = getattr(record, "temporal_workflow", None) or getattr(record, "temporal_activity", None) or {}
        kind, _, rest = str(info.get("workflow_id", "")).partition("/")
        field = self.PREFIXES.get(kind)
        if field and not hasattr(record, field):
            setattr(record, field, rest.rpartition("/")[2])
        record.context = " ".join(
            f"{k}={getattr(record, k)}" for k in ("group", "slot", "claim") if getattr(record, k, None)
        )
        return True


def setup_logging(settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ClaimContext())
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s %(context)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)
    # The emulated API server's access log would drown the operator's own lines.
    logging.getLogger("aiohttp.access").setLevel(max(logging.WARNING, root.level))


# --- the pieces ----------------------------------------------------------------------------------------------
def stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    return stop


async def checked_client(settings: Settings) -> Client | None:
    """Connect, and refuse to go on when the search attributes are missing (a workflow would stall)."""
    client = await connect(settings)
    missing = await missing_search_attributes(client, settings.temporal_namespace)
    if missing:
        hint = "; ".join(
            f"temporal operator search-attribute create --namespace {settings.temporal_namespace} --name {n} "
            f"--type {'Int' if n == 'ClaimAttempt' else 'Keyword'}"
            for n in missing
        )
        print(
            f"homelab-autoscaler: search attributes missing on Temporal: {', '.join(missing)}. Add them: {hint}",
            file=sys.stderr,
        )
        return None
    return client


# --- the roles: each takes what the composition hands it, and never connects on its own -----------------------
@dataclass
class Process:
    """What a role is handed: the settings, the process's Temporal client and adapter, its stop, its health."""

    settings: Settings
    client: Client
    kube: Kube
    stop: asyncio.Event
    health: HealthServer
    temporal: Reachability


async def worker(p: Process) -> None:
    """Every workflow and activity on one task queue, until stop."""
    built = build_worker(
        p.client,
        KubeActivities(p.kube).all(),
        task_queue=p.settings.task_queue,
        max_activity_threads=p.settings.activity_threads,
    )
    settings = p.settings
    log.info(
        "worker polling %s on %s (%s)", settings.task_queue, settings.temporal_address, settings.temporal_namespace
    )
    async with built:
        await p.stop.wait()


async def provider(p: Process) -> None:
    """The externalgrpc CloudProvider server, until stop; it answers UNAVAILABLE while Temporal is unreachable."""
    settings = cast(ProviderSettings, p.settings)
    built = CloudProvider.build(settings, p.client, p.kube, temporal_unreachable=p.temporal.describe)
    await serve_provider(settings, built, p.stop)


async def watch(p: Process) -> None:
    """The watchers and the report writer, until stop; ready once every watch has listed."""
    settings = cast(WatchSettings, p.settings)
    watchers = build_watchers(settings, p.client, p.kube)
    p.health.add(Probe("watches", watchers.not_ready))
    p.health.alive = lambda: "" if watchers.alive() else "a watch thread stopped"
    await watchers.run(p.stop, renew_every=settings.lease_renew_seconds)


Role = Callable[[Process], Coroutine[Any, Any, None]]
# The roles each command runs in one process (run is the homelab default: all three on one client).
ROLES: dict[str, tuple[Role, ...]] = {
    "worker": (worker,),
    "provider": (provider,),
    "watch": (watch,),
    "run": (worker, provider, watch),
}


async def compose(
    settings: Settings, roles: tuple[Role, ...], stop: asyncio.Event, *, extra: list[Awaitable[Any]] | None = None
) -> int:
    """The one place that connects: a Temporal client and an adapter, the health endpoints with Temporal and the
    API server as readiness probes, then the roles; the first role to fail stops the rest.
    """
    client = await checked_client(settings)
    if client is None:
        return 2
    kube = Kube.for_settings(settings)
    health = HealthServer(settings.health_host, settings.health_port)
    temporal = Reachability(
        f"Temporal at {settings.temporal_address}",
        lambda: client.service_client.check_health(timeout=timedelta(seconds=PING_TIMEOUT)),
    )
    api = Reachability("the Kubernetes API server", lambda: asyncio.to_thread(kube.ping, PING_TIMEOUT))
    health.add(temporal.probe())
    health.add(api.probe())
    process = Process(settings, client, kube, stop, health, temporal)
    port = await health.start()
    log.info("health endpoints on %s:%d (/healthz, /readyz)", settings.health_host, port)
    monitors = [asyncio.create_task(m.run(stop), name=f"ping {m.name}") for m in (temporal, api)]
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(role(process)) for role in roles]
    tasks += [asyncio.ensure_future(e) for e in extra or []]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failed = [t for t in done if not t.cancelled() and t.exception() is not None]
        for task in failed:
            log.error("a role stopped: %s", task.exception())
        return 1 if failed else 0
    finally:
        stop.set()
        for task in [*tasks, *monitors]:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, *monitors, return_exceptions=True)
        await health.stop()
        kube.close()


async def run_command(command: str, settings: Settings) -> int:
    """`worker`, `provider`, `watch` or `run`: its roles in this process until SIGINT/SIGTERM."""
    return await compose(settings, ROLES[command], stop_on_signals())


# --- dev ---------------------------------------------------------------------------------------------------------
def no_cluster_configured(settings: Settings) -> bool:
    """No API server named, no kubeconfig, not in a pod: `dev` then simulates the homelab."""
    import os

    return (
        settings.kube_server is None
        and settings.kubeconfig is None
        and "KUBERNETES_SERVICE_HOST" not in os.environ
        and not os.environ.get("KUBECONFIG")
        and not (Path.home() / ".kube" / "config").exists()
    )


async def dev_role(settings: DevSettings) -> int:
    """The embedded Temporal server (and the simulated homelab), then `run`; everything stops on SIGTERM."""
    from homelab_autoscaler.demo import demo_task
    from homelab_autoscaler.devserver import DevServer, state_dir
    from homelab_autoscaler.sim.homelab import HomelabServer
    from homelab_autoscaler.sim.homelab_spec import load_homelab_spec

    stop = stop_on_signals()
    logs = state_dir()
    logs.mkdir(parents=True, exist_ok=True)
    simulate = settings.simulate or no_cluster_configured(settings)
    db_file = settings.temporal_db
    if simulate and db_file is None:
        # The simulated homelab lives in memory: claims persisted from an earlier run would describe machines
        # this one does not have. A simulation starts from an empty Temporal database of its own.
        db_file = logs / "temporal-simulated.db"
        for stale in (db_file, db_file.with_name(db_file.name + "-wal"), db_file.with_name(db_file.name + "-shm")):
            stale.unlink(missing_ok=True)
    server = DevServer(
        ip=settings.temporal_ip,
        port=settings.temporal_port,
        ui_port=settings.ui_port,
        db_file=db_file,
        log_file=logs / "temporal-dev-server.log",
    )
    print(f"starting the embedded Temporal server on {server.address} (log: {logs / 'temporal-dev-server.log'})",
          flush=True)  # fmt: skip
    await asyncio.to_thread(server.start)
    lab: HomelabServer | None = None
    try:
        updates: dict[str, Any] = {"temporal_address": server.address}
        if simulate:
            spec = load_homelab_spec(settings.homelab)
            lab = HomelabServer(spec, port=settings.kube_port, time_scale=settings.time_scale)
            await asyncio.to_thread(lab.start)
            updates["kube_server"] = lab.url
            print(f"simulated homelab ({settings.homelab.name}) served at {lab.url}; look at it with:", flush=True)
            print(f"  KUBECONFIG=/dev/null kubectl --server {lab.url} get nodes.infra.homecluster.dev,nodeclaims -A",
                  flush=True)  # fmt: skip
        run_settings = settings.model_copy(update=updates)
        print(f"Temporal Web UI: {server.ui_url}/namespaces/{settings.temporal_namespace}/workflows", flush=True)
        print(f"cluster-autoscaler's endpoint (externalgrpc): {settings.provider_address}", flush=True)
        extra: list[Awaitable[Any]] = []
        if settings.demo:
            client = await connect(run_settings)
            extra.append(demo_task(client, settings.provider_address, server.ui_url, settings.temporal_namespace))
        return await compose(run_settings, ROLES["run"], stop, extra=extra)
    finally:
        if lab is not None:
            await asyncio.to_thread(lab.stop)
        await asyncio.to_thread(server.stop)
