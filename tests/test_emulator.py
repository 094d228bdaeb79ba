"""Contract tests of the project's Kubernetes API emulator, through the real ``kubernetes`` client over HTTP.

Each test pins one API-server semantic the operator relies on, so a regression in the emulator (or a kmock
upgrade) shows up here rather than as a mysteriously passing adapter test.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from homelab_sim.emulator import EmulatorServer, Fault, KubeEmulator
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

G, V = "infra.homecluster.dev", "v2alpha1"
GV = f"{G}/{V}"
NS = "homelab"
FIXED_NOW = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)


@pytest.fixture
def srv() -> Iterator[EmulatorServer]:
    """Not strict, whatever HOMELAB_EMULATOR_STRICT says: these bodies are minimal on purpose (a claim with only
    ``spec.node``) to pin one semantic each; strict mode has its own tests in test_emulator_strict.py.
    """
    with EmulatorServer(clock=lambda: FIXED_NOW, strict=False) as server:
        yield server


@pytest.fixture
def api(srv: EmulatorServer) -> Iterator[client.ApiClient]:
    with srv.api_client() as api_client:
        yield api_client


@pytest.fixture
def co(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def claim(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": GV, "kind": "NodeClaim", "metadata": meta, "spec": spec or {"node": "n1"}}


def create(co: Any, body: dict[str, Any], plural: str = "nodeclaims") -> dict[str, Any]:
    result: dict[str, Any] = co.create_namespaced_custom_object(G, V, NS, plural, body)
    return result


def patch(co: Any, name: str, body: Any, plural: str = "nodeclaims") -> dict[str, Any]:
    result: dict[str, Any] = co.patch_namespaced_custom_object(G, V, NS, plural, name, body)
    return result


def get(co: Any, name: str, plural: str = "nodeclaims") -> dict[str, Any]:
    result: dict[str, Any] = co.get_namespaced_custom_object(G, V, NS, plural, name)
    return result


def watch_events(co: Any, **kwargs: Any) -> list[tuple[str, str]]:
    """(type, name) of every event of a watch that the server ends after one second."""
    stream = watch.Watch().stream(co.list_namespaced_custom_object, G, V, NS, "nodeclaims", timeout_seconds=1, **kwargs)
    return [(event["type"], event["object"]["metadata"]["name"]) for event in stream]


def status_of(exc: pytest.ExceptionInfo[ApiException]) -> tuple[int, str]:
    return exc.value.status, json.loads(exc.value.body or "{}")["reason"]


# --- create ---------------------------------------------------------------------------------------------


def test_create_returns_the_object_with_201(co: Any) -> None:
    result = create(co, claim("c1"))
    assert result["metadata"]["name"] == "c1"
    assert result["spec"] == {"node": "n1"}


def test_create_fills_server_metadata(co: Any, srv: EmulatorServer) -> None:
    first = create(co, claim("c1"))
    second = create(co, claim("c2"))
    meta = first["metadata"]
    assert meta["namespace"] == NS  # from the URL; the body had none
    assert meta["uid"] and meta["uid"] != second["metadata"]["uid"]
    assert meta["creationTimestamp"] == "2030-01-02T03:04:05Z"
    assert meta["generation"] == 1
    assert int(second["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert srv.call(lambda e: e.get_object(GV, "nodeclaims", NS, "c1")) == first


def test_create_strips_status_of_a_status_subresource(co: Any) -> None:
    body = claim("c1")
    body["status"] = {"phase": "Ready"}
    assert "status" not in create(co, body)


def test_generate_name(co: Any) -> None:
    body = {"apiVersion": GV, "kind": "NodeClaim", "metadata": {"generateName": "claim-"}, "spec": {}}
    names = {create(co, body)["metadata"]["name"] for _ in range(5)}
    assert len(names) == 5
    for name in names:
        assert name.startswith("claim-") and len(name) == len("claim-") + 5


def test_create_without_name_is_422(co: Any) -> None:
    with pytest.raises(ApiException) as exc:
        create(co, {"apiVersion": GV, "kind": "NodeClaim", "metadata": {}, "spec": {}})
    assert status_of(exc) == (422, "Invalid")


def test_duplicate_create_is_409_already_exists(co: Any) -> None:
    create(co, claim("c1"))
    with pytest.raises(ApiException) as exc:
        create(co, claim("c1"))
    assert status_of(exc) == (409, "AlreadyExists")


def test_dry_run_stores_nothing(co: Any) -> None:
    result = co.create_namespaced_custom_object(G, V, NS, "nodeclaims", claim("c1"), dry_run="All")
    assert result["metadata"]["name"] == "c1"
    with pytest.raises(ApiException) as exc:
        get(co, "c1")
    assert exc.value.status == 404


# --- get / list -----------------------------------------------------------------------------------------


def test_404_for_unknown_resource_and_missing_object(co: Any) -> None:
    with pytest.raises(ApiException) as exc:
        co.list_namespaced_custom_object(G, V, NS, "widgets")
    assert exc.value.status == 404
    with pytest.raises(ApiException) as exc:
        create(co, {"metadata": {"name": "w"}}, plural="widgets")
    assert exc.value.status == 404
    with pytest.raises(ApiException) as exc:
        get(co, "missing")
    assert status_of(exc) == (404, "NotFound")


def test_crd_nodes_and_core_nodes_do_not_collide(co: Any, api: client.ApiClient) -> None:
    create(co, {"apiVersion": GV, "kind": "Node", "metadata": {"name": "slot-1"}, "spec": {}}, plural="nodes")
    core: Any = client.CoreV1Api(api)
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="k8s-1")))
    assert [n.metadata.name for n in core.list_node().items] == ["k8s-1"]
    assert [n["metadata"]["name"] for n in co.list_namespaced_custom_object(G, V, NS, "nodes")["items"]] == ["slot-1"]


def test_list_returns_current_resource_version(co: Any) -> None:
    created = create(co, claim("c1"))
    listed = co.list_namespaced_custom_object(G, V, NS, "nodeclaims")
    assert listed["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


SELECTOR_CASES = [
    ("app=a", {"a1", "a2"}),
    ("app==a", {"a1", "a2"}),
    ("app!=a", {"b1", "none"}),
    ("app in (a,b)", {"a1", "a2", "b1"}),
    ("app notin (a)", {"b1", "none"}),
    ("app", {"a1", "a2", "b1"}),
    ("!app", {"none"}),
    ("app=a,tier=x", {"a1"}),
]


def seed_labelled(co: Any) -> None:
    create(co, claim("a1", {"app": "a", "tier": "x"}))
    create(co, claim("a2", {"app": "a"}))
    create(co, claim("b1", {"app": "b"}))
    create(co, claim("none", {}))


@pytest.mark.parametrize(("selector", "expected"), SELECTOR_CASES)
def test_label_selectors_on_list(co: Any, selector: str, expected: set[str]) -> None:
    seed_labelled(co)
    items = co.list_namespaced_custom_object(G, V, NS, "nodeclaims", label_selector=selector)["items"]
    assert {item["metadata"]["name"] for item in items} == expected


def test_label_selectors_on_watch(co: Any) -> None:
    seed_labelled(co)
    start = co.list_namespaced_custom_object(G, V, NS, "nodeclaims")["metadata"]["resourceVersion"]
    for selector, expected in SELECTOR_CASES:
        # Initial replay (no resourceVersion): ADDED for the matching objects only.
        stream = watch.Watch().stream(
            co.list_namespaced_custom_object,
            G,
            V,
            NS,
            "nodeclaims",
            label_selector=selector,
            timeout_seconds=0,
        )
        assert {event["object"]["metadata"]["name"] for event in stream} == expected, selector
    # A change that makes an object leave the selection is DELETED for that watcher; entering it is ADDED.
    patch(co, "a2", {"metadata": {"labels": {"app": "b"}}})
    patch(co, "none", {"metadata": {"labels": {"app": "a"}}})
    events = watch_events(co, label_selector="app=a", resource_version=start)
    assert events == [("DELETED", "a2"), ("ADDED", "none")]


def test_field_selectors(co: Any) -> None:
    create(co, claim("c1"))
    create(co, claim("c2"))
    items = co.list_cluster_custom_object(G, V, "nodeclaims", field_selector="metadata.name=c2")["items"]
    assert [item["metadata"]["name"] for item in items] == ["c2"]
    items = co.list_cluster_custom_object(G, V, "nodeclaims", field_selector=f"metadata.namespace={NS}")["items"]
    assert len(items) == 2


# --- patch / update -------------------------------------------------------------------------------------


def test_stale_resource_version_is_409_on_patch_and_put(co: Any) -> None:
    created = create(co, claim("c1"))
    patch(co, "c1", {"spec": {"node": "n2"}})
    stale = created["metadata"]["resourceVersion"]
    with pytest.raises(ApiException) as exc:
        patch(co, "c1", {"metadata": {"resourceVersion": stale}, "spec": {"node": "n3"}})
    assert status_of(exc) == (409, "Conflict")
    with pytest.raises(ApiException) as exc:
        co.replace_namespaced_custom_object(G, V, NS, "nodeclaims", "c1", created)
    assert status_of(exc) == (409, "Conflict")
    assert get(co, "c1")["spec"] == {"node": "n2"}
    current = get(co, "c1")
    current["spec"]["node"] = "n4"
    assert co.replace_namespaced_custom_object(G, V, NS, "nodeclaims", "c1", current)["spec"] == {"node": "n4"}


def test_status_is_kept_apart_both_ways(co: Any) -> None:
    create(co, claim("c1"))
    main = patch(co, "c1", {"spec": {"node": "n2"}, "status": {"phase": "Sneaky"}})
    assert "status" not in main and main["spec"] == {"node": "n2"}
    status = co.patch_namespaced_custom_object_status(
        G, V, NS, "nodeclaims", "c1", {"spec": {"node": "n9"}, "status": {"phase": "Ready"}}
    )
    assert status["status"] == {"phase": "Ready"} and status["spec"] == {"node": "n2"}
    replaced = co.replace_namespaced_custom_object_status(G, V, NS, "nodeclaims", "c1", {**status, "status": {}})
    assert replaced["status"] == {}


def test_generation_bumps_on_spec_only_and_noop_keeps_rv(co: Any) -> None:
    created = create(co, claim("c1"))
    after_status = co.patch_namespaced_custom_object_status(G, V, NS, "nodeclaims", "c1", {"status": {"a": 1}})
    assert after_status["metadata"]["generation"] == 1
    after_labels = patch(co, "c1", {"metadata": {"labels": {"x": "y"}}})
    assert after_labels["metadata"]["generation"] == 1
    after_spec = patch(co, "c1", {"spec": {"node": "n2"}})
    assert after_spec["metadata"]["generation"] == 2
    noop = patch(co, "c1", {"spec": {"node": "n2"}})
    assert noop["metadata"]["resourceVersion"] == after_spec["metadata"]["resourceVersion"]
    assert int(after_spec["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])


def test_merge_patch_replaces_dict_with_scalar_and_null_deletes(co: Any) -> None:
    create(co, claim("c1", node="n1", call={"a": 1}, keep=[1, 2]))
    result = patch(co, "c1", {"spec": {"call": "flat", "node": None, "keep": [3]}})
    assert result["spec"] == {"call": "flat", "keep": [3]}


def test_json_patch_failed_test_is_422(co: Any) -> None:
    create(co, claim("c1"))
    ops = [
        {"op": "test", "path": "/spec/node", "value": "other"},
        {"op": "replace", "path": "/spec/node", "value": "x"},
    ]
    with pytest.raises(ApiException) as exc:
        co.patch_namespaced_custom_object(
            G, V, NS, "nodeclaims", "c1", ops, _content_type="application/json-patch+json"
        )
    assert exc.value.status == 422
    assert get(co, "c1")["spec"] == {"node": "n1"}
    ops[0]["value"] = "n1"
    result = co.patch_namespaced_custom_object(
        G, V, NS, "nodeclaims", "c1", ops, _content_type="application/json-patch+json"
    )
    assert result["spec"] == {"node": "x"}


def test_strategic_merge_patch(co: Any, api: client.ApiClient) -> None:
    core: Any = client.CoreV1Api(api)
    conditions = [{"type": "Ready", "status": "False"}, {"type": "MemoryPressure", "status": "False"}]
    node = {"metadata": {"name": "n1"}, "status": {"conditions": conditions}}
    core.create_node(node)
    patched = core.patch_node_status("n1", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert [(c.type, c.status) for c in patched.status.conditions] == [
        ("Ready", "True"),
        ("MemoryPressure", "False"),
    ]
    core.patch_node("n1", {"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}})
    tainted = core.patch_node("n1", {"spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}})
    assert [t.key for t in tainted.spec.taints] == ["b"]  # replaced whole, as on a real server
    core.patch_node("n1", {"metadata": {"finalizers": ["x"]}})
    assert core.patch_node("n1", {"metadata": {"finalizers": ["y"]}}).metadata.finalizers == ["x", "y"]
    create(co, claim("c1"))
    with pytest.raises(ApiException) as exc:
        co.patch_namespaced_custom_object(
            G, V, NS, "nodeclaims", "c1", {"spec": {}}, _content_type="application/strategic-merge-patch+json"
        )
    assert exc.value.status == 415


# --- delete, finalizers, garbage collection --------------------------------------------------------------


def test_finalizers_delay_removal(co: Any) -> None:
    body = claim("c1")
    body["metadata"]["finalizers"] = ["infra.homecluster.dev/claim"]
    created = create(co, body)
    deleted = co.delete_namespaced_custom_object(G, V, NS, "nodeclaims", "c1")
    assert deleted["metadata"]["deletionTimestamp"] == "2030-01-02T03:04:05Z"
    assert deleted["metadata"]["deletionGracePeriodSeconds"] == 0
    assert int(deleted["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert get(co, "c1")["metadata"]["deletionTimestamp"]
    with pytest.raises(ApiException) as exc:
        patch(co, "c1", {"metadata": {"finalizers": ["infra.homecluster.dev/claim", "another"]}})
    assert status_of(exc) == (422, "Invalid")
    patch(co, "c1", {"metadata": {"finalizers": None}})
    with pytest.raises(ApiException) as exc:
        get(co, "c1")
    assert exc.value.status == 404
    events = watch_events(co, resource_version=created["metadata"]["resourceVersion"])
    assert events == [("MODIFIED", "c1"), ("MODIFIED", "c1"), ("DELETED", "c1")]


def test_delete_without_finalizers_returns_the_object(co: Any) -> None:
    create(co, claim("c1"))
    assert co.delete_namespaced_custom_object(G, V, NS, "nodeclaims", "c1")["metadata"]["name"] == "c1"
    with pytest.raises(ApiException) as exc:
        get(co, "c1")
    assert exc.value.status == 404


def job(name: str, *owners: dict[str, Any]) -> client.V1Job:
    refs = [
        client.V1OwnerReference(
            api_version=o["apiVersion"], kind=o["kind"], name=o["metadata"]["name"], uid=o["metadata"]["uid"]
        )
        for o in owners
    ]
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name, owner_references=refs, labels={"type": "startup"}),
        spec=client.V1JobSpec(
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(
                    restart_policy="Never", containers=[client.V1Container(name="c", image="busybox")]
                )
            )
        ),
    )


def job_names(batch: Any) -> list[str]:
    return sorted(j.metadata.name for j in batch.list_namespaced_job(NS).items)


def test_owner_reference_cascade(co: Any, api: client.ApiClient) -> None:
    batch: Any = client.BatchV1Api(api)
    claim_obj = create(co, claim("c1"))
    slot = create(co, {"apiVersion": GV, "kind": "Node", "metadata": {"name": "s1"}, "spec": {}}, plural="nodes")
    batch.create_namespaced_job(NS, job("only-claim", claim_obj))
    batch.create_namespaced_job(NS, job("claim-and-slot", claim_obj, slot))
    batch.create_namespaced_job(NS, job("unowned"))
    co.delete_namespaced_custom_object(G, V, NS, "nodeclaims", "c1")
    assert job_names(batch) == ["claim-and-slot", "unowned"]
    survivor = batch.read_namespaced_job("claim-and-slot", NS)
    assert [ref.uid for ref in survivor.metadata.owner_references] == [slot["metadata"]["uid"]]
    co.delete_namespaced_custom_object(G, V, NS, "nodes", "s1")
    assert job_names(batch) == ["unowned"]


def test_orphan_propagation_keeps_dependents(co: Any, api: client.ApiClient) -> None:
    batch: Any = client.BatchV1Api(api)
    claim_obj = create(co, claim("c1"))
    batch.create_namespaced_job(NS, job("j1", claim_obj))
    co.delete_namespaced_custom_object(G, V, NS, "nodeclaims", "c1", propagation_policy="Orphan")
    assert job_names(batch) == ["j1"]
    assert not batch.read_namespaced_job("j1", NS).metadata.owner_references


# --- watch ----------------------------------------------------------------------------------------------


def test_watch_resume_replays_only_later_events_in_order(co: Any) -> None:
    create(co, claim("old"))
    mark = create(co, claim("c1"))["metadata"]["resourceVersion"]
    patch(co, "c1", {"spec": {"node": "n2"}})
    create(co, claim("c2"))
    co.delete_namespaced_custom_object(G, V, NS, "nodeclaims", "c1")
    assert watch_events(co, resource_version=mark) == [("MODIFIED", "c1"), ("ADDED", "c2"), ("DELETED", "c1")]
    assert watch_events(co) == [("ADDED", "c2"), ("ADDED", "old")]  # no rv: the current state


def test_watch_timeout_ends_the_stream(co: Any) -> None:
    create(co, claim("c1"))
    started = time.monotonic()
    events = watch_events(co)
    assert events == [("ADDED", "c1")]
    assert 0.9 <= time.monotonic() - started < 3


def test_watch_bookmark_at_end(co: Any) -> None:
    create(co, claim("c1"))
    raw = co.list_namespaced_custom_object(
        G,
        V,
        NS,
        "nodeclaims",
        watch=True,
        allow_watch_bookmarks=True,
        timeout_seconds=0,
        _preload_content=False,
    )
    lines = [line for line in raw.read().decode().splitlines() if line]
    assert '"BOOKMARK"' in lines[-1]


@pytest.mark.parametrize("flag", ["1", "true", "True"])
def test_watch_query_forms(co: Any, srv: EmulatorServer, flag: str) -> None:
    create(co, claim("c1"))
    url = f"{srv.url}/apis/{G}/{V}/namespaces/{NS}/nodeclaims?watch={flag}&timeoutSeconds=0"
    with urllib.request.urlopen(url, timeout=5) as response:
        lines = [json.loads(line) for line in response.read().splitlines() if line]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("ADDED", "c1")]


def test_compacted_resource_version_is_410(co: Any, srv: EmulatorServer) -> None:
    mark = create(co, claim("c1"))["metadata"]["resourceVersion"]
    create(co, claim("c2"))

    def compact(emulator: KubeEmulator) -> None:
        emulator.compacted_below = emulator.resource_version

    srv.call(compact)
    with pytest.raises(ApiException) as exc:
        list(
            watch.Watch().stream(
                co.list_namespaced_custom_object,
                G,
                V,
                NS,
                "nodeclaims",
                resource_version=mark,
                timeout_seconds=1,
            )
        )
    assert exc.value.status == 410
    with pytest.raises(ApiException) as exc:
        co.list_namespaced_custom_object(G, V, NS, "nodeclaims", resource_version=mark)
    assert status_of(exc) == (410, "Expired")


def test_bounded_event_log_expires_old_resume_points() -> None:
    with EmulatorServer(event_log_size=3, strict=False) as server, server.api_client() as api_client:
        co: Any = client.CustomObjectsApi(api_client)
        mark = create(co, claim("c0"))["metadata"]["resourceVersion"]
        for i in range(1, 6):
            create(co, claim(f"c{i}"))
        with pytest.raises(ApiException) as exc:
            list(
                watch.Watch().stream(
                    co.list_namespaced_custom_object,
                    G,
                    V,
                    NS,
                    "nodeclaims",
                    resource_version=mark,
                    timeout_seconds=1,
                )
            )
        assert exc.value.status == 410


# --- faults and request records -------------------------------------------------------------------------


def test_fault_fails_before_state_change(co: Any, srv: EmulatorServer) -> None:
    created = create(co, claim("c1"))
    srv.call(
        lambda e: e.faults.append(Fault(match=lambda r: r.verb == "patch" and r.name == "c1", status=500, times=2))
    )
    codes = []
    for value in ("w1", "w2", "w3"):
        try:
            patch(co, "c1", {"spec": {"node": value}})
            codes.append(200)
        except ApiException as exc:
            codes.append(exc.status)
    assert codes == [500, 500, 200]
    current = get(co, "c1")
    assert current["spec"] == {"node": "w3"}
    assert int(current["metadata"]["resourceVersion"]) == int(created["metadata"]["resourceVersion"]) + 1
    assert srv.call(lambda e: e.faults) == []


def test_fault_delay_then_proceeds(co: Any, srv: EmulatorServer) -> None:
    create(co, claim("c1"))
    srv.call(lambda e: e.faults.append(Fault(match=lambda r: r.verb == "get", status=None, delay=0.3, times=None)))
    started = time.monotonic()
    assert get(co, "c1")["metadata"]["name"] == "c1"
    assert time.monotonic() - started >= 0.3


def test_requests_are_recorded(co: Any, srv: EmulatorServer) -> None:
    create(co, claim("c1"))
    co.patch_namespaced_custom_object_status(G, V, NS, "nodeclaims", "c1", {"status": {"a": 1}})
    co.list_cluster_custom_object(G, V, "nodeclaims", label_selector="a=b")
    records = srv.call(lambda e: list(e.requests))
    summary = [(r.verb, r.group, r.plural, r.namespace, r.name, r.subresource) for r in records]
    assert summary == [
        ("create", G, "nodeclaims", NS, None, None),
        ("patch", G, "nodeclaims", NS, "c1", "status"),
        ("list", G, "nodeclaims", None, None, None),
    ]
    assert records[-1].params["labelSelector"] == "a=b"


def test_direct_state_helpers(srv: EmulatorServer, co: Any) -> None:
    seeded = srv.call(
        lambda e: e.put_object(GV, "nodeclaims", {"metadata": {"name": "c1"}, "status": {"phase": "X"}}, NS)
    )
    assert seeded["status"] == {"phase": "X"} and seeded["metadata"]["uid"]
    assert get(co, "c1")["status"] == {"phase": "X"}
    srv.call(lambda e: e.patch_object(GV, "nodeclaims", NS, "c1", {"status": {"phase": "Y"}}, subresource="status"))
    assert [o["status"]["phase"] for o in srv.call(lambda e: e.objects_of(GV, "nodeclaims"))] == ["Y"]


# --- other built-ins and kubectl ------------------------------------------------------------------------


def test_builtins_events_leases_namespaces(api: client.ApiClient) -> None:
    core: Any = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
    assert core.read_namespace(NS).status.phase == "Active"
    event = core.create_namespaced_event(
        NS,
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name="c1."),
            involved_object=client.V1ObjectReference(name="c1"),
            reason="ClaimCreated",
        ),
    )
    assert event.metadata.name.startswith("c1.")
    coordination: Any = client.CoordinationV1Api(api)
    lease = coordination.create_namespaced_lease(
        NS,
        client.V1Lease(metadata=client.V1ObjectMeta(name="leader"), spec=client.V1LeaseSpec(holder_identity="a")),
    )
    assert lease.metadata.resource_version


@pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl is not installed (apt-get install kubernetes-client)"
)
def test_kubectl_create_and_get(srv: EmulatorServer, tmp_path: Any) -> None:
    manifest = tmp_path / "claim.yaml"
    manifest.write_text(
        f"apiVersion: {GV}\nkind: NodeClaim\nmetadata:\n  name: c1\n  namespace: {NS}\nspec:\n  node: n1\n"
    )
    env = {**os.environ, "KUBECONFIG": os.devnull, "HOME": str(tmp_path)}  # kubectl caches under $HOME
    base = ["kubectl", "--server", srv.url]

    def run(*args: str) -> str:
        done = subprocess.run([*base, *args], env=env, capture_output=True, text=True, timeout=20, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout

    run("create", "--validate=false", "-f", str(manifest))
    assert "c1" in run("get", "nodeclaims", "-A")
    assert run("get", "nodes.infra.homecluster.dev", "-A") == ""  # "No resources found" goes to stderr
    assert run("get", "jobs", "-A") == ""
    assert run("get", "nodeclaims", "-n", NS, "c1", "-o", "jsonpath={.spec.node}") == "n1"


# --- kubectl tables of what the operator makes, through the real client --------------------------------------
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def _shown(api: client.ApiClient, path: str) -> tuple[list[str], list[list[Any]]]:
    """The columns `kubectl get` shows (priority 0) and their cells, as the client receives the Table."""
    method, url, headers, _, _ = api.param_serialize("GET", path, header_params={"Accept": TABLE})
    answer = api.call_api(method, url, header_params=headers)
    doc = json.loads(answer.read())
    assert doc["kind"] == "Table"
    shown = [i for i, c in enumerate(doc["columnDefinitions"]) if c["priority"] == 0]
    return [doc["columnDefinitions"][i]["name"] for i in shown], [[r["cells"][i] for i in shown] for r in doc["rows"]]


def test_kubectl_tables_of_the_operators_jobs_and_events(
    srv: EmulatorServer, api: client.ApiClient, tmp_path: Any
) -> None:
    """`kubectl get jobs/events` against the emulator prints kube-apiserver's columns, not only NAME and AGE."""
    from activities.jobs import build_job
    from api.v2alpha1 import Node

    slot = Node.model_validate(
        {
            "apiVersion": GV,
            "kind": "Node",
            "metadata": {"name": "w1", "namespace": NS, "uid": "slot-uid"},
            "spec": {
                "group": "g",
                "kubernetesNodeName": "w1",
                "startupPodSpec": {"image": "wol:1"},
                "shutdownPodSpec": {"image": "ssh:1"},
            },
        }
    )
    batch: Any = client.BatchV1Api(api)
    batch.create_namespaced_job(NS, build_job(slot, "startup", "c1-startup-1", "", ""))
    started = FIXED_NOW - datetime.timedelta(seconds=95)
    status = {
        "startTime": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "completionTime": (started + datetime.timedelta(seconds=35)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "succeeded": 1,
        "conditions": [{"type": "Complete", "status": "True"}],
    }
    batch.patch_namespaced_job_status("c1-startup-1", NS, {"status": status})
    assert _shown(api, f"/apis/batch/v1/namespaces/{NS}/jobs") == (
        ["Name", "Status", "Completions", "Duration", "Age"],
        [["c1-startup-1", "Complete", "1/1", "35s", "0s"]],
    )
    core: Any = client.CoreV1Api(api)
    core.create_namespaced_event(
        NS,
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="c1.1"),
            involved_object=client.V1ObjectReference(kind="NodeClaim", name="c1", namespace=NS),
            type="Normal",
            reason="ScaleDownStarted",
            message="cordoning the node of slot w1, then a shutdown Job",
            first_timestamp=FIXED_NOW - datetime.timedelta(minutes=3),
            last_timestamp=FIXED_NOW - datetime.timedelta(minutes=3),
        ),
    )
    assert _shown(api, f"/api/v1/namespaces/{NS}/events") == (
        ["Last Seen", "Type", "Reason", "Object", "Message"],
        [["3m", "Normal", "ScaleDownStarted", "nodeclaim/c1", "cordoning the node of slot w1, then a shutdown Job"]],
    )
    if shutil.which("kubectl") is None:
        return  # the Table answers above are what kubectl prints
    env = {**os.environ, "KUBECONFIG": os.devnull, "HOME": str(tmp_path)}
    for kind, header in (("jobs", ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]),
                         ("events", ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"])):  # fmt: skip
        done = subprocess.run(
            ["kubectl", "--server", srv.url, "get", kind, "-n", NS],
            env=env,
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[0].split() == header, done.stdout


# --- what kubectl asks beyond a plain table (issue 23) --------------------------------------------------------
def kubectl(srv: EmulatorServer, tmp_path: Any, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": os.devnull, "HOME": str(tmp_path)}
    return subprocess.run(
        ["kubectl", "--server", srv.url, *args], env=env, capture_output=True, text=True, timeout=30, check=False
    )


needs_kubectl_binary = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


def seed_events(srv: EmulatorServer) -> None:
    """Three Events whose names sort otherwise than their lastTimestamps (a real cluster's are arbitrary too)."""
    for name, minutes, reason in (("a", 1, "Newest"), ("b", 9, "Oldest"), ("c", 5, "Middle")):
        when = (FIXED_NOW - datetime.timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")
        event: dict[str, Any] = {
            "metadata": {"name": f"c1.{name}", "namespace": NS},
            "involvedObject": {"kind": "NodeClaim", "name": "c1", "namespace": NS},
            "reason": reason,
            "message": f"{reason} move",
            "type": "Normal",
            "firstTimestamp": when,
            "lastTimestamp": when,
            "count": 1,
        }
        srv.call(functools.partial(KubeEmulator.put_object, group_version="v1", plural="events", obj=event))


def test_table_rows_carry_the_object_include_object_asks_for(srv: EmulatorServer, api: client.ApiClient) -> None:
    """kube-apiserver's `includeObject`: Metadata (the default) a PartialObjectMetadata, Object the whole object,
    None nothing; anything else is a 400."""
    seed_events(srv)
    url = f"{srv.url}/api/v1/namespaces/{NS}/events"

    def rows(query: str) -> Any:
        request = urllib.request.Request(url + query, headers={"Accept": TABLE})
        with urllib.request.urlopen(request, timeout=5) as answer:
            return json.loads(answer.read())["rows"]

    assert {r["object"]["kind"] for r in rows("")} == {"PartialObjectMetadata"}
    whole = rows("?includeObject=Object")
    assert {r["object"]["kind"] for r in whole} == {"Event"}
    assert {r["object"]["apiVersion"] for r in whole} == {"v1"}
    assert sorted(r["object"]["lastTimestamp"] for r in whole)[0] == "2030-01-02T02:55:05Z"
    assert {r["object"] is None for r in rows("?includeObject=None")} == {True}
    with pytest.raises(urllib.error.HTTPError) as refused:
        rows("?includeObject=Everything")
    assert refused.value.code == 400


@needs_kubectl_binary
def test_kubectl_lists_events_sorted_by_last_timestamp(srv: EmulatorServer, tmp_path: Any) -> None:
    """`kubectl get events -A --sort-by=.lastTimestamp` (the operations guide's first look) lists every Event,
    oldest first. It said "No resources found": kubectl sorts the Table's rows by each row's object, which it asks
    for whole (`includeObject=Object`); the emulator sent only the metadata, so there was nothing to sort on."""
    seed_events(srv)
    done = kubectl(srv, tmp_path, "get", "events", "-A", "--sort-by=.lastTimestamp")
    assert done.returncode == 0, done.stderr
    reasons = [line.split()[3] for line in done.stdout.splitlines()[1:]]
    assert reasons == ["Oldest", "Middle", "Newest"], done.stdout


def test_a_job_gets_the_selector_labels_and_defaults_the_api_server_gives_it(api: client.ApiClient) -> None:
    """As kube-apiserver 1.35.4 answers (checked): the template is labelled with the Job's name and uid (legacy and
    `batch.kubernetes.io/` keys), the selector matches the uid (`kubectl logs job/...` finds the Pods through it),
    a Job without labels shows its template's, and `kubectl describe job` has its defaults to print;
    `manualSelector: true` is left alone (a `job-name` label that is not the Job's: test_emulator_strict.py)."""
    batch: Any = client.BatchV1Api(api)
    body: Any = job("j1")
    body.metadata.labels = None
    created = batch.create_namespaced_job(NS, body)
    uid = created.metadata.uid
    generated = {
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": "j1",
        "controller-uid": uid,
        "job-name": "j1",
    }
    assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    assert created.spec.template.metadata.labels == generated
    assert created.metadata.labels == generated
    spec = created.spec
    assert (spec.completions, spec.parallelism, spec.completion_mode, spec.suspend) == (1, 1, "NonIndexed", False)
    assert (spec.backoff_limit, spec.pod_replacement_policy) == (6, "TerminatingOrFailed")
    manual: Any = job("j3")
    manual.spec.manual_selector = True
    manual.spec.selector = client.V1LabelSelector(match_labels={"app": "x"})
    manual.spec.template.metadata = client.V1ObjectMeta(labels={"app": "x"})
    kept = batch.create_namespaced_job(NS, manual)
    assert kept.spec.selector.match_labels == {"app": "x"} and kept.spec.template.metadata.labels == {"app": "x"}


def test_crd_cells_are_null_when_absent_and_dates_are_ages(srv: EmulatorServer, api: client.ApiClient) -> None:
    """apiextensions' table convertor: a column whose path is absent is a null cell (kubectl prints <none>); a
    `date` column is the age of its time, and a time ahead is `<invalid>` there too (HumanDuration of a negative
    span), which is why the claim's Deadline is a `string` column."""
    ahead = (FIXED_NOW + datetime.timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = claim("c1", deadlineAt=ahead)
    body["status"] = {"phase": "failed", "finishedAt": ahead}
    srv.call(lambda e: e.put_object(GV, "nodeclaims", body, NS))
    srv.call(lambda e: e.put_object(GV, "nodeclaims", claim("c2"), NS))
    method, url, headers, _, _ = api.param_serialize(
        "GET", f"/apis/{GV}/namespaces/{NS}/nodeclaims", header_params={"Accept": TABLE}
    )
    doc = json.loads(api.call_api(method, url, header_params=headers).read())
    names = [c["name"] for c in doc["columnDefinitions"]]
    cells = {row["cells"][0]: dict(zip(names, row["cells"], strict=True)) for row in doc["rows"]}
    assert cells["c1"]["Deadline"] == ahead, "a string column shows the time as written"
    assert cells["c1"]["Finished"] == "<invalid>", "a date column ahead of now: what kube-apiserver prints"
    assert cells["c2"]["Deadline"] is None and cells["c2"]["Phase"] is None
    deadline = next(c for c in doc["columnDefinitions"] if c["name"] == "Deadline")
    assert (deadline["type"], deadline["format"]) == ("string", "date-time")


@needs_kubectl_binary
def test_kubectl_wide_shows_a_failed_claims_deadline(srv: EmulatorServer, tmp_path: Any) -> None:
    """`kubectl get nodeclaims -o wide` showed `<invalid>` for a failed claim's deadline (a time ahead, printed as
    an age by a `date` column); the column is the time itself now."""
    ahead = (FIXED_NOW + datetime.timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = claim("c1", deadlineAt=ahead)
    body["status"] = {"phase": "failed", "reason": "StartupJobFailed", "attempt": 1}
    srv.call(lambda e: e.put_object(GV, "nodeclaims", body, NS))
    done = kubectl(srv, tmp_path, "get", "nodeclaims", "-n", NS, "-o", "wide")
    assert done.returncode == 0, done.stderr
    assert "<invalid>" not in done.stdout and ahead in done.stdout, done.stdout


# --- Pods and their logs --------------------------------------------------------------------------------------
def a_pod(
    name: str, *, state: dict[str, Any] | None = None, containers: tuple[str, ...] = ("power",)
) -> dict[str, Any]:
    statuses = [{"name": c, "ready": False, "restartCount": 0, "image": "busybox", "imageID": "", "state": state or {}}
                for c in containers]  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [{"name": c, "image": "busybox"} for c in containers], "nodeName": "n1"},
        "status": {"phase": "Running", "containerStatuses": statuses},
    }


def fetch(srv: EmulatorServer, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(srv.url + path, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())["message"]


def test_pod_logs_are_served_as_the_kubelet_serves_them(srv: EmulatorServer) -> None:
    pod = srv.call(lambda e: e.put_object("v1", "pods", a_pod("p1", state={"running": {"startedAt": "x"}})))
    at = FIXED_NOW - datetime.timedelta(seconds=3)
    srv.call(lambda e: e.logs.write(pod["metadata"]["uid"], "power", "one\ntwo\nthree\n", at))
    log = f"/api/v1/namespaces/{NS}/pods/p1/log"
    assert fetch(srv, log) == (200, "one\ntwo\nthree\n")
    assert fetch(srv, log + "?tailLines=2") == (200, "two\nthree\n")
    assert fetch(srv, log + "?limitBytes=5") == (200, "one\nt")
    assert fetch(srv, log + "?tailLines=1&timestamps=true") == (200, "2030-01-02T03:04:02.000000000Z three\n")
    assert fetch(srv, log + "?container=other") == (400, "container other is not valid for pod p1")
    assert fetch(srv, log + "?previous=true") == (400, 'previous terminated container "power" in pod "p1" not found')
    assert fetch(srv, f"/api/v1/namespaces/{NS}/pods/p9/log")[0] == 404
    srv.call(lambda e: e.put_object("v1", "pods", a_pod("p2", state={"waiting": {"reason": "ErrImagePull"}})))
    assert fetch(srv, f"/api/v1/namespaces/{NS}/pods/p2/log") == (
        400,
        'container "power" in pod "p2" is waiting to start: ErrImagePull',
    )
    srv.call(lambda e: e.put_object("v1", "pods", a_pod("p3", containers=("a", "b"))))
    assert fetch(srv, f"/api/v1/namespaces/{NS}/pods/p3/log") == (
        400,
        "a container name must be specified for pod p3, choose one of: [a b]",
    )
    srv.call(lambda e: e.delete_object("v1", "pods", NS, "p1"))
    assert srv.call(lambda e: e.logs.of(pod["metadata"]["uid"], "power")) == [], "a Pod removed takes its log"


def test_a_followed_log_streams_until_the_container_ends(srv: EmulatorServer) -> None:
    """`follow=true`: what is there, then each new line, and the stream ends when the container terminates."""
    pod = srv.call(lambda e: e.put_object("v1", "pods", a_pod("p1", state={"running": {"startedAt": "x"}})))
    uid = pod["metadata"]["uid"]
    srv.call(lambda e: e.logs.write(uid, "power", "first", FIXED_NOW))
    got: list[str] = []

    def follow() -> None:
        with urllib.request.urlopen(f"{srv.url}/api/v1/namespaces/{NS}/pods/p1/log?follow=true", timeout=10) as a:
            got.append(a.read().decode())

    reader = threading.Thread(target=follow)
    reader.start()
    time.sleep(0.3)
    srv.call(lambda e: e.logs.write(uid, "power", "second", FIXED_NOW))
    ended = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    srv.call(lambda e: e.patch_object("v1", "pods", NS, "p1", {"status": {"containerStatuses": [
        {**pod["status"]["containerStatuses"][0], "state": ended}]}}, "status"))  # fmt: skip
    reader.join(10)
    assert not reader.is_alive() and got == ["first\nsecond\n"]


def test_pods_print_kubectls_columns(srv: EmulatorServer, api: client.ApiClient) -> None:
    ended = {"terminated": {"exitCode": 1, "reason": "Error"}}
    srv.call(lambda e: e.put_object("v1", "pods", a_pod("p1", state=ended)))
    srv.call(lambda e: e.put_object("v1", "pods", a_pod("p2", state={"terminated": {"exitCode": 2}})))
    assert _shown(api, f"/api/v1/namespaces/{NS}/pods") == (
        ["Name", "Ready", "Status", "Restarts", "Age"],
        [["p1", "0/1", "Error", "0", "0s"], ["p2", "0/1", "ExitCode:2", "0", "0s"]],
    )
