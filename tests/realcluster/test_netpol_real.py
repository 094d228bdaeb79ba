"""NetworkPolicy enforced on the real node (`make e2e-pods`): kube-network-policies in the node's namespace
(tests/realcluster/node.py) lets a Pod of another namespace reach a server Pod until a policy selects the server,
then only a client labelled `role=allowed` gets through; deleting the policy opens it again. Through the Service
(kube-proxy's DNAT, then the bridge) and to the Pod's address (bridged Pod to Pod, through br_netfilter). The
node's own root processes (the kubelet's probes, a process in the node's namespace) are let through, as the engine
does on any node.

On a PodStack of its own (namespace and cgroups `hlnp-<hex>`), without the operator's images; the tries are
tests/realcluster/doors.py's, which later tests use to try the operator's doors.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.realcluster import inventory
from tests.realcluster.cluster import wait_until
from tests.realcluster.conftest import FAILED
from tests.realcluster.doors import Attempt, forget_clients, table, try_door
from tests.realcluster.node import CONTROL_PLANE_LABEL, NETPOL_ENGINE
from tests.realcluster.podstack import TOLERATE_CONTROL_PLANE, PodStack

pytestmark = [pytest.mark.realpods, pytest.mark.timeout(1800)]

PREFIX = "hlnp-"
SERVER_NS = "netpol-server"
CLIENT_NS = "netpol-client"
SERVER = "door-server"
PORT = 8080
SERVICE = f"{SERVER}.{SERVER_NS}.svc.cluster.local"
POLICY = "only-role-allowed"
BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
TRY_SECONDS = 3.0
STATE: dict[str, Any] = {}


def _bridge_nf() -> str:
    return BRIDGE_NF.read_text().strip() if BRIDGE_NF.exists() else "(absent)"


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Iterator[PodStack]:
    STATE["began"] = time.monotonic()
    STATE["before"] = inventory.take(markers=(PREFIX,))
    STATE["bridge_nf"] = _bridge_nf()
    directory = Path(tempfile.mkdtemp(prefix=PREFIX))
    s = PodStack(directory, with_operator_image=False, prefix=PREFIX)
    s.start()
    up = time.monotonic() - STATE["began"]
    print(f"\nreal node up in {up:.0f} s in {directory}, its namespace {s.node.layout.netns}")
    yield s
    failed = bool(request.session.stash.get(FAILED, []))
    if failed:
        s.dump(80)
    s.stop()
    if failed or os.environ.get("HOMELAB_E2E_KEEP", "") not in ("", "0"):
        print(f"kept {directory}")
    else:
        shutil.rmtree(directory, ignore_errors=True)


def server_objects() -> list[dict[str, Any]]:
    """busybox's httpd on 8080, Ready by the kubelet's TCP probe (a root process of the node), behind a Service."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SERVER_NS}},
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": CLIENT_NS}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVER, "namespace": SERVER_NS},
         "spec": {"selector": {"app": SERVER}, "ports": [{"name": "http", "port": PORT, "targetPort": PORT}]}},
    ]  # fmt: skip


def server_pod(image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": SERVER, "namespace": SERVER_NS,
                                                        "labels": {"app": SERVER}},
        "spec": {"nodeSelector": {CONTROL_PLANE_LABEL: ""}, "tolerations": TOLERATE_CONTROL_PLANE,
                 "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False,
                 "containers": [{"name": "httpd", "image": image, "imagePullPolicy": "IfNotPresent",
                                 "command": ["busybox", "httpd", "-f", "-p", str(PORT), "-h", "/tmp"],
                                 "ports": [{"containerPort": PORT}],
                                 "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 2,
                                                    "failureThreshold": 1}}]},
    }  # fmt: skip


def policy() -> dict[str, Any]:
    """The server takes connections on 8080 only from Pods labelled role=allowed, of any namespace."""
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": POLICY, "namespace": SERVER_NS},
        "spec": {"podSelector": {"matchLabels": {"app": SERVER}}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "allowed"}}}],
                              "ports": [{"protocol": "TCP", "port": PORT}]}]},
    }  # fmt: skip


def test_1_the_engine_runs_in_the_nodes_namespace(stack: PodStack) -> None:
    """Its table in the node's namespace (the queue rules on postrouting), its nfqueue bound, the bridge's packets
    sent through the IP hooks there, and the machine's own setting as it was."""
    node = stack.node
    engine = next(p for p in node.procs if p.name == NETPOL_ENGINE)
    assert engine.alive, engine.tail()
    text = node.netpol_table()
    print(f"\nnft list table inet {NETPOL_ENGINE} (in {node.layout.netns}):\n{text}")
    assert "hook postrouting" in text and "queue num" in text, text
    assert node.netpol_queue_bound()
    inside = subprocess.run(["nsenter", f"--net={node.layout.netns_path}", "cat", str(BRIDGE_NF)], capture_output=True,
                            text=True, timeout=30, check=True).stdout.strip()  # fmt: skip
    assert inside == "1"
    assert _bridge_nf() == STATE["bridge_nf"], "the machine's own bridge-nf-call-iptables changed"


def test_2_a_network_policy_is_enforced_on_the_node(stack: PodStack) -> None:
    s = stack
    core: Any = k8s.CoreV1Api(s.cluster.admin)
    net: Any = k8s.NetworkingV1Api(s.cluster.admin)
    s.apply(server_objects())
    core.create_namespaced_pod(SERVER_NS, server_pod(s.images["busybox"]))

    def ready() -> str:
        pod = core.read_namespaced_pod(SERVER, SERVER_NS)
        ok = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
        return str(pod.status.pod_ip) if ok and pod.status.pod_ip else ""

    pod_ip = wait_until(f"Pod {SERVER_NS}/{SERVER} Ready (the kubelet's TCP probe)", ready, within=120)
    attempts: list[Attempt] = []
    unlabelled: dict[str, str] = {}
    allowed = {"role": "allowed"}

    def attempt(labels: dict[str, str], host: str, expected: bool, *, settle: float = 0) -> Attempt:
        """One try; with `settle`, tried again until it gives `expected` or `settle` seconds pass (the first try
        after a change: DNS, kube-proxy, the engine's sets are each a moment behind)."""
        end = time.monotonic() + settle
        while True:
            ok, how = try_door(s, CLIENT_NS, labels, host, PORT, timeout=TRY_SECONDS)
            if ok == expected or time.monotonic() >= end:
                break
            time.sleep(1)
        source = f"{CLIENT_NS}/" + (",".join(f"{k}={v}" for k, v in labels.items()) or "(no labels)")
        a = Attempt(source, "svc " + SERVICE.split(".svc")[0] if host == SERVICE else f"pod {pod_ip}", PORT,
                    expected, ok, how)  # fmt: skip
        attempts.append(a)
        print(a.row(), flush=True)
        return a

    def from_node(expected: bool) -> Attempt:
        """busybox's nc run as root in the node's own namespace (the kubelet's kind of traffic), to the Pod."""
        done = subprocess.run(["nsenter", f"--net={s.node.layout.netns_path}", "busybox", "nc", "-w",
                               str(int(TRY_SECONDS)), pod_ip, str(PORT)], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        ok = done.returncode == 0
        how = "ok" if ok else ("timeout" if "timed out" in done.stderr else done.stderr.strip() or "failed")
        a = Attempt("node (root, its namespace)", f"pod {pod_ip}", PORT, expected, ok, how)
        attempts.append(a)
        print(a.row(), flush=True)
        return a

    def in_set() -> bool:
        return bool(pod_ip in s.node.netpol_table())

    try:
        print("\nno policy:")
        attempt(unlabelled, SERVICE, True, settle=60)
        attempt(unlabelled, pod_ip, True)
        attempt(allowed, SERVICE, True, settle=30)

        began = time.monotonic()
        s.apply([policy()])
        wait_until(f"kube-network-policies to put {pod_ip} in its set (NetworkPolicy {POLICY} applied)", in_set,
                   within=30)  # fmt: skip
        print(f"\npolicy {POLICY} applied (the engine's set held the server {time.monotonic() - began:.1f} s later):")
        attempt(unlabelled, SERVICE, False, settle=10)
        attempt(unlabelled, pod_ip, False)
        attempt(allowed, SERVICE, True)
        attempt(allowed, pod_ip, True)
        from_node(True)
        assert ready(), "the kubelet's probe of the server failed under the policy"

        net.delete_namespaced_network_policy(POLICY, SERVER_NS)
        wait_until(f"kube-network-policies to drop {pod_ip} from its set (NetworkPolicy {POLICY} deleted)",
                   lambda: not in_set(), within=30)  # fmt: skip
        print(f"\npolicy {POLICY} deleted:")
        attempt(unlabelled, SERVICE, True, settle=10)
        attempt(unlabelled, pod_ip, True)
    finally:
        print("\n" + table(attempts))
        engine = next(p for p in s.node.procs if p.name == NETPOL_ENGINE)
        verdicts = [line for line in engine.tail(4000).splitlines() if "Finished syncing packet" in line]
        print(f"\nthe engine's verdicts logged: {len(verdicts)}; the last:\n" + "\n".join(verdicts[-4:]))
    wrong = [a for a in attempts if a.ok != a.expected]
    assert not wrong, "\n".join(a.row() for a in wrong)
    forget_clients(s, CLIENT_NS)
    core.delete_namespaced_pod(SERVER, SERVER_NS, grace_period_seconds=0)


def test_zz_the_node_is_gone_and_nothing_of_the_run_is_left(stack: PodStack) -> None:
    """Stopped: the machine's inventory as before (namespaces, links, firewall tables, mounts, cgroups, processes),
    its bridge-nf-call-iptables too."""
    s = stack
    s.stop()
    after = inventory.take(markers=(PREFIX,), cgroup_names=(s.node.layout.cgroup_root,))
    ours, theirs = inventory.left_behind(inventory.diff(STATE["before"], after), (PREFIX, str(s.dir)))
    print("\nphase times:\n" + "\n".join(f"  {k}: {v:.0f} s" for k, v in s.timings.items()))
    print(f"the module: {time.monotonic() - STATE['began']:.0f} s")
    if theirs:
        print("appeared meanwhile, not the run's (the machine is shared):\n" + yaml.safe_dump(theirs))
    assert not ours, "the run left the machine changed:\n" + yaml.safe_dump(ours)
    assert _bridge_nf() == STATE["bridge_nf"]
