"""Shared fixtures: a running Kubernetes API emulator and the operator's adapter talking HTTP to it.

`emulator` is a started `EmulatorServer` (fresh and empty per test): seed state with
`emulator.call(lambda e: e.put_object(group_version, plural, obj))`, inject failures with `emulator.emulator.faults`,
read what was sent in `emulator.emulator.requests`. `kube` is a `kube.adapter.Kube` connected to it, so tests go
through the real `kubernetes` client and its HTTP wire format, never a mock.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from homelab_sim.emulator import EmulatorServer

from kube.adapter import Kube

EXAMPLES = Path(__file__).resolve().parent.parent / "deploy" / "examples"

# kubectl caches discovery and HTTP answers under $HOME/.kube/cache unless KUBECACHEDIR says where: with HOME
# at a checkout (a CI job, a container) the suite would leave them in the repository. Every kubectl a test starts
# inherits this, so they go to a directory of the session's own, removed at its end.
KUBE_CACHE = Path(tempfile.mkdtemp(prefix="homelab-kubectl-cache-"))
os.environ["KUBECACHEDIR"] = str(KUBE_CACHE)


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


# --- RBAC usage: what the operator asked the emulated API server, across the whole session ----------------
# Every `EmulatorServer` a test starts (directly, through the `emulator` fixture, or inside a HomelabServer)
# is remembered; after the test, the requests it received are added to `RBAC_USAGE`. tests/test_rbac.py
# checks that set against deploy/rbac in a test that runs after every other one (see
# `pytest_collection_modifyitems`). Modules whose requests do not come from the operator are left out, and so are
# requests a test makes as someone else (a bearer token naming another user: a person applying a claim by hand).
OPERATOR_USERS = {"system:anonymous", "system:serviceaccount:homelab-autoscaler-system:homelab-autoscaler"}

RBAC_NOT_THE_OPERATOR = {
    "test_emulator.py": "drives the emulator with raw clients to test the emulator itself",
    "test_emulator_strict.py": "drives the emulator with raw clients to test its strict mode",
    "test_emulator_webhooks.py": "drives the emulator with raw clients to test its admission webhooks",
    "test_homelab.py": "drives the simulated homelab with raw clients (kubelets, Jobs) to test the simulation",
    "test_kube_adapter.py": "unit tests of every adapter method, including ones no role of the operator calls",
}


@dataclass(frozen=True, order=True)
class Use:
    """One kind of request: an RBAC (group, resource[/subresource], verb) and whether it spans namespaces."""

    group: str
    resource: str
    verb: str
    cluster_wide: bool  # a namespaced resource requested across all namespaces needs a ClusterRole


RBAC_USAGE: dict[Use, str] = {}  # each use → the first test that made it


def use_of(info: Any) -> Use | None:
    """The RBAC use of one `RequestInfo`; None for non-resource paths (discovery)."""
    if info.plural is None:
        return None
    resource = f"{info.plural}/{info.subresource}" if info.subresource else info.plural
    return Use(info.group or "", resource, info.verb, info.namespace is None)


def uses_of(requests: Iterable[Any]) -> set[Use]:
    return {u for u in map(use_of, requests) if u is not None}


@pytest.fixture(autouse=True)
def _record_rbac_usage(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    started: list[EmulatorServer] = []
    original = EmulatorServer.start

    def start(self: EmulatorServer) -> EmulatorServer:
        started.append(self)
        return original(self)

    monkeypatch.setattr(EmulatorServer, "start", start)
    yield
    _report_strict(request.node.nodeid, started)
    if request.path.name in RBAC_NOT_THE_OPERATOR:
        return
    for server in started:
        emulator = server._emulator  # still readable after stop()
        if emulator is None:
            continue
        for use in uses_of([r for r in list(emulator.requests) if r.user.username in OPERATOR_USERS]):
            RBAC_USAGE.setdefault(use, request.node.nodeid)


def _report_strict(test: str, servers: list[EmulatorServer]) -> None:
    """With HOMELAB_EMULATOR_STRICT_REPORT=<file>, append what strict mode refused or pruned (one JSON a line)."""
    target = os.environ.get("HOMELAB_EMULATOR_STRICT_REPORT")
    if not target:
        return
    with open(target, "a", encoding="utf-8") as report:
        for server in servers:
            emulator = server._emulator
            for record in list(emulator.strict_log) if emulator is not None else []:
                report.write(json.dumps({"test": test, **dataclasses.asdict(record)}, default=str) + "\n")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `rbac_session` read `RBAC_USAGE`, so they run after every other test."""
    last = [item for item in items if item.get_closest_marker("rbac_session")]
    if last:
        items[:] = [item for item in items if item not in last] + last


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "rbac_session: checks what the whole session asked of the API server")


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(KUBE_CACHE, ignore_errors=True)
