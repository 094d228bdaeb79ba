"""Processes of a bench run: free loopback ports, bounded waits that name what they waited for, stop by PID, and
peak resident memory read from /proc."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return 0


async def wait_until(check: Callable[[], bool], *, timeout: float, what: str, every: float = 0.1) -> float:
    """Poll `check` until true; the seconds it took. Raises TimeoutError naming `what` past `timeout`."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if check():
            return time.monotonic() - began
        await asyncio.sleep(every)
    raise TimeoutError(f"waited {timeout:.0f} s for {what}")


async def bounded(aw: Awaitable[T], *, timeout: float, what: str) -> T:
    try:
        return await asyncio.wait_for(aw, timeout)
    except TimeoutError:
        raise TimeoutError(f"waited {timeout:.0f} s for {what}") from None


def _status_kb(pid: int, key: str) -> int:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc/<pid>/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
    return found


def peak_rss_mb(pid: int) -> float:
    """Peak resident set (VmHWM) of a process and its descendants, summed, in MB."""
    return sum(_status_kb(p, "VmHWM") for p in _tree(pid)) / 1024


def cpu_seconds(pid: int, *, reaped: bool = False) -> float:
    """User and system CPU seconds a process and its descendants have used so far (from /proc/<pid>/stat). With
    `reaped`, also those of descendants that have exited and been waited for (a server that forks short-lived
    workers, as PostgreSQL's autovacuum: their time moves to the parent's cutime/cstime when they end)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for p in _tree(pid):
        with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{p}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat(5))
            if reaped:
                total += int(fields[13]) + int(fields[14])  # cutime, cstime (16 and 17): children waited for
    return total / ticks


def pss_mb(pid: int) -> tuple[float, int]:
    """Proportional set size of a process and its descendants, summed, in MB, and how many processes: the memory
    of a server whose processes share most of it (PostgreSQL's shared buffers are in every backend's RSS; PSS
    counts each shared page once over the processes that map it)."""
    tree = _tree(pid)
    kb = 0
    for p in tree:
        with contextlib.suppress(OSError, IndexError, ValueError), open(f"/proc/{p}/smaps_rollup") as f:
            kb += next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
    return kb / 1024, len(tree)


# What a thread's name (its comm) says it is: Temporal's Rust runtime names its threads tokio-*, gRPC's C core its
# own; every Python thread keeps the interpreter's name (Python does not name OS threads).
THREAD_KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Temporal's runtime", ("tokio",)),
    ("the provider's gRPC server", ("event_engine", "grpc", "lifeguard", "default-executo", "resolver-execut")),
)
PYTHON_THREADS = "Python (the event loop, the watch and activity threads)"


def thread_cpu_ticks(pid: int) -> dict[str, int]:
    """Clock ticks each kind of thread of `pid` has used so far (THREAD_KINDS; the rest are Python's)."""
    out: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            kind = next((k for k, prefixes in THREAD_KINDS if comm.startswith(prefixes)), PYTHON_THREADS)
            out[kind] = out.get(kind, 0) + int(fields[11]) + int(fields[12])
    return out


def rss_mb(pid: int) -> float:
    return sum(_status_kb(p, "VmRSS") for p in _tree(pid)) / 1024


def self_cpu_seconds() -> float:
    """User and system CPU seconds of this process (the bench: its driver, the simulated homelab, the floor worker)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def self_peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class Proc:
    """A child process with its output in `log`, in its own session; stopped by PID (SIGTERM, then SIGKILL)."""

    name: str
    args: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    popen: subprocess.Popen[bytes] | None = None
    peak_mb: float = 0.0
    user: str | None = None  # run as this user (and its group only): a server that refuses root, as PostgreSQL
    stop_signal: int = signal.SIGTERM  # what asks it to stop (PostgreSQL's fast shutdown is SIGINT)
    cwd: Path = ROOT

    def start(self) -> Proc:
        who = pwd.getpwnam(self.user) if self.user is not None else None
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.args,
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,
                user=who.pw_uid if who else None,
                group=who.pw_gid if who else None,
                extra_groups=[] if who else None,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, chars: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-chars:]
        return ""

    def stop(self) -> None:
        proc = self.popen
        if proc is None or proc.poll() is not None:
            return
        self.peak_mb = max(self.peak_mb, peak_rss_mb(proc.pid))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, self.stop_signal)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(15)
