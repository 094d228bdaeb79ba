"""A watch that survives: resumes from the last resourceVersion, relists on 410, and never repeats an event.

The operator acts on changes of state, so what it must not lose is the latest state of every object, and what
it must not see twice is the same version of one object. A relist after 410 (or a restart) is diffed against the
versions already delivered, so the consumer sees exactly the changes it missed, as ordinary events.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import urllib3

from kube.adapter import JSON, Kube, Resource
from kube.errors import Gone, KubeError

log = logging.getLogger(__name__)

ADDED, MODIFIED, DELETED, SYNCED = "ADDED", "MODIFIED", "DELETED", "SYNCED"


@dataclass(frozen=True)
class WatchEvent:
    """One change of one object; `SYNCED` (object None) marks the end of a (re)list."""

    type: str
    object: JSON | None


def _key(obj: JSON) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _rv(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


# The server-side timeout of one watch request, in seconds (client-go's reflectors ask for 5-10 minutes). Every
# window's end is a new request: at 30 s the idle operator's seven watches were 14 requests a minute, a third of its
# idle CPU beside the Lease (issue 34); a connection closed under it is seen at once, a silent one after this.
WATCH_WINDOW = 300


@dataclass
class Watch:
    """Iterate `events()` until `stop` is set; every network wait is bounded by `window` seconds."""

    kube: Kube
    resource: Resource
    namespace: str | None = None
    selector: str | None = None
    window: int = WATCH_WINDOW
    retry_delay: float = 1.0
    stop: threading.Event = field(default_factory=threading.Event)
    resource_version: str = ""
    relists: int = 0
    _seen: dict[tuple[str, str], str] = field(default_factory=dict)
    _stream: Any = None

    def close(self) -> None:
        """Stop the iteration from another thread; an open stream is closed so the reader wakes up."""
        self.stop.set()
        stream = self._stream
        if stream is not None:
            # shutdown() unblocks a read in progress in the iterating thread; close() alone would wait for data.
            with contextlib.suppress(Exception):
                stream.shutdown()
            with contextlib.suppress(Exception):
                stream.close()

    def events(self) -> Iterator[WatchEvent]:
        """Changes in order, each version once; a SYNCED after every (re)list. Ends only when `stop` is set."""
        expired_streak = 0
        while not self.stop.is_set():
            if not self.resource_version:
                try:
                    yield from self._relist()
                except KubeError as exc:
                    log.warning("relist %s failed: %s", self.resource.plural, exc)
                    self.stop.wait(self.retry_delay)
                    continue
            started = time.monotonic()
            try:
                yield from self._follow()
                expired_streak = 0
                # A stream the server ended before its window is a drop: don't hammer a server that is going away.
                if time.monotonic() - started < self.window / 2:
                    self.stop.wait(self.retry_delay)
            except Gone:
                log.info(
                    "watch %s: resourceVersion %s expired, relisting",
                    self.resource.plural,
                    self.resource_version,
                )
                self.resource_version = ""
                expired_streak += 1
                if expired_streak > 1:  # 410 right after a relist: back off instead of spinning
                    self.stop.wait(self.retry_delay)
            except (KubeError, urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as exc:
                # AttributeError: urllib3 reading a response that `close()` released from another thread.
                if self.stop.is_set():
                    return
                log.warning(
                    "watch %s dropped (%s); resuming from %s",
                    self.resource.plural,
                    exc,
                    self.resource_version,
                )
                self.stop.wait(self.retry_delay)

    def drain(self) -> list[WatchEvent]:
        """One non-blocking step: what happened since the last call (relisting when there is no
        resourceVersion, first or after a 410). Errors are logged; the next step resumes where this stopped.
        """
        out: list[WatchEvent] = []
        try:
            if not self.resource_version:
                # A fresh list is the state now; there is nothing to follow yet. A real API server reads a watch's
                # `timeoutSeconds=0` as "none given" and holds the stream open for its default 30-60 minutes, so
                # following here would block the first sync (the emulator answers 0 with the backlog at once).
                return list(self._relist())
            saved, self.window = self.window, 0
            try:
                out += self._follow()
            finally:
                self.window = saved
        except Gone:
            log.info("watch %s expired; relisting", self.resource.plural)
            self.resource_version = ""
            try:
                out += self._relist()
            except KubeError as exc:
                log.warning("relist %s failed: %s", self.resource.plural, exc)
        except (KubeError, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            log.warning("watch %s dropped: %s", self.resource.plural, exc)
        return out

    def _relist(self) -> Iterator[WatchEvent]:
        items, rv = self.kube.list_raw(self.resource, self.namespace, self.selector)
        self.relists += 1
        current = {_key(o): o for o in items}
        for key, obj in current.items():
            previous = self._seen.get(key)
            if previous == _rv(obj):
                continue
            self._seen[key] = _rv(obj)
            yield WatchEvent(ADDED if previous is None else MODIFIED, obj)
        for key in [k for k in self._seen if k not in current]:
            last_rv = self._seen.pop(key)
            ns, name = key
            meta: JSON = {"name": name, "resourceVersion": last_rv}
            if ns:
                meta["namespace"] = ns
            # Deleted while we were not watching: the last version we delivered is all that is known of it.
            tombstone: JSON = {"kind": self.resource.kind, "apiVersion": self.resource.api_version, "metadata": meta}
            yield WatchEvent(DELETED, tombstone)
        self.resource_version = rv
        yield WatchEvent(SYNCED, None)

    def _follow(self) -> Iterator[WatchEvent]:
        stream = self.kube.open_watch(self.resource, self.namespace, self.selector, self.resource_version, self.window)
        self._stream = stream
        try:
            if self.stop.is_set():  # closed while the stream was being opened: `close` saw no stream to shut
                with contextlib.suppress(Exception):
                    stream.close()
                return
            buffer = b""
            for chunk in stream.stream(amt=None, decode_content=False):
                if self.stop.is_set():
                    return
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        event = self._handle(json.loads(line))
                        if event is not None:
                            yield event
        finally:
            self._stream = None
            stream.release_conn()

    def _handle(self, doc: JSON) -> WatchEvent | None:
        kind = str(doc.get("type") or "")
        obj = doc.get("object") or {}
        if kind == "ERROR":
            code = int(obj.get("code") or 0)
            if code == 410:
                raise Gone(f"watch {self.resource.plural}: {obj.get('message', 'expired')}", status=410)
            raise KubeError(f"watch {self.resource.plural}: {obj.get('message', obj)}", status=code)
        rv = _rv(obj)
        if rv:
            self.resource_version = rv
        if kind == "BOOKMARK":
            return None
        obj.setdefault("kind", self.resource.kind)
        obj.setdefault("apiVersion", self.resource.api_version)
        key = _key(obj)
        if kind == DELETED:
            if self._seen.pop(key, None) is None:
                return None  # never delivered, so there is nothing for the consumer to forget
            return WatchEvent(DELETED, obj)
        if self._seen.get(key) == rv:
            return None  # the same version again, after a resume: already delivered
        previous = self._seen.get(key)
        self._seen[key] = rv
        return WatchEvent(ADDED if previous is None else MODIFIED, obj)
