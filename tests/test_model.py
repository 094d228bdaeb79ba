"""The model-based adversary (tests/model.py) in `make system` (.ci/run): a bounded budget of random examples.

`make soak SOAK_MINUTES=30` runs the same driver for as long as asked and prints the examples and steps tried.
A failure prints its seed; `MODEL_SEED=<seed> .venv/bin/pytest tests/test_model.py` reruns that schedule.
An example that failed after the time-skipping server refused a workflow task's completion (and no workflow task
failed) is printed as inconclusive and the run goes on; more than a few of them fail the test.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import Counter

import pytest

from tests.lab import REFUSALS, homelab, open_lab, refusal_watching_runtime
from tests.model import Inconclusive, run_example

# The default budget: enough examples to cover every kind of step several times, about a minute on 2 cores.
BUDGET_SECONDS = float(os.environ.get("MODEL_BUDGET_SECONDS", "30"))
STEPS = int(os.environ.get("MODEL_STEPS", "30"))


def too_many_inconclusive(inconclusive: int, examples: int) -> bool:
    """The test server strands a workflow in about one example in ten; far more than that is not its bug."""
    return inconclusive > 3 + examples // 4


@pytest.mark.long
@pytest.mark.system
@pytest.mark.timeout(BUDGET_SECONDS + 1800)  # the last examples may start just before the budget runs out
async def test_the_claim_law_holds_under_random_adversity() -> None:
    fixed = os.environ.get("MODEL_SEED")
    seeds = [int(fixed)] if fixed else None
    started, tally, examples = time.monotonic(), Counter[str](), 0
    inconclusive: list[str] = []
    rng = random.Random()
    while True:
        seed = seeds.pop() if seeds else rng.randrange(2**32)
        print(f"model example seed {seed}")
        try:
            tally += await run_example(seed, STEPS)
            examples += 1
        except Inconclusive as err:
            if fixed:
                raise
            inconclusive.append(str(err))
            print(f"model example inconclusive: {err}")
            assert not too_many_inconclusive(len(inconclusive), examples), "\n".join(inconclusive)
        # At least one example that ran to its end, however the budget went.
        if fixed or (examples >= 1 and time.monotonic() - started > BUDGET_SECONDS):
            break
    print(
        f"model: {examples} examples, {sum(tally.values())} steps: {dict(sorted(tally.items()))}; "
        f"{len(inconclusive)} inconclusive (the test server refused a workflow task's completion)"
    )
    assert examples >= 1 and sum(tally.values()) >= STEPS


def test_inconclusive_examples_are_bounded() -> None:
    """An inconclusive example is the test server's; a run of them is not, and fails the model test."""
    assert not too_many_inconclusive(1, 0) and not too_many_inconclusive(3, 1)
    assert too_many_inconclusive(4, 0) and too_many_inconclusive(6, 8) and not too_many_inconclusive(5, 8)


async def test_the_sdk_cores_warnings_reach_the_refusal_watcher(caplog: pytest.LogCaptureFixture) -> None:
    """The verdict depends on the core's log reaching Python: its own start-up warning (the test server does not
    advertise a capability) arrives through the same forwarding, and a refusal's text is recognised."""

    def arrived() -> bool:
        return any(r.name.startswith("tests.lab.core") and "capability" in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.WARNING, logger="tests.lab.core"):
        async with open_lab(homelab([{"name": "s1"}]), runtime=refusal_watching_runtime()):
            for _ in range(50):
                if arrived():
                    break
                await asyncio.sleep(0.1)
    assert arrived(), [r.getMessage() for r in caplog.records]
    before = len(REFUSALS.seen)
    REFUSALS.handle(
        logging.makeLogRecord({"msg": 'message: "invalid history builder state for action"', "levelno": 30})
    )
    assert len(REFUSALS.seen) == before + 1
    del REFUSALS.seen[before:]
