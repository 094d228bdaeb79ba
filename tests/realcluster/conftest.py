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
# The real node's tier (`make e2e-pods`): images built here, deploy/ installed on a kubelet with containerd.
PODS_ENABLED = os.environ.get("HOMELAB_E2E_PODS", "") not in ("", "0")
FAILED = pytest.StashKey[list[str]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="the real-cluster story runs under `make e2e-real` (HOMELAB_E2E_REAL=1)")
    skip_pods = pytest.mark.skip(reason="the real node's tier runs under `make e2e-pods` (HOMELAB_E2E_PODS=1, root)")
    for item in items:
        # By marker, not keyword: every test of this directory has the keyword "realcluster".
        if item.get_closest_marker("realcluster") and not ENABLED:
            item.add_marker(skip)
        if item.get_closest_marker("realpods") and not PODS_ENABLED:
            item.add_marker(skip_pods)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Result[pytest.TestReport], None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        failed = item.session.stash.get(FAILED, None)
        if failed is None:
            failed = item.session.stash[FAILED] = []
        failed.append(item.nodeid)
