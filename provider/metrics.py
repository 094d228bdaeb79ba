"""In-memory call counters: method, status code and latency, kept cheap so every call records.

A Prometheus exporter (issue 7) can read `CallMetrics.snapshot()`; until then the numbers are there for
tests and for a debugger.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

# Upper bounds of the latency histogram, in seconds; cluster-autoscaler gives up at 5.
BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, float("inf"))


@dataclass
class CallMetrics:
    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    latency: Counter[tuple[str, float]] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, method: str, code: str, seconds: float) -> None:
        bucket = next(b for b in BUCKETS if seconds <= b)
        with self._lock:
            self.calls[(method, code)] += 1
            self.latency[(method, bucket)] += 1
            self.seconds[method] = self.seconds.get(method, 0.0) + seconds

    def count(self, method: str, code: str | None = None) -> int:
        with self._lock:
            return sum(n for (m, c), n in self.calls.items() if m == method and (code is None or c == code))

    def snapshot(self) -> dict[str, dict[str, float]]:
        """{method: {code: count, ..., "seconds_total": s}}."""
        with self._lock:
            out: dict[str, dict[str, float]] = {}
            for (m, c), n in self.calls.items():
                out.setdefault(m, {})[c] = n
            for m, s in self.seconds.items():
                out.setdefault(m, {})["seconds_total"] = s
            return out
