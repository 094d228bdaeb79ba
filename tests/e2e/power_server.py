"""The e2e homelab's power switch: an HTTP server on the host that powers kind worker "machines" off and on
by stopping and starting their node containers.

    python -m tests.e2e.power_server --port 9052 --machine homelab-e2e-worker --machine homelab-e2e-worker2

    POST /machines/<name>/on    docker start <name>; 200 once the container runs
    POST /machines/<name>/off   docker stop <name>;  200 once it has stopped
    GET  /machines/<name>       {"machine": name, "power": "on" | "off"}
    GET  /log                   every power request served, in order (what the e2e test asserts on)

Only the machines named on the command line can be switched, so a typo in a slot's pod spec can never stop
the control plane. Every answer is JSON; any failure is a 4xx/5xx, so `curl -f` in a power Job fails the Job.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("power_server")

DOCKER_TIMEOUT = 60.0


class Machines:
    """The switchable machines and a log of what was asked; one lock, so two Jobs never race one container."""

    def __init__(self, names: Sequence[str], docker: str = "docker") -> None:
        self.names = frozenset(names)
        self.docker = docker
        self.lock = threading.Lock()
        self.log: list[dict[str, Any]] = []

    def power(self, name: str) -> str:
        out = subprocess.run(
            [self.docker, "inspect", "--format", "{{.State.Running}}", name],
            capture_output=True, text=True, timeout=DOCKER_TIMEOUT, check=True,
        )  # fmt: skip
        return "on" if out.stdout.strip() == "true" else "off"

    def switch(self, name: str, to: str) -> None:
        verb = "start" if to == "on" else "stop"
        with self.lock:
            self.log.append({"at": datetime.now(UTC).isoformat(), "machine": name, "power": to})
            subprocess.run(
                [self.docker, verb, name], capture_output=True, text=True, timeout=DOCKER_TIMEOUT, check=True
            )
            if self.power(name) != to:
                raise RuntimeError(f"{name} is still not {to} after `docker {verb}`")


def handler_for(machines: Machines) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self, status: int, body: dict[str, Any] | list[Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _machine(self, parts: list[str]) -> str | None:
            if len(parts) < 2 or parts[0] != "machines":
                self._reply(404, {"error": f"no such path {self.path}"})
                return None
            if parts[1] not in machines.names:
                self._reply(404, {"error": f"{parts[1]} is not a machine this server may switch"})
                return None
            return parts[1]

        def do_GET(self) -> None:
            parts = [p for p in self.path.split("?")[0].split("/") if p]
            if parts == ["log"]:
                self._reply(200, list(machines.log))
                return
            if parts == ["healthz"]:
                self._reply(200, {"ok": True})
                return
            name = self._machine(parts)
            if name is None:
                return
            if len(parts) != 2:
                self._reply(404, {"error": f"no such path {self.path}"})
                return
            try:
                self._reply(200, {"machine": name, "power": machines.power(name)})
            except (subprocess.SubprocessError, OSError) as exc:
                self._reply(502, {"error": f"docker inspect {name}: {exc}"})

        def do_POST(self) -> None:
            parts = [p for p in self.path.split("?")[0].split("/") if p]
            name = self._machine(parts)
            if name is None:
                return
            if len(parts) != 3 or parts[2] not in ("on", "off"):
                self._reply(404, {"error": f"POST /machines/{name}/on or /off, not {self.path}"})
                return
            try:
                machines.switch(name, parts[2])
            except subprocess.CalledProcessError as exc:
                self._reply(502, {"error": f"docker failed for {name}: {exc.stderr.strip() or exc}"})
                return
            except (subprocess.SubprocessError, OSError, RuntimeError) as exc:
                self._reply(502, {"error": str(exc)})
                return
            self._reply(200, {"machine": name, "power": parts[2]})

        def log_message(self, format: str, *args: Any) -> None:
            log.info("%s %s", self.address_string(), format % args)

    return Handler


def serve(machines: Machines, host: str = "0.0.0.0", port: int = 9052) -> ThreadingHTTPServer:
    """A started server (its own thread); `shutdown()` stops it."""
    server = ThreadingHTTPServer((host, port), handler_for(machines))
    threading.Thread(target=server.serve_forever, name="power-server", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=9052)
    parser.add_argument("--machine", action="append", required=True, help="a container this server may switch")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    server = ThreadingHTTPServer((args.host, args.port), handler_for(Machines(args.machine)))
    log.info("power control for %s on %s:%d", ", ".join(args.machine), args.host, args.port)
    server.serve_forever()


if __name__ == "__main__":
    main()
