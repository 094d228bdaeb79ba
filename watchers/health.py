"""`/healthz` (the process works: its event loop answers and its watch threads live) and `/readyz` (every
watch has listed once, so what the watchers say is based on the whole cluster), on a small aiohttp server.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web


class HealthServer:
    def __init__(self, host: str, port: int, *, alive: Callable[[], bool], ready: Callable[[], bool]) -> None:
        self.host = host
        self.port = port
        self.alive = alive
        self.ready = ready
        self._runner: web.AppRunner | None = None

    async def _healthz(self, _: web.Request) -> web.Response:
        ok = self.alive()
        return web.Response(status=200 if ok else 503, text="ok\n" if ok else "watch threads stopped\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        ok = self.ready()
        return web.Response(status=200 if ok else 503, text="ok\n" if ok else "not synced yet\n")

    async def start(self) -> int:
        """Serve; returns the bound port (useful when `port` is 0)."""
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
