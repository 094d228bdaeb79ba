"""The one console script, `homelab-autoscaler`; each subcommand is a role of the operator."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Any

from pydantic import ValidationError

from homelab_autoscaler.settings import Settings

log = logging.getLogger("homelab_autoscaler")

MISSING = {
    "run": "worker + provider + watchers in one process (issue 7)",
    "provider": "the externalgrpc CloudProvider server (issue 6)",
    "watch": "the watchers and report writer (issue 5)",
    "dev": "embedded Temporal dev server plus `run` (issue 7)",
}


def _settings(args: argparse.Namespace) -> Settings:
    given: dict[str, Any] = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    return Settings(**given)


async def _worker(settings: Settings) -> int:
    from activities import KubeActivities
    from homelab_autoscaler.temporal import build_worker, connect, missing_search_attributes
    from kube.adapter import Kube

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
        return 2
    kube = Kube.connect(
        server=settings.kube_server,
        kubeconfig=str(settings.kubeconfig) if settings.kubeconfig else None,
        context=settings.kube_context,
        timeout=settings.kube_timeout_seconds,
    )
    worker = build_worker(
        client,
        KubeActivities(kube).all(),
        task_queue=settings.task_queue,
        max_activity_threads=settings.activity_threads,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "worker polling %s on %s (%s)", settings.task_queue, settings.temporal_address, settings.temporal_namespace
    )
    async with worker:
        await stop.wait()
    kube.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the subcommand and its settings; a bad setting stops the process with one clear line."""
    parser = argparse.ArgumentParser(prog="homelab-autoscaler")
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("worker", help="the Temporal worker: every workflow and activity on one task queue")
    worker.add_argument("--temporal-address", dest="temporal_address")
    worker.add_argument("--temporal-namespace", dest="temporal_namespace")
    worker.add_argument("--task-queue", dest="task_queue")
    worker.add_argument("--kube-server", dest="kube_server")
    worker.add_argument("--kubeconfig", dest="kubeconfig")
    worker.add_argument("--kube-context", dest="kube_context")
    worker.add_argument("--log-level", dest="log_level")
    worker.add_argument("--metrics-address", dest="metrics_address")
    for name, what in MISSING.items():
        p = sub.add_parser(name, help=what)
        p.add_argument("--simulate", action="store_true", help="use the simulated homelab")
    args = parser.parse_args(argv)
    if args.command in MISSING:
        print(
            f"homelab-autoscaler {args.command}: not built yet — {MISSING[args.command]}. "
            "`homelab-autoscaler worker` runs today; see the open issues for the rest.",
            file=sys.stderr,
        )
        return 2
    try:
        settings = _settings(args)
    except ValidationError as err:
        first = err.errors()[0]
        print(f"homelab-autoscaler: bad setting {'.'.join(map(str, first['loc']))}: {first['msg']}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return asyncio.run(_worker(settings))


if __name__ == "__main__":
    sys.exit(main())
