"""python -m bench [sizes]: the performance figures of issue 14, each beside a floor taken in the same run.

Starts a Temporal dev server (SQLite file, loopback, free ports) shared by every figure; per figure, the simulated
homelab (in this process, so its store can be timed and its requests counted) and `homelab-autoscaler run` (a
process). Prints a table of measured / floor ratios and the peak RSS of every process, and writes them as JSON.
A benchmark, not a test: nothing here judges the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from temporalio.client import Client

from bench import floors
from bench.figures import Figures, Sizes
from bench.procs import free_port, peak_rss_mb, self_peak_rss_mb
from bench.report import Report
from homelab_autoscaler.devserver import DevServer
from homelab_autoscaler.temporal import DATA_CONVERTER

# P5 (the idle footprint) first: later figures leave ready claims on the shared server, which would bill its idle.
FIGURES = ("p5", "p1", "p1s", "p2", "p3", "p4")


def parse(argv: list[str] | None) -> argparse.Namespace:
    d = Sizes()
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--p1-claims", type=int, default=d.p1_claims, help="P1: claims in flight (issue: 200)")
    p.add_argument("--p2-slots", type=int, default=d.p2_slots, help="P2: slots in the burst, over 10 groups (1000)")
    p.add_argument("--p3-groups", type=int, default=d.p3_groups, help="P3: groups (issue: 10)")
    p.add_argument("--p3-slots", type=int, default=d.p3_slots, help="P3: slots per group (issue: 100)")
    p.add_argument("--p3-calls", type=int, default=d.p3_calls, help="P3: calls of each method (issue: 500)")
    p.add_argument("--idle-seconds", type=float, default=d.idle_seconds, help="P4: idle window, reported per minute")
    p.add_argument("--p1-boot-spread", default="20,80", help="P1 staggered: kubelets up LOW,HIGH s after their Job")
    p.add_argument("--p5-slots", default="3,100", help="P5: slot counts whose idle footprint is measured")
    p.add_argument(
        "--p5-goal-seconds", type=float, default=d.p5_goal_seconds, help="P5: the idle window at the fewest slots"
    )
    p.add_argument("--only", default=",".join(FIGURES), help=f"comma-separated subset of {','.join(FIGURES)}")
    p.add_argument("--json", type=Path, default=Path("bench-results.json"), help="where to write the results")
    p.add_argument("--keep", type=Path, default=None, help="keep logs and the Temporal database in this directory")
    args = p.parse_args(argv)
    unknown = set(args.only.split(",")) - set(FIGURES)
    if unknown:
        p.error(f"--only: unknown figures {sorted(unknown)}")
    try:
        args.p5_slots = tuple(int(x) for x in args.p5_slots.split(",") if x)
        low, high = (float(x) for x in args.p1_boot_spread.split(","))
    except ValueError:
        p.error("--p5-slots takes whole numbers (3,100); --p1-boot-spread two seconds (20,80)")
    if not args.p5_slots or min(args.p5_slots) < 1 or not 0 <= low <= high:
        p.error("--p5-slots: at least one count of 1 or more; --p1-boot-spread: 0 <= LOW <= HIGH")
    if args.p5_goal_seconds <= 0:
        p.error("--p5-goal-seconds: a window of more than 0 seconds")
    args.p1_boot_spread = (low, high)
    return args


async def run(args: argparse.Namespace, workdir: Path) -> Report:
    # SIGTERM (or Ctrl-C) cancels the run, so every `finally` stops the processes it started.
    task = asyncio.current_task()
    assert task is not None
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, task.cancel)
    sizes = Sizes(
        args.p1_claims, args.p2_slots, args.p3_groups, args.p3_slots, args.p3_calls, args.idle_seconds,
        p1_boot_spread=args.p1_boot_spread, p5_slots=args.p5_slots, p5_goal_seconds=args.p5_goal_seconds,
    )  # fmt: skip
    report = Report(sizes=vars(sizes) | {"cpus": os.cpu_count()})
    began = time.monotonic()
    load_before = os.getloadavg()[0]
    temporal = DevServer(
        port=free_port(),
        ui_port=free_port(),
        db_file=workdir / "temporal.db",
        headless=True,
        log_file=workdir / "temporal.log",
    )
    temporal.start()
    try:
        client = await Client.connect(temporal.address, data_converter=DATA_CONVERTER)
        assert temporal.process is not None
        figures = Figures(client, temporal.address, workdir, sizes, report, temporal.process.pid)
        async with floors.floor_worker(client):
            for name in FIGURES:
                if name in args.only.split(","):
                    figure_began = time.monotonic()
                    await getattr(figures, name)()
                    print(f"  ({name} took {time.monotonic() - figure_began:.0f} s)", flush=True)
        figures.task_row()
        assert temporal.process is not None
        report.processes["temporal dev server"] = peak_rss_mb(temporal.process.pid)
    finally:
        temporal.stop()
    report.processes["bench (driver, simulated homelab, floor worker)"] = self_peak_rss_mb()
    report.seconds = time.monotonic() - began
    # Other work on the machine moves every figure and floor alike; the ratios hold up better than the times.
    report.notes.append(
        f"load average (1 min) {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end,"
        f" {os.cpu_count()} cores"
    )
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        report = asyncio.run(run(args, args.keep))
    else:
        with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
            report = asyncio.run(run(args, Path(tmp)))
    print(f"\nbench: {report.seconds:.0f} s on {os.cpu_count()} cores\n", flush=True)
    print(report.table(), flush=True)
    report.write(args.json)
    print(f"\nwritten {args.json}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
