"""The simulated homelab of `dev --simulate`, run as its own process: the product never imports `homelab_sim`.

The simulator is a separate distribution (sim/, the `sim` extra) that a production install does not have; `dev`
finds it without importing it, asks it to check the homelab file before anything is started or deleted, then
serves it on its port and stops it, by PID, when `dev` stops.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from homelab_autoscaler.errors import UserError

EXAMPLE = "deploy/examples/homelab.yaml is an example"
CHECK_TIMEOUT = 60.0
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0


def command(homelab: Path | None, *args: str) -> list[str]:
    """`python -m homelab_sim` with the homelab file (its own default when None) and more arguments."""
    if importlib.util.find_spec("homelab_sim") is None:
        raise UserError(
            "--simulate needs the simulated homelab, a separate distribution: "
            "pip install -e '.[sim]' -e ./sim from a clone (make run does)"
        )
    return [sys.executable, "-m", "homelab_sim", *(["--homelab", str(homelab)] if homelab else []), *args]


def check_homelab(homelab: Path | None) -> None:
    """Read the homelab file in the simulator, or raise one line naming the file, line or field, and the fix."""
    try:
        done = subprocess.run(
            command(homelab, "--check"), capture_output=True, text=True, timeout=CHECK_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        raise UserError(f"the simulated homelab did not check {homelab} within {CHECK_TIMEOUT:.0f} s") from None
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        said = lines[-1].removeprefix("error: ") if lines else f"exit code {done.returncode}"
        raise UserError(f"--homelab {said} ({EXAMPLE})")


class SimulatedHomelab:
    """`python -m homelab_sim` serving the emulated API server on 127.0.0.1:port, its output in a log file."""

    def __init__(self, homelab: Path | None, port: int, time_scale: float, log_file: Path) -> None:
        self.homelab, self.port, self.time_scale, self.log_file = homelab, port, time_scale, log_file
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start it and wait until its API answers `/version`; a process that exits first is said in one line."""
        args = command(self.homelab, "--port", str(self.port), "--time-scale", str(self.time_scale))
        with self.log_file.open("ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise UserError(f"the simulated homelab exited with code {self.proc.returncode}: see {self.log_file}")
            try:
                with urllib.request.urlopen(f"{self.url}/version", timeout=2) as resp:
                    json.load(resp)
                return
            except (OSError, urllib.error.URLError, ValueError):
                time.sleep(0.1)
        self.stop()
        raise UserError(f"the simulated homelab did not serve {self.url}/version within {START_TIMEOUT:.0f} s")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL when it has not stopped within STOP_TIMEOUT."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(STOP_TIMEOUT)
