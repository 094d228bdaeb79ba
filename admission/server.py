"""The `webhook` role: an HTTPS server the API server posts AdmissionReviews of NodeClaims to.

A write that could be refused (`review.makes_live`) costs one list of its namespace's NodeClaims, read from the API
server at that moment rather than from a cache: the answer then sees every claim the API server has stored,
including one the group created a moment before, and the check runs only for the rare hand-written claim (the
registration never sends the operator's own writes). The list is bounded by the API server's own wait for the
answer (the `timeout` it puts on the URL), so a slow list is refused in words before the API server gives up.

The certificate and key are read again when they change (cert-manager renews them in the mounted Secret), so a
renewal needs no restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import threading
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from temporalio.common import MetricCounter, MetricMeter

from admission.review import (
    ALLOWED,
    WEBHOOK_PATH,
    BadReview,
    Review,
    Verdict,
    judge,
    makes_live,
    parse,
    response,
    unjudged,
)
from admission.settings import WebhookSettings
from api.v2alpha1 import parse_duration
from kube.adapter import CLAIMS, Kube
from kube.errors import KubeError

log = logging.getLogger(__name__)

# An AdmissionReview of one claim is a few kB; a bound stops a hostile body from costing memory.
MAX_BODY_BYTES = 3 * 1024 * 1024
# How often the certificate files are looked at for a renewal.
RELOAD_EVERY = 30.0
# Kept for the answer itself out of the API server's wait; the list gets the rest (never less than the floor).
ANSWER_MARGIN = 1.0
LIST_FLOOR = 0.5


@dataclass
class ReviewMetrics:
    """Reviews answered, by decision (allowed, refused, unjudged); on /metrics too when given a meter."""

    meter: MetricMeter | None = None
    decisions: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _counter: MetricCounter | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.meter is not None:
            self._counter = self.meter.create_counter(
                "homelab_admission_reviews", "NodeClaim admission reviews answered, by decision"
            )

    def record(self, decision: str) -> None:
        if self._counter is not None:
            self._counter.add(1, {"decision": decision})
        with self._lock:
            self.decisions[decision] += 1


class Certificate:
    """The serving certificate as an SSL context, loaded again when its files change."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._loaded = b""
        self.reload()

    def _contents(self) -> bytes:
        return self.cert.read_bytes() + b"\0" + self.key.read_bytes()

    def reload(self) -> bool:
        """Load the files when they changed since the last load; True when they were loaded now."""
        contents = self._contents()
        if contents == self._loaded:
            return False
        self.context.load_cert_chain(str(self.cert), str(self.key))  # new handshakes use it; none in flight break
        self._loaded = contents
        return True

    async def follow(self, stop: asyncio.Event, every: float = RELOAD_EVERY) -> None:
        """Reload on change until `stop`; a file that cannot be read or used keeps the certificate in use."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)
            if stop.is_set():
                return
            try:
                if await asyncio.to_thread(self.reload):
                    log.info("webhook certificate reloaded from %s", self.cert)
            except (OSError, ssl.SSLError, ValueError) as err:
                log.warning("webhook certificate %s not reloaded (the one in use stays): %s", self.cert, err)


def list_budget(query: Mapping[str, str], default: float) -> float:
    """Seconds the claims' list may take: the API server's wait (`?timeout=5s`) less the answer's margin."""
    try:
        waits = parse_duration(query.get("timeout") or "").total_seconds()
    except ValueError:
        return default
    return max(LIST_FLOOR, min(default, waits - ANSWER_MARGIN)) if waits > 0 else default


class Webhook:
    """Answers AdmissionReviews of NodeClaims from the namespace's claims as the API server holds them now."""

    def __init__(self, kube: Kube, metrics: ReviewMetrics | None = None) -> None:
        self.kube = kube
        self.metrics = metrics or ReviewMetrics()

    def claims(self, namespace: str, budget: float) -> Sequence[Mapping[str, Any]]:
        """The namespace's NodeClaims, listed within `budget` seconds (the adapter's client, its own timeout)."""
        return Kube(self.kube.api_client, timeout=budget).list_raw(CLAIMS, namespace)[0]

    async def decide(self, review: Review, budget: float) -> Verdict:
        if not makes_live(review):
            return ALLOWED
        try:
            claims = await asyncio.to_thread(self.claims, review.namespace, budget)
        except KubeError as err:
            return unjudged(review, str(err))
        return judge(review, claims)

    async def handle(self, request: web.Request) -> web.Response:
        try:
            review = parse(await request.json())
        except (ValueError, BadReview) as err:  # not JSON, or not a review: the API server's call failed
            return web.Response(status=400, text=f"{err}\n")
        verdict = await self.decide(review, list_budget(request.query, self.kube.timeout))
        decision = "allowed" if verdict.allowed else ("refused" if verdict.code == 403 else "unjudged")
        self.metrics.record(decision)
        if not verdict.allowed:
            log.info(
                "refused %s of nodeclaim %s/%s by %s: %s",
                review.operation.lower(),
                review.namespace,
                review.name,
                review.user or "an unnamed user",
                verdict.message,
            )
        return web.json_response(response(review.uid, verdict))


class WebhookServer:
    """The webhook on its address over HTTPS; `start()` returns the bound port (useful with port 0)."""

    def __init__(self, settings: WebhookSettings, webhook: Webhook) -> None:
        assert settings.tls_cert is not None and settings.tls_key is not None, "settings refuse an address alone"
        self.settings = settings
        self.webhook = webhook
        self.certificate = Certificate(settings.tls_cert, settings.tls_key)
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> int:
        host, _, port = self.settings.address.rpartition(":")
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post(WEBHOOK_PATH, self.webhook.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host.strip("[]") or None, int(port), ssl_context=self.certificate.context)
        await site.start()
        sockets = getattr(site._server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else int(port)
        log.info("NodeClaim admission webhook serving https://%s:%d%s", host or "*", self.port, WEBHOOK_PATH)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


@contextlib.asynccontextmanager
async def running(settings: WebhookSettings, webhook: Webhook) -> AsyncIterator[WebhookServer]:
    """The server for the span of a `with` (tests use it alone)."""
    server = WebhookServer(settings, webhook)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def serve(settings: WebhookSettings, webhook: Webhook, stop: asyncio.Event) -> None:
    """The `webhook` role: serve until `stop`, following the certificate's renewals."""
    async with running(settings, webhook) as server:
        await server.certificate.follow(stop)
