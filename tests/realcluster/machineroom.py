"""The machine room of `make e2e-pods`: what a power Job's container calls, as the seed's end-to-end suite calls its
VM control server. The power Jobs run for real on the real node (the slot's pod spec, busybox's wget); their call
crosses into the machine's namespace through the node's door and lands here, on the loopback, where the KWOK
machine is switched: `POST /machines/<slot>/on` powers it on and, `boot_seconds` later (a machine takes a while to
boot), its kubelet starts and registers the Node; `.../off` stops its kubelet at once.

Two switches make a BMC misbehave: `fail()` answers the next calls for a slot 503, as a BMC that does not answer
(the tool then exits 3 with a termination message, and the operator reads both from the Pod); `slow()` holds the
next answers for a while, as a BMC that takes its time (the power Job's Pod stays Running meanwhile).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from tests.procs import free_port


class Machines(Protocol):
    """What the room switches: the story's executor (its KWOK machines), or a test's own."""

    machines: dict[str, Any]

    def power_on(self, slot: str) -> None: ...

    def power_off(self, slot: str) -> None: ...


@dataclass
class Call:
    slot: str
    operation: str
    status: int
    at: float = 0.0  # time.monotonic() of the answer


@dataclass
class MachineRoom:
    executor: Machines
    port: int = field(default_factory=free_port)
    boot_seconds: float = 0.0
    calls: list[Call] = field(default_factory=list)
    booted: list[tuple[str, float]] = field(default_factory=list)  # (slot, time.monotonic()) when its kubelet started
    # (slot or "*", operation) -> (what the switch does, how many calls are left to it)
    _faults: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    _slow: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _boots: dict[str, threading.Timer] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def fail(self, slot: str, operation: str, times: int = 1) -> None:
        """The next `times` calls of `operation` ('on' or 'off') for `slot` are answered 503."""
        with self._lock:
            self._faults[(slot, operation)] = (503, times)

    def slow(self, slot: str, operation: str, seconds: float, times: int = 1) -> None:
        """The next `times` calls of `operation` for `slot` ('*': any slot) are answered after `seconds`."""
        with self._lock:
            self._slow[(slot, operation)] = (seconds, times)

    def calls_of(self, slot: str, operation: str) -> list[Call]:
        return [c for c in self.calls if c.slot == slot and c.operation == operation]

    def _take(self, table: dict[tuple[str, str], tuple[Any, int]], slot: str, op: str) -> Any:
        """What a switch does to this call (the slot's own switch first, else one for any slot), counted down;
        None when no switch applies."""
        with self._lock:
            for key in ((slot, op), ("*", op)):
                if key in table:
                    value, left = table[key]
                    if left <= 1:
                        del table[key]
                    else:
                        table[key] = (value, left - 1)
                    return value
        return None

    def handle(self, path: str) -> tuple[int, str]:
        parts = path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "machines" or parts[2] not in ("on", "off"):
            return 404, f"no such call: {path}"
        slot, op = parts[1], parts[2]
        if slot not in self.executor.machines:
            return 404, f"no machine {slot!r}"
        delay = self._take(self._slow, slot, op)
        if delay:
            time.sleep(delay)
        refused = self._take(self._faults, slot, op)
        if refused:
            self.calls.append(Call(slot, op, refused, time.monotonic()))
            return refused, f"the BMC of {slot} does not answer"
        if op == "on":
            self._power_on(slot)
        else:
            self._cancel_boot(slot)
            self.executor.power_off(slot)
        self.calls.append(Call(slot, op, 200, time.monotonic()))
        return 200, f"{slot} {op}"

    def _power_on(self, slot: str) -> None:
        """The machine boots: its kubelet starts `boot_seconds` from now (at once when 0). A second `on` while it
        boots changes nothing, as pressing a BMC's power button twice does not."""
        if self.boot_seconds <= 0:
            self._booted(slot)
            return
        with self._lock:
            if slot in self._boots and self._boots[slot].is_alive():
                return
            timer = threading.Timer(self.boot_seconds, self._booted, args=(slot,))
            timer.daemon = True
            self._boots[slot] = timer
        timer.start()

    def _booted(self, slot: str) -> None:
        try:
            self.executor.power_on(slot)
            self.booted.append((slot, time.monotonic()))
        except Exception as exc:  # a harness thread reports, never dies silently
            self.errors.append(f"booting {slot}: {type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self._boots.pop(slot, None)

    def _cancel_boot(self, slot: str) -> None:
        with self._lock:
            timer = self._boots.pop(slot, None)
        if timer is not None:
            timer.cancel()

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
        with self._lock:
            timers = list(self._boots.values())
            self._boots.clear()
        for timer in timers:
            timer.cancel()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
