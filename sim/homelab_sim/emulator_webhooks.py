"""Validating admission webhooks, called as kube-apiserver 1.35 calls them, and who is asking.

Identity: a request with ``Authorization: Bearer <token>`` is the user the emulator was given for that token
(``KubeEmulator.users``); an unknown token is refused 401, as by a real server; a request without one is
``system:anonymous``; one with ``Impersonate-User`` (``kubectl --as``) is that user. Nothing is authorized by it
(the emulator has no RBAC): it is what a webhook and its ``matchConditions`` see as ``request.userInfo``.

Webhooks: the ``ValidatingWebhookConfiguration`` objects stored in the emulator, matched and called the way
``k8s.io/apiserver/pkg/admission/plugin/webhook`` does it, for a write that arrives over HTTP (the direct helpers
and the simulated controllers write past admission, as etcd would take it):

- ``rules`` (operations, apiGroups, apiVersions, ``resources`` with ``*``, ``*/*``, ``res/*``, ``*/sub``, and
  ``scope``), ``namespaceSelector`` (the Namespace's labels; a Namespace the emulator does not hold has only
  ``kubernetes.io/metadata.name``) and ``objectSelector`` (the new or the old object's labels);
- ``matchConditions``, CEL over ``object``, ``oldObject`` and ``request`` (``authorizer`` is not modelled: an
  expression that uses it fails to evaluate, which the failure policy decides, as for any evaluation error);
- the call: ``POST <clientConfig.url>?timeout=<n>s`` with an ``admission.k8s.io/v1`` AdmissionReview, verified
  against ``caBundle``; ``timeoutSeconds`` (10 by default). A ``service`` reference cannot be routed (no cluster
  network), which is a failed call;
- the answer: a denial is the webhook's status with the real server's wording (``admission webhook "x" denied
  the request: ...``, a code below 400 made 400); a failed call is refused 500 ``failed calling webhook`` under
  ``failurePolicy: Fail`` (the default) and skipped under ``Ignore``; a dry run reaches only webhooks whose
  ``sideEffects`` are ``None`` or ``NoneOnDryRun``.

Every decision is kept in ``KubeEmulator.webhook_calls`` (readable at ``/_sim/webhook-calls``).
Not modelled: mutating webhooks, ``matchPolicy: Equivalent`` across versions, the ``v1beta1`` review, and
reinvocation.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import ssl
import urllib.parse
import uuid
from collections.abc import Mapping, MutableSequence, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from homelab_sim.emulator_errors import ApiError
from homelab_sim.emulator_resources import ResourceSpec
from homelab_sim.emulator_select import SelectorError, parse_label_selector

__all__ = [
    "ANONYMOUS",
    "WEBHOOK_CONFIGURATIONS",
    "Attributes",
    "UserInfo",
    "WebhookCall",
    "call_webhooks",
    "matching",
]

Obj = dict[str, Any]
WEBHOOK_CONFIGURATIONS = ("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations")
REVIEW_VERSION = "admission.k8s.io/v1"
DEFAULT_TIMEOUT = 10
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class UserInfo:
    """Who made a request, as a webhook sees it."""

    username: str
    groups: tuple[str, ...] = ("system:authenticated",)

    def as_json(self) -> Obj:
        return {"username": self.username, "groups": list(self.groups)}


ANONYMOUS = UserInfo("system:anonymous", ("system:unauthenticated",))


@dataclass(frozen=True)
class Attributes:
    """One write as admission sees it: the resource, the operation, the objects, the user."""

    spec: ResourceSpec
    subresource: str | None
    operation: str  # CREATE, UPDATE, DELETE
    namespace: str | None
    name: str
    obj: Obj | None
    old: Obj | None
    user: UserInfo
    dry_run: bool = False
    options: Obj = field(default_factory=dict)

    def request(self, uid: str) -> Obj:
        """The AdmissionRequest (also CEL's ``request`` in ``matchConditions``)."""
        kind = {"group": self.spec.group, "version": self.spec.version, "kind": self.spec.kind}
        resource = {"group": self.spec.group, "version": self.spec.version, "resource": self.spec.plural}
        doc: Obj = {
            "uid": uid,
            "kind": kind,
            "resource": resource,
            "requestKind": kind,
            "requestResource": resource,
            "name": self.name,
            "namespace": self.namespace or "",
            "operation": self.operation,
            "userInfo": self.user.as_json(),
            "object": self.obj,
            "oldObject": self.old,
            "dryRun": self.dry_run,
            "options": self.options,
        }
        if self.subresource:
            doc["subResource"] = doc["requestSubResource"] = self.subresource
        if not self.namespace:
            del doc["namespace"]
        return doc


@dataclass(frozen=True)
class WebhookCall:
    """One webhook's decision on one write: allowed, denied, failed (refused by the policy) or ignored."""

    webhook: str
    user: str
    operation: str
    resource: str
    namespace: str
    name: str
    outcome: str
    message: str = ""

    def as_json(self) -> Obj:
        return dict(self.__dict__)


# --- matching ---------------------------------------------------------------------------------------------------
def _rule_matches(rule: Mapping[str, Any], attrs: Attributes) -> bool:
    operations = rule.get("operations") or []
    if "*" not in operations and attrs.operation not in operations:
        return False
    groups, versions = rule.get("apiGroups") or [], rule.get("apiVersions") or []
    if "*" not in groups and attrs.spec.group not in groups:
        return False
    if "*" not in versions and attrs.spec.version not in versions:
        return False
    scope = rule.get("scope") or "*"
    if (scope == "Cluster" and attrs.spec.namespaced) or (scope == "Namespaced" and not attrs.spec.namespaced):
        return False
    plural, sub = attrs.spec.plural, attrs.subresource or ""
    for entry in rule.get("resources") or []:  # rules.Matcher.resource: "*" is no subresource, "x/*" any
        res, _, entry_sub = str(entry).partition("/")
        if res in ("*", plural) and entry_sub in ("*", sub):
            return True
    return False


def _selector_text(selector: Mapping[str, Any]) -> str:
    """A LabelSelector object as the selector string the emulator parses."""
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), ",".join(expr.get("values") or [])
        forms = {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": f"{key}"}
        parts.append(forms.get(str(op), f"!{key}" if op == "DoesNotExist" else f"{key} ?{op}"))
    return ",".join(parts)


def _selected(selector: Mapping[str, Any] | None, *labels: Mapping[str, Any] | None) -> bool:
    if not selector:
        return True
    try:
        parsed = parse_label_selector(_selector_text(selector))
    except SelectorError:
        return False
    return any(parsed.matches(each or {}) for each in labels)


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    meta = (obj or {}).get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return labels if isinstance(labels, dict) else {}


def matching(configs: Sequence[Mapping[str, Any]], attrs: Attributes, namespace: Obj | None) -> list[Obj]:
    """The webhooks of `configs` whose rules and selectors take this write (before their matchConditions)."""
    ns_labels = {**_labels(namespace), NAMESPACE_NAME_LABEL: attrs.namespace} if attrs.namespace else {}
    found: list[Obj] = []
    for config in configs:
        for hook in config.get("webhooks") or []:
            if not any(_rule_matches(rule, attrs) for rule in hook.get("rules") or []):
                continue
            if attrs.spec.namespaced and not _selected(hook.get("namespaceSelector"), ns_labels):
                continue
            if not _selected(hook.get("objectSelector"), _labels(attrs.obj), _labels(attrs.old)):
                continue
            found.append(hook)
    return found


@functools.cache
def _cel_env() -> Any:
    from cel_expr_python import cel

    dyn = cel.Type.DYN
    return cel.NewEnv(variables={"object": dyn, "oldObject": dyn, "request": dyn})


def conditions_hold(hook: Mapping[str, Any], attrs: Attributes, request: Obj) -> bool:
    """Every matchCondition is true (the webhook is called); False when one is false. An expression that does not
    evaluate raises ValueError naming it: the failure policy decides, as on a real server."""
    data = {"object": attrs.obj, "oldObject": attrs.old, "request": request}
    for condition in hook.get("matchConditions") or []:
        name = str(condition.get("name") or "")
        try:
            result = _cel_env().compile(str(condition.get("expression") or "")).eval(data=data)
        except RuntimeError as exc:
            raise ValueError(f"matchCondition {name!r}: {exc}") from None
        value = result.plain_value()
        if not isinstance(value, bool):
            raise ValueError(f"matchCondition {name!r} evaluated to {value!r}, not a bool")
        if not value:
            return False
    return True


# --- calling ----------------------------------------------------------------------------------------------------
class CallFailed(Exception):
    """The webhook could not be called or did not answer a review."""


def _context(hook: Mapping[str, Any]) -> ssl.SSLContext:
    bundle = (hook.get("clientConfig") or {}).get("caBundle")
    if bundle:
        return ssl.create_default_context(cadata=base64.b64decode(bundle).decode())
    return ssl.create_default_context()


def _url(hook: Mapping[str, Any], timeout: int) -> str:
    config = hook.get("clientConfig") or {}
    if not config.get("url"):
        service = config.get("service") or {}
        where = f"https://{service.get('name')}.{service.get('namespace')}.svc:{service.get('port') or 443}"
        raise CallFailed(
            f'Post "{where}{service.get("path") or ""}?timeout={timeout}s": the emulator routes no Service '
            "(give the webhook a clientConfig.url)"
        )
    url = str(config["url"])
    return url + ("&" if urllib.parse.urlsplit(url).query else "?") + f"timeout={timeout}s"


async def _post(hook: Mapping[str, Any], review: Obj) -> Obj:
    timeout = int(hook.get("timeoutSeconds") or DEFAULT_TIMEOUT)
    url = _url(hook, timeout)
    where = urllib.parse.urlsplit(url).netloc
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.post(url, json=review, ssl=_context(hook)) as resp,
        ):
            text = await resp.text()
            if resp.status != 200:
                raise CallFailed(f'Post "{url}": the server answered {resp.status}: {text.strip()[:200]}')
    except TimeoutError:
        raise CallFailed(f'Post "{url}": context deadline exceeded') from None
    except aiohttp.ClientConnectorError as exc:
        refused = isinstance(exc.os_error, ConnectionRefusedError)
        cause = "connect: connection refused" if refused else str(exc.os_error or exc)
        raise CallFailed(f'Post "{url}": dial tcp {where}: {cause}') from None
    except aiohttp.ClientError as exc:
        raise CallFailed(f'Post "{url}": {exc}') from None
    try:
        answer = json.loads(text)
    except ValueError:
        raise CallFailed("received invalid webhook response: the body is not JSON") from None
    if not isinstance(answer, dict) or not isinstance(answer.get("response"), dict):
        raise CallFailed("received invalid webhook response: no response in the AdmissionReview")
    result: Obj = answer["response"]
    return result


def _denial(name: str, status: Mapping[str, Any] | None) -> ApiError:
    """The webhook's refusal as the real server words it (errors.ToStatusErr)."""
    status = status or {}
    code = int(status.get("code") or 0)
    code = max(code, 400)
    denied = f'admission webhook "{name}" denied the request'
    if status.get("message"):
        message = f"{denied}: {status['message']}"
    elif status.get("reason"):
        message = f"{denied}: {status['reason']}"
    else:
        message = f"{denied} without explanation"
    return ApiError(code, str(status.get("reason") or ""), message, dict(status.get("details") or {}))


async def _one(hook: Mapping[str, Any], attrs: Attributes, log: MutableSequence[WebhookCall]) -> ApiError | None:
    """Call one webhook: None when the write may go on, else the refusal."""
    name = str(hook.get("name") or "")
    uid = str(uuid.uuid4())
    request = attrs.request(uid)
    fail = (hook.get("failurePolicy") or "Fail") == "Fail"

    def record(outcome: str, message: str = "") -> None:
        plural = attrs.spec.plural + (f"/{attrs.subresource}" if attrs.subresource else "")
        log.append(WebhookCall(name, attrs.user.username, attrs.operation, plural, attrs.namespace or "",
                               attrs.name, outcome, message))  # fmt: skip

    try:
        if not conditions_hold(hook, attrs, request):
            return None
        if attrs.dry_run and hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
            record("denied", "no dry run")
            return ApiError(400, "BadRequest", f"admission webhook {name!r} does not support dry run")
        answer = await _post(hook, {"apiVersion": REVIEW_VERSION, "kind": "AdmissionReview", "request": request})
        if answer.get("uid") != uid:
            raise CallFailed(f"expected response.uid={uid!r}, got {answer.get('uid')!r}")
    except (CallFailed, ValueError) as exc:
        message = f'failed calling webhook "{name}": failed to call webhook: {exc}'
        record("failed" if fail else "ignored", message)
        return ApiError(500, "InternalError", f"Internal error occurred: {message}") if fail else None
    if answer.get("allowed") is True:
        record("allowed")
        return None
    refusal = _denial(name, answer.get("status"))
    record("denied", refusal.message)
    return refusal


async def call_webhooks(
    hooks: Sequence[Mapping[str, Any]], attrs: Attributes, log: MutableSequence[WebhookCall]
) -> None:
    """Call every matching webhook at once, as the real server does for validating ones; raise the first refusal."""
    results = await asyncio.gather(*(_one(hook, attrs, log) for hook in hooks))
    for refusal in results:
        if refusal is not None:
            raise refusal
