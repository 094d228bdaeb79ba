"""The bench's output: one row per figure (measured, floor, ratio, goal), printed as a table and written as JSON."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


@dataclass
class Row:
    figure: str
    measured: str
    floor: str
    ratio: float
    goal: str
    values: dict[str, Any] = field(default_factory=dict)
    server: str = ""  # "": the dev server's (every figure); else the other server the row ran on ("PostgreSQL")


@dataclass
class Report:
    sizes: dict[str, Any]
    rows: list[Row] = field(default_factory=list)
    processes: dict[str, float] = field(default_factory=dict)  # name -> peak RSS MB
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)  # a part of the run that failed after others had run

    def add(self, row: Row) -> None:
        self.rows.append(row)
        print(f"  {row.figure}: {row.measured} | floor {row.floor} | ratio {row.ratio:.2f}", flush=True)

    def ordered(self) -> list[Row]:
        """The dev server's rows in the order they ran, each other server's row after the last row of its figure
        (P1, P2, P5: a row's first word), so that the same figure on two servers reads side by side."""
        out = [r for r in self.rows if not r.server]
        for row in (r for r in self.rows if r.server):
            head = row.figure.split()[0]
            at = max((i for i, o in enumerate(out) if o.figure.split()[0] == head), default=len(out) - 1)
            out.insert(at + 1, row)
        return out

    def table(self) -> str:
        lines = [
            "| figure | measured | floor (same run) | ratio | goal |",
            "|---|---|---|---|---|",
            *(f"| {r.figure} | {r.measured} | {r.floor} | {r.ratio:.2f} | {r.goal} |" for r in self.ordered()),
            "",
            "| process | peak RSS |",
            "|---|---|",
            *(f"| {name} | {mb:.0f} MB |" for name, mb in self.processes.items()),
        ]
        lines += ["", *(f"- {n}" for n in self.notes)] if self.notes else []
        return "\n".join(lines)

    def write(self, path: Path) -> None:
        doc = {
            "sizes": self.sizes,
            "seconds": round(self.seconds, 1),
            "rows": [asdict(r) for r in self.rows if not r.server],
            "rows_on_other_servers": [asdict(r) for r in self.rows if r.server],
            "peak_rss_mb": {k: round(v, 1) for k, v in self.processes.items()},
            "notes": self.notes,
            "failures": self.failures,
        }
        path.write_text(json.dumps(doc, indent=2) + "\n")
