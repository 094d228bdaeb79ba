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

from aiohttp import web

log = logging.getLogger(__name__)

# How often a dependency is pinged, and how long one ping may take before it counts as unreachable.
PING_EVERY = 2.0
PING_TIMEOUT = 2.0


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


class HealthServer:
    """`/healthz` and `/readyz` on one small aiohttp server; `/readyz` lists every probe that fails."""

    def __init__(self, host: str, port: int, *, alive: Callable[[], str] | None = None) -> None:
        self.host = host
        self.port = port
        self.alive = alive or (lambda: "")
        self.probes: list[Probe] = []
        self._runner: web.AppRunner | None = None

    def add(self, probe: Probe) -> None:
        self.probes.append(probe)

    def failing(self) -> list[str]:
        return [f"{p.name}: {why}" for p in self.probes if (why := p.check())]

    async def _healthz(self, _: web.Request) -> web.Response:
        why = self.alive()
        return web.Response(status=503 if why else 200, text=f"{why or 'ok'}\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        failing = self.failing()
        return web.Response(status=503 if failing else 200, text="\n".join(failing or ["ok"]) + "\n")

    async def start(self) -> int:
        """Serve; returns the bound port (useful when `port` is 0)."""
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
