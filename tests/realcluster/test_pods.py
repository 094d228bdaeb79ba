"""The product as a user installs it, on a real node (`make e2e-pods`): a kubelet with containerd, runc, the CNI
bridge, kube-proxy and CoreDNS in a network namespace of the run's own, joined to the harness's control plane
beside the KWOK machines; images built here; deploy/ installed by docs/install.md's own commands.

The tests run in order on one stack; the last one stops it and checks the machine is left as found.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster import inventory
from tests.realcluster.conftest import FAILED
from tests.realcluster.node import PREFIX
from tests.realcluster.podstack import PodStack

pytestmark = [pytest.mark.realpods, pytest.mark.timeout(3600)]

STATE: dict[str, Any] = {}


@pytest.fixture(scope="module")
def pods(request: pytest.FixtureRequest) -> Iterator[PodStack]:
    STATE["before"] = inventory.take(markers=(PREFIX,))
    keep = os.environ.get("HOMELAB_E2E_KEEP", "") not in ("", "0")
    directory = Path(tempfile.mkdtemp(prefix="hlas-pods-"))
    began = time.monotonic()
    stack = PodStack(directory).start()
    print(f"\nreal node up in {time.monotonic() - began:.0f} s in {directory}")
    STATE["stack"] = stack
    yield stack
    if request.session.stash.get(FAILED, []):
        stack.dump(80)
    stack.stop()
    if not keep:
        import shutil

        shutil.rmtree(directory, ignore_errors=True)


def test_the_node_runs_pods_with_cluster_dns_and_services(pods: PodStack) -> None:
    """A Pod on the real node resolves a Service by name (CoreDNS), reaches the API server through the `kubernetes`
    Service (kube-proxy), and reaches nothing outside: no name outside cluster.local resolves, no route leads off."""
    out = pods.run_pod("dns-check", (
        "nslookup kubernetes.default.svc.cluster.local && "
        "nc -z -w 5 kubernetes.default.svc.cluster.local 443 && echo api-reachable; "
        "if nslookup example.com >/dev/null 2>&1; then echo OUTSIDE-RESOLVED; fi; "
        "if nc -z -w 3 1.1.1.1 53 2>/dev/null; then echo OUTSIDE-REACHED; fi; true"
    ))  # fmt: skip
    assert out.startswith("Succeeded"), out
    assert "10.0.0.1" in out and "api-reachable" in out, out
    assert "OUTSIDE" not in out, out
