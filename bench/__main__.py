"""python -m bench [sizes]: the performance figures of issue 14, each beside a floor taken in the same run.

Starts a Temporal dev server (SQLite file, loopback, free ports) shared by every figure; per figure, the simulated
homelab (in this process, so its store can be timed and its requests counted) and `homelab-autoscaler run` (a
process). Then, the dev server stopped, the bundled stack the install runs (temporal-server on PostgreSQL,
bench/stack.py) as local processes, and on it P5 (the stack at rest), P1 and the P2 burst, each beside its floor on
that server; a machine without the stack's parts says which in one line and runs the dev server's rows only.
Prints a table of measured / floor ratios and the peak RSS of every process, and writes them as JSON.
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

from bench import floors, stack
from bench.figures import Figures, Sizes
from bench.procs import free_port, peak_rss_mb, self_peak_rss_mb
from bench.report import Report, ms, percentile
from homelab_autoscaler.devserver import DevServer
from homelab_autoscaler.temporal import DATA_CONVERTER

# P5 (the idle footprint) first: later figures leave ready claims on the shared server, which would bill its idle.
FIGURES = ("p5", "p1", "p1s", "p2", "p3", "p4")
# On the bundled stack (temporal-server on PostgreSQL), in this order: its idle first, as on the dev server.
ON_POSTGRESQL = ("p5", "p1", "p2")
POSTGRESQL = "PostgreSQL"
STACK_START_TIMEOUT = 600.0


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
    p.add_argument(
        "--postgresql",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also P5, P1 and the P2 burst on the bundled stack (temporal-server on PostgreSQL)",
    )
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
    found = find_stack(args, report)  # before anything starts: what the machine lacks is said at once
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
        assert temporal.process is not None
        report.processes["temporal dev server"] = peak_rss_mb(temporal.process.pid)
    finally:
        temporal.stop()  # before the bundled stack starts: the two servers never share the machine's cores
    if found is not None:
        await on_postgresql(args, found, workdir, sizes, report, figures)
    figures.task_row()
    report.processes["bench (driver, simulated homelab, floor worker)"] = self_peak_rss_mb()
    report.seconds = time.monotonic() - began
    # Other work on the machine moves every figure and floor alike; the ratios hold up better than the times.
    report.notes.append(
        f"load average (1 min) {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end,"
        f" {os.cpu_count()} cores"
    )
    return report


def find_stack(args: argparse.Namespace, report: Report) -> stack.Found | None:
    """The bundled stack's parts when rows on PostgreSQL are asked for; else None, and a note saying why. What the
    machine lacks is one line (the dev server's rows run on); manifests the bench cannot read are a failure."""
    wanted = [name for name in ON_POSTGRESQL if name in args.only.split(",")]
    if not args.postgresql or not wanted:
        report.notes.append(f"no rows on {POSTGRESQL}: " + ("--no-postgresql" if wanted else "--only names none of "
                                                             + ",".join(ON_POSTGRESQL)))  # fmt: skip
        return None
    try:
        return stack.find()
    except stack.Missing as missing:
        line = f"no rows on {POSTGRESQL}: {missing}"
        print(f"bench: {line}", flush=True)
        report.notes.append(line)
    except (OSError, ValueError, KeyError) as err:
        line = f"the rows on {POSTGRESQL} failed: the manifests of deploy/components/temporal could not be read: {err}"
        print(f"bench: {line}", file=sys.stderr, flush=True)
        report.failures.append(line)
    return None


async def on_postgresql(
    args: argparse.Namespace, found: stack.Found, workdir: Path, sizes: Sizes, report: Report, dev: Figures
) -> None:
    """P5, P1 and the P2 burst (those `--only` names) on the bundled stack, rows marked as on PostgreSQL. A failure
    is one line in `report.failures`: the run then ends with code 1, after the dev server's rows are printed and
    written."""
    wanted = [name for name in ON_POSTGRESQL if name in args.only.split(",")]
    print(f"On {POSTGRESQL}: PostgreSQL {found.manifests.postgres_major} (as {found.run_as or 'this user'}), the "
          f"schemas, temporal-server from {found.temporal_bins}, temporal-setup", flush=True)  # fmt: skip
    began = time.monotonic()
    bundled: stack.Stack | None = None
    try:
        bundled = await stack.started(found, workdir, args.keep is not None, STACK_START_TIMEOUT)
        steps = ", ".join(f"{step} {seconds:.1f} s" for step, seconds in bundled.timings.items())
        report.notes.append(
            f"on {POSTGRESQL}: the bundled stack up in {time.monotonic() - began:.0f} s ({steps}); PostgreSQL "
            f"{found.manifests.postgres_major} run as {found.run_as or 'the bench user'}, TLS off"
            + (f", its data kept in {bundled.pgdir}" if args.keep is not None else "")
        )
        client = await Client.connect(bundled.address, data_converter=DATA_CONVERTER)
        figures = Figures(client, bundled.address, workdir, sizes, report, on=POSTGRESQL, server_pids=bundled.pids(),
                          tag="-pg")  # fmt: skip
        async with floors.floor_worker(client):
            for name in wanted:
                figure_began = time.monotonic()
                if name == "p5":
                    await figures.p5_stack(bundled, dev.rest)
                elif name == "p1":
                    await figures.p1()
                else:
                    await figures.p2(two_workers=False)
                print(f"  ({name} on {POSTGRESQL} took {time.monotonic() - figure_began:.0f} s)", flush=True)
        server_pid, _ = bundled.pids()
        report.processes["temporal-server (on PostgreSQL)"] = peak_rss_mb(server_pid)
        _, pg_mb, processes = bundled.memory()
        report.processes[f"postgres ({processes} processes, PSS at the end)"] = pg_mb
        dev.trouble.update(figures.trouble)
        report.notes += side_by_side(dev, figures)
    except Exception as err:  # said in one line; the dev server's rows are still printed
        line = f"the rows on {POSTGRESQL} failed: {type(err).__name__}: {' | '.join(str(err).splitlines())}"
        if args.keep is None:
            line += " (--keep DIR keeps the logs)"
        print(f"bench: {line}", file=sys.stderr, flush=True)
        report.failures.append(line)
    finally:
        if bundled is not None:
            bundled.stop()


def side_by_side(dev: Figures, pg: Figures) -> list[str]:
    """The same figures on the two servers of this run, in one line each."""
    out = []
    if dev.p1_lat and pg.p1_lat and hasattr(dev, "floors_p1") and hasattr(pg, "floors_p1"):
        out.append(
            f"P1 on {POSTGRESQL} vs the dev server: claims p99 {ms(percentile(pg.p1_lat, 99))} vs "
            f"{ms(percentile(dev.p1_lat, 99))}; two-activity floor p99 {ms(percentile(pg.floors_p1[1], 99))} vs "
            f"{ms(percentile(dev.floors_p1[1], 99))}"
        )
    if dev.p2_walls and pg.p2_walls:
        out.append(
            f"P2 on {POSTGRESQL} vs the dev server: burst {ms(pg.p2_walls[1])} vs {ms(dev.p2_walls[1])}; "
            f"one-activity floor {ms(pg.p2_walls[0])} vs {ms(dev.p2_walls[0])}"
        )
    return out


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
    for failure in report.failures:
        print(f"bench: {failure}", file=sys.stderr, flush=True)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
