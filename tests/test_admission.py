"""The admission belt of one live claim per slot (issue 25): the rule, its registration, and the operator's webhook
served over HTTPS, called by the emulated API server as kube-apiserver calls it.

The same checks against the real kube-apiserver are tests/realcluster/test_admission_real.py (`make e2e-real`);
the refusal kubectl prints here is the one the real server produced (pinned below), and the registration's CEL
`matchConditions` are evaluated here by the emulator and there by the real server.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import itertools
import json
import os
import shutil
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from homelab_sim.emulator import EmulatorServer, UserInfo
from kubernetes import client as k8s

from admission.review import (
    WEBHOOK_NAME,
    WEBHOOK_PATH,
    BadReview,
    Review,
    judge,
    makes_live,
    parse,
    response,
)
from admission.server import Certificate, ReviewMetrics, Webhook, WebhookServer, list_budget
from admission.settings import WebhookSettings
from api import names
from kube.adapter import Kube
from kube.errors import Transient
from tests.realcluster import pki
from tests.test_emulator_webhooks import send

ROOT = Path(__file__).resolve().parent.parent
REGISTRATION = ROOT / "deploy" / "components" / "admission" / "webhook.yaml"
NS = "homelab-autoscaler-system"
OPERATOR = "system:serviceaccount:homelab-autoscaler-system:homelab-autoscaler"
PERSON = "kubernetes-admin"
MERGE = "application/merge-patch+json"
TOKENS = {"operator-token": UserInfo(OPERATOR), "person-token": UserInfo(PERSON)}
PHASES: list[str | None] = [None, "", "pending", "booting", "ready", "failed", "completed"]
LIVE = {None, "", "pending", "booting", "ready"}


# --- the rule ---------------------------------------------------------------------------------------------------
def claim(name: str, slot: str, phase: str | None = None, *, deleting: bool = False, **meta: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND_NODECLAIM,
        "metadata": {"name": name, "namespace": NS, **meta},
        "spec": {"node": slot, "group": "workers"},
    }
    if phase is not None:
        obj["status"] = {"phase": phase}
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2030-01-01T00:00:00Z"
    return obj


def review(operation: str, obj: dict[str, Any] | None, old: dict[str, Any] | None = None, **request: Any) -> Review:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": operation, "namespace": NS, "object": obj, "oldObject": old,
                    "userInfo": {"username": PERSON}, **request},
    }  # fmt: skip
    return parse(body)


def test_a_second_live_claim_on_a_busy_slot_is_refused_naming_the_slot_and_the_live_claim() -> None:
    verdict = judge(review("CREATE", claim("by-hand", "worker-1")), [claim("worker-1-a1b2c3", "worker-1", "booting")])
    assert not verdict.allowed and verdict.code == 403 and verdict.reason == "Forbidden"
    assert verdict.message.startswith(
        'nodeclaim "by-hand" would be a second live claim on slot "worker-1": "worker-1-a1b2c3" is live there '
        "(booting). One live claim per slot"
    ), verdict.message


def test_a_claim_on_a_free_slot_or_beside_terminal_claims_is_allowed() -> None:
    elsewhere = claim("elsewhere", "worker-1", "ready")
    elsewhere["metadata"]["namespace"] = "other"
    odd = claim("odd", "worker-1", "exploded")  # a phase the API does not define: nothing runs it
    others = [claim("old-1", "worker-1", "failed"), claim("old-2", "worker-1", "completed"),
              claim("busy", "worker-2", "ready"), elsewhere, odd]  # fmt: skip
    assert judge(review("CREATE", claim("by-hand", "worker-1")), others).allowed


def test_the_newest_live_claim_is_named_and_a_claim_being_deleted_is_still_live() -> None:
    newer = claim("newer", "s", "pending", creationTimestamp="2030-01-02T00:00:00Z")
    live = [claim("older", "s", "ready", deleting=True), newer]
    verdict = judge(review("CREATE", claim("x", "s")), live)
    assert '"newer" is live there (pending) (and 1 more)' in verdict.message, verdict.message
    verdict = judge(review("CREATE", claim("x", "s")), live[:1])
    assert '"older" is live there (ready, being deleted)' in verdict.message, verdict.message


def test_what_makes_a_claim_live_is_judged_and_nothing_else() -> None:
    busy = [claim("owner", "s1", "booting")]
    # A terminal claim moved back to a live phase (a status write), and a live claim pointed at a busy slot.
    assert not judge(review("UPDATE", claim("mine", "s1", "pending"), claim("mine", "s1", "failed")), busy).allowed
    assert not judge(review("UPDATE", claim("mine", "s1", "pending"), claim("mine", "s2", "pending")), busy).allowed
    # A terminal write, a re-apply, a finalizer removed, the streak reset: the claim stays as live as it was.
    assert judge(review("UPDATE", claim("mine", "s1", "failed"), claim("mine", "s1", "booting")), busy).allowed
    assert judge(review("UPDATE", claim("mine", "s1", "booting"), claim("mine", "s1", "booting")), busy).allowed
    assert judge(review("UPDATE", claim("mine", "s1", "completed"), claim("mine", "s2", "completed")), busy).allowed
    # A delete is never refused, and the claim under review is never its own rival.
    assert judge(review("DELETE", None, claim("owner", "s1", "booting")), busy).allowed
    assert judge(review("UPDATE", claim("owner", "s1", "booting"), claim("owner", "s2", "booting")), busy).allowed


def test_a_review_that_is_no_review_is_refused_as_such() -> None:
    for body in ({}, {"apiVersion": "admission.k8s.io/v1beta1"}, {"apiVersion": "admission.k8s.io/v1", "request": {}}):
        with pytest.raises(BadReview):
            parse(body)
    assert response("u", judge(review("CREATE", claim("x", "s")), [])) == {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {"uid": "u", "allowed": True},
    }  # fmt: skip


# --- the registration ---------------------------------------------------------------------------------------------
@functools.cache
def registration() -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(REGISTRATION.read_text()) if d and d["kind"].startswith("Validating")]
    return dict(doc)


def hook() -> dict[str, Any]:
    (webhook,) = registration()["webhooks"]
    return dict(webhook)


def condition(name: str) -> Any:
    from cel_expr_python import cel

    dyn = cel.Type.DYN
    env = cel.NewEnv(variables={"object": dyn, "oldObject": dyn, "request": dyn})
    (expression,) = [c["expression"] for c in hook()["matchConditions"] if c["name"] == name]
    return env.compile(expression)


CASES = [
    (operation, new, old, moved)
    for operation, new, old, moved in itertools.product(("CREATE", "UPDATE"), PHASES, PHASES, (False, True))
    if operation == "UPDATE" or (old is None and not moved)
]


@pytest.mark.parametrize(("operation", "new", "old", "moved"), CASES)
def test_the_registrations_condition_sends_exactly_what_the_webhook_judges(
    operation: str, new: str | None, old: str | None, moved: bool
) -> None:
    """The CEL in deploy/ and `makes_live` agree on every phase pair, so the webhook is sent what it would judge
    and nothing it would not (a terminal write never reaches it, and cannot be refused by its absence)."""
    obj = claim("c", "s2" if moved else "s1", new)
    before = claim("c", "s1", old) if operation == "UPDATE" else None
    result = condition("makes-a-claim-live").eval(data={"object": obj, "oldObject": before, "request": {}})
    assert result.plain_value() is makes_live(review(operation, obj, before))


def test_the_registration_never_sends_the_operators_writes_nor_a_delete() -> None:
    webhook = hook()
    operations = {op for rule in webhook["rules"] for op in rule["operations"]}
    assert operations == {"CREATE", "UPDATE"}, "a delete is never refused: it is never sent"
    assert {r for rule in webhook["rules"] for r in rule["resources"]} == {"nodeclaims", "nodeclaims/status"}
    who = condition("not-the-operator")
    assert who.eval(data={"request": {"userInfo": {"username": OPERATOR}}}).plain_value() is False
    assert who.eval(data={"request": {"userInfo": {"username": PERSON}}}).plain_value() is True
    assert webhook["name"] == WEBHOOK_NAME and webhook["clientConfig"]["service"]["path"] == WEBHOOK_PATH
    assert webhook["failurePolicy"] == "Fail" and webhook["sideEffects"] == "None"


# --- the webhook over HTTPS ------------------------------------------------------------------------------------------
@pytest.fixture
def certificate(tmp_path: Path) -> tuple[pki.Authority, pki.Pair]:
    ca = pki.Authority(tmp_path / "pki")
    return ca, ca.issue("webhook", "webhook", server=True, ips=("127.0.0.1",))


class Served:
    """The operator's webhook on a loop of its own (the emulator and kubectl call it from other threads)."""

    def __init__(self, pair: pki.Pair, kube: Kube) -> None:
        self.settings = WebhookSettings(address="127.0.0.1:0", tls_cert=pair.cert, tls_key=pair.key)
        self.metrics = ReviewMetrics()
        self.server = WebhookServer(self.settings, Webhook(kube, self.metrics))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self

    def stop(self) -> None:
        if self.server._runner is not None:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}{WEBHOOK_PATH}"


@pytest.fixture
def emulator() -> Iterator[EmulatorServer]:
    with EmulatorServer(users=TOKENS) as server:
        yield server


def operator_kube(server: EmulatorServer) -> Kube:
    config = server.configuration()
    config.api_key = {"authorization": "Bearer operator-token"}
    return Kube(k8s.ApiClient(config))


def post(url: str, ca: Path, body: Any) -> tuple[int, Any]:
    context = ssl.create_default_context(cafile=str(ca))
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def store(server: EmulatorServer, obj: dict[str, Any]) -> None:
    server.call(lambda e: e.put_object(names.API_VERSION, names.PLURAL_NODECLAIMS, obj))


def test_the_webhook_answers_a_review_from_the_claims_the_api_server_holds(
    emulator: EmulatorServer, certificate: tuple[pki.Authority, pki.Pair]
) -> None:
    ca, pair = certificate
    store(emulator, claim("worker-1-a1b2c3", "worker-1", "ready"))
    with Served(pair, operator_kube(emulator)) as served:
        body: dict[str, Any] = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "r-1", "operation": "CREATE", "namespace": NS,
                            "object": claim("by-hand", "worker-1")}}  # fmt: skip
        code, answer = post(served.url, ca.cert, body)
        assert code == 200 and answer["response"]["uid"] == "r-1" and answer["response"]["allowed"] is False
        assert '"worker-1-a1b2c3" is live there (ready)' in answer["response"]["status"]["message"]
        body["request"]["object"] = claim("by-hand", "worker-2")
        assert post(served.url, ca.cert, body)[1]["response"]["allowed"] is True
        assert post(served.url, ca.cert, {"not": "a review"})[0] == 400
        assert served.metrics.decisions == {"refused": 1, "allowed": 1}
    lists = [r for r in emulator.emulator.requests if r.verb == "list" and r.plural == names.PLURAL_NODECLAIMS]
    assert [(r.namespace, r.user.username) for r in lists] == [(NS, OPERATOR)] * 2, "one list per judged review"


def test_claims_that_cannot_be_read_refuse_in_words_within_the_api_servers_wait(
    certificate: tuple[pki.Authority, pki.Pair],
) -> None:
    budgets: list[float] = []

    class Unreadable(Webhook):
        def claims(self, namespace: str, budget: float) -> Any:
            budgets.append(budget)
            raise Transient("list nodeclaims: HTTP 503 ServiceUnavailable: etcd is slow")

    hook_ = Unreadable(Kube.connect(server="http://127.0.0.1:1", timeout=10.0))
    verdict = asyncio.run(hook_.decide(review("CREATE", claim("x", "s1")), list_budget({"timeout": "5s"}, 10.0)))
    assert not verdict.allowed and verdict.code == 503 and "etcd is slow" in verdict.message
    assert "Nothing was written" in verdict.message and budgets == [4.0]
    assert list_budget({}, 10.0) == 10.0 and list_budget({"timeout": "1s"}, 10.0) == 0.5


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    ca = pki.Authority(tmp_path / "pki")
    first = ca.issue("one", "first", server=True, ips=("127.0.0.1",))
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(first.cert, cert)
    shutil.copy(first.key, key)
    served = Certificate(cert, key)
    assert served.reload() is False, "unchanged files are not loaded again"
    second = ca.issue("two", "second", server=True, ips=("127.0.0.1",))
    shutil.copy(second.cert, cert)
    shutil.copy(second.key, key)
    assert served.reload() is True


# --- the emulated API server calls it as kube-apiserver does -------------------------------------------------------
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (kubernetes-client)")

# What the real kube-apiserver 1.35.4 answered `kubectl apply` of a second live claim (tests/realcluster/
# test_admission_real.py checks the same text there).
REAL_REFUSAL = (
    'Error from server (Forbidden): error when creating "STDIN": admission webhook "nodeclaims.infra.homecluster.dev" '
    'denied the request: nodeclaim "by-hand" would be a second live claim on slot "worker-1": "worker-1-a1b2c3" is '
    "live there (booting). One live claim per slot: wait until it ends, or delete it (a booting or ready claim powers "
    "its machine off first)\n"
)


def register(server: EmulatorServer, url: str, ca: Path) -> dict[str, Any]:
    """The registration of deploy/, its Service reference replaced by a URL (the emulator routes no Service)."""
    doc: dict[str, Any] = json.loads(json.dumps(registration()))
    doc["metadata"].pop("annotations", None)  # cert-manager's CA injection: the caBundle is given here
    webhook = doc["webhooks"][0]
    webhook["clientConfig"] = {"url": url, "caBundle": base64.b64encode(ca.read_bytes()).decode()}
    server.call(lambda e: e.put_object("admissionregistration.k8s.io/v1", "validatingwebhookconfigurations", doc))
    return doc


def kubectl(server: EmulatorServer, tmp: Path, *args: str, stdin: str | None = None) -> Any:
    """kubectl as a person (`--as`: it sends no token to a plain-HTTP server)."""
    env = {**os.environ, "KUBECONFIG": os.devnull, "HOME": str(tmp)}
    return subprocess.run([str(KUBECTL), "--server", server.url, "--as", PERSON, *args], input=stdin,
                          capture_output=True, text=True, timeout=60, env=env)  # fmt: skip


@needs_kubectl
def test_kubectl_apply_of_a_second_live_claim_is_refused_as_by_the_real_server(
    emulator: EmulatorServer, certificate: tuple[pki.Authority, pki.Pair], tmp_path: Path
) -> None:
    ca, pair = certificate
    store(emulator, claim("worker-1-a1b2c3", "worker-1", "booting"))
    with Served(pair, operator_kube(emulator)) as served:
        register(emulator, served.url, ca.cert)
        # --validate=false: the emulator serves no OpenAPI document for kubectl's client-side check
        done = kubectl(emulator, tmp_path, "apply", "--validate=false", "-f", "-",
                       stdin=yaml.safe_dump(claim("by-hand", "worker-1")))  # fmt: skip
        assert done.returncode == 1 and done.stderr == REAL_REFUSAL
        done = kubectl(emulator, tmp_path, "apply", "--validate=false", "-f", "-",
                       stdin=yaml.safe_dump(claim("by-hand", "worker-2")))  # fmt: skip
        assert done.returncode == 0, done.stderr
    calls = [(c.user, c.operation, c.name, c.outcome) for c in emulator.emulator.webhook_calls]
    assert calls == [(PERSON, "CREATE", "by-hand", "denied"), (PERSON, "CREATE", "by-hand", "allowed")]


def test_with_the_webhook_down_the_operators_writes_and_deletes_pass_and_a_hand_claim_is_refused(
    emulator: EmulatorServer, certificate: tuple[pki.Authority, pki.Pair]
) -> None:
    ca, pair = certificate
    claims = f"/apis/{names.API_VERSION}/namespaces/{NS}/{names.PLURAL_NODECLAIMS}"
    store(emulator, claim("worker-1-a1b2c3", "worker-1", "booting"))
    with Served(pair, operator_kube(emulator)) as served:
        register(emulator, served.url, ca.cert)
        served.stop()  # the operator is down; the registration stays
        # The operator's own writes: a claim on a slot whose last claim's end is still in flight, its terminal write.
        code, _ = send(emulator, "POST", claims, claim("worker-1-d4e5f6", "worker-1"), token="operator-token")
        assert code == 201
        code, _ = send(emulator, "PATCH", f"{claims}/worker-1-a1b2c3/status", {"status": {"phase": "failed"}},
                       token="operator-token", content_type=MERGE)  # fmt: skip
        assert code == 200
        # A person's delete of a live claim, and the streak reset the seed documents: never sent.
        assert send(emulator, "PATCH", f"{claims}/worker-1-d4e5f6/status", {"status": {"shutdownAttempts": 0}},
                    token="person-token", content_type=MERGE)[0] == 200  # fmt: skip
        assert send(emulator, "DELETE", f"{claims}/worker-1-d4e5f6", token="person-token")[0] == 200
        # A person's new claim: the failure policy refuses it, saying why.
        code, status = send(emulator, "POST", claims, claim("by-hand", "worker-2"), token="person-token")
        assert code == 500 and status["reason"] == "InternalError", status
        assert status["message"].startswith(
            'Internal error occurred: failed calling webhook "nodeclaims.infra.homecluster.dev": failed to call '
            f'webhook: Post "{served.url}?timeout=5s": dial tcp 127.0.0.1:{served.server.port}: connect: '
            "connection refused"
        ), status["message"]
    assert [(c.user, c.outcome) for c in emulator.emulator.webhook_calls] == [(PERSON, "failed")]
