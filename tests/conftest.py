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
import signal
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_timeout
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
    """The documents of `deploy/examples/*.yaml` by file stem (`group`, `nodeclaim`), parsed afresh, and `nodes`:
    three slots of `workers` with the power specs the activity tests read (tests/data/nodes.yaml, the example the
    power/ examples replaced; its specs are what those tests assert on)."""
    found = {
        path.stem: [d for d in yaml.safe_load_all(path.read_text()) if d] for path in sorted(EXAMPLES.glob("*.yaml"))
    }
    found["nodes"] = [d for d in yaml.safe_load_all((Path(__file__).parent / "data" / "nodes.yaml").read_text()) if d]
    return found


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
    "test_kube_cache.py": "runs kubectl as a person does, to check where kubectl keeps its cache",
    # The bundled Temporal's setup step creates its PostgreSQL password Secret under its own Role
    # (deploy/components/temporal/temporal-setup.yaml), not deploy/rbac's: checked by tests/test_deploy.py.
    "test_temporal_setup.py": "the bundled Temporal's setup step, whose Secret grant is its component's Role",
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


# `make unit` runs the suite as several processes (pytest-xdist's workers, then the serial part): each process writes
# the uses it saw to HOMELAB_RBAC_USAGE (a directory the run made) at its end, and the session's check reads them all.
RBAC_USAGE_DIR = "HOMELAB_RBAC_USAGE"


def session_rbac_usage() -> dict[Use, str]:
    """Every use of the run: this process's, and those the run's earlier processes wrote to HOMELAB_RBAC_USAGE."""
    usage = dict(RBAC_USAGE)
    folder = os.environ.get(RBAC_USAGE_DIR)
    if not folder:
        return usage
    written = sorted(Path(folder).glob("*.json"))
    assert written, f"{RBAC_USAGE_DIR}={folder}: no earlier process of this run wrote what it requested"
    for path in written:
        for row in json.loads(path.read_text()):
            usage.setdefault(Use(row["group"], row["resource"], row["verb"], row["cluster_wide"]), row["test"])
    return usage


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With HOMELAB_RBAC_USAGE, leave this process's uses there for the run's RBAC check (see above)."""
    folder = os.environ.get(RBAC_USAGE_DIR)
    if folder and RBAC_USAGE:
        rows = [{**dataclasses.asdict(use), "test": test} for use, test in RBAC_USAGE.items()]
        (Path(folder) / f"{os.getpid()}.json").write_text(json.dumps(rows))


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
    """Tests marked `rbac_session` read `RBAC_USAGE`, so they run after every other test. Under pytest-xdist the
    tests marked `long` come first, each followed by a short one: `make unit` hands a worker two tests to begin
    with and one more as each ends (`--dist load --maxschedchunk 1`), so the long ones start at once, one per
    worker, and the short ones fill the time around them; at the end of the queue, one would be the run's tail."""
    if getattr(config.option, "numprocesses", None):
        long = [item for item in items if item.get_closest_marker("long")]
        short = [item for item in items if not item.get_closest_marker("long")]
        ordered: list[pytest.Item] = []
        for i, item in enumerate(long):
            ordered += [item, *short[i : i + 1]]
        items[:] = ordered + short[len(long) :]
    last = [item for item in items if item.get_closest_marker("rbac_session")]
    if last:
        items[:] = [item for item in items if item not in last] + last


# The tiers that start a control plane, a node or BMCs (make e2e-real, e2e-pods, e2e-power, upgrade).
REAL_TIERS = ("HOMELAB_E2E_REAL", "HOMELAB_E2E_PODS", "HOMELAB_E2E_POWER", "HOMELAB_UPGRADE")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}: stopping, and tearing down what this run started")


def pytest_configure(config: pytest.Config) -> None:
    """Besides the marker: under a real tier a SIGTERM (CI's stop, a person's `kill`) ends the run as Ctrl-C does, so
    pytest tears its fixtures down and the control plane, the node's processes, mounts and namespace are stopped by
    PID and removed; Python's default ended the run at once and left them all running."""
    config.addinivalue_line("markers", "rbac_session: checks what the whole session asked of the API server")
    if any(os.environ.get(name, "") not in ("", "0") for name in REAL_TIERS):
        signal.signal(signal.SIGTERM, _interrupt)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(KUBE_CACHE, ignore_errors=True)


# --- timeouts that end a test whose event loop waits on the Temporal SDK ---------------------------------------
# pytest-timeout's signal method arms a process-wide SIGALRM; the kernel may hand it to any thread, and with the
# Temporal SDK's threads about, a test whose event loop waited on one of them never woke to it (a whole `make test`
# hung 20 minutes in test_replay.py, deaf to SIGALRM and to two SIGINTs). Here the alarm is sent to the main
# thread itself: its wait is interrupted and the test fails with every thread's stack. Should the failure be
# swallowed (raised inside an asyncio callback), the process ends LAST_RESORT seconds later with the stacks printed,
# as pytest-timeout's thread method does (pytest-xdist then replaces the worker and reports the test failed).
LAST_RESORT = 30.0


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own way
    main = threading.main_thread().ident
    assert main is not None

    def handler(signum: int, frame: Any) -> None:
        __tracebackhide__ = True
        pytest_timeout.timeout_sigalrm(item, settings)

    alarm = threading.Timer(settings.timeout, signal.pthread_kill, (main, signal.SIGALRM))
    last = threading.Timer(settings.timeout + LAST_RESORT, pytest_timeout.timeout_timer, (item, settings))
    for timer in (alarm, last):
        timer.daemon = True
        timer.start()

    def cancel() -> None:
        alarm.cancel()
        last.cancel()
        signal.signal(signal.SIGALRM, signal.SIG_DFL)

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # pytest-timeout's own attribute, read at teardown
    signal.signal(signal.SIGALRM, handler)
    return True
