"""The chaos suite's short run in `make system` (`make chaos` is the long one): real processes, kills, faults,
a Temporal outage, a wipe of Temporal's database and bad objects, then every invariant. A failure prints the seed
to rerun with."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.chaos import Plan, run


@pytest.mark.timeout(900)
@pytest.mark.long
@pytest.mark.system
async def test_a_short_chaos_run_leaves_no_violation(tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED") or random.randrange(2**31))
    plan = Plan(seed, lifecycles=6, kills=5, outage=12.0, time_limit=300.0, wipes=1, workers=2)
    report = await run(plan, tmp_path)
    print(report.table())
    assert report.ok, f"seed {seed} (CHAOS_SEED={seed} reruns it):\n{report.table()}"
    assert report.lifecycles >= plan.lifecycles and sum(report.kills.values()) == plan.kills
    assert report.wipes == plan.wipes
