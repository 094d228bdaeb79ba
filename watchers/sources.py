"""One watched resource (in one namespace, or all): a `kube.watch.Watch` read two ways.

* `run(emit)`, in a thread of its own, for the process: blocks on the stream, resumes and relists as
  `Watch` does, and hands every event to `emit` until `close()`.
* `drain()`, for tests and for the initial sync: everything that happened since the last call, without
  waiting on the network (a watch request with a zero timeout returns the backlog and ends).

Each event is tagged with whether it belongs to a (re)list: the dispatcher acts on a relist's changes as
a whole when its SYNCED arrives (every slot's observation sent once), rather than once per object.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from kube.adapter import Kube, Resource
from kube.watch import SYNCED, WATCH_WINDOW, Watch, WatchEvent

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tagged:
    """A watch event with where it came from and whether it is part of a (re)list."""

    source: Source
    event: WatchEvent
    relisting: bool


@dataclass(eq=False)
class Source:
    kube: Kube
    resource: Resource
    namespace: str | None = None
    window: int = WATCH_WINDOW
    retry_delay: float = 1.0
    watch: Watch = field(init=False)
    synced: bool = False
    _relists_done: int = 0

    def __post_init__(self) -> None:
        self.watch = Watch(self.kube, self.resource, self.namespace, window=self.window, retry_delay=self.retry_delay)

    @property
    def name(self) -> str:
        return f"{self.resource.plural}" + (f" in {self.namespace}" if self.namespace else "")

    def _tag(self, event: WatchEvent) -> Tagged:
        relisting = self.watch.relists != self._relists_done
        if event.type == SYNCED:
            self._relists_done = self.watch.relists
            self.synced = True
        return Tagged(self, event, relisting or event.type == SYNCED)

    def drain(self) -> list[Tagged]:
        """What happened since the last call, now (tests and the first sync step through this)."""
        return [self._tag(event) for event in self.watch.drain()]

    def run(self, emit: Callable[[Tagged], None]) -> None:
        """Block delivering events to `emit` until `close()` (run it in a thread)."""
        for event in self.watch.events():
            emit(self._tag(event))

    def close(self) -> None:
        self.watch.close()
