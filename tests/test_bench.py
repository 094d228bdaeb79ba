"""`make bench` at its smallest sizes: every figure runs end to end and has a numeric ratio. A benchmark, not a
timed test: no absolute time is asserted."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.procs import ROOT

ROWS = (
    "P1 reaction",  # twice: vs signal → handled, vs two trivial activities
    "P2 burst",
    "P2 operator memory",
    "P3 NodeGroups after Refresh",
    "P3 NodeGroupTargetSize",
    "P3 NodeGroupNodes",
    "P3 Refresh",
    "P4 history events",
    "P4 API writes per claim phase move",
    "P4 API writes in an idle minute",
)


@pytest.mark.timeout(240)  # ~1 min on an idle 2-core box; other sessions' load can double it
def test_bench_prints_every_figure_with_a_numeric_ratio(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = [sys.executable, "-m", "bench", "--p1-claims", "2", "--p2-slots", "2", "--p3-groups", "2",
            "--p3-slots", "2", "--p3-calls", "5", "--idle-seconds", "6", "--json", str(out)]  # fmt: skip
    with subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        try:
            stdout, _ = proc.communicate(timeout=150)
        except subprocess.TimeoutExpired:
            proc.terminate()  # the bench stops every process it started on SIGTERM
            stdout, _ = proc.communicate(timeout=60)
            raise AssertionError(f"the bench did not finish within 150 s:\n{stdout[-3000:]}") from None
    assert proc.returncode == 0, stdout[-5000:]
    table = [line for line in stdout.splitlines() if line.startswith("| P")]
    for name in ROWS:
        rows = [line for line in table if line.startswith(f"| {name}")]
        assert len(rows) == (2 if name == "P1 reaction" else 1), (name, stdout)
        for row in rows:
            ratio = row.split(" | ")[3]
            assert math.isfinite(float(ratio)) and float(ratio) >= 0, row
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == len(ROWS) + 1
    assert all(math.isfinite(r["ratio"]) for r in doc["rows"])
    assert {"temporal dev server", "operator (p1)", "operator (p2)", "operator (p3)", "operator (p4)"} <= set(
        doc["peak_rss_mb"]
    )
    assert all(mb > 0 for mb in doc["peak_rss_mb"].values()), doc["peak_rss_mb"]
