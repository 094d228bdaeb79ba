"""Connecting to Temporal and building the worker: one data converter, one task queue, search attributes checked."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import pkgutil
import re
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.failure.v1 import Failure
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.client import Client, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DefaultFailureConverter, PayloadConverter
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import (
    Interceptor,
    PollerBehavior,
    PollerBehaviorAutoscaling,
    PollerBehaviorSimpleMaximum,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkerTuner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

import workflows
from activities.expected import ExpectedFailures
from api.contracts import SEARCH_ATTRIBUTES, TASK_QUEUE
from homelab_autoscaler.errors import UserError
from homelab_autoscaler.settings import MetricsSettings, TemporalSettings
from workflows import metrics as operator_metrics
from workflows.registry import WORKFLOWS

log = logging.getLogger(__name__)


class ExpectedOutcomes(DefaultFailureConverter):
    """The SDK's failure converter, except that a benign application error (an expected outcome: a claim that
    closes Failed, a retryable API error) carries no stack trace. The Web UI shows a failure's stack trace under its
    message, and the SDK's frames there made a failed boot look like a crash of the operator."""

    def to_failure(self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure) -> None:
        super().to_failure(exception, payload_converter, failure)
        if isinstance(exception, ApplicationError) and exception.category == ApplicationErrorCategory.BENIGN:
            failure.stack_trace = ""


DATA_CONVERTER = dataclasses.replace(pydantic_data_converter, failure_converter_class=ExpectedOutcomes)
NAMESPACE_CHECK_TIMEOUT = timedelta(seconds=10)
_INDEXED = {"Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD, "Int": IndexedValueType.INDEXED_VALUE_TYPE_INT}


_RUNTIMES: dict[str, Runtime] = {}


def runtime_for(metrics_address: str | None) -> Runtime | None:
    """One SDK runtime per process and metrics address: it serves /metrics for the SDK and the operator.

    Named as Prometheus users expect: durations in seconds with a `_seconds` suffix, counters with `_total`
    (the exporter appends both, so the names in code stay bare), and no `service_name="temporal-core-sdk"` label,
    which says nothing about a metric of the operator's (a scrape's `job` and `instance` say where it came from).
    """
    if not metrics_address:
        return None
    if metrics_address not in _RUNTIMES:
        _RUNTIMES[metrics_address] = Runtime(
            telemetry=TelemetryConfig(
                attach_service_name=False,
                metrics=PrometheusConfig(
                    bind_address=metrics_address,
                    durations_as_seconds=True,
                    counters_total_suffix=True,
                    unit_suffix=True,
                    histogram_bucket_overrides={operator_metrics.TIME_TO_READY: operator_metrics.TIME_TO_READY_BUCKETS},
                ),
            )
        )
    return _RUNTIMES[metrics_address]


async def connect(temporal: TemporalSettings, metrics: MetricsSettings | None = None) -> Client:
    """A client with the operator's data converter, TLS/mTLS or an API key when configured, and metrics.

    Only a process that serves /metrics passes `metrics`: a command that merely reads Temporal (`claims`) binds
    no port, so it runs beside an operator that holds the metrics port.
    """
    tls: TLSConfig | bool = False
    if temporal.tls_ca or temporal.tls_cert:
        tls = TLSConfig(
            server_root_ca_cert=temporal.tls_ca.read_bytes() if temporal.tls_ca else None,
            client_cert=temporal.tls_cert.read_bytes() if temporal.tls_cert else None,
            client_private_key=temporal.tls_key.read_bytes() if temporal.tls_key else None,
            domain=temporal.tls_server_name,
        )
    elif temporal.api_key:
        tls = True
    try:
        client = await Client.connect(
            temporal.address,
            namespace=temporal.namespace,
            data_converter=DATA_CONVERTER,
            tls=tls,
            api_key=temporal.api_key,
            runtime=runtime_for(metrics.address if metrics else None),
        )
    except RuntimeError as err:
        raise TemporalUnreachable(temporal.address, str(err), hint=tls_hint(str(err), temporal)) from None
    await require_namespace(client, temporal)
    return client


def adopt_connection(client: Client, fresh: Client) -> None:
    """Point `client` at `fresh`'s connection, so everything holding `client` (the provider, the watchers, the health
    probe) makes its next call over it: the SDK reads a TLS certificate only when it connects and has no public way
    to give a Client another connection (a Worker takes one through its `client` setter). `Client` resolves its
    services from this one entry at each call; tests/test_reconnect.py holds the SDK to that."""
    client._config["service_client"] = fresh.service_client


# How long a role waits at its start for a Temporal that does not answer yet, before the one line and exit 1. An
# install starts Temporal's Pod beside the operator's (`helm install`, `kubectl apply -k`): without the wait the
# operator's first container exited and the kubelet restarted it (found on the real node, issue 30). Below the
# manifests' liveness allowance (10 s, then three failures 20 s apart), so waiting never gets the Pod killed.
START_WAIT_SECONDS = 30.0
# One try's bound: a Service whose Pod is gone answers a connect with nothing (the kernel retried the SYN for over a
# minute on the real node), and a silent peer holds the client's first call for 30 s.
CONNECT_ATTEMPT_SECONDS = 10.0


async def connect_at_start(
    temporal: TemporalSettings, metrics: MetricsSettings | None = None, *, within: float = START_WAIT_SECONDS
) -> Client:
    """`connect`, each try bounded, tried again every second while Temporal is unreachable, for at most `within`
    seconds; the wait is logged once, with the reason. Any other refusal (a namespace it lacks) is said at once."""
    deadline = time.monotonic() + within
    waiting = False
    while True:
        attempt = max(1.0, min(CONNECT_ATTEMPT_SECONDS, deadline - time.monotonic()))
        try:
            client = await asyncio.wait_for(connect(temporal, metrics), attempt)
        except (TemporalUnreachable, TimeoutError) as err:
            reason = err.reason if isinstance(err, TemporalUnreachable) else f"no answer within {attempt:.0f} s"
            if time.monotonic() >= deadline:
                hint = err.hint if isinstance(err, TemporalUnreachable) else ""
                raise TemporalUnreachable(temporal.address, reason, hint=hint) from None
            if not waiting:
                log.warning("Temporal at %s does not answer yet (%s): waiting up to %.0f s", temporal.address,
                            reason, within)  # fmt: skip
                waiting = True
            await asyncio.sleep(1.0)
            continue
        if waiting:
            log.info("Temporal at %s answers", temporal.address)
        return client


async def require_namespace(client: Client, temporal: TemporalSettings) -> None:
    """A namespace Temporal does not have is a mistake in a setting: one line naming it, before anything is asked
    of it (a list or a worker's poll failed with a page of the SDK's frames). Only NOT_FOUND says so: a
    namespace we may not describe (an API key's limits) is left for the real calls to judge."""
    try:
        await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=temporal.namespace), timeout=NAMESPACE_CHECK_TIMEOUT
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise UserError(
                f"Temporal at {temporal.address} has no namespace {temporal.namespace!r}: "
                "--temporal-namespace names another (`temporal operator namespace list` lists them)"
            ) from None


class TemporalUnreachable(RuntimeError):
    """Temporal did not answer the connection: said in one line, with the Rust client's error cut to its reason (the
    innermost one: "transport error" alone says nothing), and what to do (`hint`, else: is it running?)."""

    # Innermost first: an I/O error's words, its kind's name, hyper's own reason, then the gRPC status' message.
    REASONS = (r'error: "([^"]+)"', r"Kind\((\w+)\)", r'Error\(\w+, "([^"]+)"\)', r'message: "([^"]+)"')

    def __init__(self, address: str, error: str, *, hint: str = "") -> None:
        found = next((m for pattern in self.REASONS if (m := re.search(pattern, error))), None)
        self.reason = found.group(1).split(": https://", 1)[0] if found else error
        self.hint = hint
        what = hint or "Is it running (`make run` starts one)? --temporal-address names another"
        super().__init__(f"cannot reach Temporal at {address}: {self.reason}. {what}")


# What the Rust client says when the frontend and the client disagree on TLS: a TLS frontend closing on a plaintext
# client (a broken pipe), or refusing a session without a client certificate (an alert, or a close without notify);
# at the least, a connection made whose first call failed below gRPC ('message: "transport error"', or hyper's
# "canceled" of a connection the peer closed), which neither a frontend that is down (no connection) nor one still
# starting (a gRPC status of its own) answers.
TLS_SIGNS = ("broken pipe", "close_notify", "certificaterequired", "certificate", "handshake", "tls",
             'message: "transport error"', "hyper::error(canceled", "connection closed")  # fmt: skip


def tls_hint(error: str, temporal: TemporalSettings) -> str:
    """What to give when `error` looks like a TLS refusal, in the flags' names; "" when it does not."""
    if not any(sign in error.lower() for sign in TLS_SIGNS):
        return ""
    if temporal.tls_cert:
        return (
            "Its frontend refused the TLS session: is --temporal-tls-cert signed by a CA the frontend trusts, and "
            "--temporal-tls-ca the CA of the frontend's certificate?"
        )
    if temporal.tls_ca or temporal.tls_server_name or temporal.api_key:
        return (
            "Its frontend refused a session without a client certificate (mTLS): give --temporal-tls-cert and "
            "--temporal-tls-key (HOMELAB_AUTOSCALER_TEMPORAL_TLS_CERT, _KEY)"
        )
    return (
        "Its frontend may speak TLS and require a client certificate: give --temporal-tls-ca, --temporal-tls-cert "
        "and --temporal-tls-key (HOMELAB_AUTOSCALER_TEMPORAL_TLS_CA, _CERT, _KEY)"
    )


def search_attribute_flags() -> list[str]:
    """`temporal server start-dev` flags that register the operator's search attributes at start."""
    flags: list[str] = []
    for name, kind in SEARCH_ATTRIBUTES.items():
        flags += ["--search-attribute", f"{name}={kind}"]
    return flags


async def missing_search_attributes(client: Client, namespace: str) -> list[str]:
    resp = await client.operator_service.list_search_attributes(ListSearchAttributesRequest(namespace=namespace))
    have = set(resp.custom_attributes)
    return [name for name in SEARCH_ATTRIBUTES if name not in have]


async def register_search_attributes(client: Client, namespace: str, *, check_first: bool = True) -> None:
    """Add the operator's search attributes; existing ones are kept (the test server cannot list them)."""
    missing = await missing_search_attributes(client, namespace) if check_first else list(SEARCH_ATTRIBUTES)
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=namespace, search_attributes={n: _INDEXED[SEARCH_ATTRIBUTES[n]] for n in missing}
            )
        )


# The modules that define the registered workflow classes: the sandbox imports these afresh for every workflow.
WORKFLOW_DEFINITIONS = frozenset({"workflows.claim.workflow", "workflows.group.workflow", "workflows.release"})


def _workflow_helpers() -> tuple[str, ...]:
    """Every other module of `workflows` (the phases, the group's books, the shutdown driver, the patch table)."""
    found = pkgutil.walk_packages(workflows.__path__, prefix="workflows.")
    return tuple(sorted(m.name for m in found if not m.ispkg and m.name not in WORKFLOW_DEFINITIONS))


# Deterministic modules the sandbox need not re-import for every workflow it starts: the API's data, the pure
# rules and the workflows' own helper modules (no I/O, no clocks, no module state that changes:
# tests/test_hygiene.py holds them to that). Re-importing ~4,000 lines per workflow cost CPU at every start and
# about half a megabyte per cached workflow; the thin definition modules stay sandboxed.
PASSTHROUGH = ("api", "domain", *_workflow_helpers())


def sandbox_runner() -> SandboxedWorkflowRunner:
    """The sandbox stays on for workflow code; the pure modules pass through so they load once per process."""
    return SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules(*PASSTHROUGH))


def pollers(count: int, *, autoscaling: bool = False) -> PollerBehavior:
    """`count` task polls held at once (for workflow tasks, and as many for activities), or with `autoscaling` as
    many as Temporal asks for between one and `count`.

    Five polls (the SDK's default) took one task each per round trip: with 200 claims booting, workflow tasks
    waited 1-4 s (p50) in the queue while the worker's event loop idled. Ten fixed polls kept P1 at 200 where the
    autoscaler up to 50 had it (p99 2.97 against 3.62 s, issue 34), and at rest they cost 0.5 CPU s/h where the
    autoscaler's own ticks cost 8-11: the most of an idle operator's CPU (docs/decisions.md).
    """
    if autoscaling:
        return PollerBehaviorAutoscaling(minimum=1, maximum=count, initial=min(5, count))
    return PollerBehaviorSimpleMaximum(count)


# Workflow tasks share one interpreter: the SDK's default of 100 at once let a burst of 300 claims take tasks it
# could not finish within Temporal's 10-second task timeout (21 timed out in `make bench` P2 at 300; 0 with 8 at
# once, and the burst no slower). With few slots a task may wait its turn in the worker's sticky queue: 30 s
# before Temporal hands it to another poll (with 4 slots and the 10-second default, 226 sticky timeouts).
STICKY_WAIT = timedelta(seconds=30)


def build_worker(
    client: Client,
    activities: Sequence[Any],
    *,
    task_queue: str = TASK_QUEUE,
    max_activity_threads: int = 16,
    task_pollers: int = 10,
    poller_autoscaling: bool = False,
    workflow_task_slots: int = 8,
    max_cached_workflows: int = 300,
    sandboxed: bool = True,
    tuner: WorkerTuner | None = None,
    interceptors: Sequence[Interceptor] = (),
) -> Worker:
    """One worker for every workflow and activity; activities are synchronous (the kubernetes client is).

    `max_cached_workflows=0` replays every workflow task from its history (no sticky queue): slower, and what a
    test wants when it restarts workers at random, or wants every step replayed. `sandboxed=False` is for such a
    test only: the sandbox guards workflow code against I/O and clocks, which tests/test_hygiene.py checks too.
    `tuner` hands out the task slots (a test counts the workflow tasks in flight with it); without one,
    `workflow_task_slots` bounds the workflow tasks run at once (`STICKY_WAIT` says why). `interceptors` go after
    the operator's own (a test's).
    """
    return Worker(
        client,
        task_queue=task_queue,
        workflows=WORKFLOWS,
        activities=list(activities),
        activity_executor=concurrent.futures.ThreadPoolExecutor(max_workers=max_activity_threads),
        workflow_runner=sandbox_runner() if sandboxed else UnsandboxedWorkflowRunner(),
        max_cached_workflows=max_cached_workflows,
        interceptors=[ExpectedFailures(), *interceptors],
        tuner=tuner,
        max_concurrent_workflow_tasks=None if tuner is not None else workflow_task_slots,
        sticky_queue_schedule_to_start_timeout=STICKY_WAIT,
        workflow_task_poller_behavior=pollers(task_pollers, autoscaling=poller_autoscaling),
        activity_task_poller_behavior=pollers(task_pollers, autoscaling=poller_autoscaling),
    )
