"""The machine room's tests run only under `make e2e-power` (HOMELAB_E2E_POWER=1): they need root, network
namespaces, runc and the images tests/machineroom/images.sh builds (minutes, once), so `make test` skips them and
says how to run them. The pure parts (localizing an example, resolving its container, the peers' configurations)
are tested in `make test` by tests/test_machineroom.py."""

from __future__ import annotations

import os

import pytest

ENABLED = os.environ.get("HOMELAB_E2E_POWER", "") not in ("", "0")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if ENABLED:
        return
    skip = pytest.mark.skip(
        reason="the power methods against real BMCs run under `make e2e-power` (HOMELAB_E2E_POWER=1)"
    )
    for item in items:
        if "machineroom" in item.keywords:
            item.add_marker(skip)
