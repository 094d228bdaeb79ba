"""Keeps each test phase's report on the item (`item.rep_call`), so a failed e2e step can print the cluster's
state next to its failure."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
from pluggy import Result


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Result[pytest.TestReport], None]:
    outcome = yield
    setattr(item, f"rep_{call.when}", outcome.get_result())
