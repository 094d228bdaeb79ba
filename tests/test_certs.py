"""The `certs` setup step against the emulated API server: what it issues, what it leaves alone, when it renews.

It runs as its own ServiceAccount (deploy/base/certs.yaml), never as the operator, which never reads a Secret; the
requests here carry that account's token, so tests/test_rbac.py does not count them as the operator's.
"""

from __future__ import annotations

import base64
import datetime as dt
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID
from homelab_sim.emulator import EmulatorServer, UserInfo
from kubernetes import client as k8s

from homelab_autoscaler import pki
from homelab_autoscaler.certs import (
    CA_SECRET,
    CLIENT_SECRET,
    ISSUED_BY,
    PROVIDER_SECRET,
    SECRETS,
    TEMPORAL_CLIENT_SECRET,
    TEMPORAL_FRONTEND_SECRET,
    TEMPORAL_WEB_SECRET,
    WEBHOOK_CONFIG,
    WEBHOOK_CONFIGS,
    WEBHOOK_SECRET,
    CertSetup,
    leaves,
)
from kube.adapter import Kube
from kube.errors import NotFound
from tests.procs import BIN

NS = "homelab-autoscaler-system"
CERTS_USER = f"system:serviceaccount:{NS}:homelab-autoscaler-certs"
TOKENS = {"certs-token": UserInfo(CERTS_USER)}
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
ROOT = Path(__file__).resolve().parent.parent
REGISTRATION = ROOT / "deploy" / "components" / "admission" / "webhook.yaml"


@pytest.fixture
def emulator() -> Iterator[EmulatorServer]:
    with EmulatorServer(users=TOKENS) as server:
        yield server


def certs_kube(server: EmulatorServer) -> Kube:
    config = server.configuration()
    config.api_key = {"authorization": "Bearer certs-token"}
    return Kube(k8s.ApiClient(config))


def setup_at(kube: Kube, when: dt.datetime) -> CertSetup:
    return CertSetup(kube, NS, now=lambda: when)


def secret(kube: Kube, name: str) -> dict[str, Any]:
    return kube.get_raw(SECRETS, NS, name)


def data(kube: Kube, name: str) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in secret(kube, name)["data"].items()}


def versions(kube: Kube) -> dict[str, str]:
    names = (CA_SECRET, PROVIDER_SECRET, CLIENT_SECRET, WEBHOOK_SECRET)
    return {n: secret(kube, n)["metadata"]["resourceVersion"] for n in names}


def test_a_fresh_namespace_gets_a_ca_and_three_certificates_and_a_second_run_writes_nothing(
    emulator: EmulatorServer,
) -> None:
    kube = certs_kube(emulator)
    said = setup_at(kube, START).run()
    assert said[:4] == [
        f"Secret {CA_SECRET}: created",
        f"Secret {PROVIDER_SECRET}: created (none yet)",
        f"Secret {CLIENT_SECRET}: created (none yet)",
        f"Secret {WEBHOOK_SECRET}: created (none yet)",
    ]
    ca = data(kube, CA_SECRET)
    provider = data(kube, PROVIDER_SECRET)
    assert secret(kube, PROVIDER_SECRET)["type"] == "kubernetes.io/tls"
    assert pki.signed_by(provider["tls.crt"], ca["tls.crt"]) and provider["ca.crt"] == ca["tls.crt"]
    assert "homelab-autoscaler-provider.homelab-autoscaler-system.svc" in pki.dns_names(provider["tls.crt"])
    client = x509.load_pem_x509_certificate(data(kube, CLIENT_SECRET)["tls.crt"])
    usages = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert pki.dns_names(data(kube, WEBHOOK_SECRET)["tls.crt"]) == [
        "homelab-autoscaler-webhook.homelab-autoscaler-system.svc",
        "homelab-autoscaler-webhook.homelab-autoscaler-system.svc.cluster.local",
    ]
    before = versions(kube)
    again = setup_at(kube, START + dt.timedelta(days=10)).run()
    assert versions(kube) == before, again
    assert all(line.endswith(("valid, kept", "(admission is off)")) for line in again), again


def test_secrets_it_did_not_write_are_never_written(emulator: EmulatorServer) -> None:
    kube = certs_kube(emulator)
    theirs = pki.new_ca("my-ca", START)
    served = pki.issue(theirs, "mine", dns_names=["mine.example"], now=START)
    for name, marks in ((PROVIDER_SECRET, {}), (WEBHOOK_SECRET, {"cert-manager.io/certificate-name": "x"})):
        kube.create_raw(
            SECRETS,
            NS,
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": {"name": name, "namespace": NS, "annotations": marks},
                "data": {
                    "tls.crt": base64.b64encode(served.cert).decode(),
                    "tls.key": base64.b64encode(served.key).decode(),
                },
            },
        )
    # One this step wrote and cert-manager took over (it keeps the annotations it finds) is cert-manager's now.
    setup_at(kube, START).run()
    kube.patch_raw(SECRETS, NS, CLIENT_SECRET, {"metadata": {"annotations": {"cert-manager.io/certificate-name": "c"}}})
    kept = {n: secret(kube, n) for n in (PROVIDER_SECRET, WEBHOOK_SECRET, CLIENT_SECRET)}
    # Even when theirs is expired, and years later.
    said = setup_at(kube, START + dt.timedelta(days=2000)).run()
    assert {n: secret(kube, n) for n in kept} == kept
    assert f"Secret {PROVIDER_SECRET}: yours (or cert-manager's), left alone" in said
    assert ISSUED_BY in secret(kube, CA_SECRET)["metadata"]["annotations"]


def test_a_ca_a_user_brought_signs_the_rest(emulator: EmulatorServer) -> None:
    kube = certs_kube(emulator)
    theirs = pki.new_ca("my-ca", START)
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": CA_SECRET, "namespace": NS},
        "data": {"tls.crt": base64.b64encode(theirs.cert).decode(), "tls.key": base64.b64encode(theirs.key).decode()},
    }
    kube.create_raw(SECRETS, NS, body)
    setup_at(kube, START).run()
    assert pki.signed_by(data(kube, PROVIDER_SECRET)["tls.crt"], theirs.cert)
    assert ISSUED_BY not in (secret(kube, CA_SECRET)["metadata"].get("annotations") or {})
    # Without its key, a certificate that falls due cannot be issued: said, naming the Secret, nothing written.
    kube.patch_raw(SECRETS, NS, CA_SECRET, {"data": {"tls.key": None}})
    before = versions(kube)
    with pytest.raises(ValueError, match=f"{PROVIDER_SECRET} needs issuing .* {CA_SECRET} \\(yours\\) has no tls.key"):
        setup_at(kube, START + dt.timedelta(days=70)).run()
    assert versions(kube) == before


def test_certificates_are_renewed_with_a_third_left_and_a_renewed_ca_signs_only_later(emulator: EmulatorServer) -> None:
    kube = certs_kube(emulator)
    setup_at(kube, START).run()
    first = data(kube, CA_SECRET)
    old_provider = data(kube, PROVIDER_SECRET)["tls.crt"]
    said = setup_at(kube, START + dt.timedelta(days=61)).run()
    assert f"Secret {PROVIDER_SECRET}: renewed (a third of its life left)" in said
    renewed = data(kube, PROVIDER_SECRET)["tls.crt"]
    assert renewed != old_provider and pki.signed_by(renewed, first["tls.crt"])
    assert data(kube, CA_SECRET) == first
    # Seven years on, the CA has a third of its life left: a new CA, trusted at once; the old one still signs.
    later = START + dt.timedelta(days=2500)
    setup_at(kube, later).run()
    ca = data(kube, CA_SECRET)
    assert ca["tls.crt"] != first["tls.crt"] and ca["previous.crt"] == first["tls.crt"]
    trusted = x509.load_pem_x509_certificates(data(kube, PROVIDER_SECRET)["ca.crt"])
    serials = {c.serial_number for c in trusted}
    assert serials == {pki.load(ca["tls.crt"]).serial_number, pki.load(first["tls.crt"]).serial_number}
    assert pki.signed_by(data(kube, PROVIDER_SECRET)["tls.crt"], first["tls.crt"])
    # Once the old CA would not outlive two certificates, the new one signs, and every certificate moves to it.
    last = START + dt.timedelta(days=3650 - 150)
    said = setup_at(kube, last).run()
    for name in (PROVIDER_SECRET, CLIENT_SECRET, WEBHOOK_SECRET):
        assert pki.signed_by(data(kube, name)["tls.crt"], ca["tls.crt"]), (name, said)


def registration() -> dict[str, Any]:
    docs = yaml.safe_load_all(REGISTRATION.read_text())
    (config,) = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    return dict(config)


@pytest.mark.parametrize("injected", [False, True])
def test_the_webhook_registration_trusts_the_ca_unless_cert_manager_injects_it(
    emulator: EmulatorServer, injected: bool
) -> None:
    kube = certs_kube(emulator)
    config = registration()
    if injected:
        config["metadata"].setdefault("annotations", {})["cert-manager.io/inject-ca-from"] = f"{NS}/x"
    kube.create_raw(WEBHOOK_CONFIGS, None, config)
    said = setup_at(kube, START).run()
    (hook,) = kube.get_raw(WEBHOOK_CONFIGS, None, WEBHOOK_CONFIG)["webhooks"]
    bundle = hook["clientConfig"].get("caBundle")
    if injected:
        assert bundle is None and said[-1].endswith("cert-manager injects its CA")
        return
    assert base64.b64decode(bundle) == data(kube, WEBHOOK_SECRET)["ca.crt"], said
    version = kube.get_raw(WEBHOOK_CONFIGS, None, WEBHOOK_CONFIG)["metadata"]["resourceVersion"]
    assert setup_at(kube, START).run()[-1].endswith("caBundle current")
    assert kube.get_raw(WEBHOOK_CONFIGS, None, WEBHOOK_CONFIG)["metadata"]["resourceVersion"] == version


def test_two_runs_at_once_agree_on_one_ca(emulator: EmulatorServer) -> None:
    errors: list[BaseException] = []

    def one() -> None:
        try:
            setup_at(certs_kube(emulator), START).run()
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    kube = certs_kube(emulator)
    ca = data(kube, CA_SECRET)["tls.crt"]
    for name in (PROVIDER_SECRET, CLIENT_SECRET, WEBHOOK_SECRET):
        assert pki.signed_by(data(kube, name)["tls.crt"], ca), name


class BeatenAtEverySecret(Kube):
    """The API as a run sees it when another run writes each Secret just before it: the first create of every
    Secret name is preceded by the competitor writing that same Secret (the CA, or the one leaf)."""

    def __init__(self, server: EmulatorServer) -> None:
        super().__init__(certs_kube(server).api_client)
        self.competitor = setup_at(certs_kube(server), START)
        self.beaten: list[str] = []

    def create_raw(self, res: Any, namespace: str | None, body: Any) -> Any:
        name = body["metadata"]["name"]
        if res == SECRETS and name not in self.beaten:
            self.beaten.append(name)
            authority = self.competitor.authority()
            if name != CA_SECRET:
                (leaf,) = [leaf for leaf in leaves(NS) if leaf.secret == name]
                self.competitor.leaf(leaf, authority)
        return super().create_raw(res, namespace, body)


def test_a_run_beaten_to_every_secret_decides_again_and_agrees(emulator: EmulatorServer) -> None:
    """However many runs start together, a run is refused at most once per object it writes; beaten to each of them
    in turn, it keeps what the other run wrote and ends with one CA (three tries were once all it had)."""
    kube = BeatenAtEverySecret(emulator)
    said = setup_at(kube, START).run()
    assert kube.beaten == [CA_SECRET, *[leaf.secret for leaf in leaves(NS)]]
    assert all(line.endswith("valid, kept") for line in said if line.startswith("Secret")), said
    ca = data(kube, CA_SECRET)["tls.crt"]
    for name in (PROVIDER_SECRET, CLIENT_SECRET, WEBHOOK_SECRET):
        assert pki.signed_by(data(kube, name)["tls.crt"], ca), name


def test_the_command_prints_what_it_did_and_refuses_a_bad_namespace(emulator: EmulatorServer, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "e", "cluster": {"server": emulator.url}}],
                "users": [{"name": "u", "user": {"token": "certs-token"}}],
                "contexts": [{"name": "c", "context": {"cluster": "e", "user": "u"}}],
            }
        )
    )
    run = [str(BIN / "homelab-autoscaler"), "certs", "--kubeconfig", str(kubeconfig)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"Secret {CA_SECRET}: created" in done.stdout
    bad = subprocess.run([*run, "--namespace", "Not_A_Namespace"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "DNS-1123" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
    bad = subprocess.run([*run, "--client-namespace", "kube_system"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--client-namespace" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr


def test_cluster_autoscaler_in_another_namespace_gets_its_client_certificate_there(emulator: EmulatorServer) -> None:
    """A Pod mounts Secrets of its own namespace only: with cluster-autoscaler in kube-system (the chart's
    clusterAutoscaler.namespace) its client certificate is issued there, by the same CA, and kept on a second run."""
    kube = certs_kube(emulator)
    said = CertSetup(kube, NS, client_namespace="kube-system", now=lambda: START).run()
    assert f"Secret kube-system/{CLIENT_SECRET}: created (none yet)" in said, said
    with pytest.raises(NotFound):
        secret(kube, CLIENT_SECRET)
    there = kube.get_raw(SECRETS, "kube-system", CLIENT_SECRET)
    assert there["metadata"]["annotations"][ISSUED_BY]
    client_cert = base64.b64decode(there["data"]["tls.crt"])
    assert pki.signed_by(client_cert, data(kube, CA_SECRET)["tls.crt"])
    assert base64.b64decode(there["data"]["ca.crt"]) == data(kube, PROVIDER_SECRET)["ca.crt"]
    again = CertSetup(kube, NS, client_namespace="kube-system", now=lambda: START + dt.timedelta(days=1)).run()
    assert f"Secret kube-system/{CLIENT_SECRET}: valid, kept" in again, again
    rv = kube.get_raw(SECRETS, "kube-system", CLIENT_SECRET)["metadata"]["resourceVersion"]
    assert rv == there["metadata"]["resourceVersion"]


def test_the_bundled_temporals_certificates_only_with_temporal(emulator: EmulatorServer) -> None:
    """`certs --temporal` (the bundled Temporal's install): the frontend's certificate serves its Service's names and
    also authenticates as a client (the server's system worker calls its own frontend with it); the operator's and
    the Web UI's are client certificates; all by the install's CA. Without it, none of the three."""
    kube = certs_kube(emulator)
    said = CertSetup(kube, NS, now=lambda: START).run()
    assert not [line for line in said if "temporal" in line], said
    said = CertSetup(kube, NS, temporal=True, now=lambda: START).run()
    assert [line for line in said if "temporal" in line] == [
        f"Secret {TEMPORAL_FRONTEND_SECRET}: created (none yet)",
        f"Secret {TEMPORAL_CLIENT_SECRET}: created (none yet)",
        f"Secret {TEMPORAL_WEB_SECRET}: created (none yet)",
    ]
    ca = data(kube, CA_SECRET)["tls.crt"]

    def usages(name: str) -> list[Any]:
        cert = x509.load_pem_x509_certificate(data(kube, name)["tls.crt"])
        return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)

    frontend = data(kube, TEMPORAL_FRONTEND_SECRET)
    assert pki.signed_by(frontend["tls.crt"], ca) and frontend["ca.crt"] == ca
    assert pki.dns_names(frontend["tls.crt"]) == [
        "temporal-frontend",
        f"temporal-frontend.{NS}",
        f"temporal-frontend.{NS}.svc",
        f"temporal-frontend.{NS}.svc.cluster.local",
    ]
    assert usages(TEMPORAL_FRONTEND_SECRET) == [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    for name in (TEMPORAL_CLIENT_SECRET, TEMPORAL_WEB_SECRET):
        assert pki.signed_by(data(kube, name)["tls.crt"], ca), name
        assert usages(name) == [ExtendedKeyUsageOID.CLIENT_AUTH], name
    again = CertSetup(kube, NS, temporal=True, now=lambda: START + dt.timedelta(days=5)).run()
    assert all(line.endswith(("valid, kept", "(admission is off)")) for line in again), again


def test_only_a_certificate_read_at_start_asks_for_a_restart_when_renewed(
    emulator: EmulatorServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The operator and the Web UI take a renewed Temporal certificate as it is (homelab_autoscaler/renewal.py, the
    UI re-reads the file), the provider and webhook servers likewise; cluster-autoscaler reads its client certificate
    once, when it starts: that renewal alone says to restart it, and names it."""
    kube = certs_kube(emulator)
    CertSetup(kube, NS, temporal=True, now=lambda: START).run()
    caplog.clear()
    said = CertSetup(kube, NS, temporal=True, now=lambda: START + dt.timedelta(days=61)).run()
    renewed = [line for line in said if "renewed" in line]
    assert len(renewed) == 6, said  # provider, cluster-autoscaler, webhook and the bundled Temporal's three
    restarts = [r.getMessage() for r in caplog.records if "restart" in r.getMessage()]
    assert restarts == [
        f"cluster-autoscaler reads Secret {CLIENT_SECRET} at start: restart it before the old one expires"
    ], restarts
