"""The provider's side of the group workflows: make sure one runs, read it with Queries, write it with Updates.

Handlers are named by the tables in `api.contracts` (`GroupQuery`, `GroupUpdate`), never by bare strings.

The group workflow is the single authority on a group's size, so every size the provider reports comes from a
Query and every change goes through an Update whose validator refuses bad input before anything is recorded.
Writes to one group are serialized here (an asyncio.Lock per group): a burst from cluster-autoscaler queues in
the provider instead of meeting Temporal's limit of 10 in-flight Updates per workflow.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

import grpc
from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import QueryRejectCondition, WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from api import contracts as c
from provider.errors import WORKFLOW_CODES, ProviderError, unavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
# The share of the budget the group workflow may spend waiting for its first load; the rest carries its answer
# back before the RPC deadline, so "not loaded in time" arrives as the workflow's answer, not as a timeout.
LOAD_WAIT_SHARE = 0.8
MIN_STEP_SECONDS = 0.05  # the shortest RPC a step is given once the budget is spent (as the service's own floor)

_RPC_CODES: dict[RPCStatusCode, grpc.StatusCode] = {
    RPCStatusCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    RPCStatusCode.RESOURCE_EXHAUSTED: grpc.StatusCode.UNAVAILABLE,
    RPCStatusCode.CANCELLED: grpc.StatusCode.UNAVAILABLE,
}


class GroupGateway:
    """Queries and Updates of `GroupWorkflow` by name (the provider never imports workflow code)."""

    def __init__(
        self,
        client: Client,
        task_queue: str = c.TASK_QUEUE,
        *,
        reuse_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.task_queue = task_queue
        self.reuse_seconds = reuse_seconds
        self.clock = clock
        self._ready: set[str] = set()  # workflow ids this process has seen loaded
        self._ensured: set[str] = set()  # workflow ids made sure of since the last Refresh
        self._locks: dict[str, asyncio.Lock] = {}
        # A Query's answer, reused until the next Refresh, a write to its group, or `reuse_seconds`: within one
        # loop cluster-autoscaler asks each group's size and instances several times.
        self._answers: dict[tuple[str, str], tuple[float, Any]] = {}

    def refresh(self) -> None:
        """A new autoscaler loop: every group is asked afresh, and made sure of again (a deleted and re-created
        Group's workflow may have ended since)."""
        self._answers.clear()
        self._ensured.clear()

    # --- the workflow -------------------------------------------------------------------------------------
    def lock(self, ref: c.GroupRef) -> asyncio.Lock:
        wid = c.group_workflow_id(ref.namespace, ref.group)
        return self._locks.setdefault(wid, asyncio.Lock())

    async def ensure(self, ref: c.GroupRef, timeout: float) -> WorkflowHandle[Any, Any]:
        """Start the group workflow unless one runs (idempotent: the watchers signal-with-start the same id).

        The first time this process meets a group it also waits (one Update, within `timeout` in all) until the
        workflow has read its group, so a target size is never reported before the claims that make it up are known.
        """
        started = time.monotonic()
        wid = c.group_workflow_id(ref.namespace, ref.group)
        if wid in self._ensured:  # made sure of in this loop: its Query (or Update) says if it is gone since
            return self.client.get_workflow_handle(wid)
        await self._temporal(
            ref,
            "start the group workflow",
            lambda: self.client.start_workflow(
                c.WorkflowName.GROUP,
                args=[ref, None],
                id=wid,
                task_queue=self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                static_summary=f"group {ref.namespace}/{ref.group}: cluster-autoscaler's node group",
                rpc_timeout=timedelta(seconds=timeout),
            ),
        )
        handle = self.client.get_workflow_handle(wid)  # follow whichever run is current from now on
        if wid not in self._ready:
            await self._wait_loaded(ref, handle, _left(started, timeout))
            self._ready.add(wid)
        self._ensured.add(wid)
        return handle

    async def _wait_loaded(self, ref: c.GroupRef, handle: WorkflowHandle[Any, Any], timeout: float) -> None:
        """Wait in the workflow (an Update that returns once the group has loaded), bounded by the budget left."""
        within = timeout * LOAD_WAIT_SHARE
        name = c.GroupUpdate.WAIT_LOADED
        try:
            loaded: bool = await handle.execute_update(
                name, within, result_type=bool, rpc_timeout=timedelta(seconds=timeout)
            )
        except WorkflowUpdateFailedError as err:
            raise _refusal(ref, name, err) from err
        except RPCTimeoutOrCancelledError as err:
            raise ProviderError(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"group {ref.group}: its workflow did not say within {timeout:.2f} s whether it has read the Group "
                "and its slots (is a worker running?)",
            ) from err
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                self.forget(ref)
            raise _rpc_failure(ref, "wait for the group workflow to read the group", err) from err
        if not loaded:
            raise unavailable(
                f"group {ref.group}: its workflow has not read the Group and its slots within {within:.2f} s "
                "(Kubernetes slow or unreachable?); the next call waits again"
            )

    def forget(self, ref: c.GroupRef) -> None:
        wid = c.group_workflow_id(ref.namespace, ref.group)
        self._ready.discard(wid)
        self._ensured.discard(wid)
        self._drop_answers(wid)

    def _drop_answers(self, wid: str) -> None:
        for key in [k for k in self._answers if k[0] == wid]:
            del self._answers[key]

    # --- reads --------------------------------------------------------------------------------------------
    async def target_size(self, ref: c.GroupRef, timeout: float) -> int:
        size: int = await self._read(ref, c.GroupQuery.TARGET_SIZE, int, timeout)
        return size

    async def instances(self, ref: c.GroupRef, timeout: float) -> list[c.Instance]:
        found: list[c.Instance] = await self._read(ref, c.GroupQuery.INSTANCES, list[c.Instance], timeout)
        return found

    async def snapshot(self, ref: c.GroupRef, timeout: float) -> dict[str, Any]:
        snap: dict[str, Any] = await self._read(ref, c.GroupQuery.SNAPSHOT, dict, timeout)
        return snap

    async def _read(self, ref: c.GroupRef, name: c.GroupQuery, kind: Any, timeout: float) -> Any:
        """A Query of the group workflow, made sure of first unless this process has seen it loaded.

        A workflow seen loaded is asked at once, on the condition that it is still open: one round trip for the
        first read of a loop instead of a start and a Query. One that has closed since (its Group deleted and made
        again) refuses the Query; only then is it started again and asked.
        """
        started = time.monotonic()
        wid = c.group_workflow_id(ref.namespace, ref.group)
        if wid in self._ready and wid not in self._ensured:
            handle = self.client.get_workflow_handle(wid)
            try:
                answer = await self._query(ref, handle, name, kind, timeout, open_only=True)
            except _Closed:
                self.forget(ref)
            else:
                self._ensured.add(wid)
                return answer
        handle = await self.ensure(ref, _left(started, timeout))
        return await self._query(ref, handle, name, kind, _left(started, timeout))

    # --- writes -------------------------------------------------------------------------------------------
    async def update(self, ref: c.GroupRef, name: c.GroupUpdate, arg: Any, timeout: float) -> int:
        """One Update, serialized with every other write to the group; returns the new target size.

        The caller's budget covers the wait for the lock, so a call queued behind a burst still answers in time
        (DEADLINE_EXCEEDED, with nothing written, if its turn does not come).
        """
        async with self.lock(ref):
            handle = await self.ensure(ref, timeout)
            self._drop_answers(handle.id)  # whatever the outcome, the group's answers may have changed
            try:
                result: int = await handle.execute_update(
                    name, arg, result_type=int, rpc_timeout=timedelta(seconds=timeout)
                )
            except WorkflowUpdateFailedError as err:
                raise _refusal(ref, name, err) from err
            except RPCTimeoutOrCancelledError as err:
                # The group may still take it; it takes an Update whole or not at all, and TargetSize says which.
                raise ProviderError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"group {ref.group}: {name} not answered within {timeout:.2f} s; it is applied whole or not at "
                    "all, and the next TargetSize says which",
                ) from err
            except RPCError as err:
                raise _rpc_failure(ref, f"update {name}", err) from err
            return result

    # --- plumbing -----------------------------------------------------------------------------------------
    async def _query(
        self,
        ref: c.GroupRef,
        handle: WorkflowHandle[Any, Any],
        name: c.GroupQuery,
        kind: Any,
        timeout: float,
        *,
        open_only: bool = False,
    ) -> Any:
        """Ask the workflow (or reuse this loop's answer); with `open_only`, a closed or unknown workflow raises
        `_Closed` instead of answering from its last state."""
        key = (handle.id, str(name))
        held = self._answers.get(key)
        if held is not None and self.clock() - held[0] < self.reuse_seconds:
            return held[1]

        async def ask() -> Any:
            try:
                return await handle.query(
                    name,
                    result_type=kind,
                    reject_condition=QueryRejectCondition.NOT_OPEN if open_only else None,
                    rpc_timeout=timedelta(seconds=timeout),
                )
            except WorkflowQueryRejectedError as err:  # only asked for with open_only: the workflow has closed
                raise _Closed from err
            except RPCError as err:
                if open_only and err.status == RPCStatusCode.NOT_FOUND:
                    raise _Closed from err
                raise

        try:
            answer = await self._temporal(ref, f"query {name}", ask)
        except WorkflowQueryFailedError as err:
            raise ProviderError(
                grpc.StatusCode.INTERNAL, f"group {ref.group}: the group workflow failed query {name}: {err}"
            ) from err
        if self.reuse_seconds > 0:
            self._answers[key] = (self.clock(), answer)
        return answer

    async def _temporal(self, ref: c.GroupRef, what: str, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                self.forget(ref)
            raise _rpc_failure(ref, what, err) from err


class _Closed(Exception):
    """The group workflow this process knew has closed (or is unknown to Temporal): make sure of it again."""


def _left(started: float, timeout: float) -> float:
    """What is left of a call's budget (never nothing: a spent budget still makes one short try)."""
    return max(timeout - (time.monotonic() - started), MIN_STEP_SECONDS)


def _refusal(ref: c.GroupRef, update: str, err: WorkflowUpdateFailedError) -> ProviderError:
    """A validator's (or handler's) refusal, with the workflow's own message: it already names the group."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type in WORKFLOW_CODES:
        return ProviderError(WORKFLOW_CODES[cause.type], cause.message)
    log.error("group %s/%s: update %s failed: %s", ref.namespace, ref.group, update, cause)
    return ProviderError(grpc.StatusCode.INTERNAL, f"group {ref.group}: {update} failed: {cause}")


def _rpc_failure(ref: c.GroupRef, what: str, err: RPCError) -> ProviderError:
    code = _RPC_CODES.get(err.status)
    text = f"group {ref.group}: Temporal did not {what}: {err.message}"
    if code is None:
        log.error("%s (%s)", text, err.status.name)
        return ProviderError(grpc.StatusCode.INTERNAL, text)
    return unavailable(text) if code == grpc.StatusCode.UNAVAILABLE else ProviderError(code, text)
