"""The operator's roles as coroutines, and `run`/`dev`, which compose them in one process.

Each role takes the process's Temporal client and Kubernetes adapter when composed, and one stop event, so a
SIGTERM stops every role and then the process, in that order, with nothing left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field
from temporalio.client import Client

from activities import KubeActivities
from homelab_autoscaler.settings import Settings
from homelab_autoscaler.temporal import build_worker, connect, missing_search_attributes
from kube.adapter import Kube
from provider.server import serve as serve_provider
from provider.settings import ProviderSettings
from watchers.main import run_watch
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


async def run_worker(settings: Settings, client: Client, kube: Kube, stop: asyncio.Event) -> None:
    worker = build_worker(
        client,
        KubeActivities(kube).all(),
        task_queue=settings.task_queue,
        max_activity_threads=settings.activity_threads,
    )
    log.info(
        "worker polling %s on %s (%s)", settings.task_queue, settings.temporal_address, settings.temporal_namespace
    )
    async with worker:
        await stop.wait()


async def worker_role(settings: Settings) -> int:
    client = await checked_client(settings)
    if client is None:
        return 2
    kube = Kube.for_settings(settings)
    try:
        await run_worker(settings, client, kube, stop_on_signals())
    finally:
        kube.close()
    return 0


async def run_all(settings: RunSettings, stop: asyncio.Event, *, extra: list[Awaitable[Any]] | None = None) -> int:
    """Worker, provider and watchers on one client and one adapter; the first role to fail stops the rest."""
    client = await checked_client(settings)
    if client is None:
        return 2
    kube = Kube.for_settings(settings)
    roles = [
        asyncio.create_task(run_worker(settings, client, kube, stop), name="worker"),
        asyncio.create_task(serve_provider(settings, client=client, kube=kube, stop=stop), name="provider"),
        asyncio.create_task(run_watch(settings, client=client, kube=kube, stop=stop), name="watch"),
        *(asyncio.ensure_future(e) for e in extra or []),
    ]
    try:
        done, _ = await asyncio.wait(roles, return_when=asyncio.FIRST_EXCEPTION)
        failed = [t for t in done if not t.cancelled() and t.exception() is not None]
        for task in failed:
            log.error("%s stopped: %s", task.get_name(), task.exception())
        return 1 if failed else 0
    finally:
        stop.set()
        for task in roles:
            if not task.done():
                task.cancel()
        await asyncio.gather(*roles, return_exceptions=True)
        kube.close()


async def run_role(settings: RunSettings) -> int:
    return await run_all(settings, stop_on_signals())


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
        return await run_all(run_settings, stop, extra=extra)
    finally:
        if lab is not None:
            await asyncio.to_thread(lab.stop)
        await asyncio.to_thread(server.stop)
