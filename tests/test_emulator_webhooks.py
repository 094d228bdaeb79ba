"""The emulator's validating admission webhooks and identities (homelab_sim/emulator_webhooks.py), each semantic
pinned against a webhook of the test's own over HTTPS: which writes are sent (rules, selectors, matchConditions),
what a refusal and a failed call look like, the failure policy, dry runs, and who the request says is asking.

The wording is kube-apiserver 1.35's (k8s.io/apiserver/pkg/admission/plugin/webhook); the operator's own webhook
against the real server is tests/realcluster/test_admission_real.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from homelab_sim.emulator import EmulatorServer, UserInfo

from tests.realcluster import pki

GV = "infra.homecluster.dev/v2alpha1"
NS = "lab"
CLAIMS = f"/apis/{GV}/namespaces/{NS}/nodeclaims"
VWC = "admissionregistration.k8s.io/v1", "validatingwebhookconfigurations"
Answer = Callable[[dict[str, Any]], dict[str, Any]]


def allow(request: dict[str, Any]) -> dict[str, Any]:
    return {"uid": request["uid"], "allowed": True}


class Hook:
    """A webhook of the test's own on HTTPS: it records every review and answers with `answer`."""

    def __init__(self, pair: pki.Pair) -> None:
        self.pair = pair
        self.reviews: list[dict[str, Any]] = []
        self.answer: Answer = allow
        self.delay = 0.0
        self.on_call: Callable[[], None] = lambda: None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.port = 0
        self.runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        review = await request.json()
        self.reviews.append(review["request"])
        await asyncio.to_thread(self.on_call)
        await asyncio.sleep(self.delay)
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                  "response": self.answer(review["request"])})  # fmt: skip

    async def _start(self) -> None:
        import ssl

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(self.pair.cert), str(self.pair.key))
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def __enter__(self) -> Hook:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    def stop(self) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
            self.runner = None

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/hook"


@pytest.fixture
def ca(tmp_path: Path) -> pki.Authority:
    return pki.Authority(tmp_path / "pki")


@pytest.fixture
def hook(ca: pki.Authority) -> Iterator[Hook]:
    with Hook(ca.issue("hook", "hook", server=True, ips=("127.0.0.1",))) as h:
        yield h


@pytest.fixture
def srv() -> Iterator[EmulatorServer]:
    with EmulatorServer(strict=False, users={"t-person": UserInfo("alice", ("team",))}) as server:
        yield server


def register(srv: EmulatorServer, hook: Hook, ca: pki.Authority, **webhook: Any) -> None:
    config = {
        "name": "claims.test",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "timeoutSeconds": 5,
        "clientConfig": {"url": hook.url, "caBundle": base64.b64encode(ca.cert.read_bytes()).decode()},
        "rules": [{"apiGroups": ["infra.homecluster.dev"], "apiVersions": ["*"], "operations": ["CREATE"],
                   "resources": ["nodeclaims"]}],
        **webhook,
    }  # fmt: skip
    doc = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
           "metadata": {"name": "test"}, "webhooks": [config]}  # fmt: skip
    srv.call(lambda e: e.put_object(*VWC, doc))


def send(srv: EmulatorServer, method: str, path: str, body: Any = None, *, token: str = "", as_user: str = "",
         content_type: str = "application/json") -> tuple[int, dict[str, Any]]:  # fmt: skip
    headers = {"Content-Type": content_type, **({"Authorization": f"Bearer {token}"} if token else {})}
    if as_user:
        headers["Impersonate-User"] = as_user
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(srv.url + path, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def claim(name: str, node: str = "n1", **meta: Any) -> dict[str, Any]:
    return {"apiVersion": GV, "kind": "NodeClaim", "metadata": {"name": name, **meta}, "spec": {"node": node}}


def merge(srv: EmulatorServer, name: str, body: Any, sub: str = "") -> tuple[int, dict[str, Any]]:
    path = f"{CLAIMS}/{name}" + (f"/{sub}" if sub else "")
    return send(srv, "PATCH", path, body, content_type="application/merge-patch+json")


# --- identity -------------------------------------------------------------------------------------------------------
def test_the_user_is_the_tokens_or_the_impersonated_and_an_unknown_token_is_refused(
    srv: EmulatorServer, hook: Hook, ca: pki.Authority
) -> None:
    register(srv, hook, ca)
    assert send(srv, "POST", CLAIMS, claim("a"), token="t-person")[0] == 201
    assert send(srv, "POST", CLAIMS, claim("b"))[0] == 201
    assert send(srv, "POST", CLAIMS, claim("c"), as_user="bob")[0] == 201
    assert [r["userInfo"] for r in hook.reviews] == [
        {"username": "alice", "groups": ["team"]},
        {"username": "system:anonymous", "groups": ["system:unauthenticated"]},
        {"username": "bob", "groups": ["system:authenticated"]},
    ]
    code, status = send(srv, "GET", CLAIMS, token="nobody-knows-it")
    assert (code, status["reason"]) == (401, "Unauthorized")


# --- what is sent ----------------------------------------------------------------------------------------------------
def test_rules_send_their_operations_and_resources_only(srv: EmulatorServer, hook: Hook, ca: pki.Authority) -> None:
    register(srv, hook, ca, rules=[{"apiGroups": ["infra.homecluster.dev"], "apiVersions": ["v2alpha1"],
                                    "operations": ["UPDATE"], "resources": ["nodeclaims/status"]}])  # fmt: skip
    assert send(srv, "POST", CLAIMS, claim("a"))[0] == 201
    assert merge(srv, "a", {"spec": {"node": "n2"}})[0] == 200
    assert merge(srv, "a", {"status": {"phase": "failed"}}, "status")[0] == 200
    assert send(srv, "DELETE", f"{CLAIMS}/a")[0] == 200
    (only,) = hook.reviews
    assert (only["operation"], only["subResource"], only["object"]["status"]) == (
        "UPDATE",
        "status",
        {"phase": "failed"},
    )
    assert only["oldObject"]["spec"]["node"] == "n2" and "status" not in only["oldObject"]
    assert only["resource"] == {"group": "infra.homecluster.dev", "version": "v2alpha1", "resource": "nodeclaims"}


def test_selectors_and_match_conditions_decide_who_is_called(
    srv: EmulatorServer, hook: Hook, ca: pki.Authority
) -> None:
    register(srv, hook, ca,
             objectSelector={"matchExpressions": [{"key": "hand", "operator": "Exists"}]},
             namespaceSelector={"matchLabels": {"kubernetes.io/metadata.name": NS}},
             matchConditions=[{"name": "not-alice", "expression": "request.userInfo.username != 'alice'"}])  # fmt: skip
    assert send(srv, "POST", CLAIMS, claim("unlabelled"))[0] == 201
    assert send(srv, "POST", CLAIMS, claim("alices", labels={"hand": "y"}), token="t-person")[0] == 201
    assert send(srv, "POST", CLAIMS, claim("sent", labels={"hand": "y"}))[0] == 201
    other = CLAIMS.replace(f"/namespaces/{NS}/", "/namespaces/elsewhere/")
    assert send(srv, "POST", other, claim("other-ns", labels={"hand": "y"}))[0] == 201
    assert [r["name"] for r in hook.reviews] == ["sent"]


def test_a_match_condition_that_does_not_evaluate_is_the_failure_policys(
    srv: EmulatorServer, hook: Hook, ca: pki.Authority
) -> None:
    broken = [{"name": "broken", "expression": "object.spec.nothing == 'x'"}]
    register(srv, hook, ca, matchConditions=broken)
    code, status = send(srv, "POST", CLAIMS, claim("a"))
    assert code == 500 and 'failed calling webhook "claims.test"' in status["message"], status
    register(srv, hook, ca, failurePolicy="Ignore", matchConditions=broken)
    assert send(srv, "POST", CLAIMS, claim("a"))[0] == 201
    assert hook.reviews == []


# --- answers ---------------------------------------------------------------------------------------------------------
def test_a_refusal_reads_as_the_real_servers(srv: EmulatorServer, hook: Hook, ca: pki.Authority) -> None:
    register(srv, hook, ca)
    hook.answer = lambda r: {"uid": r["uid"], "allowed": False,
                             "status": {"code": 403, "reason": "Forbidden", "message": "slot n1 is taken"}}  # fmt: skip
    code, status = send(srv, "POST", CLAIMS, claim("a"))
    assert (code, status["reason"]) == (403, "Forbidden")
    assert status["message"] == 'admission webhook "claims.test" denied the request: slot n1 is taken'
    hook.answer = lambda r: {"uid": r["uid"], "allowed": False}
    code, status = send(srv, "POST", CLAIMS, claim("a"))
    assert code == 400 and status["message"] == 'admission webhook "claims.test" denied the request without explanation'
    hook.answer = lambda r: {"uid": "not-" + r["uid"], "allowed": True}
    code, status = send(srv, "POST", CLAIMS, claim("a"))
    assert code == 500 and "expected response.uid=" in status["message"]
    assert srv.call(lambda e: e.get_object(GV, "nodeclaims", NS, "a")) is None, "nothing refused was stored"


def test_a_webhook_that_is_down_slow_or_unroutable_is_the_failure_policys(
    srv: EmulatorServer, hook: Hook, ca: pki.Authority
) -> None:
    register(srv, hook, ca, timeoutSeconds=1)
    hook.delay = 1.5
    code, status = send(srv, "POST", CLAIMS, claim("slow"))
    assert code == 500 and status["message"].endswith(f'Post "{hook.url}?timeout=1s": context deadline exceeded')
    hook.delay = 0
    hook.stop()
    code, status = send(srv, "POST", CLAIMS, claim("down"))
    assert code == 500 and status["message"] == (
        'Internal error occurred: failed calling webhook "claims.test": failed to call webhook: '
        f'Post "{hook.url}?timeout=1s": dial tcp 127.0.0.1:{hook.port}: connect: connection refused'
    )
    register(srv, hook, ca, failurePolicy="Ignore")
    assert send(srv, "POST", CLAIMS, claim("ignored"))[0] == 201
    register(srv, hook, ca, clientConfig={"service": {"name": "svc", "namespace": "ns", "path": "/hook"}})
    code, status = send(srv, "POST", CLAIMS, claim("unroutable"))
    assert code == 500 and "the emulator routes no Service" in status["message"]
    outcomes = [c.outcome for c in srv.emulator.webhook_calls]
    assert outcomes == ["failed", "failed", "ignored", "failed"]


def test_a_dry_run_reaches_only_a_webhook_without_side_effects(
    srv: EmulatorServer, hook: Hook, ca: pki.Authority
) -> None:
    register(srv, hook, ca, sideEffects="Some")
    code, status = send(srv, "POST", CLAIMS + "?dryRun=All", claim("a"))
    assert code == 400 and "does not support dry run" in status["message"]
    register(srv, hook, ca)
    assert send(srv, "POST", CLAIMS + "?dryRun=All", claim("a"))[0] == 201
    assert [r["dryRun"] for r in hook.reviews] == [True]


# --- the write that was judged is the one stored ---------------------------------------------------------------------
def test_a_generated_name_is_the_one_judged(srv: EmulatorServer, hook: Hook, ca: pki.Authority) -> None:
    register(srv, hook, ca)
    code, created = send(srv, "POST", CLAIMS, {**claim(""), "metadata": {"generateName": "hand-"}})
    assert code == 201 and hook.reviews[0]["object"]["metadata"]["name"] == created["metadata"]["name"]


def test_an_object_changed_while_the_webhook_answered_is_judged_again(
    srv: EmulatorServer, hook: Hook, ca: pki.Authority
) -> None:
    assert send(srv, "POST", CLAIMS, claim("a"))[0] == 201
    register(srv, hook, ca, rules=[{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["UPDATE"],
                                    "resources": ["*/*"]}])  # fmt: skip
    changed = threading.Event()

    def change_once() -> None:
        if not changed.is_set():
            changed.set()
            srv.call(lambda e: e.patch_object(GV, "nodeclaims", NS, "a", {"metadata": {"labels": {"by": "other"}}}))

    hook.on_call = change_once
    code, written = merge(srv, "a", {"spec": {"node": "n2"}})
    assert code == 200 and written["metadata"]["labels"] == {"by": "other"} and written["spec"]["node"] == "n2"
    assert [r["oldObject"]["metadata"].get("labels") for r in hook.reviews] == [None, {"by": "other"}]


def test_a_delete_is_sent_only_when_registered_and_then_may_be_refused(
    srv: EmulatorServer, hook: Hook, ca: pki.Authority
) -> None:
    assert send(srv, "POST", CLAIMS, claim("a"))[0] == 201
    register(srv, hook, ca, rules=[{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["DELETE"],
                                    "resources": ["nodeclaims"]}])  # fmt: skip
    hook.answer = lambda r: {"uid": r["uid"], "allowed": False, "status": {"code": 403, "message": "keep it"}}
    code, _ = send(srv, "DELETE", f"{CLAIMS}/a")
    assert code == 403 and hook.reviews[0]["object"] is None and hook.reviews[0]["oldObject"]["metadata"]["name"] == "a"
    started = time.monotonic()
    hook.answer = allow
    assert send(srv, "DELETE", f"{CLAIMS}/a")[0] == 200 and time.monotonic() - started < 5
