"""A small Chrome DevTools Protocol client for browser tests: headless Debian Chromium, driven over one websocket.

`Chromium` starts `/usr/bin/chromium` headless with a fresh profile on an ephemeral loopback debugging port
(read back from `<profile>/DevToolsActivePort`) and stops it by PID. `Page` is one tab attached with a flat
session: navigate, evaluate JavaScript, wait for the page's text to satisfy a check, take a PNG screenshot.
Every wait is bounded and fails with a message saying what did not happen. No dependency beyond aiohttp.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

CHROMIUM = Path("/usr/bin/chromium")
START_TIMEOUT = 30.0
COMMAND_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


# The page's text, then each same-origin iframe's (a cross-origin one has no readable document: skipped).
TEXT_JS = """(() => {
  const texts = [document.body ? document.body.innerText : ''];
  for (const frame of document.querySelectorAll('iframe')) {
    try {
      const body = frame.contentDocument && frame.contentDocument.body;
      if (body) texts.push(body.innerText);
    } catch (e) {}
  }
  return texts.join('\\n');
})()"""


class CDPError(RuntimeError):
    """A protocol command answered with an error, or the browser went away."""


def chromium_missing() -> str | None:
    """Why a browser test cannot run here (None when it can): Debian's `chromium` package is not installed."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing: install Debian's chromium package (apt-get install -y chromium)"
    return None


class Chromium:
    """Headless Chromium with a fresh profile; an async context manager that stops the browser by PID."""

    def __init__(self, *, log: Path, width: int = 1440, height: int = 1000) -> None:
        self.log = log
        self.width = width
        self.height = height
        self.profile = Path(tempfile.mkdtemp(prefix="chromium-profile-"))
        self.process: subprocess.Popen[bytes] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self.port = 0

    async def __aenter__(self) -> Chromium:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Launch the browser and connect to its browser-level websocket (bounded by START_TIMEOUT)."""
        args = [str(CHROMIUM), *FLAGS, f"--user-data-dir={self.profile}", f"--window-size={self.width},{self.height}"]
        env = {**os.environ, "HOME": str(self.profile)}  # the Debian launcher tidies $HOME/.config/chromium
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [*args, "about:blank"], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        active = self.profile / "DevToolsActivePort"
        end = time.monotonic() + START_TIMEOUT
        while not (active.exists() and len(active.read_text().splitlines()) >= 2):
            if self.process.poll() is not None:
                raise CDPError(f"chromium exited with {self.process.returncode} at start: {self._log_tail()}")
            if time.monotonic() > end:
                raise CDPError(f"chromium wrote no DevToolsActivePort within {START_TIMEOUT:.0f} s: {self._log_tail()}")
            await asyncio.sleep(0.05)
        port, path = active.read_text().splitlines()[:2]
        self.port = int(port)
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=COMMAND_TIMEOUT))
        self._ws = await self._http.ws_connect(f"ws://127.0.0.1:{self.port}{path}", max_msg_size=0)
        self._reader = asyncio.create_task(self._read())

    async def version(self) -> dict[str, Any]:
        """The browser's `/json/version` (Browser, Protocol-Version, User-Agent, webSocketDebuggerUrl)."""
        assert self._http is not None, "chromium is not started"
        async with self._http.get(f"http://127.0.0.1:{self.port}/json/version") as resp:
            data: dict[str, Any] = await resp.json()
            return data

    async def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
        """Send one command (to the browser, or to an attached target's `session`) and return its result."""
        if self._ws is None or self._ws.closed:
            raise CDPError(f"{method}: the browser connection is closed")
        ident = next(self._ids)
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[ident] = fut
        try:
            await self._ws.send_json(message)
            try:
                reply = await asyncio.wait_for(fut, COMMAND_TIMEOUT)
            except TimeoutError:
                raise CDPError(f"{method}: no answer within {COMMAND_TIMEOUT:.0f} s") from None
        finally:
            self._pending.pop(ident, None)
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def new_page(self) -> Page:
        """Open a new tab and attach to it with a flat session."""
        target = (await self.send("Target.createTarget", {"url": "about:blank"}))["targetId"]
        session = (await self.send("Target.attachToTarget", {"targetId": target, "flatten": True}))["sessionId"]
        page = Page(self, target, session)
        await page.send("Page.enable")
        await page.send("Runtime.enable")
        await page.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
        )
        return page

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = msg.json()
            fut = self._pending.get(data.get("id", -1))
            if fut is not None and not fut.done():
                fut.set_result(data)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(CDPError("the browser closed the connection"))

    async def stop(self) -> None:
        """Ask the browser to close, then SIGTERM/SIGKILL its PID (and its own process group); remove the profile."""
        if self._ws is not None and not self._ws.closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.send("Browser.close"), 5)
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
        if self._http is not None:
            await self._http.close()
        proc, self.process = self.process, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait, STOP_TIMEOUT)
            # Renderer/zygote helpers live in the group this PID leads (start_new_session): none may outlive it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(self.profile, ignore_errors=True)

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-1500:]
        return ""


class Page:
    """One attached tab."""

    def __init__(self, browser: Chromium, target: str, session: str) -> None:
        self.browser = browser
        self.target = target
        self.session = session

    async def send(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """A command for this tab's session."""
        return await self.browser.send(method, params, self.session)

    async def navigate(self, url: str) -> None:
        """Start loading `url` (a single-page app keeps rendering after this: wait for its text)."""
        result = await self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise CDPError(f"navigating to {url}: {result['errorText']}")

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        result = await self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in result:
            raise CDPError(f"evaluating {expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def text(self) -> str:
        """The rendered text of the page (`document.body.innerText`) followed by that of its same-origin iframes
        (the Temporal UI renders user metadata, such as a workflow's summary, as markdown in an iframe)."""
        value = await self.evaluate(TEXT_JS)
        return value if isinstance(value, str) else ""

    async def wait_for_text(
        self, check: Callable[[str], bool], *, timeout: float, what: str, every: float = 0.25
    ) -> str:
        """Poll the page's text until `check(text)`; return that text, or fail saying `what` and what it showed."""
        end = time.monotonic() + timeout
        text = ""
        while True:
            text = await self.text()
            if check(text):
                return text
            if time.monotonic() > end:
                raise AssertionError(f"{what}: not shown within {timeout:.0f} s; the page showed:\n{text[:3000]}")
            await asyncio.sleep(every)

    async def scroll_to(self, text: str) -> bool:
        """Scroll the innermost element whose text contains `text` to the middle of the view; False if none."""
        found = await self.evaluate(
            f"""(() => {{
  const all = Array.from(document.querySelectorAll('body *')).filter(e => e.textContent.includes({json.dumps(text)}));
  const inner = all.filter(e => !Array.from(e.children).some(c => c.textContent.includes({json.dumps(text)})));
  if (!inner.length) return false;
  inner[0].scrollIntoView({{block: 'center'}});
  return true;
}})()"""
        )
        return bool(found)

    async def screenshot(self, path: Path) -> Path:
        """Save a PNG of the viewport to `path`."""
        data = (await self.send("Page.captureScreenshot", {"format": "png"}))["data"]
        path.write_bytes(base64.b64decode(data))
        return path
