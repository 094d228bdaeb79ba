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
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from temporalio.client import Client
from temporalio.runtime import Runtime

from activities import KubeActivities
from admission.settings import WebhookSettings
from homelab_autoscaler.commands import COMMANDS, ROLE_SECTIONS, CommandSpec
from homelab_autoscaler.errors import UserError
from homelab_autoscaler.health import API_PING_EVERY, PING_TIMEOUT, HealthServer, Probe, Reachability
from homelab_autoscaler.ports import Port, check_free, free_port, split_address
from homelab_autoscaler.renewal import renew_on_change
from homelab_autoscaler.settings import (
    DevSettings,
    HealthSettings,
    LoggingSettings,
    MetricsSettings,
    NamespaceSettings,
    QueueSettings,
    Settings,
    TemporalSettings,
    WorkerSettings,
)
from homelab_autoscaler.simulator import SimulatedHomelab, check_homelab
from homelab_autoscaler.temporal import (
    adopt_connection,
    build_worker,
    connect,
    connect_at_start,
    missing_search_attributes,
)
from kube.adapter import Kube, config_problem
from kube.settings import KubeSettings
from provider.server import serve as serve_provider
from provider.service import CloudProvider
from provider.settings import ProviderSettings
from watchers.main import build_watchers
from watchers.settings import WatchSettings

log = logging.getLogger("homelab_autoscaler")


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


def setup_logging(settings: LoggingSettings) -> None:
    """One handler on stderr, text or JSON, naming the claim, slot and group a record is about."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ClaimContext())
    if settings.format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s %(context)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.level)
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


async def checked_client(temporal: TemporalSettings, metrics: MetricsSettings | None) -> Client | None:
    """Connect (waiting a while for a Temporal that starts beside us), and refuse to go on when the search attributes
    are missing (a workflow would stall)."""
    client = await connect_at_start(temporal, metrics)
    missing = await missing_search_attributes(client, temporal.namespace)
    if missing:
        hint = "; ".join(
            f"temporal operator search-attribute create --namespace {temporal.namespace} --name {n} "
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
    """What a role is handed: the command's settings, the process's Temporal client and adapter, its stop, its
    health."""

    settings: Settings
    client: Client
    kube: Kube
    stop: asyncio.Event
    health: HealthServer
    temporal: Reachability
    # Called once `client` has a new connection (a renewed certificate): what holds a connection of its own moves.
    reconnected: list[Callable[[], None]] = field(default_factory=list)


async def worker(p: Process) -> None:
    """Every workflow and activity on one task queue, until stop."""
    queue = p.settings.section(QueueSettings)
    tuning = p.settings.section(WorkerSettings)
    built = build_worker(
        p.client,
        KubeActivities(p.kube).all(),
        task_queue=queue.task_queue,
        max_activity_threads=tuning.activity_threads,
        task_pollers=tuning.task_pollers,
        poller_autoscaling=tuning.poller_autoscaling,
        workflow_task_slots=tuning.workflow_task_slots,
        max_cached_workflows=tuning.cached_workflows,
    )
    temporal = p.settings.section(TemporalSettings)
    log.info("worker polling %s on %s (%s)", queue.task_queue, temporal.address, temporal.namespace)

    def move() -> None:
        built.client = p.client  # the Worker's setter takes the client's new connection for its next polls

    p.reconnected.append(move)
    async with built:
        await p.stop.wait()


async def provider(p: Process) -> None:
    """The externalgrpc CloudProvider server, until stop; it answers UNAVAILABLE while Temporal is unreachable."""
    settings = p.settings.section(ProviderSettings)
    built = CloudProvider.build(
        settings,
        p.client,
        p.kube,
        namespaces=p.settings.section(NamespaceSettings).namespaces,
        task_queue=p.settings.section(QueueSettings).task_queue,
        temporal_unreachable=p.temporal.describe,
    )
    built.catalog.watch()  # Groups and slots followed by watches: a loop's reads cost no API request
    try:
        await serve_provider(settings, built, p.stop)
    finally:
        await asyncio.to_thread(built.catalog.close)


async def watch(p: Process) -> None:
    """The watchers and the report writer, until stop; ready once every watch has listed."""
    settings = p.settings.section(WatchSettings)
    runtime = p.client.service_client.config.runtime or Runtime.default()
    watchers = build_watchers(
        settings,
        p.client,
        p.kube,
        namespaces=p.settings.section(NamespaceSettings).namespaces,
        task_queue=p.settings.section(QueueSettings).task_queue,
        meter=runtime.metric_meter,
    )
    p.health.add(Probe("watches", watchers.not_ready))
    p.health.alive = lambda: "" if watchers.alive() else "a watch thread stopped"
    await watchers.run(p.stop, renew_every=settings.lease_renew_seconds)


async def webhook(p: Process) -> None:
    """The NodeClaim admission webhook over HTTPS, until stop; idle when no address is given (the default)."""
    settings = p.settings.section(WebhookSettings)
    if not settings.enabled:
        await p.stop.wait()
        return
    # Here, not at the top: the webhook's server is aiohttp, 9 MB a process without the webhook never needs.
    from admission.server import ReviewMetrics, Webhook
    from admission.server import serve as serve_webhook

    runtime = p.client.service_client.config.runtime or Runtime.default()
    hook = Webhook(p.kube, ReviewMetrics(meter=runtime.metric_meter))
    await serve_webhook(settings, hook, p.stop)


@dataclass(frozen=True)
class Role:
    """A role of the operator: what it runs in a process, and the settings sections it reads besides the
    process's own (`commands.ROLE_SECTIONS`, `commands.PROCESS_SECTIONS`)."""

    name: str
    run: Callable[[Process], Coroutine[Any, Any, None]]

    @property
    def sections(self) -> tuple[str, ...]:
        return ROLE_SECTIONS[self.name]


WORKER = Role("worker", worker)
PROVIDER = Role("provider", provider)
WATCH = Role("watch", watch)
WEBHOOK = Role("webhook", webhook)
_BY_NAME = {role.name: role for role in (WORKER, PROVIDER, WATCH, WEBHOOK)}


@dataclass(frozen=True)
class Command:
    """A subcommand of `commands.COMMANDS` with its roles: what a process of it runs."""

    spec: CommandSpec
    roles: tuple[Role, ...]

    @property
    def help(self) -> str:
        return self.spec.help

    @property
    def sections(self) -> tuple[str, ...]:
        return self.spec.sections


# The table of homelab_autoscaler.commands, each name with the roles it runs.
ROLES: dict[str, Command] = {
    name: Command(spec, tuple(_BY_NAME[role] for role in spec.roles)) for name, spec in COMMANDS.items()
}


def process_ports(settings: Settings, roles: tuple[Role, ...]) -> list[Port]:
    """The ports a process of these roles listens on: health, metrics, the provider's and the webhook's."""
    health = settings.section(HealthSettings)
    ports = [Port(health.host, health.port, "the health endpoints", "--health-port")]
    metrics = settings.section(MetricsSettings)
    if metrics.address and (at := split_address(metrics.address)):
        ports.append(Port(*at, "the Prometheus /metrics endpoint", "--metrics-address"))
    if PROVIDER in roles and (at := split_address(settings.section(ProviderSettings).address)):
        ports.append(Port(*at, "the provider (cluster-autoscaler's endpoint)", "--provider-address"))
    if WEBHOOK in roles and (at := split_address(settings.section(WebhookSettings).address)):
        ports.append(Port(*at, "the NodeClaim admission webhook", "--webhook-address"))
    return ports


def check_kube(kube: KubeSettings) -> None:
    """The kubeconfig (and its context) load, or one line naming the flag: found before anything starts."""
    problem = config_problem(kube)
    if problem:
        raise UserError(problem)


def preflight(command: str, settings: Settings) -> None:
    """What settings validation cannot see and a person can still get wrong, checked before anything starts: the
    kubeconfig and its context, and the ports (`compose` checks them again, for a port taken in between)."""
    check_kube(settings.section(KubeSettings))
    check_free(process_ports(settings, ROLES[command].roles))


async def compose(
    settings: Settings, roles: tuple[Role, ...], stop: asyncio.Event, *, extra: list[Awaitable[Any]] | None = None
) -> int:
    """The one place that connects: a Temporal client and an adapter, the health endpoints with Temporal and the
    API server as readiness probes, then the roles; the first role to fail stops the rest. The ports are checked
    first, so a busy one stops the process before anything binds.
    """
    check_free(process_ports(settings, roles))
    temporal_settings = settings.section(TemporalSettings)
    client = await checked_client(temporal_settings, settings.section(MetricsSettings))
    if client is None:
        return 2
    kube = Kube.for_settings(settings.section(KubeSettings))
    health_settings = settings.section(HealthSettings)
    health = HealthServer(health_settings.host, health_settings.port)
    temporal = Reachability(
        f"Temporal at {temporal_settings.address}",
        lambda: client.service_client.check_health(timeout=timedelta(seconds=PING_TIMEOUT)),
    )
    api = Reachability(
        "the Kubernetes API server", lambda: asyncio.to_thread(kube.ping, PING_TIMEOUT), every=API_PING_EVERY
    )
    health.add(temporal.probe())
    health.add(api.probe())
    process = Process(settings, client, kube, stop, health, temporal)
    port = await health.start()
    log.info("health endpoints on %s:%d (/healthz, /readyz)", health_settings.host, port)
    monitors = [asyncio.create_task(m.run(stop), name=f"ping {m.name}") for m in (temporal, api)]

    async def reconnect() -> None:
        """The renewed certificate in a new connection, and every user of the client moved onto it."""
        fresh = await connect(temporal_settings, settings.section(MetricsSettings))
        adopt_connection(client, fresh)
        for move in process.reconnected:
            move()

    certificate = [f for f in (temporal_settings.tls_cert, temporal_settings.tls_key, temporal_settings.tls_ca) if f]
    if temporal_settings.tls_cert is not None:
        watch = renew_on_change(certificate, reconnect, stop)
        monitors.append(asyncio.create_task(watch, name="Temporal client certificate"))
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(role.run(process)) for role in roles]
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
    return await compose(settings, ROLES[command].roles, stop_on_signals())


# --- dev ---------------------------------------------------------------------------------------------------------
def no_cluster_configured(kube: KubeSettings) -> bool:
    """No API server named, no kubeconfig or context, not in a pod: `dev` then simulates the homelab."""
    return (
        kube.server is None
        and kube.kubeconfig is None
        and kube.context is None
        and "KUBERNETES_SERVICE_HOST" not in os.environ
        and not os.environ.get("KUBECONFIG")
        and not (Path.home() / ".kube" / "config").exists()
    )


def dev_ports(settings: Settings, simulate: bool) -> list[Port]:
    """Every port `dev` listens on: the embedded Temporal server and its UI, the emulator, then `run`'s."""
    dev = settings.section(DevSettings)
    ports = [
        Port(dev.temporal_ip, dev.temporal_port, "the embedded Temporal server", "--temporal-port"),
        Port(dev.temporal_ip, dev.ui_port, "the Temporal Web UI", "--ui-port"),
    ]
    if simulate:
        ports.append(Port("127.0.0.1", dev.kube_port, "the simulated homelab's API server", "--kube-port"))
    return ports + process_ports(settings, ROLES["run"].roles)


def dev_preflight(settings: Settings) -> bool:
    """Everything a person can get wrong in `dev` (the cluster to use, the homelab file, the `temporal` binary, a
    busy port), checked before anything is started or deleted, so a second `dev` beside a running one leaves the
    first untouched. Whether it simulates the homelab."""
    from homelab_autoscaler.devserver import temporal_binary

    dev = settings.section(DevSettings)
    kube_settings = settings.section(KubeSettings)
    if dev.simulate and (kube_settings.server or kube_settings.kubeconfig or kube_settings.context):
        raise UserError("--simulate serves its own API server: drop --kube-server, --kubeconfig and --kube-context")
    simulate = dev.simulate or no_cluster_configured(kube_settings)
    if not simulate:
        check_kube(kube_settings)
    if simulate or dev.homelab is not None:
        check_homelab(dev.homelab)
    try:
        temporal_binary()
    except FileNotFoundError as err:
        raise UserError(str(err)) from None
    check_free(dev_ports(settings, simulate))
    return simulate


async def dev_role(settings: Settings, simulate: bool) -> int:
    """The embedded Temporal server (and the simulated homelab), then `run`; everything stops on SIGTERM.

    `dev_preflight` has checked what a person can get wrong and decided `simulate`."""
    from homelab_autoscaler.demo import demo_task
    from homelab_autoscaler.devserver import DevServer, state_dir

    dev = settings.section(DevSettings)
    kube_settings = settings.section(KubeSettings)
    stop = stop_on_signals()
    logs = state_dir()
    logs.mkdir(parents=True, exist_ok=True)
    db_file = dev.temporal_db
    if simulate and db_file is None:
        # The simulated homelab lives in memory: claims persisted from an earlier run would describe machines
        # this one does not have. A simulation starts from an empty Temporal database of its own.
        db_file = logs / "temporal-simulated.db"
        for stale in (db_file, db_file.with_name(db_file.name + "-wal"), db_file.with_name(db_file.name + "-shm")):
            stale.unlink(missing_ok=True)
    server = DevServer(
        ip=dev.temporal_ip,
        port=dev.temporal_port,
        ui_port=dev.ui_port,
        db_file=db_file,
        log_file=logs / "temporal-dev-server.log",
    )
    print(f"starting the embedded Temporal server on {server.address} (log: {logs / 'temporal-dev-server.log'})",
          flush=True)  # fmt: skip
    await asyncio.to_thread(server.start)
    lab: SimulatedHomelab | None = None
    try:
        temporal = TemporalSettings(address=server.address)
        updates: dict[str, Any] = {"temporal": temporal}
        if simulate:
            lab = SimulatedHomelab(dev.homelab, dev.kube_port or free_port(), dev.time_scale, logs / "homelab.log")
            await asyncio.to_thread(lab.start)
            updates["kube"] = kube_settings.model_copy(update={"server": lab.url})
            shown = dev.homelab.name if dev.homelab else "the default homelab"
            print(f"simulated homelab ({shown}) served at {lab.url}; look at it with:", flush=True)
            print(f"  KUBECONFIG=/dev/null kubectl --server {lab.url} get nodes.infra.homecluster.dev,nodeclaims -A",
                  flush=True)  # fmt: skip
        run_settings = settings.model_copy(update=updates)
        provider_address = settings.section(ProviderSettings).address
        print(f"Temporal Web UI: {server.ui_url}/namespaces/{temporal.namespace}/workflows", flush=True)
        print(f"cluster-autoscaler's endpoint (externalgrpc): {provider_address}", flush=True)
        extra: list[Awaitable[Any]] = []
        if dev.demo:
            client = await connect(temporal)
            extra.append(
                demo_task(client, provider_address, server.ui_url, temporal.namespace, lab.url if lab else None)
            )
        return await compose(run_settings, ROLES["run"].roles, stop, extra=extra)
    finally:
        if lab is not None:
            await asyncio.to_thread(lab.stop)
        await asyncio.to_thread(server.stop)
