"""A process's health: `/healthz` says it works (its loop answers), `/readyz` says it can do its work right now.

Readiness is a set of named probes, each a cheap read of state a monitor keeps: a `Reachability` pings Temporal
or the API server in the background, and a role adds its own (the watchers have listed every watch once). A
role that cannot reach what it needs is not ready, and says which, so a Deployment stops sending it traffic and
an operator reading `/readyz` sees why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

# How often a dependency is pinged, and how long one ping may take before it counts as unreachable.
PING_EVERY = 2.0
PING_TIMEOUT = 2.0
# The API server's ping is a request through the Kubernetes client (a thread, urllib3, JSON): every 2 s it was the
# idle operator's largest source of requests (30 a minute, issue 34). Only readiness reads it, and a kubelet's
# readiness probe asks every 10 s (deploy/): a fresher answer than that is never read. Temporal's stays at 2 s: a
# gRPC health check in the client's runtime costs next to nothing, and an outage is noticed within a probe or two.
API_PING_EVERY = 10.0


@dataclass
class Probe:
    """One readiness condition: `check` returns "" when it holds, else why not (one line)."""

    name: str
    check: Callable[[], str]


@dataclass
class Reachability:
    """Whether a dependency answered its last ping (a ping that raises or outlasts its timeout did not)."""

    name: str
    ping: Callable[[], Awaitable[object]]
    every: float = PING_EVERY
    timeout: float = PING_TIMEOUT
    reachable: bool = True  # innocent until a ping says otherwise: the process just connected to it
    since: float = field(default_factory=time.monotonic)
    error: str = ""

    async def check_once(self) -> bool:
        try:
            await asyncio.wait_for(self.ping(), self.timeout)
        except Exception as err:  # any failure to answer is unreachable, whatever the client raised
            self._set(False, str(err) or type(err).__name__)
        else:
            self._set(True, "")
        return self.reachable

    def _set(self, reachable: bool, error: str) -> None:
        if reachable != self.reachable:
            self.since = time.monotonic()
            log.log(
                logging.INFO if reachable else logging.WARNING,
                "%s is %s%s",
                self.name,
                "reachable again" if reachable else "unreachable",
                f": {error}" if error else "",
            )
        self.reachable, self.error = reachable, error

    async def run(self, stop: asyncio.Event) -> None:
        """Ping until `stop`, every `every` seconds."""
        while not stop.is_set():
            await self.check_once()
            try:
                await asyncio.wait_for(stop.wait(), self.every)
            except TimeoutError:
                continue

    def describe(self) -> str:
        """ "" while reachable, else "<name> unreachable for 12 s: <error>"."""
        if self.reachable:
            return ""
        return f"{self.name} unreachable for {time.monotonic() - self.since:.0f} s: {self.error}"

    def probe(self) -> Probe:
        return Probe(self.name, self.describe)


# A probe's request: its head must arrive within this, and be no longer than the stream reader's limit (64 KiB).
REQUEST_TIMEOUT = 5.0
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class HealthServer:
    """`/healthz` and `/readyz` on a small HTTP/1.1 server of asyncio's own; `/readyz` lists every probe that fails.

    Two plain-text GETs answered from memory need no web framework: aiohttp, imported for them, was 9 MB of an idle
    operator's 128 (issue 34, part 4); the admission webhook, which needs it, imports it when it is enabled.
    """

    def __init__(self, host: str, port: int, *, alive: Callable[[], str] | None = None) -> None:
        self.host = host
        self.port = port
        self.alive = alive or (lambda: "")
        self.probes: list[Probe] = []
        self._server: asyncio.Server | None = None

    def add(self, probe: Probe) -> None:
        self.probes.append(probe)

    def failing(self) -> list[str]:
        return [f"{p.name}: {why}" for p in self.probes if (why := p.check())]

    def answer(self, method: str, target: str) -> tuple[int, str]:
        """The status and text for one request line's method and target (a query string is ignored)."""
        path = target.split("?", 1)[0]
        if path not in ("/healthz", "/readyz"):
            return 404, "not found: /healthz or /readyz\n"
        if method not in ("GET", "HEAD"):
            return 405, f"{method} not allowed: GET or HEAD\n"
        if path == "/healthz":
            why = self.alive()
            return (503 if why else 200), f"{why or 'ok'}\n"
        failing = self.failing()
        return (503 if failing else 200), "\n".join(failing or ["ok"]) + "\n"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One request per connection: read its head (bounded in time and size), answer, close."""
        method = ""
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
                method, target, _version = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
                status, text = self.answer(method, target)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
                status, text = 400, "bad request: one HTTP/1.1 GET of /healthz or /readyz\n"
            body = text.encode()
            writer.write(
                f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: text/plain; charset=utf-8\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1")
                + (b"" if method == "HEAD" else body)
            )
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT)
        except (ConnectionError, TimeoutError):
            pass  # the prober went away or stopped reading: nothing to answer
        finally:
            writer.close()

    async def start(self) -> int:
        """Serve; returns the bound port (useful when `port` is 0)."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        sockets = self._server.sockets or ()
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
