"""In-memory call counters: method, status code and latency, kept cheap so every call records.

With a meter (the Temporal runtime's) they also reach the process's /metrics endpoint.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio.common import MetricMeter

# Upper bounds of the latency histogram, in seconds; cluster-autoscaler gives up at 5.
BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, float("inf"))


@dataclass
class CallMetrics:
    """Counts in memory (tests, debugging) and, given a meter, on the process's Prometheus endpoint."""

    meter: MetricMeter | None = None
    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    latency: Counter[tuple[str, float]] = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, method: str, code: str, seconds: float) -> None:
        bucket = next(b for b in BUCKETS if seconds <= b)
        if self.meter is not None:
            attrs: dict[str, str | int | float | bool] = {"method": method, "code": code}
            self.meter.create_counter("homelab_provider_calls", "provider calls by method and code").add(1, attrs)
            self.meter.create_histogram_timedelta(
                "homelab_provider_call_latency", "provider call latency by method", "duration"
            ).record(timedelta(seconds=seconds), {"method": method})
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
