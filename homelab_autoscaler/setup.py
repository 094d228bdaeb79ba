"""`homelab-autoscaler temporal-setup`: what the bundled Temporal needs before the operator's first workflow, done
idempotently by an init container of the operator's Pod (docs/decisions.md, "The bundled Temporal's setup").

Two steps, each safe to repeat on every start: the PostgreSQL password Secret created when absent (never replaced:
a Secret a user brought is theirs), then, once the frontend answers, the operator's namespace registered with its
retention and its search attributes added. An init container rather than a Job: it runs again on every start of
the operator (a Temporal restored from an old backup or a fresh database gets its namespace back), orders itself
before the operator without hooks, and has no immutable spec for `kubectl apply`, Helm, Flux or Argo CD to trip on.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import string
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from google.protobuf.duration_pb2 import Duration
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from homelab_autoscaler.errors import UserError
from homelab_autoscaler.settings import TemporalSettings
from homelab_autoscaler.temporal import TemporalUnreachable, connect_at_start, register_search_attributes

log = logging.getLogger(__name__)

PASSWORD_KEY = "password"
PASSWORD_LENGTH = 32
# Letters and digits only: the password goes into a libpq connection string and a YAML file unquoted-safe.
PASSWORD_ALPHABET = string.ascii_letters + string.digits
CALL_TIMEOUT = timedelta(seconds=10)
KUBE_TIMEOUT = 10.0


@dataclass(frozen=True)
class SetupPlan:
    """What one run does: the Secret to ensure (empty: none) and the namespace's retention."""

    secret_namespace: str
    secret_name: str
    retention: timedelta
    wait_seconds: float


def new_password() -> str:
    return "".join(secrets.choice(PASSWORD_ALPHABET) for _ in range(PASSWORD_LENGTH))


def ensure_password_secret(core: Any, namespace: str, name: str) -> bool:
    """Create `name` with a random password unless it exists; True when this call created it. A Secret that exists
    without the key is a user's mistake, said in one line naming it (nothing is written over it)."""
    from kubernetes.client.exceptions import ApiException

    try:
        found = core.read_namespaced_secret(name, namespace, _request_timeout=KUBE_TIMEOUT)
    except ApiException as err:
        if err.status != 404:
            raise UserError(f"cannot read Secret {namespace}/{name}: {err.status} {err.reason}") from None
    else:
        if PASSWORD_KEY not in (found.data or {}) and PASSWORD_KEY not in (found.string_data or {}):
            raise UserError(f"Secret {namespace}/{name} has no key {PASSWORD_KEY!r}: add it, or delete the Secret "
                            "and the next start creates one")  # fmt: skip
        return False
    body = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/part-of": "homelab-autoscaler",
                                "app.kubernetes.io/managed-by": "homelab-autoscaler"}},
        "stringData": {PASSWORD_KEY: new_password()},
    }  # fmt: skip
    try:
        core.create_namespaced_secret(namespace, body, _request_timeout=KUBE_TIMEOUT)
    except ApiException as err:
        if err.status == 409:  # another Pod's init container made it first: theirs is the one
            return False
        raise UserError(f"cannot create Secret {namespace}/{name}: {err.status} {err.reason}") from None
    return True


async def ensure_namespace(client: Client, namespace: str, retention: timedelta) -> bool:
    """Register `namespace` with `retention` unless it exists; True when this call registered it. An existing
    namespace keeps the retention it has (a person may have changed it): the run says what it is."""
    try:
        described = await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=namespace), timeout=CALL_TIMEOUT
        )
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
    else:
        kept = described.config.workflow_execution_retention_ttl.ToTimedelta()
        log.info("Temporal namespace %s exists (retention %s): kept as it is", namespace, kept)
        return False
    ttl = Duration()
    ttl.FromTimedelta(retention)
    try:
        await client.workflow_service.register_namespace(
            RegisterNamespaceRequest(namespace=namespace, workflow_execution_retention_period=ttl,
                                     description="homelab-autoscaler's claims"),
            timeout=CALL_TIMEOUT,
        )  # fmt: skip
    except RPCError as refused:
        if refused.status != RPCStatusCode.ALREADY_EXISTS:
            raise
        return False
    return True


async def wait_for_namespace(client: Client, namespace: str, within: float) -> None:
    """A registered namespace is served once the frontend's namespace cache refreshes (up to ~10 s): wait for it."""
    deadline = time.monotonic() + within
    while True:
        try:
            await client.workflow_service.describe_namespace(
                DescribeNamespaceRequest(namespace=namespace), timeout=CALL_TIMEOUT
            )
            return
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND or time.monotonic() >= deadline:
                raise UserError(f"Temporal namespace {namespace!r} not served within {within:.0f} s after it was "
                                f"registered: {err.message}") from None  # fmt: skip
        await asyncio.sleep(1.0)


def said(span: timedelta) -> str:
    """A duration as the command took it: `7d`, `72h`, `30m`."""
    seconds = int(span.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


async def _with_namespace_served(call: Callable[[], Awaitable[None]], within: float) -> None:
    """`call`, again while the operator service's own cache does not know a namespace registered moments ago."""
    deadline = time.monotonic() + within
    while True:
        try:
            await call()
            return
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(1.0)


async def setup_temporal(temporal: TemporalSettings, plan: SetupPlan, core: Any | None) -> int:
    """Both steps, in order; each says what it did in one line."""
    if plan.secret_name:
        if core is None:
            raise UserError("the PostgreSQL password Secret needs the Kubernetes API (a Pod's, or a kubeconfig)")
        made = ensure_password_secret(core, plan.secret_namespace, plan.secret_name)
        print(f"Secret {plan.secret_namespace}/{plan.secret_name}: {'created' if made else 'exists, kept'}", flush=True)
    # The operator's namespace may not exist yet: connect through `temporal-system`, which every server has.
    bootstrap = temporal.model_copy(update={"namespace": "temporal-system"})
    try:
        client = await connect_at_start(bootstrap, within=plan.wait_seconds)
    except TemporalUnreachable as err:
        raise UserError(f"Temporal at {temporal.address} did not answer within {plan.wait_seconds:.0f} s: "
                        f"{err.reason}") from None  # fmt: skip
    made = await ensure_namespace(client, temporal.namespace, plan.retention)
    if made:
        await wait_for_namespace(client, temporal.namespace, within=60)
    print(f"Temporal namespace {temporal.namespace}: "
          f"{f'registered, retention {said(plan.retention)}' if made else 'exists, kept'}", flush=True)  # fmt: skip
    await _with_namespace_served(lambda: register_search_attributes(client, temporal.namespace), within=60)
    print(f"search attributes of {temporal.namespace}: present", flush=True)
    return 0
