"""Real processes for end-to-end tests: started on free loopback ports, stopped by PID, every wait bounded."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    """A loopback port nothing listens on, kept from the kernel's other callers for a minute.

    A port bound to 0 and closed is free for anyone: another pytest-xdist worker's `free_port`, or an outgoing
    connection, could be handed it before this test's server binds it. So the port is left in TIME_WAIT (a
    connection to it, closed from the listening side first): for TIME_WAIT's 60 s the kernel gives it to no
    bind(0) and no connect(), while a server binding it by number with SO_REUSEADDR (Go's, asyncio's, grpc's,
    Python's http.server, Rust's: every server the tests start) takes it at once.
    """
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the TIME_WAIT socket inherits it
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = int(listener.getsockname()[1])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the listening side closes first: its end is the one left in TIME_WAIT
            client.recv(1)  # its FIN has arrived
    return port


def wait_for(check: Callable[[], bool], *, timeout: float, what: str, every: float = 0.1) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return
        time.sleep(every)
    raise AssertionError(f"{what}: not true within {timeout:.0f} s")


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


def readyz(port: int) -> int:
    """The HTTP status of a role's /readyz on 127.0.0.1:`port`; 0 when nothing answers (the process is down)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=3) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return 0


@contextlib.contextmanager
def process(args: list[str], *, log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Run a process with its output in `log`; on exit stop it with SIGTERM (then SIGKILL after 10 s)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
