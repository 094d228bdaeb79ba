"""The Kubernetes activities against the HTTP API emulator: effects, idempotency under retry, and error mapping.

Activities are plain synchronous methods, so they are called directly (as the worker's thread pool would); the
emulator is seeded with the example group and slots, their Secrets and ConfigMaps, and the kubelet Nodes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from contextlib import closing
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from homelab_sim.emulator import EmulatorServer, Fault, KubeEmulator
from homelab_sim.homelab import HomelabServer
from homelab_sim.homelab_spec import parse_homelab_spec
from temporalio import activity
from temporalio.converter import DataConverter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import KubeActivities
from activities.jobs import build_job
from api import contracts as c
from api import names
from api.v2alpha1 import Node
from kube import views
from kube.adapter import Kube
from kube.errors import Transient

NS = "homelab-autoscaler-system"
CRD = names.API_VERSION
NOW = datetime(2026, 1, 1, 9, 0, tzinfo=UTC)
Obj = dict[str, Any]
CILIUM = {"key": "node.cilium.io/agent-not-ready", "effect": "NoExecute"}
OUT_OF_SERVICE = {"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}
FOREIGN = {"key": "example.com/foreign", "effect": "NoSchedule"}


# --- fixtures and helpers ---------------------------------------------------------------------------------
def put(srv: EmulatorServer, group_version: str, plural: str, obj: Obj) -> Obj:
    return srv.call(lambda e: e.put_object(group_version, plural, obj))


def objects(srv: EmulatorServer, group_version: str, plural: str, namespace: str | None = NS) -> list[Obj]:
    return srv.call(lambda e: e.objects_of(group_version, plural, namespace))


def stored(srv: EmulatorServer, group_version: str, plural: str, namespace: str | None, name: str) -> Obj:
    obj = srv.call(lambda e: e.get_object(group_version, plural, namespace, name))
    assert obj is not None, f"{plural} {name} is not stored"
    return obj


def kubelet_node(name: str, *, ready: bool = True, taints: list[Obj] | None = None, **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "homelab.dev/pool": "workers"}},
        "spec": {**spec, **({"taints": taints} if taints else {})},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady"}],
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "7800m", "memory": "31Gi", "pods": "110"},
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
        },
    }


def failure(err: pytest.ExceptionInfo[ApplicationError], kind: str) -> str:
    """Assert a non-retryable ApplicationError of `kind`; its message for further checks."""
    assert err.value.type == kind, err.value
    assert err.value.non_retryable
    return str(err.value.message)


@pytest.fixture
def cluster(emulator: EmulatorServer, examples: dict[str, list[Obj]]) -> EmulatorServer:
    """The example homelab: namespace, Secrets/ConfigMaps, group `workers`, three slots, their kubelet Nodes."""
    put(emulator, "v1", "namespaces", {"metadata": {"name": NS}})
    put(
        emulator, "v1", "secrets", {"metadata": {"name": "worker-ssh", "namespace": NS}, "data": {"passphrase": "eA=="}}
    )
    put(emulator, "v1", "configmaps", {"metadata": {"name": "shutdown-scripts", "namespace": NS}, "data": {"a": "b"}})
    put(emulator, CRD, "groups", examples["group"][0])
    for slot in examples["nodes"]:
        put(emulator, CRD, "nodes", slot)
    put(
        emulator,
        CRD,
        "nodes",
        {
            "metadata": {"name": "elsewhere", "namespace": NS},
            "spec": {**examples["nodes"][1]["spec"], "group": "other"},
        },
    )
    for name in ("worker-1", "worker-2", "gpu-1"):
        put(emulator, "v1", "nodes", kubelet_node(name))
    return emulator


@pytest.fixture
def acts(kube: Kube) -> KubeActivities:
    return KubeActivities(kube, clock=lambda: NOW)


def seed(name: str = "c1", slot: str = "worker-1", **kw: Any) -> c.ClaimSeed:
    base: dict[str, Any] = {
        "namespace": NS,
        "name": name,
        "slot": slot,
        "group": "workers",
        "call": "IncreaseSize",
        "attempt": 1,
        "requested_at": NOW,
        "deadline_at": NOW + timedelta(minutes=15),
        "max_provision_seconds": 900.0,
        "ttl_seconds": 3600,
    }
    return c.ClaimSeed(**{**base, **kw})


# --- registration -----------------------------------------------------------------------------------------
def test_all_registers_every_activity_by_its_contract_name(acts: KubeActivities) -> None:
    defined = {activity._Definition.must_from_callable(fn).name for fn in acts.all()}
    wanted = {v for k, v in vars(c.Act).items() if not k.startswith("_")}
    assert defined == wanted


def test_results_round_trip_through_the_temporal_converter(cluster: EmulatorServer, acts: KubeActivities) -> None:
    converter = DataConverter.default.payload_converter
    for value, kind in (
        (acts.load_group(c.GroupRef(NS, "workers")), c.GroupView),
        (acts.observe_slot(c.SlotRef(NS, "worker-1")), c.Observation),
        (acts.read_job(c.JobRef(NS, "nope")), c.JobStatus),
    ):
        (payload,) = converter.to_payloads([value])
        assert converter.from_payloads([payload], [kind]) == [value]


# --- claims ------------------------------------------------------------------------------------------------
def test_create_claim_makes_one_claim_owned_by_its_slot(cluster: EmulatorServer, acts: KubeActivities) -> None:
    acts.create_claim(seed())
    acts.create_claim(seed())
    (claim,) = objects(cluster, CRD, "nodeclaims")
    slot = stored(cluster, CRD, "nodes", NS, "worker-1")
    assert claim["metadata"]["name"] == "c1"
    assert claim["metadata"]["labels"] == {names.LABEL_NODE: "worker-1", names.LABEL_GROUP: "workers"}
    assert claim["metadata"]["ownerReferences"] == [
        {"apiVersion": CRD, "kind": "Node", "name": "worker-1", "uid": slot["metadata"]["uid"]}
    ]
    assert claim["spec"] == {
        "node": "worker-1",
        "group": "workers",
        "requestedAt": "2026-01-01T09:00:00Z",
        "deadlineAt": "2026-01-01T09:15:00Z",
        "maxNodeProvisionTime": "15m0s",
        "ttlSecondsAfterFinished": 3600,
        "call": "IncreaseSize",
    }
    # its first status (the API server drops status from a create, so it is a second write) and one Event,
    # however often the activity runs
    assert claim["status"] == {"phase": "pending", "attempt": 1}
    assert [e["reason"] for e in objects(cluster, "v1", "events")] == ["ClaimCreated"]
    # deleting the slot takes its claims (garbage collection follows the owner reference)
    cluster.call(lambda e: e.delete_object(CRD, "nodes", NS, "worker-1"))
    assert objects(cluster, CRD, "nodeclaims") == []


def test_create_claim_without_deadline_or_provision_time(cluster: EmulatorServer, acts: KubeActivities) -> None:
    acts.create_claim(seed(deadline_at=None, max_provision_seconds=0.0, call="Adopted", phase="ready"))
    spec = stored(cluster, CRD, "nodeclaims", NS, "c1")["spec"]
    assert "deadlineAt" not in spec and "maxNodeProvisionTime" not in spec
    assert spec["call"] == "Adopted"


def test_create_claim_for_a_deleted_slot_is_not_retried(cluster: EmulatorServer, acts: KubeActivities) -> None:
    with pytest.raises(ApplicationError) as err:
        acts.create_claim(seed(slot="gone"))
    assert "gone" in failure(err, "SlotDeleted")
    assert objects(cluster, CRD, "nodeclaims") == []


def test_record_claim_projects_status_spec_and_one_event(cluster: EmulatorServer, acts: KubeActivities) -> None:
    acts.create_claim(seed())
    write = c.StatusWrite(
        NS,
        "c1",
        status={"phase": "ready", "attempt": 1, "reason": None, "finishedAt": None},
        spec={"deadlineAt": None},
        event_reason="ClaimReady",
        event_message="the node is Ready",
    )
    acts.record_claim(write)
    acts.record_claim(write)  # a retry: same state, the Event counts the repeat
    claim = stored(cluster, CRD, "nodeclaims", NS, "c1")
    assert claim["status"] == {"phase": "ready", "attempt": 1}
    assert "deadlineAt" not in claim["spec"]
    (event,) = [e for e in objects(cluster, "v1", "events") if e["reason"] != "ClaimCreated"]
    assert (event["reason"], event["message"], event["type"], event["count"]) == (
        "ClaimReady",
        "the node is Ready",
        "Normal",
        2,
    )
    assert event["involvedObject"]["kind"] == "NodeClaim"
    assert event["involvedObject"]["uid"] == claim["metadata"]["uid"]
    assert event["lastTimestamp"] == "2026-01-01T09:00:00Z"
    status_writes = [r for r in list(cluster.emulator.requests) if r.verb == "patch" and r.plural == "nodeclaims"]
    assert status_writes[1].subresource == "status"
    assert status_writes[0].content_type == "application/merge-patch+json"

    acts.record_claim(c.StatusWrite(NS, "c1", status={"phase": "failed"}, event_reason="ClaimFailed", warning=True))
    assert {e["type"] for e in objects(cluster, "v1", "events")} == {"Normal", "Warning"}


def test_record_claim_on_a_gone_claim_is_moot(cluster: EmulatorServer, acts: KubeActivities) -> None:
    acts.record_claim(c.StatusWrite(NS, "gone", status={"phase": "ready"}, event_reason="ClaimReady"))
    assert objects(cluster, "v1", "events") == []


def test_a_numbered_record_lands_above_another_runs_revision_and_never_passes_for_landed(
    cluster: EmulatorServer, acts: KubeActivities
) -> None:
    """A run that records one projection at a time: the resource holds revision 3 of a lost run, so this run's
    revision 1 lands as 4 (returned), never skipped; its retry (same status) is found landed; a gone claim is an
    error. An earlier run's write keeps the old rule: a stored later revision (its own) is not overwritten.
    """
    acts.create_claim_held(seed())
    acts.record_claim(c.StatusWrite(NS, "c1", status={"phase": "ready", "attempt": 1}, revision=3))
    # An earlier run's projections could overlap (a handler's beside the run's): a later one of its own stands.
    assert acts.record_claim(c.StatusWrite(NS, "c1", status={"phase": "failed"}, revision=1)) == 3
    claim = stored(cluster, CRD, "nodeclaims", NS, "c1")
    assert claim["status"]["phase"] == "ready" and claim["metadata"]["finalizers"]
    write = c.StatusWrite(
        NS, "c1", status={"phase": "completed", "attempt": 1, "reason": "NodeDeleted"}, event_reason="ClaimCompleted",
        release_finalizer=True, revision=1, above_held=True,
    )  # fmt: skip
    assert acts.record_claim(write) == 4
    assert acts.record_claim(dataclasses.replace(write, revision=4)) == 4  # its retry: landed already, not again
    claim = stored(cluster, CRD, "nodeclaims", NS, "c1")
    assert claim["status"] == {"phase": "completed", "attempt": 1, "reason": "NodeDeleted", "revision": 4}
    assert not claim["metadata"].get("finalizers")
    assert [e["reason"] for e in objects(cluster, "v1", "events") if e["reason"] != "ClaimCreated"] == [
        "ClaimCompleted"
    ]
    with pytest.raises(ApplicationError) as err:
        acts.record_claim(dataclasses.replace(write, name="gone"))
    failure(err, "NotFound")


def test_claim_record_and_status_edit_views() -> None:
    """What a run taken over reads back, and what the watchers call a person's edit (the revision did not move)."""
    status = {
        "phase": "ready",
        "attempt": 2,
        "revision": 5,
        "shutdownAttempts": 3,
        "lastShutdownAttemptAt": "2026-01-01T08:30:00Z",
        "conditions": [
            {"type": "MachineObservedOff", "status": "True", "lastTransitionTime": "2026-01-01T08:00:00Z"},
            {"type": "Ready", "status": "True"},
        ],
    }  # fmt: skip
    claim = {"metadata": {"name": "c1"}, "spec": {"node": "worker-1", "group": "workers"}, "status": status}
    record = views.claim_record(claim, NOW)
    assert record is not None
    assert (record.revision, record.shutdown_attempts) == (5, 3)
    assert record.last_shutdown_attempt_at == datetime(2026, 1, 1, 8, 30, tzinfo=UTC)
    off = record.condition("MachineObservedOff")
    assert off is not None and off.status and off.since == datetime(2026, 1, 1, 8, tzinfo=UTC)
    ready = record.condition("Ready")
    assert ready is not None and ready.since == NOW, "a condition without its clock counts from the read"
    assert views.claim_record({"spec": claim["spec"]}, NOW) is None, "nothing recorded: applied by hand"
    reset: dict[str, Any] = {**status, "shutdownAttempts": 0, "lastShutdownAttemptAt": None}
    edited = {**claim, "status": reset}
    edit = views.status_edit(claim, edited)
    assert edit == c.StatusEdit(5, {k: v for k, v in reset.items() if k != "revision" and v is not None})
    assert views.status_edit(claim, {**claim, "status": {**status, "revision": 6, "phase": "failed"}}) is None
    assert views.status_edit(None, edited) is None
    assert views.status_edit(claim, {**claim, "metadata": {"name": "c1", "finalizers": []}}) is None


def test_finalizer_release_and_delete_are_idempotent(cluster: EmulatorServer, acts: KubeActivities) -> None:
    acts.create_claim(seed())
    ref = c.ClaimRef(NS, "c1")
    acts.add_claim_finalizer(ref)
    acts.add_claim_finalizer(ref)
    assert stored(cluster, CRD, "nodeclaims", NS, "c1")["metadata"]["finalizers"] == [names.FINALIZER_CLAIM]
    acts.release_claim(ref)
    acts.release_claim(ref)
    assert "finalizers" not in stored(cluster, CRD, "nodeclaims", NS, "c1")["metadata"]
    acts.add_claim_finalizer(ref)
    # deleting is collecting: nothing more is done for the claim, so its finalizer comes off first
    acts.delete_claim(ref)
    assert objects(cluster, CRD, "nodeclaims") == []
    acts.delete_claim(ref)
    acts.release_claim(ref)
    with pytest.raises(ApplicationError) as err:
        acts.add_claim_finalizer(ref)
    assert "c1" in failure(err, "NotFound")


def test_a_transient_failure_is_raised_for_temporal_to_retry(cluster: EmulatorServer, acts: KubeActivities) -> None:
    cluster.emulator.faults.append(Fault(match=lambda i: i.verb == "create", status=503, times=1))
    with pytest.raises(Transient):  # not an ApplicationError: the activity's retry policy applies
        acts.create_claim(seed())
    assert objects(cluster, CRD, "nodeclaims") == []
    acts.create_claim(seed())  # the retry
    assert len(objects(cluster, CRD, "nodeclaims")) == 1


# --- Jobs --------------------------------------------------------------------------------------------------
def container_of(job: Obj) -> Obj:
    container: Obj
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


def test_startup_job_for_a_claim(cluster: EmulatorServer, acts: KubeActivities) -> None:
    acts.create_claim(seed())
    req = c.JobRequest(NS, "worker-1", "startup", 1, "c1")
    assert acts.create_job(req) == {"name": "c1-startup", "namespace": NS}
    assert acts.create_job(req) == {"name": "c1-startup", "namespace": NS}
    (job,) = objects(cluster, "batch/v1", "jobs")
    claim = stored(cluster, CRD, "nodeclaims", NS, "c1")
    slot = stored(cluster, CRD, "nodes", NS, "worker-1")
    assert job["metadata"]["labels"] == {
        names.LABEL_NODE: "worker-1",
        names.LABEL_NODECLAIM: "c1",
        "type": "startup",
        "app.kubernetes.io/managed-by": "homelab-autoscaler",
    }
    assert job["metadata"]["ownerReferences"] == [
        {
            "apiVersion": CRD,
            "kind": "NodeClaim",
            "name": "c1",
            "uid": claim["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        },
        {"apiVersion": CRD, "kind": "Node", "name": "worker-1", "uid": slot["metadata"]["uid"]},
    ]
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (0, 300, 600)
    uid = job["metadata"]["uid"]
    generated = {"job-name": "c1-startup", "batch.kubernetes.io/job-name": "c1-startup", "controller-uid": uid,
                 "batch.kubernetes.io/controller-uid": uid}  # the API server's, for the Job's Pods  # fmt: skip
    assert spec["template"]["metadata"]["labels"] == {**job["metadata"]["labels"], **generated}
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    container = container_of(job)
    assert container["name"] == "power"
    assert container["image"] == "ghcr.io/homecluster/wol:1.0"
    assert container["command"] == ["wakeonlan"]
    assert container["args"] == ["-i", "192.168.1.255", "aa:bb:cc:dd:ee:01"]
    assert container["env"] == [
        {"name": "HOMELAB_SLOT", "value": "worker-1"},
        {"name": "HOMELAB_NODE_NAME", "value": "worker-1"},
        {"name": "HOMELAB_OPERATION", "value": "startup"},
    ]
    # garbage collection waits for every owner: the claim's deletion leaves the slot's, the slot's takes the Job
    cluster.call(lambda e: e.delete_object(CRD, "nodeclaims", NS, "c1"))
    (job,) = objects(cluster, "batch/v1", "jobs")
    assert [o["kind"] for o in job["metadata"]["ownerReferences"]] == ["Node"]
    cluster.call(lambda e: e.delete_object(CRD, "nodes", NS, "worker-1"))
    assert objects(cluster, "batch/v1", "jobs") == []


def test_shutdown_job_carries_secrets_and_config_maps_by_reference(
    cluster: EmulatorServer, acts: KubeActivities
) -> None:
    acts.create_claim(seed())
    acts.create_job(c.JobRequest(NS, "worker-1", "shutdown", 2, "c1"))
    job = stored(cluster, "batch/v1", "jobs", NS, "c1-shutdown-2")
    container = container_of(job)
    assert container["env"][:2] == [
        {"name": "SSH_USER", "value": "homelab"},
        {"name": "SSH_PASSPHRASE", "valueFrom": {"secretKeyRef": {"name": "worker-ssh", "key": "passphrase"}}},
    ]
    assert container["env"][-1] == {"name": "HOMELAB_OPERATION", "value": "shutdown"}
    assert container["volumeMounts"] == [
        {"name": "ssh-key", "mountPath": "/ssh", "readOnly": True},
        {"name": "scripts", "mountPath": "/scripts", "readOnly": True},
    ]
    assert job["spec"]["template"]["spec"]["volumes"] == [
        {"name": "ssh-key", "secret": {"secretName": "worker-ssh"}},
        {"name": "scripts", "configMap": {"name": "shutdown-scripts"}},
    ]
    assert container["resources"] == {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}
    assert job["spec"]["activeDeadlineSeconds"] == 300


def test_a_release_job_is_owned_by_the_slot_alone(cluster: EmulatorServer, acts: KubeActivities) -> None:
    assert acts.create_job(c.JobRequest(NS, "gpu-1", "shutdown", 3)) == {"name": "gpu-1-shutdown-3", "namespace": NS}
    named = acts.create_job(c.JobRequest(NS, "gpu-1", "shutdown", 1, "", "gpu-1-release-7"))
    assert named == {"name": "gpu-1-release-7", "namespace": NS}
    job = stored(cluster, "batch/v1", "jobs", NS, "gpu-1-shutdown-3")
    slot = stored(cluster, CRD, "nodes", NS, "gpu-1")
    assert job["metadata"]["ownerReferences"] == [
        {
            "apiVersion": CRD,
            "kind": "Node",
            "name": "gpu-1",
            "uid": slot["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert names.LABEL_NODECLAIM not in job["metadata"]["labels"]
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "homelab-lifecycle"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pod["tolerations"] == [
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert container_of(job)["envFrom"] == [{"prefix": "BMC_", "secretRef": {"name": "gpu-1-bmc"}}]


def test_a_retried_create_job_never_makes_a_second_job(cluster: EmulatorServer) -> None:
    """The first answer is lost (the client times out, the server creates anyway); the retry finds the Job."""
    impatient = Kube.connect(server=cluster.url, timeout=0.3)
    try:
        acts = KubeActivities(impatient, clock=lambda: NOW)
        cluster.emulator.faults.append(Fault(match=lambda i: i.verb == "create", status=None, delay=0.8))
        req = c.JobRequest(NS, "worker-2", "startup", 1)
        with pytest.raises(Exception, match="Timeout"):
            acts.create_job(req)
        time.sleep(1.0)
        assert acts.create_job(req) == {"name": "worker-2-startup", "namespace": NS}
        assert acts.create_job(req) == {"name": "worker-2-startup", "namespace": NS}
    finally:
        impatient.close()
    assert [j["metadata"]["name"] for j in objects(cluster, "batch/v1", "jobs")] == ["worker-2-startup"]


def test_create_job_failures_that_retrying_cannot_fix(cluster: EmulatorServer, acts: KubeActivities) -> None:
    with pytest.raises(ApplicationError) as err:
        acts.create_job(c.JobRequest(NS, "gone", "startup"))
    assert "gone" in failure(err, "SlotDeleted")

    bad = stored(cluster, CRD, "nodes", NS, "worker-2")
    bad["spec"]["startupPodSpec"] = {"image": "x", "comand": ["typo"]}
    put(cluster, CRD, "nodes", bad)
    with pytest.raises(ApplicationError) as err:
        acts.create_job(c.JobRequest(NS, "worker-2", "startup"))
    assert "startupPodSpec" in failure(err, "InvalidPodSpec")

    del bad["spec"]["startupPodSpec"]
    put(cluster, CRD, "nodes", bad)
    with pytest.raises(ApplicationError) as err:
        acts.create_job(c.JobRequest(NS, "worker-2", "startup"))
    assert "worker-2" in failure(err, "InvalidPodSpec")

    with pytest.raises(ApplicationError) as err:
        acts.create_job(c.JobRequest(NS, "worker-1", "startup", 1, "gone-claim"))
    assert "gone-claim" in failure(err, "NotFound")

    with pytest.raises(ApplicationError) as err:
        acts.create_job(c.JobRequest(NS, "worker-1", "reboot"))
    failure(err, "Invalid")

    cluster.emulator.faults.append(Fault(match=lambda i: i.verb == "create", status=422, reason="Invalid"))
    with pytest.raises(ApplicationError) as err:
        acts.create_job(c.JobRequest(NS, "worker-1", "startup"))
    assert "refused" in failure(err, "JobRefused")
    assert err.value.__cause__ is None, "the refusal may quote the pod spec: it is not chained into the failure"
    assert objects(cluster, "batch/v1", "jobs") == []


def test_read_job_states(cluster: EmulatorServer, acts: KubeActivities) -> None:
    acts.create_job(c.JobRequest(NS, "worker-1", "startup"))
    name = "worker-1-startup"
    assert acts.read_job(c.JobRef(NS, "nope")) == c.JobStatus("nope", c.JOB_MISSING)
    assert acts.read_job(c.JobRef(NS, name)) == c.JobStatus(name, c.JOB_RUNNING)

    def conditions(*conds: Obj) -> None:
        cluster.call(
            lambda e: e.patch_object("batch/v1", "jobs", NS, name, {"status": {"conditions": list(conds)}}, "status")
        )

    conditions({"type": "SuccessCriteriaMet", "status": "False"})
    assert acts.read_job(c.JobRef(NS, name)).state == c.JOB_RUNNING
    conditions({"type": "SuccessCriteriaMet", "status": "True"})
    assert acts.read_job(c.JobRef(NS, name)) == c.JobStatus(name, c.JOB_SUCCEEDED)
    conditions({"type": "SuccessCriteriaMet", "status": "True"}, {"type": "Complete", "status": "True"})
    assert acts.read_job(c.JobRef(NS, name)) == c.JobStatus(name, c.JOB_SUCCEEDED)
    conditions({"type": "FailureTarget", "status": "True", "reason": "DeadlineExceeded"})
    assert acts.read_job(c.JobRef(NS, name)) == c.JobStatus(name, c.JOB_FAILED, "DeadlineExceeded")
    conditions({"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"})
    assert acts.read_job(c.JobRef(NS, name)) == c.JobStatus(name, c.JOB_FAILED, "BackoffLimitExceeded")


# --- a failed Job's cause (issue 23): its exit code to the workflow, its Pod's words to the cluster -----------
WORDS = "wake-on-LAN: m1 did not answer"


def test_a_failed_jobs_words_reach_the_cluster_and_only_its_exit_code_reaches_the_workflow() -> None:
    script = f'echo "logging in as admin:$BMC_PASSWORD"\necho "{WORDS}" >&2\nexit 3'
    pod = {"image": "busybox", "command": ["sh", "-c", script], "env": [{"name": "BMC_PASSWORD", "value": "s3cret"}]}
    slot = {"name": "m1", "group": "workers", "startupPodSpec": pod}
    spec = parse_homelab_spec({"namespace": NS, "groups": [{"name": "workers", "maxSize": 3}], "slots": [slot]})
    with HomelabServer(spec, time_scale=0) as lab, closing(Kube.connect(server=lab.url, timeout=5.0)) as kube:
        acts = KubeActivities(kube, clock=lambda: NOW)
        acts.create_claim_held(seed(slot="m1"))
        job = acts.create_job(c.JobRequest(NS, "m1", "startup", 1, "c1"))["name"]
        ended = acts.read_job_exit(c.JobRef(NS, job))
        assert (ended.exit_code, ended.reason, ended.said()) == (3, "Error", "exit code 3 (Error)")
        sent = DataConverter.default.payload_converter.to_payloads([ended])[0].data.decode()
        assert "s3cret" not in sent and "did not answer" not in sent, sent

        said = f"startup Job {job} failed: exit code 3 (Error)"
        write = c.StatusWrite(
            NS, "c1", status={"phase": "failed", "reason": "StartupJobFailed", "message": said},
            event_reason="ClaimFailed", event_message=f"{said} (attempt 1)", warning=True, revision=1, above_held=True,
            last_words_of=job,
        )  # fmt: skip
        acts.record_claim(write)
        claim = stored(lab.server, CRD, "nodeclaims", NS, "c1")
        words = f"logging in as admin:s3cret | {WORDS}"
        assert claim["status"]["message"] == f"{said}{c.LAST_WORDS_MARK}{words}"
        (failed,) = [e for e in objects(lab.server, "v1", "events") if e["reason"] == "ClaimFailed"]
        assert failed["message"] == f"{said} (attempt 1){c.LAST_WORDS_MARK}{words}"
        # What is read back into a workflow (a record taken over, a person's edit) is the workflow's own message.
        record = views.claim_record(claim, NOW)
        assert record is not None and record.message == said
        edited = {**claim, "status": {**claim["status"], "reason": "ByHand"}}
        edit = views.status_edit(claim, edited)
        assert edit is not None and edit.status["message"] == said

        # A Pod list a retry may fix fails the write with it (retried until it lands); one refused for good (an
        # install whose RBAC lacks `pods list`) leaves the words out, not the record.
        lab.server.emulator.faults.append(Fault(match=lambda i: i.plural == "pods", status=503, times=1))
        with pytest.raises(Transient):
            acts.record_claim(dataclasses.replace(write, status={**write.status, "message": "again"}, revision=2))
        assert stored(lab.server, CRD, "nodeclaims", NS, "c1")["status"]["message"].startswith(said)
        lab.server.emulator.faults.append(
            Fault(match=lambda i: i.plural == "pods", status=403, reason="Forbidden", times=None)
        )
        acts.record_claim(dataclasses.replace(write, status={**write.status, "message": "again"}, revision=2))
        assert stored(lab.server, CRD, "nodeclaims", NS, "c1")["status"]["message"] == "again"
        lab.server.emulator.faults.clear()

        # A law-3 release's Warning on the slot carries them too.
        acts.slot_event(c.SlotEvent(NS, "m1", "ShutdownJobFailed", f"shutdown Job {job} failed", True, job))
        (warning,) = [e for e in objects(lab.server, "v1", "events") if e["reason"] == "ShutdownJobFailed"]
        assert warning["message"] == f"shutdown Job {job} failed{c.LAST_WORDS_MARK}{words}"


# --- the machine -------------------------------------------------------------------------------------------
def observe(acts: KubeActivities, slot: str = "worker-1") -> tuple[str, bool, bool, bool]:
    o = acts.observe_slot(c.SlotRef(NS, slot))
    assert o.observed_at == NOW
    return (o.power, o.usable, o.exists, o.gate_open)


def test_observe_slot(cluster: EmulatorServer, acts: KubeActivities) -> None:
    obs = acts.observe_slot(c.SlotRef(NS, "worker-1"))
    assert obs.resource_version == stored(cluster, "v1", "nodes", None, "worker-1")["metadata"]["resourceVersion"]
    assert observe(acts) == ("on", True, True, True)
    put(cluster, "v1", "nodes", kubelet_node("worker-1", ready=False))
    assert observe(acts) == ("off", False, True, False)
    put(cluster, "v1", "nodes", kubelet_node("worker-1", taints=[CILIUM]))
    assert observe(acts) == ("on", False, True, False)  # the readiness taint closes the gate
    put(cluster, "v1", "nodes", kubelet_node("worker-1", taints=[FOREIGN], unschedulable=True))
    assert observe(acts) == ("on", False, True, True)  # cordoned: unusable, yet the gate is open
    cluster.call(lambda e: e.delete_object("v1", "nodes", None, "worker-1"))
    obs = acts.observe_slot(c.SlotRef(NS, "worker-1"))
    assert (obs.power, obs.usable, obs.exists, obs.gate_open, obs.resource_version) == ("off", False, False, False, "")
    with pytest.raises(ApplicationError) as err:
        acts.observe_slot(c.SlotRef(NS, "gone"))
    failure(err, "SlotDeleted")


def test_observe_slot_reads_the_groups_readiness_taints(cluster: EmulatorServer, acts: KubeActivities) -> None:
    put(cluster, "v1", "nodes", kubelet_node("worker-1", taints=[CILIUM]))
    cluster.call(lambda e: e.patch_object(CRD, "groups", NS, "workers", {"spec": {"nodeReadinessTaints": []}}))
    assert observe(acts) == ("on", True, True, True)  # [] disables the gate
    cluster.call(lambda e: e.delete_object(CRD, "groups", NS, "workers"))
    assert observe(acts) == ("on", False, True, False)  # no group: the default readiness taints


def test_cordon_and_uncordon_slot(cluster: EmulatorServer, acts: KubeActivities) -> None:
    ref = c.SlotRef(NS, "worker-1")
    acts.cordon_slot(ref)
    acts.cordon_slot(ref)
    assert stored(cluster, "v1", "nodes", None, "worker-1")["spec"]["unschedulable"] is True
    acts.uncordon_slot(ref)
    assert "unschedulable" not in stored(cluster, "v1", "nodes", None, "worker-1")["spec"]
    cluster.call(lambda e: e.delete_object("v1", "nodes", None, "worker-1"))
    acts.cordon_slot(ref)  # no Node: nothing to do
    acts.uncordon_slot(ref)
    with pytest.raises(ApplicationError) as err:
        acts.cordon_slot(c.SlotRef(NS, "gone"))
    failure(err, "SlotDeleted")


def test_open_gate(cluster: EmulatorServer, acts: KubeActivities) -> None:
    pool = {"key": "homelab.dev/pool", "value": "workers", "effect": "PreferNoSchedule"}
    cluster.call(lambda e: e.patch_object(CRD, "groups", NS, "workers", {"spec": {"nodeTaints": [pool]}}))
    put(cluster, "v1", "nodes", kubelet_node("worker-1", taints=[FOREIGN, OUT_OF_SERVICE], unschedulable=True))
    ref = c.SlotRef(NS, "worker-1")
    acts.open_gate(ref)
    node = stored(cluster, "v1", "nodes", None, "worker-1")
    assert "unschedulable" not in node["spec"]
    assert node["spec"]["taints"] == [FOREIGN, pool]
    assert node["spec"]["providerID"] == "homelab://homelab-autoscaler-system/worker-1"
    assert node["metadata"]["labels"][names.LABEL_GROUP] == "workers"
    assert node["metadata"]["labels"][names.LABEL_NODE] == "worker-1"
    writes = len([r for r in list(cluster.emulator.requests) if r.verb == "patch"])
    acts.open_gate(ref)
    assert len([r for r in list(cluster.emulator.requests) if r.verb == "patch"]) == writes  # nothing: it is open
    assert stored(cluster, "v1", "nodes", None, "worker-1") == node

    acts.open_gate(c.SlotRef(NS, "gpu-1"))  # the slot's own providerID wins over the default
    assert (
        stored(cluster, "v1", "nodes", None, "gpu-1")["spec"]["providerID"]
        == "homelab://homelab-autoscaler-system/gpu-1"
    )
    cluster.call(lambda e: e.delete_object("v1", "nodes", None, "worker-2"))
    acts.open_gate(c.SlotRef(NS, "worker-2"))  # the Node vanished: nothing to do


def test_slot_event(cluster: EmulatorServer, acts: KubeActivities) -> None:
    ev = c.SlotEvent(NS, "worker-1", "ReadinessGateTimeout", "the node never became ready", warning=True)
    acts.slot_event(ev)
    acts.slot_event(ev)
    (event,) = objects(cluster, "v1", "events")
    slot = stored(cluster, CRD, "nodes", NS, "worker-1")
    assert event["involvedObject"]["uid"] == slot["metadata"]["uid"]
    assert (event["type"], event["count"], event["reason"]) == ("Warning", 2, "ReadinessGateTimeout")
    acts.slot_event(c.SlotEvent(NS, "gone", "MachineReleased", "released"))  # moot
    assert len(objects(cluster, "v1", "events")) == 1


# --- the group ---------------------------------------------------------------------------------------------
def test_load_group(cluster: EmulatorServer, acts: KubeActivities) -> None:
    assert acts.load_group(c.GroupRef(NS, "nope")) == c.GroupView(NS, "nope", exists=False)
    put(cluster, "v1", "nodes", kubelet_node("worker-1", ready=False, taints=[CILIUM]))
    cluster.call(lambda e: e.delete_object("v1", "nodes", None, "worker-2"))
    put(cluster, "v1", "nodes", kubelet_node("gpu-1", taints=[CILIUM, FOREIGN], providerID="kind://gpu-1"))
    cluster.call(
        lambda e: e.patch_object(CRD, "nodes", NS, "worker-1", {"status": {"activationsLast24H": 4}}, "status")
    )
    acts.create_claim(seed("c1", "worker-1"))
    acts.record_claim(c.StatusWrite(NS, "c1", status={"phase": "booting", "attempt": 2, "reason": None}))
    acts.create_claim(seed("c2", "worker-2", deadline_at=None))
    acts.add_claim_finalizer(c.ClaimRef(NS, "c2"))
    cluster.call(lambda e: e.delete_object(CRD, "nodeclaims", NS, "c2"))  # kubectl delete: held by the finalizer
    put(
        cluster,
        CRD,
        "nodeclaims",
        {
            "metadata": {"name": "c3", "namespace": NS},
            "spec": {"node": "elsewhere", "group": "other", "requestedAt": "2026-01-01T08:00:00Z"},
        },
    )

    view = acts.load_group(c.GroupRef(NS, "workers"))
    assert (view.exists, view.min_size, view.max_size, view.max_provision_seconds) == (True, 0, 3, 900.0)
    assert [s.name for s in view.slots] == ["gpu-1", "worker-1", "worker-2"]
    gpu, w1, w2 = view.slots
    assert (gpu.provider_id, w1.provider_id) == ("kind://gpu-1", "homelab://homelab-autoscaler-system/worker-1")
    assert (w1.activations_last_24h, w2.activations_last_24h) == (4, 0)
    assert (gpu.observation.power, gpu.observation.usable, gpu.observation.gate_open) == ("on", False, False)
    assert (w1.observation.power, w1.observation.exists) == ("off", True)
    assert (w2.observation.exists, w2.node_name) == (False, "worker-2")
    assert all(s.observation.observed_at == NOW for s in view.slots)
    assert view.claims == (
        c.ClaimView(
            name="c1",
            slot="worker-1",
            phase="booting",
            attempt=2,
            call="IncreaseSize",
            marked=False,
            requested_at=NOW,
            deadline_at=NOW + timedelta(minutes=15),
            max_provision_seconds=900.0,
            has_attempt=True,
            record=c.ClaimRecord(),  # what a run taken over goes on from: nothing numbered yet
        ),
        c.ClaimView(
            name="c2",
            slot="worker-2",
            phase="pending",
            attempt=1,
            call="IncreaseSize",
            marked=True,
            requested_at=NOW,
            max_provision_seconds=900.0,
            has_attempt=True,  # create_claim stamps the first status
            record=c.ClaimRecord(),
        ),
    )
    template = view.template
    assert template is not None
    assert template["metadata"]["name"] == "gpu-1"  # the Ready one
    assert template["metadata"]["labels"]["homelab.dev/pool"] == "workers"
    assert template["metadata"]["annotations"] == {names.ANNOTATION_TEMPLATE_SNAPSHOT_AT: "2026-01-01T09:00:00Z"}
    assert template["spec"] == {"taints": [FOREIGN]}  # the readiness taint is one boot's, not the group's
    assert set(template["status"]) == {"capacity", "allocatable", "nodeInfo"}
    assert "uid" not in template["metadata"] and "resourceVersion" not in template["metadata"]


def delete_node(name: str) -> Callable[[KubeEmulator], Obj]:
    """An emulator call that deletes the Node `name`."""
    return lambda e: e.delete_object("v1", "nodes", None, name)


def test_load_group_with_no_kubelet_nodes_has_no_template(cluster: EmulatorServer, acts: KubeActivities) -> None:
    for name in ("worker-1", "worker-2", "gpu-1"):
        cluster.call(delete_node(name))
    view = acts.load_group(c.GroupRef(NS, "workers"))
    assert view.template is None
    assert [s.observation.exists for s in view.slots] == [False, False, False]


def test_load_group_falls_back_to_the_slot_reports_node_template(cluster: EmulatorServer, acts: KubeActivities) -> None:
    for name in ("worker-1", "worker-2", "gpu-1"):
        cluster.call(delete_node(name))
    snapshot = {
        "labels": {"homelab.dev/pool": "workers"},
        "taints": [{"key": "dedicated", "value": "batch", "effect": "NoSchedule"}],
        "capacity": {"cpu": "4", "memory": "16Gi"},
        "allocatable": {"cpu": "3800m"},
        "takenAt": "2026-01-01T08:00:00Z",
    }
    cluster.call(
        lambda e: e.patch_object(CRD, "nodes", NS, "worker-2", {"status": {"nodeTemplate": snapshot}}, "status")
    )
    template = acts.load_group(c.GroupRef(NS, "workers")).template
    assert template is not None
    assert template["metadata"]["labels"] == {"homelab.dev/pool": "workers"}
    assert template["spec"]["taints"] == snapshot["taints"]
    assert template["status"]["capacity"] == {"cpu": "4", "memory": "16Gi"}


# --- the pure Job builder ----------------------------------------------------------------------------------
def test_build_job_defaults_bound_every_job(examples: dict[str, list[Obj]]) -> None:
    raw = examples["nodes"][2]  # gpu-1: no backoff, deadline or TTL of its own
    raw["metadata"]["uid"] = "slot-uid"
    job = build_job(Node.model_validate(raw), "startup", "c9-startup", "c9", "claim-uid")
    spec = job["spec"]
    assert spec["backoffLimit"] == names.JOB_BACKOFF_LIMIT
    assert spec["activeDeadlineSeconds"] == int(names.JOB_TIMEOUT.total_seconds())
    assert spec["ttlSecondsAfterFinished"] == names.JOB_TTL_SECONDS_AFTER_FINISHED
    assert job["metadata"]["namespace"] == NS
    assert [o["uid"] for o in job["metadata"]["ownerReferences"]] == ["claim-uid", "slot-uid"]
    env = container_of(job)["env"]
    assert env[0] == {"name": "BMC_HOST", "valueFrom": {"configMapKeyRef": {"name": "bmc-hosts", "key": "gpu-1"}}}
    assert env[1]["valueFrom"] == {"secretKeyRef": {"name": "gpu-1-bmc", "key": "username"}}
    assert "volumes" not in spec["template"]["spec"]


def test_build_job_takes_the_pod_specs_own_bounds_and_keeps_the_operators_env(examples: dict[str, list[Obj]]) -> None:
    raw = examples["nodes"][0]
    raw["metadata"]["uid"] = "slot-uid"
    raw["spec"]["startupPodSpec"].update(
        backoffLimit=2,
        activeDeadlineSeconds=120,
        ttlSecondsAfterFinished=30,
        env=[{"name": "HOMELAB_SLOT", "value": "x"}],
    )
    job = build_job(Node.model_validate(raw), "startup", "w-startup", "", "")
    assert (job["spec"]["backoffLimit"], job["spec"]["activeDeadlineSeconds"]) == (2, 120)
    assert job["spec"]["ttlSecondsAfterFinished"] == 30
    env = container_of(job)["env"]
    assert [e for e in env if e["name"] == "HOMELAB_SLOT"] == [{"name": "HOMELAB_SLOT", "value": "worker-1"}]
    assert job["metadata"]["ownerReferences"][0]["controller"] is True
    with pytest.raises(ValueError):
        build_job(Node.model_validate(raw), "reboot", "w-reboot", "", "")


def test_a_claim_without_requested_at_is_taken_as_asked_for_at_its_creation(
    cluster: EmulatorServer, acts: KubeActivities
) -> None:
    """deploy/examples/nodeclaim.yaml leaves requestedAt out, so its deadline counts from when it was applied."""
    created = "2031-05-06T07:08:09Z"
    put(
        cluster,
        CRD,
        "nodeclaims",
        {
            "metadata": {"name": "by-hand", "namespace": NS, "creationTimestamp": created},
            "spec": {"node": "worker-1", "group": "workers"},
        },
    )
    (view,) = [v for v in acts.load_group(c.GroupRef(NS, "workers")).claims if v.name == "by-hand"]
    assert view.requested_at == datetime(2031, 5, 6, 7, 8, 9, tzinfo=UTC)
    assert view.deadline_at is None, "the group sets it from requestedAt and the provision time in force"


def test_build_job_carries_the_pod_fields_a_power_job_needs(examples: dict[str, list[Obj]]) -> None:
    """hostNetwork (a wake-on-LAN broadcast on the node's LAN), nodeSelector, tolerations, dnsPolicy reach the pod."""
    raw = examples["nodes"][0]
    raw["metadata"]["uid"] = "slot-uid"
    raw["spec"]["startupPodSpec"].update(
        hostNetwork=True,
        nodeSelector={"homelab.dev/lan": "main"},
        tolerations=[{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}],
    )
    pod = build_job(Node.model_validate(raw), "startup", "w-startup", "", "")["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet", "a host-network pod keeps cluster DNS by default"
    assert pod["nodeSelector"] == {"homelab.dev/lan": "main"}
    assert pod["tolerations"] == [
        {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}
    ]
    raw["spec"]["startupPodSpec"]["dnsPolicy"] = "Default"
    assert build_job(Node.model_validate(raw), "startup", "w", "", "")["spec"]["template"]["spec"]["dnsPolicy"] == (
        "Default"
    )
    plain = build_job(Node.model_validate(raw), "shutdown", "w-shutdown", "", "")["spec"]["template"]["spec"]
    assert "hostNetwork" not in plain and "dnsPolicy" not in plain, "unset: the pod network and Kubernetes' DNS"


def test_a_power_container_falls_back_to_its_log_for_last_words_unless_told(examples: dict[str, list[Obj]]) -> None:
    """A script that fails without writing /dev/termination-log still says why: the end of its log becomes its
    terminated state's message (`FallbackToLogsOnError`), unless the slot asks for the kubelet's `File`."""
    raw = examples["nodes"][0]
    raw["metadata"]["uid"] = "slot-uid"
    job = build_job(Node.model_validate(raw), "startup", "w-startup", "", "")
    assert container_of(job)["terminationMessagePolicy"] == "FallbackToLogsOnError"
    raw["spec"]["startupPodSpec"]["terminationMessagePolicy"] = "File"
    job = build_job(Node.model_validate(raw), "startup", "w-startup", "", "")
    assert container_of(job)["terminationMessagePolicy"] == "File"
    raw["spec"]["startupPodSpec"]["terminationMessagePolicy"] = "Always"
    assert "terminationMessagePolicy" in views.slot_problem(raw)


def test_a_dns_policy_the_template_cannot_serve_is_refused_by_name(examples: dict[str, list[Obj]]) -> None:
    """dnsPolicy None needs a dnsConfig the template does not offer: refused, naming the field."""
    raw = examples["nodes"][0]
    raw["spec"]["startupPodSpec"]["dnsPolicy"] = "None"
    problem = views.slot_problem(raw)
    assert "spec.startupPodSpec.dnsPolicy" in problem, problem


def test_in_a_worker_each_claim_move_is_its_own_event_listed_in_order(
    cluster: EmulatorServer, acts: KubeActivities
) -> None:
    """Events are named from the activity's first scheduling: ordered by name, and a retry finds its Event."""
    acts.create_claim(seed())
    env = ActivityEnvironment()
    for minute, reason in ((1, "ClaimCreated"), (2, "ClaimBooting"), (3, "ClaimReady")):
        env.info = dataclasses.replace(env.info, scheduled_time=NOW + timedelta(minutes=minute))
        write = c.StatusWrite(NS, "c1", status={"phase": "pending"}, event_reason=reason, event_message="m")
        env.run(acts.record_claim, write)
    env.run(acts.record_claim, write)  # a retry of the last one (same first scheduling)
    events = [e for e in objects(cluster, "v1", "events") if e["message"] == "m"]  # the API lists by name
    assert [e["reason"] for e in events] == ["ClaimCreated", "ClaimBooting", "ClaimReady"]
    assert [e["count"] for e in events] == [1, 1, 2]
    assert all(e["metadata"]["name"].startswith("c1.") for e in events)


# --- issue 32: what a run taking a claim over adopts, and Events said once per fact ----------------------------
def test_load_group_gives_each_claims_record_its_own_jobs(cluster: EmulatorServer, acts: KubeActivities) -> None:
    """The claim's own Jobs (by owner), with their state, age and streak number: a run that takes it over adopts
    them. Another claim's Jobs, and a release's (the slot's alone), are not its."""
    acts.create_claim(seed("c1", "worker-1"))
    acts.record_claim(c.StatusWrite(NS, "c1", status={"phase": "ready", "attempt": 1}, revision=4))
    acts.create_claim(seed("c2", "worker-2"))
    acts.create_job(c.JobRequest(NS, "worker-1", "startup", 1, "c1"))
    acts.create_job(c.JobRequest(NS, "worker-1", "shutdown", 5, "c1", attempt=2))
    acts.create_job(c.JobRequest(NS, "worker-2", "startup", 1, "c2"))
    acts.create_job(c.JobRequest(NS, "worker-1", "shutdown", 1, "", "worker-1-release-abcde-shutdown"))
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
    cluster.call(lambda e: e.patch_object("batch/v1", "jobs", NS, "c1-startup", done, "status"))
    later = KubeActivities(acts.kube, clock=lambda: datetime.now(UTC) + timedelta(seconds=90))
    (c1, _) = later.load_group(c.GroupRef(NS, "workers")).claims
    assert c1.record is not None
    shutdown, startup = c1.record.jobs  # by name
    assert (startup.name, startup.job_type, startup.state, startup.sequence) == (
        "c1-startup",
        "startup",
        "succeeded",
        1,
    )
    assert (shutdown.name, shutdown.state, shutdown.attempt, shutdown.sequence) == ("c1-shutdown-5", "running", 2, 5)
    assert 85 <= shutdown.age_seconds <= 150


def test_job_sequence_reads_the_number_in_a_lifecycle_jobs_name() -> None:
    assert [c.job_sequence(c.job_name("w-1-abc", "shutdown", n), "shutdown") for n in (1, 2, 17)] == [1, 2, 17]
    assert c.job_sequence("w-1-abc-startup", "startup") == 1
    assert c.job_sequence("w-1-abc-startup", "shutdown") == 0 and c.job_sequence("shutdown", "shutdown") == 0


def test_an_event_of_a_fact_is_said_once(cluster: EmulatorServer, acts: KubeActivities) -> None:
    """Two runs saying one fact (a spent streak): the second finds the first's Event and adds none, whatever its
    message or moment; another fact of the same reason is its own Event."""
    acts.create_claim(seed())
    spent = "c1: shutdown streak spent at 2026-01-01T09:00:00Z"
    for message in ("3 shutdown Jobs did not power the machine off", "said again by the run that took it over"):
        acts.record_claim(
            c.StatusWrite(NS, "c1", status={"phase": "ready"}, event_reason="ShutdownAttemptLimitReached",
                          event_message=message, warning=True, event_fact=spent)
        )  # fmt: skip
    acts.slot_event(c.SlotEvent(NS, "worker-1", "ScaleDownStarted", "first", fact="worker-1-release-a: started"))
    acts.slot_event(c.SlotEvent(NS, "worker-1", "ScaleDownStarted", "again", fact="worker-1-release-a: started"))
    acts.record_claim(
        c.StatusWrite(NS, "c1", status={"phase": "ready"}, event_reason="ShutdownAttemptLimitReached",
                      event_message="a later streak", warning=True, event_fact="c1: shutdown streak spent at later")
    )  # fmt: skip
    said = [
        (e["reason"], e["message"], e["count"])
        for e in objects(cluster, "v1", "events")
        if e["reason"] != "ClaimCreated"
    ]
    assert sorted(said) == [
        ("ScaleDownStarted", "first", 1),
        ("ShutdownAttemptLimitReached", "3 shutdown Jobs did not power the machine off", 1),
        ("ShutdownAttemptLimitReached", "a later streak", 1),
    ]


def test_a_hand_applied_claim_is_given_its_slots_labels_owner_and_deadline_once(
    cluster: EmulatorServer, acts: KubeActivities
) -> None:
    """The take-over's record writes what the claim lacks (labels, the slot as a non-controller owner, a deadline)
    in one write beside the status, keeps what it has (its own labels, another owner, a deadline of its own), and
    writes nothing the second time."""
    put(cluster, CRD, "nodeclaims", {
        "metadata": {"name": "by-hand", "namespace": NS, "labels": {"team": "lab"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u-x"}]},
        "spec": {"node": "worker-1", "group": "workers", "call": "Manual"},
    })  # fmt: skip
    identity = c.ClaimIdentity("worker-1", "workers", NOW + timedelta(minutes=12, seconds=10))
    write = c.StatusWrite(NS, "by-hand", status={"phase": "pending"}, revision=1, identity=identity)
    acts.record_claim(write)
    claim = stored(cluster, CRD, "nodeclaims", NS, "by-hand")
    slot = stored(cluster, CRD, "nodes", NS, "worker-1")
    assert claim["metadata"]["labels"] == {"team": "lab", names.LABEL_NODE: "worker-1", names.LABEL_GROUP: "workers"}
    assert claim["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u-x"},
        {"apiVersion": CRD, "kind": "Node", "name": "worker-1", "uid": slot["metadata"]["uid"]},
    ]
    assert claim["spec"]["deadlineAt"] == "2026-01-01T09:12:10Z"
    before = len([r for r in cluster.emulator.requests if r.verb == "patch" and not r.subresource])
    acts.record_claim(dataclasses.replace(write, identity=dataclasses.replace(identity, deadline_at=NOW)))
    assert len([r for r in cluster.emulator.requests if r.verb == "patch" and not r.subresource]) == before
    assert stored(cluster, CRD, "nodeclaims", NS, "by-hand")["spec"]["deadlineAt"] == "2026-01-01T09:12:10Z"


def test_a_shutdown_job_carries_its_number_in_the_streak(examples: dict[str, list[Obj]]) -> None:
    slot = Node.model_validate(examples["nodes"][0])
    job = build_job(slot, "shutdown", "c1-shutdown-3", "c1", "u1", attempt=2)
    assert job["metadata"]["annotations"] == {names.ANNOTATION_SHUTDOWN_ATTEMPT: "2"}
    assert "annotations" not in build_job(slot, "startup", "c1-startup", "c1", "u1")["metadata"]


def test_an_event_of_a_fact_is_said_when_events_cannot_be_listed(cluster: EmulatorServer, acts: KubeActivities) -> None:
    """An install whose RBAC lacks `events list` (manifests older than the worker): the fact cannot be looked up, and
    the Event is said all the same (maybe twice), never held back by a write retried for good."""
    acts.create_claim(seed())
    cluster.emulator.faults.append(
        Fault(match=lambda r: r.plural == "events" and r.verb == "list", status=403, reason="Forbidden", times=None)
    )
    acts.record_claim(
        c.StatusWrite(NS, "c1", status={"phase": "ready"}, event_reason="ScaleDownStarted", event_message="m",
                      event_fact="c1: scale-down started")
    )  # fmt: skip
    assert sorted(e["reason"] for e in objects(cluster, "v1", "events")) == ["ClaimCreated", "ScaleDownStarted"]
