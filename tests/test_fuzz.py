"""The fuzzers of tests/fuzz run in `make test` too, briefly (`make fuzz` and .ci/run run them for a minute each):
the provider's request decoding and the webhook's review handling survive what atheris makes of valid requests."""

from __future__ import annotations

import pytest

from tests.fuzz.run import TARGETS, fuzz


@pytest.mark.parametrize("target", TARGETS)
def test_a_short_fuzz_finds_no_crash_and_tries_many_inputs(target: str) -> None:
    outcome = fuzz(target, 4)
    assert outcome.ok, outcome.why
    assert outcome.inputs > 1000, outcome
    print(f"\n{target}: {outcome.inputs} inputs in {outcome.seconds} s")
