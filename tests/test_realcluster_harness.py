"""The real-cluster harness's own logic, without a cluster (`make e2e-real` runs the rest): the stand-in
autoscaler's decisions as cluster-autoscaler makes them, the RBAC table's arithmetic over deploy/'s own rules, the
replay's comparison, and the PKI's certificates."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from proto import externalgrpc_pb2 as pb
from tests.realcluster import audit, pki, replay, standin
from tests.realcluster.standin import GroupView, NodeShape, PodNeed, Standin

ROOT = Path(__file__).resolve().parent.parent
NODE = NodeShape(labels={"homelab.dev/machine": "true"}, taints=(), cpu_m=4000, mem=8 * 2**30)


def pod(name: str = "p", cpu: int = 3000, selector: dict[str, str] | None = None, **kw: Any) -> PodNeed:
    return PodNeed(name, selector if selector is not None else {"homelab.dev/machine": "true"},
                   kw.get("tolerations", ()), cpu, 2**30)  # fmt: skip


# --- the stand-in's simulation ----------------------------------------------------------------------------------
def test_quantities_parse_as_the_api_server_writes_them() -> None:
    assert [standin.cpu_millis(q) for q in ("500m", "2", "1.5")] == [500, 2000, 1500]
    assert [standin.mem_bytes(q) for q in ("1Gi", "64Mi", "1000", "1G")] == [2**30, 64 * 2**20, 1000, 10**9]


def test_a_pod_fits_a_node_by_selector_taints_and_room() -> None:
    assert standin.fits(pod(), NODE)
    assert not standin.fits(pod(selector={"homelab.dev/machine": "false"}), NODE)
    assert not standin.fits(pod(cpu=5000), NODE)
    tainted = NodeShape(NODE.labels, (("dedicated", "batch", "NoSchedule"),), NODE.cpu_m, NODE.mem)
    assert not standin.fits(pod(), tainted)
    assert standin.fits(pod(tolerations=(("dedicated", "Equal", "batch", "NoSchedule"),)), tainted)
    assert standin.fits(pod(tolerations=(("", "Exists", "", ""),)), tainted)


def test_the_estimate_packs_pods_first_fit_into_new_nodes() -> None:
    assert standin.machines_for([pod("a"), pod("b")], NODE) == 2  # 3 of 4 CPUs each: one per machine
    assert standin.machines_for([pod("a", cpu=1000), pod("b", cpu=1000), pod("c", cpu=2000)], NODE) == 1


def test_the_priority_expander_prefers_the_listed_order_then_names() -> None:
    assert standin.choose(["spares", "workers"], ("workers", "spares")) == "workers"
    assert standin.choose(["b", "a"], ()) == "a"
    assert standin.choose([], ("workers",)) is None


class Recorder:
    """The provider as the stand-in sees it: records the writes, answers nothing else."""

    def __init__(self) -> None:
        self.deleted: list[tuple[str, list[str]]] = []

    def NodeGroupDeleteNodes(self, req: pb.NodeGroupDeleteNodesRequest, timeout: float) -> None:
        self.deleted.append((req.id, [n.name for n in req.nodes]))


def errored(instance_id: str) -> pb.Instance:
    status = pb.InstanceStatus(instanceState=pb.InstanceStatus.instanceCreating)
    status.errorInfo.CopyFrom(pb.InstanceErrorInfo(errorCode="startup-job-failed", errorMessage="claim failed"))
    return pb.Instance(id=instance_id, status=status)


def test_a_failure_backs_the_group_off_only_while_its_scale_up_is_in_flight() -> None:
    """cluster-autoscaler's clusterstate: the request ends when the target stops being above the registered nodes,
    before the errors are read; an error seen then is deleted but backs nothing off (the real one did just this)."""
    stub = Recorder()
    s = Standin(core=None, stub=stub, namespace="ns")
    s.scale_up_requests["w"] = 0.0
    s.groups = {"w": GroupView("w", 2, target=1, instances=[errored("kwok://m2")])}  # the error is in the target
    s.update_scale_requests()
    s.handle_instance_errors(now=10.0)
    assert s.backoff_until["w"] == 10.0 + s.backoff_seconds and "w" not in s.scale_up_requests
    assert stub.deleted == [("w", ["kwok://m2"])]

    s2 = Standin(core=None, stub=Recorder(), namespace="ns")
    s2.scale_up_requests["w"] = 0.0
    s2.groups = {"w": GroupView("w", 2, target=0, instances=[errored("kwok://m2")])}  # the error left the target
    s2.update_scale_requests()
    s2.handle_instance_errors(now=10.0)
    assert s2.backoff_until == {}, "a scale-up that ended as a success is not backed off"


def test_an_error_already_seen_does_not_back_off_again() -> None:
    s = Standin(core=None, stub=Recorder(), namespace="ns")
    s.previous_errors = {"kwok://m2"}
    s.scale_up_requests["w"] = 0.0
    s.groups = {"w": GroupView("w", 2, target=1, instances=[errored("kwok://m2")])}
    s.handle_instance_errors(now=10.0)
    assert s.backoff_until == {}


# --- the RBAC table -----------------------------------------------------------------------------------------------
def event(verb: str, resource: str, code: int = 200, *, group: str = "", name: str = "", ns: str = "") -> Any:
    return audit.AuditEvent(audit.OPERATOR, verb, group, resource, ns, name, code, "", f"/{resource}")


def test_the_rbac_table_counts_uses_refusals_and_grants_never_used() -> None:
    rules = audit.rules_from(ROOT / f for f in audit.OPERATOR_RBAC)
    assert audit.Rule("ClusterRole/homelab-autoscaler", "batch", "jobs", "create") in rules
    events = [
        event("create", "jobs", 201, group="batch"),
        event("create", "jobs", 201, group="batch"),
        event("delete", "jobs", 403, group="batch"),
        event("get", "leases", 200, group="coordination.k8s.io", ns="homelab-autoscaler-system"),
        event("get", "leases", 200, group="coordination.k8s.io", ns="elsewhere"),
    ]
    used = audit.usage(events, audit.OPERATOR, rules)
    assert used.used[("batch", "jobs", "create")][201] == 2
    assert [e.verb for e in used.forbidden] == ["delete"]
    assert [e.namespace for e in used.ungranted] == ["elsewhere"], "a Role grants in its own namespace only"
    assert audit.Rule("ClusterRole/homelab-autoscaler", "batch", "jobs", "create") not in used.unused
    table = audit.table(used, rules)
    assert "| batch | jobs | create | ClusterRole/homelab-autoscaler | 201: 2 |" in table
    assert "| batch | jobs | delete | NOT GRANTED | 403: 1 |" in table


def test_a_named_grant_covers_only_its_names() -> None:
    rule = audit.Rule("Role/x", "", "configmaps", "get", ("cluster-autoscaler-status",), "ns")
    assert audit.grants(rule, event("get", "configmaps", name="cluster-autoscaler-status", ns="ns"))
    assert not audit.grants(rule, event("get", "configmaps", name="other", ns="ns"))


# --- the replay's comparison --------------------------------------------------------------------------------------
def test_a_difference_is_a_field_the_request_wrote_that_the_servers_stored_differently() -> None:
    request = {"status": {"phase": "ready", "conditions": [{"type": "Ready"}]}, "metadata": {"resourceVersion": "7"}}
    real = {"status": {"phase": "ready", "conditions": [{"type": "Ready"}]}, "metadata": {"resourceVersion": "9"}}
    assert replay.written_differences(request, real, dict(real)) == []
    emulated = {"status": {"phase": "ready", "conditions": []}, "metadata": {"resourceVersion": "3"}}
    assert replay.written_differences(request, real, emulated) == [
        'status.conditions: real [{"type": "Ready"}], emulator null'
    ]
    assert replay.written_differences({"status": {}}, {"status": {}}, {}) == [], "{} and absent mean the same"


# --- the PKI --------------------------------------------------------------------------------------------------------
def test_the_pki_issues_a_serving_and_a_client_certificate_the_ca_verifies(tmp_path: Path) -> None:
    ca = pki.Authority(tmp_path)
    serving = ca.issue("api", "kube-apiserver", server=True, ips=("127.0.0.1",), dns=("localhost",))
    client = ca.issue("admin", "kubernetes-admin", organizations=("system:masters",))
    cert = x509.load_pem_x509_certificate(client.cert.read_bytes())
    assert cert.subject.get_attributes_for_oid(x509.NameOID.ORGANIZATION_NAME)[0].value == "system:masters"
    assert cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "kubernetes-admin"
    san = x509.load_pem_x509_certificate(serving.cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert "localhost" in san.value.get_values_for_type(x509.DNSName)
    ctx = ssl.create_default_context(cafile=str(ca.cert))
    ctx.load_cert_chain(str(client.cert), str(client.key))  # a key that does not match its certificate raises
    with pytest.raises(ssl.SSLError):
        ctx.load_cert_chain(str(client.cert), str(serving.key))
