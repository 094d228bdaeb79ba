"""The simulated homelab, seen the only way the operator sees it: through the Kubernetes API over HTTP.

Every fault switch is checked by the Kubernetes-visible behaviour it names. Most tests run with all delays
zero, where the sim must have done everything before the create call returns (the workflow tests on
Temporal's time-skipping server depend on that); one test runs with small real delays and checks the order
of events through a watch.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from homelab_sim.emulator import EmulatorServer, KubeEmulator, ResourceSpec
from homelab_sim.homelab import Homelab, HomelabServer, Stage
from homelab_sim.homelab_spec import (
    HomelabSpec,
    HomelabSpecError,
    load_homelab_spec,
    parse_homelab_spec,
)
from homelab_sim.power_pods import ScriptRun, read_script, termination_message
from kubernetes import client, watch

from api import names
from tests.procs import wait_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "deploy" / "examples" / "homelab.yaml"
NS = "homelab-autoscaler-system"
G, V = names.GROUP, names.VERSION
TAINT = {"key": "node.cilium.io/agent-not-ready", "effect": "NoExecute"}


def homelab_spec(timings: dict[str, float] | None = None, **slot_extra: Any) -> HomelabSpec:
    """Three machines in one group; ``slot_extra`` (e.g. faults) applies to ``m1``."""
    slots: list[dict[str, Any]] = [
        {"name": "m1", "group": "workers", "node": {"labels": {"pool": "w"}}, **slot_extra},
        {"name": "m2", "group": "workers", "kubernetesNodeName": "m2.lan"},
        {"name": "m3", "group": "workers", "initiallyOn": True},
    ]
    return parse_homelab_spec(
        {
            "namespace": NS,
            "timings": timings or {},
            "groups": [{"name": "workers", "maxSize": 3}],
            "slots": slots,
        }
    )


class Lab:
    """A running homelab plus typed API handles, so each test reads like what it checks."""

    def __init__(self, server: HomelabServer, api: client.ApiClient) -> None:
        self.server = server
        # Any: the client's generated stubs want model objects, and these tests send plain dicts on purpose
        self.core: Any = client.CoreV1Api(api)
        self.batch: Any = client.BatchV1Api(api)
        self.custom: Any = client.CustomObjectsApi(api)

    def job(
        self,
        slot: str,
        job_type: str,
        *,
        name: str | None = None,
        namespace: str = NS,
        labels: dict[str, str] | None = None,
        deadline: int | None = None,
        container: dict[str, Any] | None = None,
        backoff_limit: int = 0,
    ) -> str:
        name = name or f"{slot}-{job_type}"
        meta_labels = {names.LABEL_NODE: slot, names.LABEL_JOB_TYPE: job_type} if labels is None else labels
        spec: dict[str, Any] = {
            "backoffLimit": backoff_limit,
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [container or {"name": "c", "image": "busybox"}]},
            },
        }
        if deadline is not None:
            spec["activeDeadlineSeconds"] = deadline
        body = {"metadata": {"name": name, "labels": meta_labels}, "spec": spec}
        self.batch.create_namespaced_job(namespace, body)
        return name

    def job_status(self, name: str, namespace: str = NS) -> Any:
        return self.batch.read_namespaced_job(name, namespace).status

    def node(self, name: str) -> Any | None:
        found = [n for n in self.core.list_node().items if n.metadata.name == name]
        return found[0] if found else None

    def ready(self, name: str) -> str | None:
        node = self.node(name)
        if node is None:
            return None
        status: str | None = next(c.status for c in node.status.conditions if c.type == "Ready")
        return status

    def taints(self, name: str) -> list[dict[str, Any]]:
        node = self.node(name)
        assert node is not None
        return [{"key": t.key, "effect": t.effect} for t in node.spec.taints or []]


def conditions(status: Any) -> dict[str, tuple[str, str | None]]:
    return {c.type: (c.status, c.reason) for c in status.conditions or []}


@pytest.fixture
def lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    """A seeded zero-delay homelab; ``@pytest.mark.parametrize('lab', [spec], indirect=True)`` overrides it."""
    spec = getattr(request, "param", None) or homelab_spec()
    with HomelabServer(spec) as server, server.api_client() as api:
        yield Lab(server, api)


# --- the emulator hook -----------------------------------------------------------------------------------


def test_listeners_see_every_change_in_order_and_may_write_reentrantly() -> None:
    seen: list[tuple[str, str, str | None]] = []

    def labeller(kind: str, spec: ResourceSpec, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        # reacts to a create by writing the same object again, from inside the notification
        if spec.plural == "configmaps" and kind == "ADDED":
            emulator.patch_object("v1", "configmaps", "default", obj["metadata"]["name"], {"data": {"seen": "yes"}})

    def recorder(kind: str, spec: ResourceSpec, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        seen.append((kind, obj["metadata"]["resourceVersion"], (old or {}).get("data", {}).get("seen")))

    with EmulatorServer() as srv, srv.api_client() as api:
        emulator: KubeEmulator = srv.emulator
        srv.call(lambda e: e.listeners.extend([labeller, recorder]))
        core: Any = client.CoreV1Api(api)
        core.create_namespaced_config_map("default", {"metadata": {"name": "cm"}, "data": {"a": "1"}})
        # the listener's write landed before the create returned, and the watch log has both changes
        assert core.read_namespaced_config_map("cm", "default").data == {"a": "1", "seen": "yes"}
        # the second listener saw the create before the re-entrant write, never the other way round
        assert [(kind, seen_before) for kind, _, seen_before in seen] == [("ADDED", None), ("MODIFIED", None)]
        assert int(seen[0][1]) < int(seen[1][1])
        core.delete_namespaced_config_map("cm", "default")
        assert seen[-1][0] == "DELETED"


def test_a_failing_listener_does_not_fail_the_write(caplog: pytest.LogCaptureFixture) -> None:
    def broken(kind: str, spec: ResourceSpec, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        raise RuntimeError("boom")

    with EmulatorServer() as srv, srv.api_client() as api:
        srv.call(lambda e: e.listeners.append(broken))
        core: Any = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": "x"}})
        assert srv.call(lambda e: e.get_object("v1", "namespaces", None, "x")) is not None
    assert "boom" in caplog.text


# --- seeding ---------------------------------------------------------------------------------------------


def test_seed_creates_the_homelab_as_installed(lab: Lab) -> None:
    assert lab.core.read_namespace(NS).status.phase == "Active"
    group = lab.custom.get_namespaced_custom_object(G, V, NS, "groups", "workers")
    assert group["spec"]["maxSize"] == 3
    assert group["spec"]["nodeReadinessTaints"] == [TAINT]
    slots = lab.custom.list_namespaced_custom_object(G, V, NS, "nodes")["items"]
    assert [(s["metadata"]["name"], s["spec"]["kubernetesNodeName"]) for s in slots] == [
        ("m1", "m1"),
        ("m2", "m2.lan"),
        ("m3", "m3"),
    ]
    assert slots[0]["spec"]["startupPodSpec"]["image"] == "busybox"
    assert all("status" not in s for s in slots)  # the report is the operator's to write
    # m3 was on at install time: Ready, no readiness taints; the others are off with no Node
    assert [n.metadata.name for n in lab.core.list_node().items] == ["m3"]
    assert lab.ready("m3") == "True" and lab.taints("m3") == []
    assert [lab.server.power(s) for s in ("m1", "m2", "m3")] == ["off", "off", "on"]
    lab.server.call(lambda h: h.seed())  # idempotent
    assert len(lab.custom.list_namespaced_custom_object(G, V, NS, "nodes")["items"]) == 3


# --- startup ---------------------------------------------------------------------------------------------


def test_startup_with_zero_delays_is_complete_when_the_create_returns(lab: Lab) -> None:
    job = lab.job("m1", "startup")
    status = lab.job_status(job)
    assert conditions(status) == {
        "SuccessCriteriaMet": ("True", "CompletionsReached"),
        "Complete": ("True", "CompletionsReached"),
    }
    assert status.succeeded == 1 and status.active is None
    assert status.start_time is not None and status.completion_time is not None
    node = lab.node("m1")
    assert node is not None
    assert node.metadata.labels["kubernetes.io/hostname"] == "m1" and node.metadata.labels["pool"] == "w"
    assert node.status.capacity == {"cpu": "4", "memory": "16Gi", "pods": "110"}
    assert lab.ready("m1") == "True" and lab.taints("m1") == []
    assert lab.server.power("m1") == "on" and lab.server.stage("m1") is Stage.SETTLED
    # the whole story, in order, happened inside the create
    assert [e.what for e in lab.server.history("m1")] == [
        "job-started",
        "job-succeeded",
        "powered-on",
        "registered",
        "ready",
        "taints-cleared",
    ]


def test_startup_registers_the_kubernetes_node_name(lab: Lab) -> None:
    lab.job("m2", "startup")
    assert lab.node("m2") is None and lab.ready("m2.lan") == "True"


@pytest.mark.parametrize("lab", [homelab_spec(faults={"startupJobFails": True})], indirect=True)
def test_startup_job_fails(lab: Lab) -> None:
    status = lab.job_status(lab.job("m1", "startup"))
    assert conditions(status) == {
        "FailureTarget": ("True", "BackoffLimitExceeded"),
        "Failed": ("True", "BackoffLimitExceeded"),
    }
    assert status.failed == 1 and status.succeeded is None and status.active is None
    assert lab.node("m1") is None and lab.server.power("m1") == "off"


@pytest.mark.parametrize("lab", [homelab_spec(faults={"jobHangs": True})], indirect=True)
def test_job_hangs_stays_active_even_past_its_deadline_with_zero_delays(lab: Lab) -> None:
    job = lab.job("m1", "startup", deadline=1)
    time.sleep(1.2)
    status = lab.job_status(job)
    assert status.active == 1 and status.start_time is not None and not status.conditions
    assert lab.node("m1") is None and lab.server.power("m1") == "off"


def test_job_hangs_fails_deadline_exceeded_in_real_time() -> None:
    spec = homelab_spec(timings={"jobSeconds": 1}, faults={"jobHangs": True})
    with HomelabServer(spec, time_scale=0.1) as server, server.api_client() as api:
        lab = Lab(server, api)
        job = lab.job("m1", "startup", deadline=2)  # 0.2 s at this time scale
        assert lab.job_status(job).active == 1
        time.sleep(0.6)
        status = lab.job_status(job)
        assert conditions(status)["Failed"] == ("True", "DeadlineExceeded") and status.failed == 1
        assert lab.node("m1") is None


def test_a_job_slower_than_its_deadline_fails_deadline_exceeded() -> None:
    with HomelabServer(homelab_spec(timings={"jobSeconds": 5}), time_scale=0.1) as server, server.api_client() as api:
        lab = Lab(server, api)
        job = lab.job("m1", "startup", deadline=2)
        time.sleep(0.7)  # past the deadline (0.2 s) and the job's own run (0.5 s): the deadline won
        status = conditions(lab.job_status(job))
        assert status["Failed"] == ("True", "DeadlineExceeded") and "Complete" not in status
        assert lab.server.power("m1") == "off"


@pytest.mark.parametrize("lab", [homelab_spec(faults={"neverBoots": True})], indirect=True)
def test_never_boots(lab: Lab) -> None:
    assert conditions(lab.job_status(lab.job("m1", "startup")))["Complete"] == ("True", "CompletionsReached")
    assert lab.node("m1") is None and lab.server.power("m1") == "off"


@pytest.mark.parametrize("lab", [homelab_spec(faults={"kubeletNeverReady": True})], indirect=True)
def test_kubelet_never_ready_until_the_fault_is_cleared(lab: Lab) -> None:
    lab.job("m1", "startup")
    node = lab.node("m1")
    assert node is not None
    ready = next(c for c in node.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("False", "KubeletNotReady")
    assert lab.taints("m1") == [TAINT] and lab.server.power("m1") == "on"
    lab.server.set_fault("m1", "kubeletNeverReady", False)  # clearing it at run time resumes the boot
    assert lab.ready("m1") == "True" and lab.taints("m1") == []


@pytest.mark.parametrize("lab", [homelab_spec(faults={"kubeletNeverRegisters": True})], indirect=True)
def test_kubelet_never_registers_until_the_fault_is_cleared(lab: Lab) -> None:
    """A machine on whose kubelet shows nothing: the cluster sees no Node, yet the power is on."""
    lab.job("m1", "startup")
    assert lab.node("m1") is None and lab.server.power("m1") == "on"
    lab.server.set_fault("m1", "kubeletNeverRegisters", False)  # it comes up late
    assert lab.node("m1") is not None and lab.ready("m1") == "True"


@pytest.mark.parametrize("lab", [homelab_spec(faults={"taintNeverClears": True})], indirect=True)
def test_taint_never_clears(lab: Lab) -> None:
    lab.job("m1", "startup")
    assert lab.ready("m1") == "True" and lab.taints("m1") == [TAINT]
    assert lab.server.stage("m1") is Stage.READY
    lab.server.set_fault("m1", "taint_never_clears", False)
    assert lab.taints("m1") == []


def test_readiness_taints_come_from_the_group_object(lab: Lab) -> None:
    custom = [{"key": "example.com/warming", "effect": "NoSchedule"}]
    lab.custom.patch_namespaced_custom_object(G, V, NS, "groups", "workers", {"spec": {"nodeReadinessTaints": custom}})
    lab.server.set_fault("m1", "taintNeverClears")
    lab.job("m1", "startup")
    assert lab.taints("m1") == custom


# --- shutdown and the machine's own life ------------------------------------------------------------------


def test_shutdown_leaves_the_node_unknown(lab: Lab) -> None:
    job = lab.job("m3", "shutdown")
    assert conditions(lab.job_status(job))["Complete"][0] == "True"
    node = lab.node("m3")
    assert node is not None  # the object stays: deleting it is the operator's call
    assert {c.type: (c.status, c.reason) for c in node.status.conditions}["Ready"] == ("Unknown", "NodeStatusUnknown")
    assert lab.server.power("m3") == "off"
    # booting again re-posts the kept Node: NotReady with taints, then Ready, then usable
    lab.job("m3", "startup")
    assert lab.ready("m3") == "True" and lab.taints("m3") == [] and lab.server.power("m3") == "on"
    assert [e.what for e in lab.server.history("m3")][-4:] == ["powered-on", "registered", "ready", "taints-cleared"]


@pytest.mark.parametrize("lab", [homelab_spec(faults={"shutdownDoesNothing": True})], indirect=True)
def test_shutdown_does_nothing(lab: Lab) -> None:
    lab.job("m1", "startup")
    assert conditions(lab.job_status(lab.job("m1", "shutdown")))["Complete"][0] == "True"
    assert lab.ready("m1") == "True" and lab.server.power("m1") == "on"


def test_shutdown_job_fails(lab: Lab) -> None:
    lab.server.set_fault("m3", "shutdownJobFails")
    assert conditions(lab.job_status(lab.job("m3", "shutdown")))["Failed"] == ("True", "BackoffLimitExceeded")
    assert lab.ready("m3") == "True" and lab.server.power("m3") == "on"


def test_die_then_power_on_by_hand(lab: Lab) -> None:
    lab.server.die("m3")
    assert lab.ready("m3") == "Unknown" and lab.server.power("m3") == "off"
    lab.server.die("m3")  # dead is dead
    lab.server.power_on_by_hand("m3")
    assert lab.ready("m3") == "True" and lab.server.power("m3") == "on"
    assert lab.batch.list_namespaced_job(NS).items == []  # no Job was involved


def test_power_on_by_hand_registers_a_new_node(lab: Lab) -> None:
    lab.server.power_on_by_hand("m1")
    assert lab.ready("m1") == "True" and lab.taints("m1") == []
    lab.job("m1", "startup")  # waking a running machine changes nothing
    assert [e.what for e in lab.server.history("m1")].count("powered-on") == 1


def test_set_fault_at_run_time(lab: Lab) -> None:
    lab.server.set_fault("m1", "startupJobFails", True)
    assert "Failed" in conditions(lab.job_status(lab.job("m1", "startup", name="first")))
    lab.server.set_fault("m1", "startupJobFails", False)
    assert "Complete" in conditions(lab.job_status(lab.job("m1", "startup", name="second")))
    assert lab.server.power("m1") == "on"
    with pytest.raises(ValueError, match="unknown fault 'explodes'"):
        lab.server.set_fault("m1", "explodes")
    with pytest.raises(KeyError, match="no slot 'nope'"):
        lab.server.die("nope")


def test_jobs_that_are_not_lifecycle_jobs_are_ignored(lab: Lab) -> None:
    lab.core.create_namespace({"metadata": {"name": "elsewhere"}})
    jobs = [
        (lab.job("m1", "startup", name="unlabelled", labels={}), NS),
        (lab.job("m1", "startup", name="other-type", labels={names.LABEL_NODE: "m1", "type": "backup"}), NS),
        (lab.job("ghost", "startup", name="unknown-slot"), NS),
        (lab.job("m1", "startup", name="other-namespace", namespace="elsewhere"), "elsewhere"),
    ]
    for name, namespace in jobs:
        assert lab.job_status(name, namespace) is None, name
    assert lab.node("m1") is None and lab.server.power("m1") == "off"
    assert lab.server.history("m1") == []


# --- the Job controller's Pods, their scripts and logs (issue 23) ------------------------------------------------
def script(text: str, policy: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "power", "image": "busybox:1.36", "command": ["sh", "-c", text]}
    if policy:
        container["terminationMessagePolicy"] = policy
    return container


def pods_of(lab: Lab, job: str) -> list[Any]:
    """The Job's Pods by the selector the API server generated for it (what kubectl uses), oldest first."""
    selector = lab.batch.read_namespaced_job(job, NS).spec.selector.match_labels
    found = lab.core.list_namespaced_pod(NS, label_selector=",".join(f"{k}={v}" for k, v in selector.items())).items
    return sorted(found, key=lambda p: (p.metadata.creation_timestamp, p.metadata.resource_version))


def job_events(lab: Lab, job: str) -> list[tuple[str, str, str]]:
    events = lab.core.list_namespaced_event(NS, field_selector=f"involvedObject.name={job}").items
    return [(e.type, e.reason, e.message) for e in sorted(events, key=lambda e: int(e.metadata.resource_version))]


def test_a_lifecycle_job_runs_in_a_pod_made_as_the_job_controller_makes_it(lab: Lab) -> None:
    job = lab.job("m1", "startup", container=script("echo powering on $HOMELAB_SLOT"))
    uid = lab.batch.read_namespaced_job(job, NS).metadata.uid
    (pod,) = pods_of(lab, job)
    assert re.fullmatch(rf"{job}-[bcdfghjklmnpqrstvwxz2456789]{{5}}", pod.metadata.name), pod.metadata.name
    assert pod.metadata.generate_name == f"{job}-"
    for key, value in (("job-name", job), ("batch.kubernetes.io/job-name", job), ("controller-uid", uid),
                       ("batch.kubernetes.io/controller-uid", uid)):  # fmt: skip
        assert pod.metadata.labels[key] == value, key
    (owner,) = pod.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.controller, owner.api_version) == (
        "Job",
        job,
        uid,
        True,
        "batch/v1",
    )
    assert pod.status.phase == "Succeeded" and pod.spec.node_name == "homelab-control-plane"
    (container,) = pod.status.container_statuses
    ended = container.state.terminated
    assert (ended.exit_code, ended.reason, ended.message) == (0, "Completed", None)
    assert ended.started_at is not None and ended.finished_at >= ended.started_at
    assert pod.spec.containers[0].termination_message_policy == "File", "the API server's default"
    assert job_events(lab, job) == [
        ("Normal", "SuccessfulCreate", f"Created pod: {pod.metadata.name}"),
        ("Normal", "Completed", "Job completed"),
    ]
    assert lab.core.read_namespaced_pod_log(pod.metadata.name, NS) == "powering on $HOMELAB_SLOT\n"


def test_a_failed_script_says_why_in_its_terminated_state(lab: Lab) -> None:
    """The exit code is the script's, the reason the runtime's (Error); with FallbackToLogsOnError the message is
    the end of the log; with the default File policy it is what the script wrote to /dev/termination-log."""
    text = "echo sending magic packet\necho 'sendto: Network is unreachable' >&2\nexit 3"
    job = lab.job("m1", "startup", container=script(text, "FallbackToLogsOnError"))
    (pod,) = pods_of(lab, job)
    ended = pod.status.container_statuses[0].state.terminated
    assert pod.status.phase == "Failed" and pod.status.container_statuses[0].ready is False
    assert (ended.exit_code, ended.reason) == (3, "Error")
    assert ended.message == "sending magic packet\nsendto: Network is unreachable\n"
    assert conditions(lab.job_status(job))["Failed"] == ("True", "BackoffLimitExceeded")
    assert [reason for _, reason, _ in job_events(lab, job)] == ["SuccessfulCreate", "BackoffLimitExceeded"]
    file_job = lab.job(
        "m2", "startup", container=script("echo noise; echo 'BMC refused' > /dev/termination-log; exit 1")
    )
    (file_pod,) = pods_of(lab, file_job)
    assert file_pod.status.container_statuses[0].state.terminated.message == "BMC refused\n"
    quiet_job = lab.job("m2", "startup", name="quiet", container=script("echo noise; exit 1"))
    assert pods_of(lab, quiet_job)[0].status.container_statuses[0].state.terminated.message is None


@pytest.mark.parametrize("lab", [homelab_spec(faults={"startupJobFails": True})], indirect=True)
def test_a_failing_fault_exits_1_and_says_so_in_the_log(lab: Lab) -> None:
    job = lab.job("m1", "startup", container=script("echo wake-on-LAN aa:bb", "FallbackToLogsOnError"))
    (pod,) = pods_of(lab, job)
    ended = pod.status.container_statuses[0].state.terminated
    said = "wake-on-LAN aa:bb\nhomelab simulator: fault startupJobFails is set: exit 1\n"
    assert (ended.exit_code, ended.message) == (1, said)
    assert lab.core.read_namespaced_pod_log(pod.metadata.name, NS) == said


def test_a_failed_pod_is_retried_up_to_the_backoff_limit(lab: Lab) -> None:
    job = lab.job("m1", "startup", container=script("exit 2"), backoff_limit=2)
    pods = pods_of(lab, job)
    assert len(pods) == 3 and len({p.metadata.name for p in pods}) == 3
    assert {p.status.phase for p in pods} == {"Failed"}
    status = lab.job_status(job)
    assert status.failed == 3 and conditions(status)["Failed"] == ("True", "BackoffLimitExceeded")
    assert [reason for _, reason, _ in job_events(lab, job)] == ["SuccessfulCreate"] * 3 + ["BackoffLimitExceeded"]
    assert lab.server.power("m1") == "off"


def test_past_its_deadline_the_running_pod_is_deleted() -> None:
    spec = homelab_spec(timings={"jobSeconds": 1}, faults={"jobHangs": True})
    with HomelabServer(spec, time_scale=0.1) as server, server.api_client() as api:
        lab = Lab(server, api)
        # 3 s at this scale: time to read the running Pod and its log first (0.2 s was not, beside pytest-xdist's
        # workers on a busy box: the Pod was gone before its log was read).
        job = lab.job("m1", "startup", deadline=30, container=script("echo trying"))
        (pod,) = pods_of(lab, job)
        assert pod.status.phase == "Running" and lab.core.read_namespaced_pod_log(pod.metadata.name, NS) == "trying\n"
        wait_for(
            lambda: pods_of(lab, job) == [] and len(job_events(lab, job)) >= 3,
            timeout=30,
            what="the Pod deleted past the Job's deadline, and said",
        )
        assert job_events(lab, job) == [
            ("Normal", "SuccessfulCreate", f"Created pod: {pod.metadata.name}"),
            ("Normal", "SuccessfulDelete", f"Deleted pod: {pod.metadata.name}"),
            ("Warning", "DeadlineExceeded", "Job was active longer than specified deadline"),
        ]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_logs_and_describe_a_failed_job(lab: Lab, tmp_path: Path) -> None:
    """The operations guide's first steps against the simulated homelab: `kubectl logs job/<claim>-startup`
    printed nothing for 20 s and failed (no Pods); `kubectl describe job` lists the Pods' outcome and Events."""
    job = lab.job("m1", "startup", container=script("echo 'wake-on-LAN: no answer' >&2; exit 1"))
    env = {**os.environ, "KUBECONFIG": os.devnull, "HOME": str(tmp_path)}

    def kubectl(*args: str) -> str:
        done = subprocess.run(["kubectl", "--server", lab.server.url, "-n", NS, *args], env=env, capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    started = time.monotonic()
    assert kubectl("logs", f"job/{job}") == "wake-on-LAN: no answer\n"
    assert time.monotonic() - started < 10, "found the Pod at once"
    described = kubectl("describe", "job", job)
    assert re.search(r"Pods Statuses:\s+0 Active \(0 Ready\) / 0 Succeeded / 1 Failed", described), described
    assert re.search(r"Warning\s+BackoffLimitExceeded\s+\S+\s+job-controller", described), described
    pods = kubectl("get", "pods")
    assert re.search(rf"{job}-\w{{5}}\s+0/1\s+Error\s+0", pods), pods


def test_a_script_is_read_not_run() -> None:
    def run(text: str, **extra: Any) -> ScriptRun:
        return read_script({"name": "c", "command": ["/bin/sh", "-c"], "args": [text], **extra})

    assert run("set -eu\necho one; echo -n two && echo 'three  four' # note\nexit 4\necho never") == ScriptRun(
        "one\ntwo\nthree  four\n", 4
    )
    assert run(
        'echo "$MAC ${HOST} $UNKNOWN"', env=[{"name": "MAC", "value": "aa"}, {"name": "HOST", "value": "h"}]
    ) == (ScriptRun("aa h $UNKNOWN\n"))
    assert run("echo gone > /dev/null; echo x > /dev/termination-log; echo y >&2") == ScriptRun("y\n", 0, "x\n")
    assert read_script({"name": "c", "command": ["curl", "-fsS", "http://bmc"]}) == ScriptRun()
    assert read_script({"name": "c", "command": ["bash", "-ec", "exit 300"]}).exit_code == 300 % 256


def test_termination_messages_follow_the_kubelets_policy_and_bounds() -> None:
    fallback = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    log = "".join(f"line {i}\n" for i in range(200))
    assert termination_message({}, ScriptRun(log, 1), log) == "", "File: only the file"
    assert termination_message(fallback, ScriptRun(log, 0), log) == "", "a success keeps no fallback"
    tail = termination_message(fallback, ScriptRun(log, 1), log)
    assert tail.endswith("line 199\n") and tail.count("\n") <= 80 and len(tail.encode()) <= 2048
    assert termination_message(fallback, ScriptRun(log, 1, "x" * 5000), log) == "x" * 4096


# --- real time -------------------------------------------------------------------------------------------


def test_real_delays_show_each_step_in_order_through_a_watch() -> None:
    step = 0.2
    timings = dict.fromkeys(("jobSeconds", "bootSeconds", "readySeconds", "taintClearSeconds"), step)
    with HomelabServer(homelab_spec(timings=timings)) as server, server.api_client() as api:
        lab = Lab(server, api)
        since = lab.core.list_node().metadata.resource_version
        started = time.monotonic()
        job = lab.job("m1", "startup")
        assert lab.job_status(job).active == 1 and lab.node("m1") is None  # nothing done yet
        seen: list[tuple[float, int, str, str, list[str]]] = []
        stream = watch.Watch().stream(lab.core.list_node, resource_version=since, timeout_seconds=5)
        for event in stream:
            node = event["object"]
            if node.metadata.name != "m1":
                continue
            ready = next(c.status for c in node.status.conditions if c.type == "Ready")
            taints = [t.key for t in node.spec.taints or []]
            seen.append((time.monotonic() - started, int(node.metadata.resource_version), event["type"], ready, taints))
            if ready == "True" and not taints:
                break
        assert [(kind, ready, taints) for _, _, kind, ready, taints in seen] == [
            ("ADDED", "False", [TAINT["key"]]),
            ("MODIFIED", "True", [TAINT["key"]]),
            ("MODIFIED", "True", []),
        ]
        # job (0.2) + boot (0.2), then ready (+0.2), then taints cleared (+0.2)
        at = [moment for moment, *_ in seen]
        assert at[0] >= 2 * step - 0.05 and at[1] - at[0] >= step - 0.05 and at[2] - at[1] >= step - 0.05
        # the Job completed before the kubelet registered (one resourceVersion counter orders all kinds)
        job_events = [
            (int(e["object"].metadata.resource_version), e["object"].status)
            for e in watch.Watch().stream(lab.batch.list_namespaced_job, NS, resource_version=since, timeout_seconds=1)
        ]
        completed = [rv for rv, status in job_events if status and status.completion_time]
        assert completed and completed[0] < seen[0][1]


# --- the file and the standalone process -----------------------------------------------------------------


def test_the_example_homelab_loads() -> None:
    spec = load_homelab_spec(EXAMPLE)
    assert spec.namespace == NS and [g.name for g in spec.groups] == ["workers"] and spec.groups[0].max_size == 3
    assert [s.name for s in spec.slots] == ["worker-1", "worker-2", "worker-3"]
    assert spec.slot("worker-3").faults.startup_job_fails
    assert spec.timings_of(spec.slot("worker-2")).boot_seconds == 8
    assert spec.timings_of(spec.slot("worker-1")).boot_seconds == 5


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("groups: [{name: w, maxSize: 1}]\nslots: [{name: a, group: w, timings: {bootSeconds: -1}}]\n", "bootSeconds"),
        ("groups: [{name: w, maxSize: 1}]\nslots: [{name: a, group: w, faults: {explodes: true}}]\n", "explodes"),
        ("groups: [{name: w, maxSize: 1}]\nslots: [{name: a, group: nope}]\n", "slots[0].group"),
        ("kind: Group\ngroups: [{name: w, maxSize: 1}]\n", "kind"),
        ("groups: [{name: w}]\n", "groups[0].maxSize"),
        ("- just\n- a list\n", "mapping"),
    ],
)
def test_a_bad_homelab_file_is_rejected_naming_the_field(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(HomelabSpecError, match=r"bad\.yaml") as caught:
        load_homelab_spec(path)
    assert needle in str(caught.value)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_the_standalone_simulator_starts_answers_and_stops() -> None:
    port = free_port()
    command = [sys.executable, "-m", "homelab_sim", "--homelab", str(EXAMPLE), "--port", str(port)]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api", timeout=1) as response:
                    assert response.status == 200
                    break
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                assert time.monotonic() < deadline, "the simulator did not answer in 15 s"
                time.sleep(0.1)
        with urllib.request.urlopen(f"{url}/apis/{G}/{V}/namespaces/{NS}/nodes", timeout=2) as response:
            assert b"worker-3" in response.read()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert url in out and f"kubectl --server {url} get nodes.infra.homecluster.dev -A" in out


def test_homelab_attaches_to_a_bare_emulator() -> None:
    """``Homelab`` works on any ``KubeEmulator``: seed, then answer a Job written with the in-loop helpers."""

    def drive(emulator: KubeEmulator) -> tuple[str, str]:
        homelab = Homelab(emulator, homelab_spec(), time_scale=0)
        homelab.seed()
        labels = {names.LABEL_NODE: "m2", names.LABEL_JOB_TYPE: "startup"}
        emulator.put_object("batch/v1", "jobs", {"metadata": {"name": "j", "labels": labels}}, NS)
        homelab.close()
        node = emulator.get_object("v1", "nodes", None, "m2.lan")
        assert node is not None
        ready = next(c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready")
        return homelab.power("m2"), ready

    with EmulatorServer() as srv:
        assert srv.call(drive) == ("on", "True")
