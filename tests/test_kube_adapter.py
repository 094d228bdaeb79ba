"""Contract suite of `kube.adapter.Kube` and `kube.watch.Watch` against the HTTP API emulator.

Everything goes through the real `kubernetes` client over HTTP: the assertions are on what the server stored and
on the requests it received (path, verb, content type), so they hold for the wire format, not for a mock.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from datetime import UTC, datetime
from typing import Any

import pytest
from homelab_sim.emulator import EmulatorServer, Fault, KubeEmulator, RequestInfo
from homelab_sim.homelab import HomelabServer
from homelab_sim.homelab_spec import parse_homelab_spec

from api import names
from api.v2alpha1 import Group, Node, NodeClaim, NodeClaimSpec, ObjectMeta
from kube.adapter import CLAIMS, JOBS, KUBELET_NODES, SLOTS, Kube, ObjectRef, Resource
from kube.errors import Conflict, Invalid, NotFound, Transient
from kube.views import (
    CAUSE_DEADLINE,
    CAUSE_JOB_GONE,
    CAUSE_MESSAGE_CHARS,
    CAUSE_NO_POD,
    CAUSE_NOT_TERMINATED,
    JobCause,
    job_pod_selector,
    trimmed_message,
)
from kube.watch import Watch

NS = "homelab-autoscaler-system"
CRD = names.API_VERSION
Obj = dict[str, Any]


# --- helpers -----------------------------------------------------------------------------------------------
def put(srv: EmulatorServer, group_version: str, plural: str, obj: Obj) -> Obj:
    """Seed one object (server metadata stamped) and return it as stored."""
    return srv.call(lambda e: e.put_object(group_version, plural, obj))


def stored(srv: EmulatorServer, group_version: str, plural: str, namespace: str | None, name: str) -> Obj | None:
    return srv.call(lambda e: e.get_object(group_version, plural, namespace, name))


def count(srv: EmulatorServer, group_version: str, plural: str, namespace: str | None = None) -> int:
    return len(srv.call(lambda e: e.objects_of(group_version, plural, namespace)))


def requests(srv: EmulatorServer, verb: str, plural: str | None = None) -> list[RequestInfo]:
    return [r for r in list(srv.emulator.requests) if r.verb == verb and (plural is None or r.plural == plural)]


def kubelet_node(name: str, *, ready: bool = True, taints: list[Obj] | None = None, **spec: Any) -> Obj:
    node: Obj = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {**spec, **({"taints": taints} if taints else {})},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }
    return node


def claim_model(name: str, slot: str = "worker-1") -> NodeClaim:
    return NodeClaim(
        metadata=ObjectMeta(name=name, namespace=NS, labels={names.LABEL_NODE: slot, names.LABEL_GROUP: "workers"}),
        spec=NodeClaimSpec(node=slot, group="workers", requested_at=datetime(2026, 1, 1, 8, tzinfo=UTC)),
    )


def a_job(name: str, slot: str = "worker-1") -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {names.LABEL_NODE: slot, names.LABEL_MANAGED_BY: names.MANAGED_BY}},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "power", "image": "busybox"}]}},
        },
    }


@pytest.fixture
def cluster(emulator: EmulatorServer, examples: dict[str, list[Obj]]) -> EmulatorServer:
    """The example group and slots (two slots labelled with their group, gpu-1 not), and three kubelet Nodes."""
    put(emulator, CRD, "groups", examples["group"][0])
    for slot in examples["nodes"]:
        if slot["metadata"]["name"] != "gpu-1":
            slot["metadata"]["labels"] = {names.LABEL_GROUP: "workers"}
        put(emulator, CRD, "nodes", slot)
    put(emulator, CRD, "groups", {**examples["group"][0], "metadata": {"name": "other", "namespace": "elsewhere"}})
    for name in ("worker-1", "worker-2", "gpu-1"):
        put(emulator, "v1", "nodes", kubelet_node(name))
    return emulator


# --- reads -------------------------------------------------------------------------------------------------
def test_get_and_list_the_three_resources_with_label_selectors(cluster: EmulatorServer, kube: Kube) -> None:
    assert kube.get(Group, NS, "workers").spec.max_size == 3
    assert [g.metadata.name for g in kube.items(Group, NS)] == ["workers"]
    assert sorted(str(g.metadata.namespace) for g in kube.items(Group)) == ["elsewhere", NS]  # all namespaces

    assert kube.get(Node, NS, "gpu-1").spec.provider_id == "homelab://homelab-autoscaler-system/gpu-1"
    assert [s.metadata.name for s in kube.items(Node, NS)] == ["gpu-1", "worker-1", "worker-2"]
    labelled = kube.items(Node, NS, f"{names.LABEL_GROUP}=workers")
    assert [s.metadata.name for s in labelled] == ["worker-1", "worker-2"]
    assert requests(cluster, "list", "nodes")[-1].params["labelSelector"] == f"{names.LABEL_GROUP}=workers"

    kube.create_claim(claim_model("c1", "worker-1"))
    kube.create_claim(claim_model("c2", "worker-2"))
    assert kube.get_claim(NS, "c1").spec.node == "worker-1"
    assert [c.metadata.name for c in kube.items(NodeClaim, NS, f"{names.LABEL_NODE}=worker-2")] == ["c2"]
    assert [c.metadata.name for c in kube.items(NodeClaim, NS, f"{names.LABEL_NODE} in (worker-1,worker-2)")] == [
        "c1",
        "c2",
    ]
    with pytest.raises(NotFound):
        kube.get_claim(NS, "nope")


def test_kubelet_nodes_and_jobs_are_read_as_json(cluster: EmulatorServer, kube: Kube) -> None:
    node = kube.get_node("worker-1")
    assert node is not None and node["status"]["conditions"][0]["type"] == "Ready"
    assert kube.get_node("nope") is None
    assert [n["metadata"]["name"] for n in kube.list_nodes("kubernetes.io/hostname=gpu-1")] == ["gpu-1"]
    kube.create_job(NS, a_job("j1", "worker-1"))
    kube.create_job(NS, a_job("j2", "worker-2"))
    assert [j["metadata"]["name"] for j in kube.list_raw(JOBS, NS, f"{names.LABEL_NODE}=worker-2")[0]] == ["j2"]
    assert len(kube.list_raw(JOBS)[0]) == 2
    job = kube.get_job(NS, "j1")
    assert job is not None and job["kind"] == "Job"
    assert kube.get_job(NS, "nope") is None
    items, rv = kube.list_raw(JOBS, NS)
    assert all(i["kind"] == "Job" and i["apiVersion"] == "batch/v1" for i in items)  # filled for list items
    assert rv == str(cluster.emulator.resource_version)


def test_a_stored_object_our_schema_refuses_is_invalid_not_a_pydantic_error(
    cluster: EmulatorServer, kube: Kube
) -> None:
    put(cluster, CRD, "nodes", {"metadata": {"name": "broken", "namespace": NS}, "spec": {"group": "workers"}})
    with pytest.raises(Invalid, match="broken"):
        kube.get(Node, NS, "broken")
    assert kube.get_raw(SLOTS, NS, "broken")["spec"] == {"group": "workers"}


# --- lists follow continue ---------------------------------------------------------------------------------
def test_every_list_pages_with_a_limit_and_follows_continue(
    emulator: EmulatorServer, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that pages (``limit``/``continue``, `emulator_pages`) gives every object to a list of the adapter,
    in bounded pages, under the first page's resourceVersion (a consistent snapshot).
    """
    monkeypatch.setattr("kube.adapter.LIST_PAGE_LIMIT", 3)
    for i in range(8):
        put(emulator, CRD, "nodes", slot(f"s{i}"))
    items, list_rv = kube.list_raw(SLOTS, NS)
    assert [i["metadata"]["name"] for i in items] == [f"s{i}" for i in range(8)]
    pages = requests(emulator, "list", "nodes")
    assert [p.params.get("limit") for p in pages] == ["3", "3", "3"]
    assert [bool(p.params.get("continue")) for p in pages] == [False, True, True]
    assert list_rv == str(emulator.emulator.resource_version)
    labelled, _ = kube.list_raw(SLOTS, NS, f"{names.LABEL_GROUP}=workers")
    assert len(labelled) == 8 and requests(emulator, "list", "nodes")[-1].params["labelSelector"]


def test_an_expired_continue_token_costs_one_unpaged_list(
    emulator: EmulatorServer, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """410 Expired on a continued page (the server compacted the first page's revision): client-go's pager lists
    everything again in one response rather than failing, and so does the adapter.
    """
    monkeypatch.setattr("kube.adapter.LIST_PAGE_LIMIT", 2)
    for i in range(5):
        put(emulator, CRD, "nodes", slot(f"s{i}"))
    expired = Fault(match=lambda r: r.verb == "list" and bool(r.params.get("continue")), status=410, reason="Expired")
    emulator.emulator.faults.append(expired)
    items, _ = kube.list_raw(SLOTS, NS)
    assert [i["metadata"]["name"] for i in items] == [f"s{i}" for i in range(5)]
    assert [p.params.get("limit") for p in requests(emulator, "list", "nodes")] == ["2", "2", None]


def test_the_list_that_starts_a_watch_follows_continue(
    emulator: EmulatorServer, consume: Callable[..., Consumer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watch's (re)list sees every object of a paging server before it says SYNCED and starts watching."""
    monkeypatch.setattr("kube.adapter.LIST_PAGE_LIMIT", 2)
    for i in range(5):
        put(emulator, CRD, "nodes", slot(f"s{i}"))
    c = consume(SLOTS, namespace=NS)
    assert sorted(c.take(5)) == [("ADDED", f"s{i}", str(i + 1)) for i in range(5)]
    assert c.take(1) == [SYNCED]
    assert len(requests(emulator, "list", "nodes")) == 3


# --- creates with deterministic names ----------------------------------------------------------------------
def test_create_claim_twice_returns_the_one_claim(cluster: EmulatorServer, kube: Kube) -> None:
    first = kube.create_claim(claim_model("c1"))
    again = kube.create_claim(claim_model("c1"))
    assert first.metadata.uid == again.metadata.uid
    assert count(cluster, CRD, "nodeclaims", NS) == 1
    assert [r.verb for r in list(cluster.emulator.requests) if r.plural == "nodeclaims"] == ["create", "create", "get"]


def test_a_create_whose_answer_was_lost_is_found_by_the_retry(cluster: EmulatorServer) -> None:
    """The server applies the create after the client gave up: the caller's retry must not make a second one."""
    impatient = Kube.connect(server=cluster.url, timeout=0.3)
    try:
        slow = Fault(match=lambda i: i.verb == "create", status=None, delay=0.8, times=2)
        cluster.emulator.faults.append(slow)
        with pytest.raises(Transient):
            impatient.create_job(NS, a_job("startup-1"))
        with pytest.raises(Transient):
            impatient.create_claim(claim_model("c1"))
        time.sleep(1.0)  # both creates land on the server
        assert impatient.create_job(NS, a_job("startup-1"))["metadata"]["name"] == "startup-1"
        assert impatient.create_claim(claim_model("c1")).metadata.name == "c1"
    finally:
        impatient.close()
    assert count(cluster, "batch/v1", "jobs", NS) == 1
    assert count(cluster, CRD, "nodeclaims", NS) == 1


def test_create_job_twice_returns_the_one_job(cluster: EmulatorServer, kube: Kube) -> None:
    first = kube.create_job(NS, a_job("c1-startup"))
    again = kube.create_job(NS, a_job("c1-startup"))
    assert first["metadata"]["uid"] == again["metadata"]["uid"]
    assert count(cluster, "batch/v1", "jobs", NS) == 1


# --- status writes ------------------------------------------------------------------------------------------
def test_status_patches_go_to_the_status_subresource_as_merge_patches(cluster: EmulatorServer, kube: Kube) -> None:
    kube.create_claim(claim_model("c1"))
    claim = NodeClaim.model_validate(
        kube.patch_raw(CLAIMS, NS, "c1", {"status": {"phase": "booting", "attempt": 2}}, status=True)
    )
    assert claim.status.phase == "booting" and claim.status.attempt == 2
    kube.patch_raw(CLAIMS, NS, "c1", {"status": {"attempt": None}}, status=True)  # null deletes (RFC 7386)
    assert stored(cluster, CRD, "nodeclaims", NS, "c1")["status"] == {"phase": "booting"}  # type: ignore[index]
    assert kube.patch_slot_status(NS, "worker-1", {"phase": "off", "powerState": "off"}).status.phase == "off"
    assert kube.patch_group_status(NS, "workers", {"slots": 3}).status.slots == 3
    writes = [r for r in list(cluster.emulator.requests) if r.verb == "patch"]
    assert len(writes) == 4
    for r in writes:
        assert r.path.endswith("/status"), r.path
        assert r.subresource == "status"
        assert r.content_type == "application/merge-patch+json"
    # the status writes left every spec alone
    assert stored(cluster, CRD, "nodes", NS, "worker-1")["metadata"]["generation"] == 1  # type: ignore[index]


def test_patch_claim_writes_the_main_resource(cluster: EmulatorServer, kube: Kube) -> None:
    model = claim_model("c1")
    model.spec.deadline_at = datetime(2026, 1, 1, 8, 15, tzinfo=UTC)
    kube.create_claim(model)
    assert (
        NodeClaim.model_validate(kube.patch_raw(CLAIMS, NS, "c1", {"spec": {"deadlineAt": None}})).spec.deadline_at
        is None
    )
    last = requests(cluster, "patch", "nodeclaims")[-1]
    assert last.subresource is None and last.content_type == "application/merge-patch+json"


# --- finalizers ------------------------------------------------------------------------------------------
def test_finalizer_add_and_remove_are_idempotent(cluster: EmulatorServer, kube: Kube) -> None:
    kube.create_claim(claim_model("c1"))
    kube.add_claim_finalizer(NS, "c1")
    kube.add_claim_finalizer(NS, "c1")
    assert stored(cluster, CRD, "nodeclaims", NS, "c1")["metadata"]["finalizers"] == [names.FINALIZER_CLAIM]  # type: ignore[index]
    assert len(requests(cluster, "patch", "nodeclaims")) == 1  # the second add wrote nothing
    kube.remove_claim_finalizer(NS, "c1")
    kube.remove_claim_finalizer(NS, "c1")
    assert "finalizers" not in stored(cluster, CRD, "nodeclaims", NS, "c1")["metadata"]  # type: ignore[index]
    assert len(requests(cluster, "patch", "nodeclaims")) == 2
    kube.remove_claim_finalizer(NS, "gone")  # a claim that is gone is released already


def test_the_finalizer_holds_a_deleted_claim_until_removed(cluster: EmulatorServer, kube: Kube) -> None:
    kube.create_claim(claim_model("c1"))
    kube.add_claim_finalizer(NS, "c1")
    assert kube.delete_claim(NS, "c1") is True
    assert kube.get_claim(NS, "c1").metadata.deletion_timestamp is not None
    with pytest.raises(Invalid, match="being deleted"):
        kube.add_claim_finalizer(NS, "c1", "someone/else")
    kube.remove_claim_finalizer(NS, "c1")
    with pytest.raises(NotFound):
        kube.get_claim(NS, "c1")
    assert kube.delete_claim(NS, "c1") is False


# --- kubelet Nodes ----------------------------------------------------------------------------------------
def test_cordon_and_uncordon(cluster: EmulatorServer, kube: Kube) -> None:
    assert kube.cordon("worker-1")["spec"]["unschedulable"] is True
    assert stored(cluster, "v1", "nodes", None, "worker-1")["spec"] == {"unschedulable": True}  # type: ignore[index]
    kube.uncordon("worker-1")
    kube.uncordon("worker-1")
    assert "unschedulable" not in stored(cluster, "v1", "nodes", None, "worker-1")["spec"]  # type: ignore[index]
    with pytest.raises(NotFound):
        kube.cordon("nope")


FOREIGN = {"key": "example.com/foreign", "effect": "NoSchedule"}
CILIUM = {"key": "node.cilium.io/agent-not-ready", "effect": "NoExecute"}


def test_stamp_taints_keeps_the_others_and_is_idempotent(cluster: EmulatorServer, kube: Kube) -> None:
    put(cluster, "v1", "nodes", kubelet_node("worker-1", taints=[FOREIGN]))
    wanted = {"key": "homelab/pool", "value": "workers", "effect": "NoSchedule"}
    kube.stamp_taints("worker-1", [wanted])
    writes = len(requests(cluster, "patch", "nodes"))
    kube.stamp_taints("worker-1", [wanted])
    assert len(requests(cluster, "patch", "nodes")) == writes  # nothing to do, nothing written
    assert stored(cluster, "v1", "nodes", None, "worker-1")["spec"]["taints"] == [FOREIGN, wanted]  # type: ignore[index]


def _concurrent_writer(taint: Obj) -> Callable[[RequestInfo], bool]:
    """A Fault matcher that, on the adapter's first Node patch, lets another writer add `taint` first.

    Nothing is injected: the adapter's write then carries a stale resourceVersion and the server answers a real 409.
    """
    state = {"fired": False}
    emulator_box: list[KubeEmulator] = []

    def match(info: RequestInfo) -> bool:
        if info.verb == "patch" and info.plural == "nodes" and info.group == "" and not state["fired"]:
            state["fired"] = True
            emulator = emulator_box[0]
            node = emulator.get_object("v1", "nodes", None, str(info.name)) or {}
            taints = [*(node.get("spec") or {}).get("taints", []), taint]
            emulator.patch_object("v1", "nodes", None, str(info.name), {"spec": {"taints": taints}})
        return False

    match.box = emulator_box  # type: ignore[attr-defined]
    return match


def test_a_concurrent_taint_writer_costs_a_retry_never_a_lost_taint(cluster: EmulatorServer, kube: Kube) -> None:
    put(cluster, "v1", "nodes", kubelet_node("worker-1", taints=[FOREIGN]))
    match = _concurrent_writer({"key": "example.com/late", "effect": "NoExecute"})
    match.box.append(cluster.emulator)  # type: ignore[attr-defined]
    cluster.emulator.faults.append(Fault(match=match, status=None, times=None))
    wanted = {"key": "homelab/pool", "effect": "NoSchedule"}
    kube.stamp_taints("worker-1", [wanted])
    patches = requests(cluster, "patch", "nodes")
    assert len(patches) == 2  # the first was refused with 409, the second landed
    assert all(p.body["metadata"]["resourceVersion"] for p in patches)  # compare-and-set, guarded by rv
    taints = stored(cluster, "v1", "nodes", None, "worker-1")["spec"]["taints"]  # type: ignore[index]
    assert taints == [FOREIGN, {"key": "example.com/late", "effect": "NoExecute"}, wanted]


def test_an_injected_conflict_is_retried_by_the_compare_and_set(cluster: EmulatorServer, kube: Kube) -> None:
    cluster.emulator.faults.append(
        Fault(match=lambda i: i.verb == "patch" and i.plural == "nodes", status=409, reason="Conflict", times=1)
    )
    kube.remove_taints("worker-1", [])  # nothing to remove: no write at all
    put(cluster, "v1", "nodes", kubelet_node("worker-1", taints=[FOREIGN, CILIUM]))
    kube.remove_taints("worker-1", [{"key": CILIUM["key"]}])  # no effect given: every effect of the key
    assert stored(cluster, "v1", "nodes", None, "worker-1")["spec"]["taints"] == [FOREIGN]  # type: ignore[index]
    assert len(requests(cluster, "patch", "nodes")) == 2


def test_remove_taints_by_key_and_effect_is_idempotent(cluster: EmulatorServer, kube: Kube) -> None:
    other_effect = {"key": CILIUM["key"], "effect": "NoSchedule"}
    put(cluster, "v1", "nodes", kubelet_node("worker-1", taints=[FOREIGN, CILIUM, other_effect]))
    kube.remove_taints("worker-1", [CILIUM])
    kube.remove_taints("worker-1", [CILIUM])
    assert stored(cluster, "v1", "nodes", None, "worker-1")["spec"]["taints"] == [FOREIGN, other_effect]  # type: ignore[index]
    assert len(requests(cluster, "patch", "nodes")) == 1
    kube.remove_taints("worker-1", [FOREIGN, other_effect])
    assert "taints" not in stored(cluster, "v1", "nodes", None, "worker-1")["spec"]  # type: ignore[index]


def test_stamp_slot_identity_sets_provider_id_only_when_empty(cluster: EmulatorServer, kube: Kube) -> None:
    node = kube.stamp_slot_identity("worker-1", group="workers", slot="worker-1", provider_id="homelab://ns/worker-1")
    assert node["spec"]["providerID"] == "homelab://ns/worker-1"
    assert node["metadata"]["labels"][names.LABEL_GROUP] == "workers"
    assert node["metadata"]["labels"][names.LABEL_NODE] == "worker-1"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "worker-1"  # other labels kept
    writes = len(requests(cluster, "patch", "nodes"))
    kube.stamp_slot_identity("worker-1", group="workers", slot="worker-1", provider_id="homelab://ns/worker-1")
    assert len(requests(cluster, "patch", "nodes")) == writes
    put(cluster, "v1", "nodes", kubelet_node("gpu-1", providerID="kind://docker/gpu-1"))
    node = kube.stamp_slot_identity("gpu-1", group="workers", slot="gpu-1", provider_id="homelab://ns/gpu-1")
    assert node["spec"]["providerID"] == "kind://docker/gpu-1"  # immutable once set: never overwritten


def test_delete_node(cluster: EmulatorServer, kube: Kube) -> None:
    assert kube.delete_node("worker-2") is True
    assert kube.delete_node("worker-2") is False
    assert stored(cluster, "v1", "nodes", None, "worker-2") is None


def test_delete_node_only_as_read(cluster: EmulatorServer, kube: Kube) -> None:
    """A Node changed since it was read (a kubelet re-posting it) is not deleted on the strength of that read."""
    seen = stored(cluster, "v1", "nodes", None, "worker-1")
    assert seen is not None
    cluster.call(lambda e: e.patch_object("v1", "nodes", None, "worker-1", {"metadata": {"labels": {"x": "1"}}}))
    assert kube.delete_node("worker-1", seen["metadata"]["resourceVersion"]) is False
    assert stored(cluster, "v1", "nodes", None, "worker-1") is not None
    now = stored(cluster, "v1", "nodes", None, "worker-1")
    assert now is not None
    assert kube.delete_node("worker-1", now["metadata"]["resourceVersion"]) is True


def test_delete_claim_lets_the_collector_take_its_dependents(cluster: EmulatorServer, kube: Kube) -> None:
    kube.create_claim(claim_model("c1"))
    assert kube.delete_claim(NS, "c1") is True
    assert kube.delete_claim(NS, "c1") is False
    assert requests(cluster, "delete", "nodeclaims")[0].params.get("propagationPolicy") == "Background"


# --- Events --------------------------------------------------------------------------------------------
def test_the_same_event_twice_is_one_event_with_count_two(cluster: EmulatorServer, kube: Kube) -> None:
    slot = kube.get(Node, NS, "worker-1")
    ref = ObjectRef(names.KIND_NODE, NS, "worker-1", str(slot.metadata.uid))
    first = kube.create_event(ref, "ReadinessGateTimeout", "node never became ready", warning=True)
    kube.create_event(ref, "ReadinessGateTimeout", "node never became ready", warning=True)
    kube.create_event(ref, "MachineReleased", "released")
    events = cluster.call(lambda e: e.objects_of("v1", "events", NS))
    assert len(events) == 2
    (repeated,) = [e for e in events if e["metadata"]["name"] == first["metadata"]["name"]]
    assert repeated["count"] == 2
    assert repeated["type"] == "Warning"
    assert repeated["involvedObject"] == {
        "apiVersion": CRD,
        "kind": "Node",
        "name": "worker-1",
        "namespace": NS,
        "uid": slot.metadata.uid,
    }
    assert repeated["source"] == {"component": names.MANAGED_BY}


# --- typed errors ---------------------------------------------------------------------------------------
def test_errors_are_typed(cluster: EmulatorServer, kube: Kube) -> None:
    with pytest.raises(NotFound, match="nope"):
        kube.get(Group, NS, "nope")
    slot = stored(cluster, CRD, "nodes", NS, "worker-1")
    assert slot is not None
    stale = slot["metadata"]["resourceVersion"]
    kube.patch_slot_status(NS, "worker-1", {"phase": "off"})
    with pytest.raises(Conflict) as conflict:
        kube.patch_raw(SLOTS, NS, "worker-1", {"metadata": {"resourceVersion": stale, "labels": {"a": "b"}}})
    assert conflict.value.status == 409 and conflict.value.retryable
    kube.create_claim(claim_model("c1"))
    kube.add_claim_finalizer(NS, "c1")
    kube.delete_claim(NS, "c1")
    with pytest.raises(Invalid) as invalid:  # a real 422: a new finalizer on a terminating object
        kube.patch_raw(CLAIMS, NS, "c1", {"metadata": {"finalizers": [names.FINALIZER_CLAIM, "x/y"]}})
    assert invalid.value.status == 422 and not invalid.value.retryable


def test_a_server_error_is_transient_and_a_retry_succeeds(cluster: EmulatorServer, kube: Kube) -> None:
    cluster.emulator.faults.append(Fault(match=lambda i: i.verb == "get", status=500, times=1))
    with pytest.raises(Transient) as err:
        kube.get(Group, NS, "workers")
    assert err.value.status == 500 and err.value.retryable
    assert kube.get(Group, NS, "workers").metadata.name == "workers"


def test_an_injected_422_is_invalid(cluster: EmulatorServer, kube: Kube) -> None:
    cluster.emulator.faults.append(Fault(match=lambda i: i.verb == "create", status=422, reason="Invalid"))
    with pytest.raises(Invalid):
        kube.create_job(NS, a_job("j1"))
    assert count(cluster, "batch/v1", "jobs", NS) == 0


def test_no_server_is_transient() -> None:
    nowhere = Kube.connect(server="http://127.0.0.1:9", timeout=1.0)
    try:
        with pytest.raises(Transient):
            nowhere.get_node("worker-1")
    finally:
        nowhere.close()


# --- the watch -----------------------------------------------------------------------------------------
Seen = tuple[str, str, str]


class Consumer:
    """Runs a `Watch` in a thread and hands each event to the test as (type, name, resourceVersion)."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.queue: queue.Queue[Seen | None] = queue.Queue(maxsize=1000)
        self.seen: list[Seen] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            for ev in self.watch.events():
                meta = (ev.object or {}).get("metadata") or {}
                self.queue.put((ev.type, str(meta.get("name") or ""), str(meta.get("resourceVersion") or "")))
        finally:
            self.queue.put(None)

    def take(self, n: int, timeout: float = 5.0) -> list[Seen]:
        got: list[Seen] = []
        for _ in range(n):
            item = self.queue.get(timeout=timeout)
            assert item is not None, f"the watch ended after {got}"
            got.append(item)
        self.seen += got
        return got

    def quiet(self, seconds: float = 0.4) -> None:
        with pytest.raises(queue.Empty):
            extra = self.queue.get(timeout=seconds)
            pytest.fail(f"unexpected event {extra}")


@pytest.fixture
def consume(kube: Kube) -> Iterator[Callable[..., Consumer]]:
    started: list[Consumer] = []

    def start(resource: Resource, **kw: Any) -> Consumer:
        consumer = Consumer(Watch(kube, resource, window=5, retry_delay=0.05, **kw))
        consumer.thread.start()
        started.append(consumer)
        return consumer

    yield start
    for consumer in started:
        consumer.watch.close()
        consumer.thread.join(5)
        assert not consumer.thread.is_alive()


SYNCED: Seen = ("SYNCED", "", "")


def rv(obj: Obj) -> str:
    return str(obj["metadata"]["resourceVersion"])


def slot(name: str, group: str = "workers") -> Obj:
    return {
        "metadata": {"name": name, "namespace": NS, "labels": {names.LABEL_GROUP: group}},
        "spec": {"group": group, "kubernetesNodeName": name},
    }


def test_a_watch_delivers_each_change_once_in_order(emulator: EmulatorServer, consume: Callable[..., Consumer]) -> None:
    a = put(emulator, CRD, "nodes", slot("a"))
    put(emulator, CRD, "nodes", slot("x", "other"))
    c = consume(SLOTS, namespace=NS, selector=f"{names.LABEL_GROUP}=workers")
    assert c.take(2) == [("ADDED", "a", rv(a)), SYNCED]
    b = put(emulator, CRD, "nodes", slot("b"))
    a2 = emulator.call(lambda e: e.patch_object(CRD, "nodes", NS, "a", {"spec": {"kubernetesNodeName": "a2"}}))
    a3 = emulator.call(lambda e: e.patch_object(CRD, "nodes", NS, "a", {"status": {"phase": "off"}}, "status"))
    put(emulator, CRD, "nodes", slot("y", "other"))  # outside the selector: never seen
    gone = emulator.call(lambda e: e.delete_object(CRD, "nodes", NS, "b"))
    assert c.take(4) == [
        ("ADDED", "b", rv(b)),
        ("MODIFIED", "a", rv(a2)),
        ("MODIFIED", "a", rv(a3)),
        ("DELETED", "b", rv(gone)),
    ]
    c.quiet()


def _drop_watches(srv: EmulatorServer, while_down: Callable[[KubeEmulator], Any]) -> None:
    """End every open watch stream server-side and refuse reconnects (500) while `while_down` changes state.

    Relies on the emulator's `shutdown_watches()` (ends streams) and its private `_closing` flag (re-opened after).
    """
    refuse = Fault(match=lambda i: i.verb == "watch", status=500, times=None)
    before = len(requests(srv, "watch"))
    srv.call(lambda e: e.faults.append(refuse))
    srv.call(lambda e: e.shutdown_watches())
    deadline = time.monotonic() + 5
    while len(requests(srv, "watch")) == before:  # the consumer noticed and was refused at least once
        assert time.monotonic() < deadline, "the watch never tried to reconnect"
        time.sleep(0.02)
    srv.call(while_down)

    def reopen(e: KubeEmulator) -> None:
        e.faults.remove(refuse)
        e._closing = False

    srv.call(reopen)


def test_a_dropped_watch_resumes_without_losing_or_repeating(
    emulator: EmulatorServer, consume: Callable[..., Consumer]
) -> None:
    a = put(emulator, "v1", "nodes", kubelet_node("a"))
    b = put(emulator, "v1", "nodes", kubelet_node("b"))
    c = consume(KUBELET_NODES)
    assert c.take(3) == [("ADDED", "a", rv(a)), ("ADDED", "b", rv(b)), SYNCED]
    a2 = emulator.call(lambda e: e.patch_object("v1", "nodes", None, "a", {"spec": {"unschedulable": True}}))
    assert c.take(1) == [("MODIFIED", "a", rv(a2))]
    box: dict[str, Obj] = {}

    def while_down(e: KubeEmulator) -> None:
        box["b"] = e.delete_object("v1", "nodes", None, "b")
        box["c"] = e.put_object("v1", "nodes", kubelet_node("c"))
        box["a"] = e.patch_object("v1", "nodes", None, "a", {"spec": {"unschedulable": None}})

    _drop_watches(emulator, while_down)
    assert c.take(3) == [
        ("DELETED", "b", rv(box["b"])),
        ("ADDED", "c", rv(box["c"])),
        ("MODIFIED", "a", rv(box["a"])),
    ]
    c.quiet()
    assert c.watch.relists == 1  # resumed from its resourceVersion, no relist needed
    d = put(emulator, "v1", "nodes", kubelet_node("d"))
    assert c.take(1) == [("ADDED", "d", rv(d))]
    changes = [s for s in c.seen if s != SYNCED]
    assert len(changes) == len(set(changes))


def test_an_expired_resource_version_relists_and_delivers_only_the_difference(
    emulator: EmulatorServer, consume: Callable[..., Consumer]
) -> None:
    a = put(emulator, "v1", "nodes", kubelet_node("a"))
    b = put(emulator, "v1", "nodes", kubelet_node("b"))
    keep = put(emulator, "v1", "nodes", kubelet_node("k"))
    c = consume(KUBELET_NODES)
    assert c.take(4) == [("ADDED", "a", rv(a)), ("ADDED", "b", rv(b)), ("ADDED", "k", rv(keep)), SYNCED]
    box: dict[str, Obj] = {}

    def while_down(e: KubeEmulator) -> None:
        e.patch_object("v1", "nodes", None, "a", {"spec": {"unschedulable": True}})
        box["a"] = e.patch_object("v1", "nodes", None, "a", {"spec": {"podCIDR": "10.0.0.0/24"}})
        e.delete_object("v1", "nodes", None, "b")
        box["d"] = e.put_object("v1", "nodes", kubelet_node("d"))
        e.compacted_below = e.resource_version  # the watcher's resourceVersion is history now: 410 on resume

    _drop_watches(emulator, while_down)
    # The latest state of each changed object, once; the deletion it missed as DELETED with the last version seen.
    assert c.take(4) == [
        ("MODIFIED", "a", rv(box["a"])),
        ("ADDED", "d", rv(box["d"])),
        ("DELETED", "b", rv(b)),
        SYNCED,
    ]
    c.quiet()
    assert c.watch.relists == 2
    a3 = emulator.call(lambda e: e.patch_object("v1", "nodes", None, "a", {"spec": {"unschedulable": None}}))
    assert c.take(1) == [("MODIFIED", "a", rv(a3))]


def test_an_error_410_inside_the_stream_relists(emulator: EmulatorServer, consume: Callable[..., Consumer]) -> None:
    """A watcher that fell behind the server's event log gets ERROR 410 in the stream, then relists."""
    a = put(emulator, "v1", "nodes", kubelet_node("a"))
    c = consume(KUBELET_NODES)
    assert c.take(2) == [("ADDED", "a", rv(a)), SYNCED]
    box: dict[str, Obj] = {}

    def while_down(e: KubeEmulator) -> None:
        box["a"] = e.patch_object("v1", "nodes", None, "a", {"spec": {"unschedulable": True}})
        e._logs[("", "v1", "nodes")].dropped_upto = e.resource_version  # the log lost what the watcher needs

    _drop_watches(emulator, while_down)
    assert c.take(2) == [("MODIFIED", "a", rv(box["a"])), SYNCED]
    c.quiet()
    assert c.watch.relists == 2


def test_close_ends_a_watch_blocked_on_a_quiet_stream(kube: Kube) -> None:
    w = Watch(kube, KUBELET_NODES, window=30, retry_delay=0.05)
    c = Consumer(w)
    c.thread.start()
    assert c.take(1) == [SYNCED]
    time.sleep(0.2)  # now blocked reading a stream with nothing to say
    started = time.monotonic()
    w.close()
    c.thread.join(3)
    assert not c.thread.is_alive()
    assert time.monotonic() - started < 2


def test_events_of_distinct_occurrences_are_named_in_order(cluster: EmulatorServer, kube: Kube) -> None:
    ref = ObjectRef(names.KIND_NODECLAIM, NS, "c1", "uid-1")
    base = datetime(2026, 1, 1, 8, tzinfo=UTC)
    for second, reason in ((3, "ClaimReady"), (1, "ClaimCreated"), (2, "ClaimBooting")):
        kube.create_event(ref, reason, "m", occurrence=base.replace(second=second))
    kube.create_event(ref, "ClaimReady", "m", occurrence=base.replace(second=3))  # a retry of that occurrence
    events = cluster.call(lambda e: e.objects_of("v1", "events", NS))
    assert [(e["reason"], e["count"]) for e in events] == [("ClaimCreated", 1), ("ClaimBooting", 1), ("ClaimReady", 2)]


# --- why a Job failed: its Pods, read through the simulated Job controller's (issue 23) ----------------------
@pytest.fixture
def homelab() -> Iterator[HomelabServer]:
    """A zero-delay homelab: every Job's Pods have run by the time its create returns."""
    spec = parse_homelab_spec(
        {"namespace": NS, "groups": [{"name": "workers", "maxSize": 3}], "slots": [{"name": "m1", "group": "workers"}]}
    )
    with HomelabServer(spec, time_scale=0) as server:
        yield server


def power_job(name: str, script: str, *, backoff_limit: int = 0, policy: str = "FallbackToLogsOnError") -> Obj:
    container = {"name": "power", "image": "busybox", "command": ["sh", "-c", script]}
    container["terminationMessagePolicy"] = policy
    labels = {names.LABEL_NODE: "m1", names.LABEL_JOB_TYPE: "startup"}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {"metadata": {"labels": labels}, "spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }


def test_the_cause_of_a_failed_job_is_its_pods_exit_code_reason_and_last_words(homelab: HomelabServer) -> None:
    with closing(Kube.connect(server=homelab.url, timeout=5.0)) as kube:
        kube.create_job(NS, power_job("j1", "echo sending\necho 'sendto: Network is unreachable' >&2\nexit 2"))
        cause = kube.job_cause(NS, "j1")
        assert (cause.exit_code, cause.reason) == (2, "Error")
        assert cause.message == "sending | sendto: Network is unreachable"
        assert cause.pod.startswith("j1-") and len(cause.pod) == len("j1-") + 5
        assert cause.summary() == "exit code 2 (Error): sending | sendto: Network is unreachable"
        pods = [r for r in requests(homelab.server, "list", "pods")]
        assert [r.params.get("labelSelector") for r in pods] == [
            f"batch.kubernetes.io/controller-uid={kube.get_job(NS, 'j1')['metadata']['uid']}"  # type: ignore[index]
        ], "the Pods are found by the Job's own selector"


def test_the_newest_failed_pod_speaks_for_a_retried_job(homelab: HomelabServer) -> None:
    with closing(Kube.connect(server=homelab.url, timeout=5.0)) as kube:
        kube.create_job(NS, power_job("j2", "exit 7", backoff_limit=2))
        pods = homelab.server.call(lambda e: e.objects_of("v1", "pods", NS))
        assert len(pods) == 3
        cause = kube.job_cause(NS, "j2")
        newest = max(pods, key=lambda p: int(p["metadata"]["resourceVersion"]))
        assert (cause.exit_code, cause.reason, cause.message) == (7, "Error", "")
        assert cause.pod in {p["metadata"]["name"] for p in pods}
        assert newest["status"]["phase"] == "Failed"


def test_a_cause_says_what_happened_when_no_container_did(homelab: HomelabServer) -> None:
    with closing(Kube.connect(server=homelab.url, timeout=5.0)) as kube:
        assert kube.job_cause(NS, "never-made") == JobCause(CAUSE_JOB_GONE)
        kube.create_job(NS, power_job("j3", "exit 1"))
        homelab.server.call(lambda e: [e.delete_object("v1", "pods", NS, p["metadata"]["name"])
                                       for p in e.objects_of("v1", "pods", NS)])  # fmt: skip
        gone = kube.job_cause(NS, "j3")
        assert (gone.reason, gone.exit_code) == (CAUSE_NO_POD, None) and "no Pod" in gone.summary()
        homelab.call(lambda lab: lab.set_fault("m1", "jobHangs"))
        kube.create_job(NS, power_job("j4", "echo still trying"))
        hung = kube.job_cause(NS, "j4")
        assert (hung.reason, hung.exit_code, hung.message) == (CAUSE_NOT_TERMINATED, None, "")
        assert hung.summary() == f"its Pod {hung.pod} never ended"


def test_a_job_past_its_deadline_says_so() -> None:
    """activeDeadlineSeconds: the Job controller deletes the running Pod, so the Job's condition is the cause."""
    spec = parse_homelab_spec(
        {
            "namespace": NS,
            "timings": {"jobSeconds": 1},
            "groups": [{"name": "workers", "maxSize": 1}],
            "slots": [{"name": "m1", "group": "workers", "faults": {"jobHangs": True}}],
        }
    )
    with HomelabServer(spec, time_scale=0.1) as server, closing(Kube.connect(server=server.url, timeout=5.0)) as kube:
        body = power_job("j5", "echo waking")
        body["spec"]["activeDeadlineSeconds"] = 2  # 0.2 s at this time scale
        kube.create_job(NS, body)
        deadline = time.monotonic() + 10
        while kube.job_cause(NS, "j5").reason != CAUSE_DEADLINE:
            assert time.monotonic() < deadline, "the Job never hit its deadline"
            time.sleep(0.1)
        cause = kube.job_cause(NS, "j5")
        assert (cause.exit_code, cause.deadline_seconds, cause.pod) == (None, 2, "")
        assert cause.summary() == "ran longer than its activeDeadlineSeconds (2 s) and was stopped"


def test_a_waiting_container_is_the_cause(kube: Kube, emulator: EmulatorServer) -> None:
    """A Pod that never started (an image it cannot pull, a Secret it cannot mount) says so in its waiting state."""
    job = kube.create_job(NS, power_job("j6", "true"))
    uid = job["metadata"]["uid"]
    waiting = {"reason": "CreateContainerConfigError", "message": 'secret "bmc" not found'}
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "j6-abcde",
            "namespace": NS,
            "labels": {"batch.kubernetes.io/controller-uid": uid},
            "ownerReferences": [
                {"apiVersion": "batch/v1", "kind": "Job", "name": "j6", "uid": uid, "controller": True}
            ],
        },
        "spec": {"containers": [{"name": "power", "image": "busybox"}]},
        "status": {"phase": "Pending", "containerStatuses": [{"name": "power", "state": {"waiting": waiting}}]},
    }
    put(emulator, "v1", "pods", pod)
    stranger = {**pod, "metadata": {**pod["metadata"], "name": "other", "ownerReferences": []}}
    put(emulator, "v1", "pods", stranger)
    cause = kube.job_cause(NS, "j6")
    assert (cause.reason, cause.message, cause.pod) == (
        "CreateContainerConfigError",
        'secret "bmc" not found',
        "j6-abcde",
    )


def test_a_cause_message_is_the_end_of_the_last_words_within_its_bound() -> None:
    long = "\n".join(f"line {i}" for i in range(20)) + "\n" + "x" * 1000
    assert trimmed_message("a\n\n  b   c \n") == "a | b c"
    kept = trimmed_message(long)
    assert kept.startswith("…") and kept.endswith("x") and len(kept) <= CAUSE_MESSAGE_CHARS
    assert trimmed_message("\n".join(str(i) for i in range(9))) == f"…{' | '.join(str(i) for i in range(4, 9))}"
    assert job_pod_selector({"metadata": {"name": "j"}, "spec": {}}) == "batch.kubernetes.io/job-name=j"
    expressions = {
        "matchExpressions": [
            {"key": "a", "operator": "In", "values": ["x", "y"]},
            {"key": "b", "operator": "DoesNotExist"},
        ]
    }
    assert job_pod_selector({"spec": {"selector": {"matchLabels": {"k": "v"}, **expressions}}}) == "k=v,a in (x,y),!b"
