"""The model-based adversary (tests/model.py) inside `make test`: a bounded budget of random examples.

`make soak SOAK_MINUTES=30` runs the same driver for as long as asked and prints the examples and steps tried.
A failure prints its seed; `MODEL_SEED=<seed> .venv/bin/pytest tests/test_model.py` reruns that schedule.
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter

import pytest

from tests.model import run_example

# The default budget: enough examples to cover every kind of step several times, about a minute on 2 cores.
BUDGET_SECONDS = float(os.environ.get("MODEL_BUDGET_SECONDS", "30"))
STEPS = int(os.environ.get("MODEL_STEPS", "30"))


@pytest.mark.timeout(BUDGET_SECONDS + 900)  # the last example may start just before the budget runs out
async def test_the_claim_law_holds_under_random_adversity() -> None:
    fixed = os.environ.get("MODEL_SEED")
    seeds = [int(fixed)] if fixed else None
    started, tally, examples = time.monotonic(), Counter[str](), 0
    rng = random.Random()
    while True:
        seed = seeds.pop() if seeds else rng.randrange(2**32)
        print(f"model example seed {seed}")
        tally += await run_example(seed, STEPS)
        examples += 1
        if fixed or time.monotonic() - started > BUDGET_SECONDS:
            break
    print(f"model: {examples} examples, {sum(tally.values())} steps: {dict(sorted(tally.items()))}")
    assert examples >= 1 and sum(tally.values()) >= STEPS
