"""The whole product on a real cluster: kind, the operator image built from this checkout, Temporal and
cluster-autoscaler from deploy/, and "machines" that really lose power (their node containers stop).

    make e2e        # needs docker (a running engine), kind and kubectl; takes about 20 minutes

The story, in order (each step waits with a bound and says what it waited for):
1. create the kind cluster (deploy/kind/cluster.yaml), build and `kind load` the image, start the power-control
   server on the host (tests/e2e/power_server.py) and point the `power-control` Service at it;
2. apply deploy/kind (the homelab install + cluster-autoscaler), then the Group and its two slots
   (deploy/kind/homelab.yaml);
3. both machines are on and idle: the operator adopts them (claims created directly `ready`), cluster-autoscaler
   finds them unneeded and deletes them, the shutdown Jobs call the power server, the containers stop, the
   claims complete and the Node objects are deleted (powerOffNodePolicy Delete). The group is now at zero;
4. a Deployment whose pod only a machine can run (deploy/kind/workload.yaml) stays Pending; cluster-autoscaler
   scales the group up from zero; a startup Job wakes one machine; its kubelet registers; the pod runs there;
5. the Deployment is deleted; cluster-autoscaler scales down; the machine is powered off and its claim completes.

Set HOMELAB_E2E_KEEP=1 to keep the cluster afterwards for a look (`kind delete cluster --name homelab-e2e`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.e2e.power_server import Machines, serve

ROOT = Path(__file__).resolve().parents[2]
KIND_DIR = ROOT / "deploy" / "kind"
CLUSTER = "homelab-e2e"
MACHINES = [f"{CLUSTER}-worker", f"{CLUSTER}-worker2"]
NS = "homelab-autoscaler-system"
IMAGE = "homelab-autoscaler:e2e"
POWER_PORT = 9052
GROUP_LABEL = "infra.homecluster.dev/group"

T = TypeVar("T")


def _missing_tools() -> str | None:
    for tool in ("docker", "kind", "kubectl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        subprocess.run(["docker", "info"], capture_output=True, check=True, timeout=30)
    except (subprocess.SubprocessError, OSError):
        return "docker is installed but no docker engine answers (`docker info` failed)"
    return None


MISSING = _missing_tools()
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(MISSING is not None, reason=f"kind e2e needs docker, kind and kubectl: {MISSING}"),
    pytest.mark.timeout(3600),
]


# --- plumbing -----------------------------------------------------------------------------------------------
def sh(*args: str, input: str | None = None, timeout: float = 600, check: bool = True) -> str:
    result = subprocess.run(list(args), input=input, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"`{' '.join(args)}` failed ({result.returncode}):\n{result.stderr or result.stdout}")
    return result.stdout


def kubectl(*args: str, **kw: Any) -> str:
    return sh("kubectl", "--context", f"kind-{CLUSTER}", *args, **kw)


def get(*args: str) -> Any:
    """`kubectl get ... -o json`, parsed; None when the object does not exist."""
    out = kubectl("get", *args, "-o", "json", "--ignore-not-found", check=False)
    return json.loads(out) if out.strip() else None


def wait_for(what: str, check: Callable[[], T | None], *, within: float, every: float = 5.0) -> T:
    """Poll `check` until it returns something truthy; fail after `within` seconds saying what did not happen."""
    deadline = time.monotonic() + within
    last_error: Exception | None = None
    while True:
        try:
            got = check()
            if got:
                return got
        except (AssertionError, subprocess.SubprocessError, OSError, ValueError) as exc:
            last_error = exc
        if time.monotonic() > deadline:
            hint = f" (last error: {last_error})" if last_error else ""
            raise AssertionError(f"waited {within:.0f} s for {what}, in vain{hint}")
        time.sleep(every)


def container_running(name: str) -> bool:
    return sh("docker", "inspect", "--format", "{{.State.Running}}", name).strip() == "true"


def claims() -> list[dict[str, Any]]:
    doc = get("nodeclaims.infra.homecluster.dev", "-n", NS)
    return list(doc["items"]) if doc else []


def claims_of(slot: str) -> list[dict[str, Any]]:
    return [c for c in claims() if c["spec"]["node"] == slot]


def phase(claim: dict[str, Any]) -> str:
    return str((claim.get("status") or {}).get("phase") or "")


def node_ready(name: str) -> bool:
    node = get("node", name)
    if not node:
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))


def logs_on_failure(request: pytest.FixtureRequest) -> None:
    """Print what an investigator needs first when a step failed."""
    report = getattr(request.node, "rep_call", None)
    if report is None or not report.failed:
        return
    for args in [
        ("get", "nodes", "-o", "wide"),
        ("get", "nodeclaims.infra.homecluster.dev,nodes.infra.homecluster.dev,jobs,pods", "-n", NS, "-o", "wide"),
        ("logs", "-n", NS, "deploy/homelab-autoscaler", "--tail", "200"),
        ("logs", "-n", NS, "deploy/cluster-autoscaler", "--tail", "200"),
        ("get", "events", "-n", NS, "--sort-by", ".lastTimestamp"),
    ]:
        print(f"$ kubectl {' '.join(args)}\n{kubectl(*args, check=False)}")


# --- the cluster --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A fresh kind cluster with the image loaded and the install applied; deleted afterwards."""
    sh("kind", "delete", "cluster", "--name", CLUSTER, check=False)
    sh("kind", "create", "cluster", "--config", str(KIND_DIR / "cluster.yaml"), "--wait", "180s", timeout=900)
    power = None
    try:
        sh("docker", "build", "-t", IMAGE, str(ROOT), timeout=1800)
        sh("kind", "load", "docker-image", IMAGE, "--name", CLUSTER, timeout=900)
        # Power control on the host, reachable from pods through the kind network's gateway.
        power = serve(Machines(MACHINES), host="0.0.0.0", port=POWER_PORT)
        gateway = sh(
            "docker", "network", "inspect", "kind", "--format", "{{range .IPAM.Config}}{{.Gateway}} {{end}}"
        ).split()
        ipv4 = next(g for g in gateway if "." in g)
        kubectl("apply", "-k", str(KIND_DIR), timeout=300)
        kubectl("apply", "-f", "-", input=json.dumps(_power_endpoints(ipv4)))
        kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=120s")
        kubectl("-n", NS, "rollout", "status", "statefulset/temporal", "--timeout=300s", timeout=330)
        kubectl("-n", NS, "rollout", "status", "deployment/homelab-autoscaler", "--timeout=300s", timeout=330)
        kubectl("-n", NS, "rollout", "status", "deployment/cluster-autoscaler", "--timeout=300s", timeout=330)
        kubectl("apply", "-f", str(KIND_DIR / "homelab.yaml"))
        yield CLUSTER
    finally:
        if power is not None:
            power.shutdown()
        if os.environ.get("HOMELAB_E2E_KEEP") != "1":
            sh("kind", "delete", "cluster", "--name", CLUSTER, check=False)


def _power_endpoints(ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "power-control-host",
            "namespace": NS,
            "labels": {"kubernetes.io/service-name": "power-control"},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip]}],
        "ports": [{"name": "http", "port": POWER_PORT, "protocol": "TCP"}],
    }


@pytest.fixture(autouse=True)
def _diagnose(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    logs_on_failure(request)  # tests/e2e/conftest.py keeps each phase's report on the item


def power_log() -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{POWER_PORT}/log", timeout=10) as resp:
        return list(json.loads(resp.read()))


# --- the story ----------------------------------------------------------------------------------------------
def test_idle_machines_are_adopted_then_scaled_down_and_powered_off(cluster: str) -> None:
    for machine in MACHINES:

        def adopted(m: str = machine) -> bool:
            return any(phase(c) == "ready" for c in claims_of(m))

        wait_for(f"an adopted, ready claim for {machine}", adopted, within=180)
    for machine in MACHINES:

        def stopped(m: str = machine) -> bool:
            return not container_running(m)

        def completed(m: str = machine) -> list[dict[str, Any]] | bool:
            return claims_of(m) and all(phase(c) == "completed" for c in claims_of(m))

        def deleted(m: str = machine) -> bool:
            return get("node", m) is None

        wait_for(
            f"cluster-autoscaler to scale {machine} down and the power server to stop it", stopped, within=600, every=10
        )
        wait_for(f"the claims of {machine} to complete", completed, within=300)
        wait_for(f"the Node {machine} to be deleted (powerOffNodePolicy Delete)", deleted, within=180)
    stops = {(e["machine"], e["power"]) for e in power_log()}
    assert {(m, "off") for m in MACHINES} <= stops, "the machines went off through their shutdown Jobs"
    jobs = get("jobs", "-n", NS)["items"]
    assert {j["metadata"]["labels"].get("type") for j in jobs} >= {"shutdown"}
    assert all((j["status"].get("succeeded") or 0) >= 1 for j in jobs), "every power Job succeeded"


def test_a_pending_pod_wakes_a_machine_and_runs_on_it(cluster: str) -> None:
    kubectl("apply", "-f", str(KIND_DIR / "workload.yaml"))

    def pod() -> dict[str, Any] | None:
        doc = get("pods", "-n", "default", "-l", "app.kubernetes.io/name=needs-a-machine")
        return doc["items"][0] if doc and doc["items"] else None

    booting = wait_for("a claim created by cluster-autoscaler's scale-up from zero", lambda: [
        c for c in claims() if phase(c) in ("pending", "booting", "ready") and c["spec"].get("call") == "IncreaseSize"
    ], within=300)  # fmt: skip
    slot = booting[0]["spec"]["node"]
    wait_for(f"the startup Job to power {slot} on", lambda: container_running(slot), within=300)
    wait_for(f"the kubelet of {slot} to register Ready", lambda: node_ready(slot), within=300)
    wait_for(f"the claim on {slot} to be ready", lambda: any(phase(c) == "ready" for c in claims_of(slot)),
             within=360)  # fmt: skip
    running = wait_for("the pod to run", lambda: (p := pod()) and p["status"].get("phase") == "Running" and p,
                       within=300)  # fmt: skip
    assert running["spec"]["nodeName"] == slot, "the pod runs on the machine that was woken for it"
    node = get("node", slot)
    assert node["metadata"]["labels"].get(GROUP_LABEL) == "e2e"
    assert not node["spec"].get("unschedulable")
    assert (slot, "on") in {(e["machine"], e["power"]) for e in power_log()}


def test_without_the_pod_the_machine_is_powered_off_and_its_claim_completes(cluster: str) -> None:
    slot = next(c["spec"]["node"] for c in claims() if phase(c) == "ready")
    kubectl("delete", "-f", str(KIND_DIR / "workload.yaml"), "--wait=true", timeout=180)
    wait_for(f"cluster-autoscaler to scale {slot} down and the power server to stop it",
             lambda: not container_running(slot), within=600, every=10)  # fmt: skip
    wait_for(f"every claim on {slot} to be finished", lambda: all(
        phase(c) in ("completed", "failed") for c in claims_of(slot)), within=300)  # fmt: skip
    finished = [c for c in claims_of(slot) if c["spec"].get("call") == "IncreaseSize"]
    assert finished and all(phase(c) == "completed" for c in finished), "the scale-up's claim completed"
    conditions = {cond["type"]: cond["status"] for cond in finished[-1]["status"].get("conditions", [])}
    assert conditions.get("MachineObservedOff") == "True", "completion waited for the machine to be seen off"
