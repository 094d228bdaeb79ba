"""The real-cluster suite runs only under `make e2e-real` (HOMELAB_E2E_REAL=1): it starts a control plane, Temporal,
the operator and cluster-autoscaler, which takes minutes, so `make test` skips it and says how to run it. A step's
report is kept on its item so the stack's logs can be printed next to the first failure."""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest
from pluggy import Result

ENABLED = os.environ.get("HOMELAB_E2E_REAL", "") not in ("", "0")
FAILED = pytest.StashKey[list[str]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="the real-cluster story runs under `make e2e-real` (HOMELAB_E2E_REAL=1)")
    for item in items:
        if "realcluster" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Result[pytest.TestReport], None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        failed = item.session.stash.get(FAILED, None)
        if failed is None:
            failed = item.session.stash[FAILED] = []
        failed.append(item.nodeid)
