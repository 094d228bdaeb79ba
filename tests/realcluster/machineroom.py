"""The machine room of `make e2e-pods`: what a power Job's container calls, as the seed's end-to-end suite calls its
VM control server. The power Jobs run for real on the real node (the slot's pod spec, busybox's wget); their call
crosses into the machine's namespace through the node's door and lands here, on the loopback, where the KWOK
machine is switched: `POST /machines/<slot>/on` boots it (its kubelet registers the Node), `.../off` stops its
kubelet. A fault switch makes the next calls for a slot answer 503, as a BMC that does not answer: the tool then
exits 3 with a termination message, and the operator reads both from the Pod.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.procs import free_port
from tests.realcluster.executor import Executor


@dataclass
class Call:
    slot: str
    operation: str
    status: int


@dataclass
class MachineRoom:
    executor: Executor
    port: int = field(default_factory=free_port)
    calls: list[Call] = field(default_factory=list)
    _faults: dict[tuple[str, str], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def fail(self, slot: str, operation: str, times: int = 1) -> None:
        """The next `times` calls of `operation` ('on' or 'off') for `slot` are answered 503."""
        with self._lock:
            self._faults[(slot, operation)] = times

    def handle(self, path: str) -> tuple[int, str]:
        parts = path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "machines" or parts[2] not in ("on", "off"):
            return 404, f"no such call: {path}"
        slot, op = parts[1], parts[2]
        if slot not in self.executor.machines:
            return 404, f"no machine {slot!r}"
        with self._lock:
            left = self._faults.get((slot, op), 0)
            if left:
                self._faults[(slot, op)] = left - 1
        if left:
            self.calls.append(Call(slot, op, 503))
            return 503, f"the BMC of {slot} does not answer"
        if op == "on":
            self.executor.power_on(slot)
        else:
            self.executor.power_off(slot)
        self.calls.append(Call(slot, op, 200))
        return 200, f"{slot} {op}"

    def start(self) -> MachineRoom:
        room = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                try:
                    status, text = room.handle(self.path)
                except Exception as exc:  # the room says what broke, the harness's thread lives on
                    status, text = 500, f"{type(exc).__name__}: {exc}"
                body = (text + "\n").encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: Any) -> None:
                print("machine room: " + fmt % args, flush=True)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, name="machine-room", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
