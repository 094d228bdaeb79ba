"""Shared fixtures: a running Kubernetes API emulator and the operator's adapter talking HTTP to it.

`emulator` is a started `EmulatorServer` (fresh and empty per test): seed state with
`emulator.call(lambda e: e.put_object(group_version, plural, obj))`, inject failures with `emulator.emulator.faults`,
read what was sent in `emulator.emulator.requests`. `kube` is a `kube.adapter.Kube` connected to it, so tests go
through the real `kubernetes` client and its HTTP wire format, never a mock.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from homelab_autoscaler.sim.emulator import EmulatorServer
from kube.adapter import Kube

EXAMPLES = Path(__file__).resolve().parent.parent / "deploy" / "examples"


@pytest.fixture
def emulator() -> Iterator[EmulatorServer]:
    """A fresh, empty API emulator on 127.0.0.1 (its own thread and loop), stopped after the test."""
    with EmulatorServer() as server:
        yield server


@pytest.fixture
def kube(emulator: EmulatorServer) -> Iterator[Kube]:
    """The operator's adapter connected to `emulator` with a short timeout, so a hung call fails the test fast."""
    adapter = Kube.connect(server=emulator.url, timeout=5.0)
    try:
        yield adapter
    finally:
        adapter.close()


@pytest.fixture
def examples() -> dict[str, list[dict[str, Any]]]:
    """The documents of `deploy/examples/*.yaml` by file stem (`group`, `nodes`, `nodeclaim`), parsed afresh."""
    return {
        path.stem: [d for d in yaml.safe_load_all(path.read_text()) if d] for path in sorted(EXAMPLES.glob("*.yaml"))
    }
