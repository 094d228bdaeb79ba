"""The Temporal client's certificate, renewed under a running process: the SDK reads it once, at connect, and has
no way to take another, so the process stops cleanly and its container starts again with the new one.

The certs step (or cert-manager) renews a certificate with a third of its life left and the kubelet rewrites the
mounted Secret's files in place; the old certificate stays valid for that third, so nothing fails in between. A
stop is the roles' ordinary shutdown (the worker drains its tasks, the provider its calls); a Deployment's Pod
restarts the container, and Temporal resumes every claim where it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

CHECK_EVERY = 60.0  # seconds: the kubelet's own sync of a Secret volume takes about as long


class FilesSeen:
    """Files as they were read at the start; `changed()` names the first that differs now (or cannot be read)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = tuple(paths)
        self.seen = {p: self._read(p) for p in self.paths}

    @staticmethod
    def _read(path: Path) -> bytes | None:
        try:
            return path.read_bytes()
        except OSError:
            return None

    def changed(self) -> Path | None:
        for path in self.paths:
            now = self._read(path)
            # A file gone for a moment (the kubelet swaps the volume's directory) is no renewal: wait for its content.
            if now is not None and now != self.seen[path]:
                return path
        return None


async def stop_on_renewal(paths: Sequence[Path], stop: asyncio.Event, *, every: float = CHECK_EVERY) -> None:
    """Set `stop` once one of `paths` has new content, saying why; return when `stop` is set either way."""
    files = FilesSeen(paths)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every)
        if stop.is_set():
            return
        renewed = files.changed()
        if renewed is not None:
            log.warning(
                "the Temporal client certificate was renewed (%s changed): stopping, so that the process starts "
                "again with it (the Temporal SDK reads it only when it connects)",
                renewed,
            )
            stop.set()
            return
