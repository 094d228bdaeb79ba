"""The Temporal client's certificate, renewed under a running process: the SDK reads it only when it connects, so a
renewal is taken by connecting again and moving every user of the client onto the new connection.

The certs step (or cert-manager) renews a certificate with a third of its life left and the kubelet rewrites the
mounted Secret's files in place; the old certificate stays valid for that third, so nothing fails in between, and a
renewal that cannot be taken at once (the files half written, Temporal away) is tried again at the next look while
the connection in use carries on. Nothing stops: the provider keeps answering cluster-autoscaler throughout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

CHECK_EVERY = 60.0  # seconds: the kubelet's own sync of a Secret volume takes about as long


class FilesSeen:
    """Files as last taken; `changed()` names the first whose content differs now (a missing one does not)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = tuple(paths)
        self.seen = self.now()

    @staticmethod
    def _read(path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except OSError:
            return None

    def now(self) -> dict[Path, bytes | None]:
        return {p: self._read(p) for p in self.paths}

    def changed(self, now: dict[Path, bytes | None] | None = None) -> Path | None:
        now = self.now() if now is None else now
        for path in self.paths:
            # A file gone for a moment (the kubelet swaps the volume's directory) is no renewal: wait for its content.
            if now[path] is not None and now[path] != self.seen[path]:
                return path
        return None


async def renew_on_change(
    paths: Sequence[Path],
    renew: Callable[[], Awaitable[None]],
    stop: asyncio.Event,
    *,
    every: float = CHECK_EVERY,
) -> None:
    """Call `renew` each time `paths` have new content, until `stop`; a failed renewal is said and tried again."""
    files = FilesSeen(paths)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every)
        if stop.is_set():
            return
        now = files.now()
        renewed = files.changed(now)
        if renewed is None:
            continue
        try:
            await renew()
        except Exception as err:  # a monitor: whatever the reconnect raised, the connection in use carries on
            log.warning(
                "the Temporal client certificate changed (%s) but connecting with it failed, the connection in use "
                "carries on; trying again in %.0f s: %s",
                renewed,
                every,
                err,
            )
            continue
        files.seen = now
        log.info("connected to Temporal again with the renewed client certificate (%s changed)", renewed)
