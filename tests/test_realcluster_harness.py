"""The real-cluster harness's own logic, without a cluster (`make e2e-real` runs the rest): the stand-in
autoscaler's decisions as cluster-autoscaler makes them, the RBAC table's arithmetic over deploy/'s own rules, the
replay's comparison, the PKI's certificates, how cluster-autoscaler is launched from deploy/'s manifests, and how
machines' kubelets start side by side."""

from __future__ import annotations

import ipaddress
import ssl
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509 import verification

from proto import externalgrpc_pb2 as pb
from tests.realcluster import audit, deployed, pki, replay, standin
from tests.realcluster.cluster import KWOK_LOGS_CRD, KWOK_STAGES, Cluster, wait_until
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
    assert audit.Rule("ClusterRole/homelab-autoscaler", "", "pods", "list") in rules
    events = [
        event("list", "pods", 200),
        event("list", "pods", 200),
        event("create", "pods", 403),
        event("get", "leases", 200, group="coordination.k8s.io", ns="homelab-autoscaler-system"),
        event("get", "leases", 200, group="coordination.k8s.io", ns="elsewhere"),
    ]
    used = audit.usage(events, audit.OPERATOR, rules)
    assert used.used[("", "pods", "list")][200] == 2
    assert [e.verb for e in used.forbidden] == ["create"]
    assert [e.namespace for e in used.ungranted] == ["elsewhere"], "a Role grants in its own namespace only"
    assert audit.Rule("ClusterRole/homelab-autoscaler", "", "pods", "list") not in used.unused
    table = audit.table(used, rules)
    row = next(line for line in table.splitlines() if line.startswith("| core | pods | list |"))
    assert "ClusterRole/homelab-autoscaler" in row and row.endswith("| 200: 2 |"), table
    assert "pods | create | NOT GRANTED | 403: 1 |" in table, table


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


def _evictions(answers: tuple[int, ...], max_unavailable: tuple[int, ...]) -> list[audit.AuditEvent]:
    """A drain as the audit log records it: the operator lists the node's Pods and evicts one; a person made (and
    then relaxed) the budget it meets, which the operator never read; each eviction answered as `answers` says."""
    op, person = audit.OPERATOR, "kubernetes-admin"
    pod_ = {"metadata": {"name": "web-1", "namespace": "default", "labels": {"app": "web"}, "uid": "u1"},
            "spec": {"nodeName": "machine-1", "containers": [{"name": "app", "image": "app:1"}]},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip

    def budget(n: int) -> dict[str, Any]:
        return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "web", "namespace": "default", "generation": 1},
                "spec": {"maxUnavailable": n, "selector": {"matchLabels": {"app": "web"}}}}  # fmt: skip

    def evict(code: int) -> audit.AuditEvent:
        body = {"kind": "Eviction", "apiVersion": "policy/v1", "metadata": {"name": "web-1", "namespace": "default"}}
        reason = "TooManyRequests" if code == 429 else ""
        answer = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "code": code,
                  "status": "Failure" if code == 429 else "Success", "reason": reason}  # fmt: skip
        return audit.AuditEvent(op, "create", "", "pods/eviction", "default", "web-1", code, reason,
                                "/api/v1/namespaces/default/pods/web-1/eviction", body, answer)  # fmt: skip

    out = [audit.AuditEvent(op, "list", "", "pods", "", "", 200, "", "/api/v1/pods?fieldSelector=spec.nodeName%3Dm",
                            None, {"kind": "PodList", "apiVersion": "v1", "items": [pod_]})]  # fmt: skip
    uri = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"
    for i, (n, code) in enumerate(zip(max_unavailable, answers, strict=True)):
        verb = "create" if i == 0 else "patch"
        out.append(audit.AuditEvent(person, verb, "policy", "poddisruptionbudgets", "default", "web", 200, "",
                                    uri if i == 0 else f"{uri}/web", budget(n), budget(n)))  # fmt: skip
        out.append(evict(code))
    return out


def test_an_eviction_is_judged_by_the_pod_as_last_listed_and_the_budgets_as_the_log_last_showed_them() -> None:
    outcomes = replay.replay_all(_evictions((429, 201), (0, 1)), user=audit.OPERATOR)
    assert [(o.event.code, o.code, o.differences) for o in outcomes if o.event.resource == "pods/eviction"] == [
        (429, 429, []),
        (201, 201, []),
    ]
    assert len(outcomes) == 3, "the person's writes are learned, not replayed"
    # A budget the log never showed cannot refuse: the emulator then answers differently, and that is said.
    (_, refused, allowed) = replay.replay_all([e for e in _evictions((429, 201), (0, 1)) if e.user == audit.OPERATOR])
    assert refused.differences == ["status 429 TooManyRequests on the real server, 201  here"], refused.differences
    assert allowed.differences == []


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


# --- the machines' kubelets (cluster.py) ---------------------------------------------------------------------------
# A stand-in for KWOK: it says whether its kubeconfig's client certificate and key are a pair (what the API server's
# handshake refuses when they are not), then runs until stopped; a node named "dies" exits at once, as a KWOK that
# cannot reach the API server does.
FAKE_KWOK = f"""#!{sys.executable}
import sys, time, yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if "=" in a)
user = yaml.safe_load(open(args["kubeconfig"]))["users"][0]["user"]
cert = x509.load_pem_x509_certificate(open(user["client-certificate"], "rb").read())
key = serialization.load_pem_private_key(open(user["client-key"], "rb").read(), None)
print("pair" if cert.public_key() == key.public_key() else "mismatch", flush=True)
if args["manage-single-node"] == "dies":
    sys.exit(3)
time.sleep(60)
"""
# kubectl applies and waits for KWOK's Logs CRD: it takes a moment, as against a real API server.
FAKE_KUBECTL = f"""#!{sys.executable}
import sys, time
open(sys.argv[0] + ".calls", "a").write(" ".join(sys.argv[3:4]) + "\\n")
time.sleep(0.2)
"""


def fake_kubelet_cluster(tmp_path: Path) -> Cluster:
    bins = tmp_path / "kube" / "bin"
    bins.mkdir(parents=True)
    for name, text in (("kwok", FAKE_KWOK), ("kubectl", FAKE_KUBECTL)):
        (bins / name).write_text(text)
        (bins / name).chmod(0o755)
    for rel in KWOK_STAGES:
        (bins.parent / "kwok-stages" / rel).parent.mkdir(parents=True, exist_ok=True)
        (bins.parent / "kwok-stages" / rel).write_text(f"kind: Stage\nmetadata: {{name: {Path(rel).stem}}}\n")
    (bins.parent / KWOK_LOGS_CRD).parent.mkdir(parents=True, exist_ok=True)
    (bins.parent / KWOK_LOGS_CRD).write_text("kind: CustomResourceDefinition\n")
    return Cluster(tmp_path / "cluster", bins=bins)


def test_machines_that_boot_at_once_share_one_kubelet_credential_made_once(tmp_path: Path) -> None:
    """Machines power on side by side (the machine room's boot timers, the executor's thread): the first kubelet's
    setup (KWOK's client certificate, its CRD, its Stages) happens once, and every KWOK reads a certificate with its
    own key. Two first boots at once each issued the certificate, a KWOK read one's cert with the other's key, exited
    ("private key does not match public key"), and its claim waited out its boot with no Node."""
    cluster = fake_kubelet_cluster(tmp_path)
    nodes = [f"machine-{i}" for i in range(6)]
    gate = threading.Barrier(len(nodes))
    errors: list[BaseException] = []

    def boot(node: str) -> None:
        try:
            gate.wait(10)
            cluster.start_kubelet(node)
        except BaseException as exc:  # the assertion below names it
            errors.append(exc)

    threads = [threading.Thread(target=boot, args=(n,)) for n in nodes]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        assert sorted(cluster.kubelets) == nodes
        logs = {n: tmp_path / "cluster" / f"kubelet-{n}.log" for n in nodes}
        said = wait_until("every KWOK to say whether its credential is a pair",
                          lambda: all(p.is_file() and p.read_text().strip() for p in logs.values()) and
                          {n: p.read_text().strip() for n, p in logs.items()}, within=30)  # fmt: skip
        assert said == dict.fromkeys(nodes, "pair")
        calls = (cluster.bins / "kubectl.calls").read_text().split()
        assert calls == ["apply", "wait"], f"KWOK's CRD applied and waited for once, not {calls}"
        assert not cluster.dead_kubelets()
    finally:
        cluster.stop()


def test_a_kubelet_that_exits_unasked_fails_a_wait_at_once_and_one_stopped_does_not(tmp_path: Path) -> None:
    """A machine's kubelet that exits (its API server unreachable, a bad credential) is named by a wait on its Node at
    once, with its log; a machine powered off stops its kubelet, and that is no failure."""
    cluster = fake_kubelet_cluster(tmp_path)
    try:
        cluster.start_kubelet("machine-1")
        cluster.start_kubelet("dies")
        cluster.stop_kubelet("machine-1")
        dead = wait_until("the kubelet of 'dies' to exit", cluster.dead_kubelets, within=30)
        assert [p.name for p in dead] == ["kubelet-dies"]
        began = time.monotonic()
        with pytest.raises(AssertionError, match=r"kubelet-dies exited with code 3 while waiting for dies Ready"):
            cluster.wait("dies Ready", lambda: False, within=60)
        assert time.monotonic() - began < 5, "the wait named the dead kubelet at once, not at its bound"
    finally:
        cluster.stop()


def test_a_wait_that_times_out_says_how_things_stand_then() -> None:
    """What a wait's text says is written before it waits; `now` says how things stand when it gives up."""
    state = ["booting"]

    def check() -> bool:
        state[0] = "failed"
        return False

    with pytest.raises(AssertionError, match=r"waited 0 s for the claim ready, in vain; now: failed"):
        wait_until("the claim ready", check, within=0.1, now=lambda: state[0])


# --- cluster-autoscaler as deploy/ runs it (deployed.py) -----------------------------------------------------------
def test_an_override_replaces_the_manifests_value_or_is_added_and_says_why() -> None:
    args, lines = deployed.apply_overrides(
        ["--cloud-provider=externalgrpc", "--scan-interval=10s", "--balance-similar-node-groups"],
        [deployed.Override("scan-interval", "5s", "short"), deployed.Override("kubeconfig", "/k", "no Pod")],
    )
    assert args == ["--cloud-provider=externalgrpc", "--scan-interval=5s", "--balance-similar-node-groups",
                    "--kubeconfig=/k"]  # fmt: skip
    assert lines == ["--scan-interval: 10s -> 5s (short)", "--kubeconfig=/k added (no Pod)"]
    with pytest.raises(ValueError, match="--v more than once"):
        deployed.apply_overrides(["--v=2", "--v=4"], [])
    with pytest.raises(ValueError, match="'cluster-autoscaler'"):
        deployed.parse_args(["cluster-autoscaler"])


def rendered_autoscaler(cloud_config: dict[str, Any]) -> list[dict[str, Any]]:
    """A rendered kustomization as `kubectl kustomize` gives it: the Deployment and its generated ConfigMap."""
    container = {
        "name": "cluster-autoscaler", "args": ["--cloud-config=/etc/ca/cloud-config.yaml", "--v=2"],
        "volumeMounts": [{"name": "cloud-config", "mountPath": "/etc/ca"}, {"name": "tls", "mountPath": "/etc/ca/tls"}],
    }  # fmt: skip
    items = [{"key": "c.yaml", "path": "cloud-config.yaml"}]
    pod = {"containers": [container], "volumes": [
        {"name": "cloud-config", "configMap": {"name": "cc-h4sh", "items": items}},
        {"name": "tls", "secret": {"secretName": "client-tls"}},
    ]}  # fmt: skip
    return [
        {"kind": "Deployment", "metadata": {"name": "cluster-autoscaler"}, "spec": {"template": {"spec": pod}}},
        {"kind": "ConfigMap", "metadata": {"name": "cc-h4sh"}, "data": {"c.yaml": yaml.safe_dump(cloud_config)}},
    ]


def test_the_launch_keeps_the_manifests_flags_and_maps_its_volumes_and_address(tmp_path: Path) -> None:
    config = {"address": "provider.ns.svc:8086", "cert": "/etc/ca/tls/tls.crt", "key": "/etc/ca/tls/tls.key",
              "cacert": "/etc/ca/tls/ca.crt"}  # fmt: skip
    docs = rendered_autoscaler(config)

    def kubectl(*args: str) -> Any:
        assert args[0] == "kustomize"
        return SimpleNamespace(stdout=yaml.safe_dump_all(docs))

    secrets = {"client-tls": {"tls.crt": b"C", "tls.key": b"K", "ca.crt": b"A"}}
    launch = deployed.autoscaler_launch(kubectl, Path("/bin/ca"), "x", tmp_path, kubeconfig=Path("/k"),
                                        metrics_port=1, provider_port=2, secrets=secrets)  # fmt: skip
    argv = launch.argv[launch.argv.index("/bin/ca") :]
    cloud = Path(argv[1].removeprefix("--cloud-config="))
    assert argv[1:3] == [f"--cloud-config={cloud}", "--v=2"], "the manifest's flags, in its order"
    assert cloud.is_relative_to(tmp_path)
    written = yaml.safe_load(cloud.read_text())
    assert written["address"] == "provider.ns.svc:2", "the host is kept: the certificate is checked against it"
    assert Path(written["cert"]).read_bytes() == b"C" and Path(written["cacert"]).read_bytes() == b"A"
    hosts = Path(launch.argv[launch.argv.index("/bin/ca") - 1]).read_text()
    assert hosts.endswith("127.0.0.1 provider.ns.svc\n")
    with pytest.raises(ValueError, match="under no volume mount"):
        deployed.Volumes(docs[0]["spec"]["template"]["spec"], docs[0]["spec"]["template"]["spec"]["containers"][0],
                         tmp_path).path("/var/run/elsewhere")  # fmt: skip


def handshake(server: ssl.SSLContext, client: ssl.SSLContext, hostname: str) -> None:
    """A TLS handshake between the two contexts in memory; raises the ssl.SSLError either side sees."""
    s_in, s_out, c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO(), ssl.MemoryBIO()
    s = server.wrap_bio(s_in, s_out, server_side=True)
    c = client.wrap_bio(c_in, c_out, server_hostname=hostname)
    done = {"s": False, "c": False}
    for _ in range(20):
        for name, end in (("c", c), ("s", s)):
            if not done[name]:
                try:
                    end.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return
    raise AssertionError("the handshake did not finish")


def test_the_certificates_are_what_cert_manager_issues_for_deploys_certificate_resources(tmp_path: Path) -> None:
    """The provider's certificate is a server's for the Service name cluster-autoscaler's mtls cloud-config dials
    (and only for that name), cluster-autoscaler's is a client's, both of the one CA: an mTLS handshake passes."""
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/components/cert-manager/certificates.yaml").read_text()) if d]
    secrets = deployed.issue_as_cert_manager(docs, tmp_path)
    assert {"homelab-autoscaler-ca", "homelab-autoscaler-provider-tls", "cluster-autoscaler-client-tls"} <= set(secrets)
    ca = x509.load_pem_x509_certificate(secrets["homelab-autoscaler-ca"]["tls.crt"])
    assert ca.subject.rfc4514_string() == "CN=homelab-autoscaler-ca"
    builder = verification.PolicyBuilder().store(verification.Store([ca]))
    provider, client = secrets["homelab-autoscaler-provider-tls"], secrets["cluster-autoscaler-client-tls"]
    assert provider["ca.crt"] == client["ca.crt"] == secrets["homelab-autoscaler-ca"]["tls.crt"]
    host = yaml.safe_load((ROOT / "deploy/cluster-autoscaler/mtls/cloud-config.yaml").read_text())["address"]
    host = host.rpartition(":")[0]
    server = x509.load_pem_x509_certificate(provider["tls.crt"])
    builder.build_server_verifier(x509.DNSName(host)).verify(server, [])  # RFC 5280, strictly
    with pytest.raises(verification.VerificationError):
        builder.build_server_verifier(x509.IPAddress(ipaddress.ip_address("127.0.0.1"))).verify(server, [])
    assert x509.load_pem_x509_certificate(client["tls.crt"]).subject.rfc4514_string() == "CN=cluster-autoscaler"

    files = {}
    for secret, keys in (("provider", provider), ("client", client)):
        for key, data in keys.items():
            files[(secret, key)] = tmp_path / f"{secret}-{key}"
            files[(secret, key)].write_bytes(data)

    def contexts(client_secret: str) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        srv = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # the provider: a client certificate of its CA is required
        srv.load_cert_chain(files[("provider", "tls.crt")], files[("provider", "tls.key")])
        srv.load_verify_locations(files[("provider", "ca.crt")])
        srv.verify_mode = ssl.CERT_REQUIRED
        cli = ssl.create_default_context(cafile=str(files[("client", "ca.crt")]))
        cli.load_cert_chain(files[(client_secret, "tls.crt")], files[(client_secret, "tls.key")])
        return srv, cli

    handshake(*contexts("client"), host)
    with pytest.raises(ssl.SSLError):
        handshake(*contexts("client"), "127.0.0.1")  # not a name of the provider's certificate
    with pytest.raises(ssl.SSLError):
        handshake(*contexts("provider"), host)  # a server certificate is no client certificate
    with pytest.raises(ValueError, match="ECDSA P-256"):
        rsa = [{**d, "spec": {**d["spec"], "privateKey": {"algorithm": "RSA", "size": 2048}}} for d in docs]
        deployed.issue_as_cert_manager(rsa, tmp_path / "rsa")


def test_the_audited_grants_are_every_role_deploy_rbac_ships() -> None:
    """The grants the story audits are read from deploy/rbac's kustomization: a Role added there (the power Jobs'
    Role was) is audited, not reported as requests 'allowed by no rule of deploy/'."""
    assert "deploy/rbac/jobs_role.yaml" in audit.OPERATOR_RBAC
    sources = {r.source for r in audit.rules_from(ROOT / f for f in audit.OPERATOR_RBAC)}
    assert {"ClusterRole/homelab-autoscaler", "Role/homelab-autoscaler-jobs"} <= sources, sources
