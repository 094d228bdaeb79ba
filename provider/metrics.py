"""The provider's call metrics: a count per method and status code, and a latency histogram on /metrics.

The count is also kept in memory, so a test (or a debugger) can read it without scraping; the latency lives
only in the process's Prometheus endpoint (the Temporal runtime's meter), where its buckets are set.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio.common import MetricCounter, MetricHistogramTimedelta, MetricMeter


@dataclass
class CallMetrics:
    """Every answered call, by method and code; given a meter, on the process's Prometheus endpoint too."""

    meter: MetricMeter | None = None
    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _counter: MetricCounter | None = field(default=None, repr=False)
    _latency: MetricHistogramTimedelta | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.meter is not None:
            self._counter = self.meter.create_counter("homelab_provider_calls", "provider calls by method and code")
            self._latency = self.meter.create_histogram_timedelta(
                "homelab_provider_call_latency", "provider call latency by method", "duration"
            )

    def record(self, method: str, code: str, seconds: float) -> None:
        if self._counter is not None and self._latency is not None:
            self._counter.add(1, {"method": method, "code": code})
            self._latency.record(timedelta(seconds=seconds), {"method": method})
        with self._lock:
            self.calls[(method, code)] += 1

    def count(self, method: str, code: str | None = None) -> int:
        with self._lock:
            return sum(n for (m, c), n in self.calls.items() if m == method and (code is None or c == code))
