"""The product as a user installs it, on a real node (`make e2e-pods`): a kubelet with containerd, runc, the CNI
bridge, kube-proxy and CoreDNS in a network namespace of the run's own, joined to the harness's control plane
beside the KWOK machines; images built here; deploy/ installed by docs/install.md's own commands.

The tests run in order on one stack; the last one stops it and checks the machine is left as found.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.realcluster import inventory
from tests.realcluster.cluster import wait_until
from tests.realcluster.conftest import FAILED
from tests.realcluster.node import CONTROL_PLANE_LABEL, NODE_IP, NODE_NAME, PREFIX
from tests.realcluster.podstack import PodStack
from tests.realcluster.stack import DEPLOY, NS, STORY_HOMELAB, homelab_objects, phase

OPERATOR_IMAGE = "ghcr.io/homecluster/homelab-autoscaler"
CA_IMAGE = "registry.k8s.io/autoscaling/cluster-autoscaler"
ROOT = DEPLOY.parent
# Every command docs/install.md types, as run here (the test overlays in place of deploy/'s paths) or why not.
GUIDE: list[tuple[str, str]] = []

pytestmark = [pytest.mark.realpods, pytest.mark.timeout(3600)]

STATE: dict[str, Any] = {}


@pytest.fixture(scope="module")
def pods(request: pytest.FixtureRequest) -> Iterator[PodStack]:
    STATE["before"] = inventory.take(markers=(PREFIX,))
    keep = os.environ.get("HOMELAB_E2E_KEEP", "") not in ("", "0")
    directory = Path(tempfile.mkdtemp(prefix="hlas-pods-"))
    began = time.monotonic()
    stack = PodStack(directory)
    stack.start()
    print(f"\nreal node up in {time.monotonic() - began:.0f} s in {directory}")
    STATE["stack"] = stack
    yield stack
    if request.session.stash.get(FAILED, []):
        stack.dump(80)
    stack.stop()
    if not keep:
        shutil.rmtree(directory, ignore_errors=True)


def typed(s: PodStack, command: str, paths: dict[str, Path] | None = None, *, timeout: float = 600) -> str:
    """A command of docs/install.md run as written: `kubectl` of the cluster's release with the admin's kubeconfig,
    a deploy/ path replaced by the run's overlay of it (which renames images only), from the repository root."""
    args = shlex.split(command)
    assert args[0] == "kubectl", command
    for i, a in enumerate(args):
        if paths and a in paths:
            args[i] = str(paths[a])
    done = s.cluster.kubectl(*args[1:], timeout=timeout)
    GUIDE.append((command, "run" if not paths else f"run, {', '.join(paths)} through the run's overlay"))
    return done.stdout


def test_the_node_runs_pods_with_cluster_dns_and_services(pods: PodStack) -> None:
    """A Pod on the real node resolves a Service by name (CoreDNS), reaches the API server through the `kubernetes`
    Service (kube-proxy), and reaches nothing outside: no name outside cluster.local resolves, no route leads off."""
    out = pods.run_pod("dns-check", (
        "nslookup kubernetes.default.svc.cluster.local && "
        "nc -w 5 kubernetes.default.svc.cluster.local 443 </dev/null && echo api-reachable; "
        "if nslookup example.com >/dev/null 2>&1; then echo OUTSIDE-RESOLVED; fi; "
        # TEST-NET-1: routed nowhere on any network; the node's namespace has no default route to try it on.
        "if nc -w 3 192.0.2.1 53 </dev/null 2>/dev/null; then echo OUTSIDE-REACHED; fi; true"
    ))  # fmt: skip
    assert out.startswith("Succeeded"), out
    assert "10.0.0.1" in out and "api-reachable" in out, out
    assert "OUTSIDE" not in out, out
    routes = subprocess.run(["nsenter", f"--net={pods.node.layout.netns_path}", "ip", "route"], capture_output=True,
                            text=True, timeout=30, check=True).stdout  # fmt: skip
    assert "default" not in routes, f"the node's namespace routes somewhere:\n{routes}"


# --- the install, typed as docs/install.md types it ------------------------------------------------------------------
def test_a_default_storage_class_as_the_guide_says(pods: PodStack) -> None:
    """local-path-provisioner installed, then marked the default with the guide's own `kubectl patch`."""
    with pods.phase("storage class"):
        pods.install_storage()
        before = typed(pods, "kubectl get storageclass")
        assert "local-path" in before and "(default)" not in before, before
        typed(
            pods,
            "kubectl patch storageclass local-path -p "
            '\'{"metadata": {"annotations": {"storageclass.kubernetes.io/is-default-class": "true"}}}\'',
        )
        after = typed(pods, "kubectl get storageclass")
        assert "local-path (default)" in after, after


def test_the_homelab_install_as_the_guide_types_it(pods: PodStack) -> None:
    """`kubectl apply -k deploy/overlays/homelab` (through an overlay that renames the image only), the two
    `rollout status` lines, and the Temporal volume bound by the default StorageClass."""
    overlay = pods.overlay("homelab", DEPLOY / "overlays" / "homelab",
                           {OPERATOR_IMAGE: pods.images["homelab-autoscaler"]})  # fmt: skip
    paths = {"deploy/overlays/homelab": overlay}
    with pods.phase("install (apply, rollout status)"):
        rendered = typed(pods, "kubectl kustomize deploy/overlays/homelab", paths)
        assert pods.images["homelab-autoscaler"] in rendered
        typed(pods, "kubectl apply -k deploy/overlays/homelab", paths)
        typed(pods, "kubectl -n homelab-autoscaler-system rollout status statefulset/temporal")
        typed(pods, "kubectl -n homelab-autoscaler-system rollout status deployment/homelab-autoscaler")
    core: Any = k8s.CoreV1Api(pods.cluster.admin)
    pvc = core.read_namespaced_persistent_volume_claim("data-temporal-0", NS)
    assert pvc.status.phase == "Bound" and pvc.spec.storage_class_name == "local-path", pvc.status
    for pod in core.list_namespaced_pod(NS).items:
        assert pod.spec.node_name == NODE_NAME, f"{pod.metadata.name} is on {pod.spec.node_name}"


def test_the_web_ui_through_the_guides_port_forward(pods: PodStack) -> None:
    """`kubectl -n homelab-autoscaler-system port-forward svc/temporal-web 8233`, then its page: the API server
    reaches the kubelet through the node's door, the kubelet the Pod through containerd."""
    command = "kubectl -n homelab-autoscaler-system port-forward svc/temporal-web 8233"
    args = shlex.split(command)[1:]
    local = 8233
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 8233)) == 0:  # another program has the guide's port: pick a free one
            local = _free()
            args[-1] = f"{local}:8233"
    proc = subprocess.Popen([str(pods.cluster.bins / "kubectl"), "--kubeconfig", str(pods.cluster.admin_kubeconfig),
                             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:

        def page() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=5) as r:
                return str(r.read().decode(errors="replace"))

        html = wait_until("the Web UI's page through kubectl port-forward", page, within=60)
        assert "<html" in html.lower() and "/_app/immutable/" in html, html[:300]

        def namespaces() -> str:  # the UI's server asks the Temporal frontend: the page is the live UI
            with urllib.request.urlopen(f"http://127.0.0.1:{local}/api/v1/namespaces", timeout=10) as r:
                return str(r.read().decode(errors="replace"))

        listed = wait_until("the Web UI to list Temporal's namespaces", namespaces, within=60)
        assert '"default"' in listed, listed[:300]
    finally:
        proc.terminate()
        proc.wait(10)
    GUIDE.append((command, "run" if local == 8233 else f"run on local port {local} (8233 was taken)"))


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the story through Pods ------------------------------------------------------------------------------------------
MACHINE_ROOM = f"http://machine-room.{NS}.svc:9052"
WORKLOAD = "needs-a-machine"


def power_spec(s: PodStack, operation: str) -> dict[str, Any]:
    """A slot's power pod spec as a user writes one: busybox's wget calls the machine room (a BMC's API) through
    its Service; an answer other than 200 fails the Job with exit code 3 and says so in the termination message."""
    script = (
        f'wget -q -O - --post-data= "{MACHINE_ROOM}/machines/$HOMELAB_SLOT/{operation}" '
        f'|| {{ echo "the BMC of $HOMELAB_SLOT did not answer" > /dev/termination-log; exit 3; }}'
    )
    return {
        "image": s.images["busybox"],
        "command": ["sh", "-c", script],
        "nodeSelector": {CONTROL_PLANE_LABEL: ""},
        "tolerations": [{"key": CONTROL_PLANE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
        "activeDeadlineSeconds": 120,
        "backoffLimit": 0,
        "ttlSecondsAfterFinished": 60,
    }


def machine_room_service(port: int) -> list[dict[str, Any]]:
    """The Service the power Jobs call, its endpoint the node's door to the machine room on the loopback."""
    return [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "machine-room", "namespace": NS},
         "spec": {"ports": [{"name": "http", "port": 9052, "targetPort": port}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "machine-room", "namespace": NS,
                      "labels": {"kubernetes.io/service-name": "machine-room"}},
         "addressType": "IPv4", "endpoints": [{"addresses": [NODE_IP]}],
         "ports": [{"name": "http", "port": port, "protocol": "TCP"}]},
    ]  # fmt: skip


def claims(s: PodStack) -> list[dict[str, Any]]:
    api: Any = k8s.CustomObjectsApi(s.cluster.admin)
    return list(api.list_namespaced_custom_object("infra.homecluster.dev", "v2alpha1", NS, "nodeclaims")["items"])


def node_ready(s: PodStack, name: str) -> bool:
    core: Any = k8s.CoreV1Api(s.cluster.admin)
    try:
        node = core.read_node(name)
    except k8s.exceptions.ApiException:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def test_cluster_autoscaler_installed_as_the_guide_types_it(pods: PodStack) -> None:
    """`kubectl apply -k deploy/cluster-autoscaler/plaintext` (the image renamed; then, for a story that ends in
    minutes, the scale-down timings shortened as deploy/kind does), its Pod Running on the control plane."""
    if "cluster-autoscaler" not in pods.images.refs:
        pytest.skip("no cluster-autoscaler binary to make its image from (HOMELAB_CLUSTER_AUTOSCALER or make "
                    "cluster-bins with issue 29's build)")  # fmt: skip
    overlay = pods.overlay("cluster-autoscaler", DEPLOY / "cluster-autoscaler" / "plaintext",
                           {CA_IMAGE: pods.images["cluster-autoscaler"]})  # fmt: skip
    with pods.phase("cluster-autoscaler install"):
        typed(pods, "kubectl apply -k deploy/cluster-autoscaler/plaintext",
              {"deploy/cluster-autoscaler/plaintext": overlay})  # fmt: skip
        pods.rollout(NS, "deployment/cluster-autoscaler")


def test_a_boot_and_a_power_off_through_real_pods(pods: PodStack) -> None:
    """The homelab applied as the guide says (`--validate=strict`); a workload that fits no node; cluster-autoscaler's
    Pod asks the provider's Service for a machine; the startup Job's Pod runs on the real node and calls the machine
    room, which boots the KWOK machine; the workload runs there. The operator and Temporal stay on the control plane.
    Then the workload goes and the machine is powered off by a shutdown Job's Pod."""
    if "cluster-autoscaler" not in pods.images.refs:
        pytest.skip("cluster-autoscaler's image could not be made (see the install step)")
    s = pods
    room = s.start_machine_room({slot.name: slot.machine() for slot in STORY_HOMELAB.slots})
    s.apply(machine_room_service(room.port))
    docs = homelab_objects(STORY_HOMELAB)
    for doc in docs:
        if doc["kind"] == "Node":
            doc["spec"]["startupPodSpec"] = power_spec(s, "on")
            doc["spec"]["shutdownPodSpec"] = power_spec(s, "off")
    s.cluster.kubectl("apply", "--validate=strict", "-f", "-", input=yaml.safe_dump_all(docs))
    GUIDE.append(("kubectl apply --validate=strict", "run (the story's Groups and slots)"))
    # The story's timings (deploy/kind does the same for make e2e): scale-down in seconds, not ten minutes.
    s.cluster.kubectl("-n", NS, "patch", "deployment/cluster-autoscaler", "--type=json", "-p", yaml.safe_dump([
        {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": flag}
        for flag in ("--scan-interval=5s", "--scale-down-unneeded-time=30s", "--scale-down-delay-after-add=20s",
                     "--scale-down-delay-after-delete=0s", "--expander=priority", "--skip-nodes-with-system-pods=false")
    ]))  # fmt: skip
    s.apply([{"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "cluster-autoscaler-priority-expander", "namespace": NS},
              "data": {"priorities": "20: ['^workers$']\n10: ['^spares$']\n"}}])  # fmt: skip
    s.rollout(NS, "deployment/cluster-autoscaler")
    apps: Any = k8s.AppsV1Api(s.cluster.admin)
    core: Any = k8s.CoreV1Api(s.cluster.admin)
    apps.create_namespaced_deployment("default", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": WORKLOAD},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": WORKLOAD}},
                 "template": {"metadata": {"labels": {"app": WORKLOAD}},
                              "spec": {"nodeSelector": {"homelab.dev/machine": "true"},
                                       "containers": [{"name": "app", "image": s.images["busybox"],
                                                       "resources": {"requests": {"cpu": "3"}}}]}}},
    })  # fmt: skip
    with s.phase("story: scale-up through real Pods"):
        wait_until("a claim in workers ready (the startup Job's Pod ran on the real node and called the machine room)",
                   lambda: any(phase(c) == "ready" and c["spec"]["group"] == "workers" for c in claims(s)),
                   within=600)  # fmt: skip
        wait_until("the workload Running on a machine",
                   lambda: any(p.status.phase == "Running" and (p.spec.node_name or "").startswith("machine-")
                               for p in core.list_namespaced_pod("default", label_selector=f"app={WORKLOAD}").items),
                   within=180)  # fmt: skip
    busiest = s.cluster.kubectl("get", "pods", "-A", "-o", "wide").stdout
    print(f"\nkubectl get pods -A -o wide, at the story's busiest moment:\n{busiest}")
    STATE["busiest"] = busiest
    assert [c for c in room.calls if c.operation == "on" and c.status == 200], room.calls
    for pod in core.list_namespaced_pod(NS).items:
        if pod.metadata.labels.get("app.kubernetes.io/managed-by") != "homelab-autoscaler":
            assert pod.spec.node_name == NODE_NAME, f"{pod.metadata.name} stands on {pod.spec.node_name}"
    with s.phase("story: scale-down through real Pods"):
        apps.delete_namespaced_deployment(WORKLOAD, "default")
        wait_until("every claim ended and every machine powered off (a shutdown Job's Pod called the machine room)",
                   lambda: all(phase(c) in ("completed", "failed") for c in claims(s))
                   and not any(node_ready(s, slot.name) for slot in STORY_HOMELAB.slots), within=600)  # fmt: skip
    assert [c for c in room.calls if c.operation == "off" and c.status == 200], room.calls


# --- the end: the machine as found ---------------------------------------------------------------------------------
def test_zz_the_machine_is_left_as_found(pods: PodStack) -> None:
    """Everything stopped; the inventory of namespaces, links, firewall tables, mounts, cgroups and processes is
    the one taken before the run. Then the guide's commands, run and not run, are printed."""
    pods.stop()
    after = inventory.take(markers=(PREFIX,))
    ours, theirs = inventory.left_behind(inventory.diff(STATE["before"], after), (PREFIX, str(pods.dir)))
    print("\nphase times:\n" + "\n".join(f"  {k}: {v:.0f} s" for k, v in pods.timings.items()))
    print("\ndocs/install.md's commands:\n" + "\n".join(f"  {c}  -- {how}" for c, how in GUIDE))
    if theirs:
        print("appeared meanwhile, not the run's (the machine is shared):\n" + yaml.safe_dump(theirs))
    assert not ours, "the run left the machine changed:\n" + yaml.safe_dump(ours)
