"""The provider's side of the group workflows: make sure one runs, read it with Queries, write it with Updates.

The group workflow is the single authority on a group's size, so every size the provider reports comes from a
Query and every change goes through an Update whose validator refuses bad input before anything is recorded.
Writes to one group are serialized here (an asyncio.Lock per group): a burst from cluster-autoscaler queues in
the provider instead of meeting Temporal's limit of 10 in-flight Updates per workflow.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

import grpc
from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from api import contracts as c
from provider.errors import WORKFLOW_CODES, ProviderError, unavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
GROUP_WORKFLOW = "GroupWorkflow"
# How often a freshly started group workflow is asked whether it has read its group yet.
LOAD_POLL_SECONDS = 0.05

_RPC_CODES: dict[RPCStatusCode, grpc.StatusCode] = {
    RPCStatusCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    RPCStatusCode.RESOURCE_EXHAUSTED: grpc.StatusCode.UNAVAILABLE,
    RPCStatusCode.CANCELLED: grpc.StatusCode.UNAVAILABLE,
}


class GroupGateway:
    """Queries and Updates of `GroupWorkflow` by name (the provider never imports workflow code)."""

    def __init__(self, client: Client, task_queue: str = c.TASK_QUEUE) -> None:
        self.client = client
        self.task_queue = task_queue
        self._ready: set[str] = set()  # workflow ids this process has seen loaded
        self._locks: dict[str, asyncio.Lock] = {}

    # --- the workflow -------------------------------------------------------------------------------------
    def lock(self, ref: c.GroupRef) -> asyncio.Lock:
        wid = c.group_workflow_id(ref.namespace, ref.group)
        return self._locks.setdefault(wid, asyncio.Lock())

    async def ensure(self, ref: c.GroupRef, timeout: float) -> WorkflowHandle[Any, Any]:
        """Start the group workflow unless one runs (idempotent: the watchers signal-with-start the same id).

        The first time this process meets a group it also waits until the workflow has read its group, so a
        target size is never reported before the claims that make it up are known.
        """
        wid = c.group_workflow_id(ref.namespace, ref.group)
        await self._temporal(
            ref,
            "start the group workflow",
            lambda: self.client.start_workflow(
                GROUP_WORKFLOW,
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
            while True:
                snap = await self._query(ref, handle, "snapshot", dict, timeout)
                if snap.get("loaded"):
                    break
                await asyncio.sleep(LOAD_POLL_SECONDS)
            self._ready.add(wid)
        return handle

    def forget(self, ref: c.GroupRef) -> None:
        self._ready.discard(c.group_workflow_id(ref.namespace, ref.group))

    # --- reads --------------------------------------------------------------------------------------------
    async def target_size(self, ref: c.GroupRef, timeout: float) -> int:
        handle = await self.ensure(ref, timeout)
        size: int = await self._query(ref, handle, "target_size", int, timeout)
        return size

    async def instances(self, ref: c.GroupRef, timeout: float) -> list[c.Instance]:
        handle = await self.ensure(ref, timeout)
        found: list[c.Instance] = await self._query(ref, handle, "instances", list[c.Instance], timeout)
        return found

    async def snapshot(self, ref: c.GroupRef, timeout: float) -> dict[str, Any]:
        handle = await self.ensure(ref, timeout)
        snap: dict[str, Any] = await self._query(ref, handle, "snapshot", dict, timeout)
        return snap

    # --- writes -------------------------------------------------------------------------------------------
    async def update(self, ref: c.GroupRef, name: str, arg: Any, timeout: float) -> int:
        """One Update, serialized with every other write to the group; returns the new target size.

        The caller's budget covers the wait for the lock, so a call queued behind a burst still answers in time
        (DEADLINE_EXCEEDED, with nothing written, if its turn does not come).
        """
        async with self.lock(ref):
            handle = await self.ensure(ref, timeout)
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
        self, ref: c.GroupRef, handle: WorkflowHandle[Any, Any], name: str, kind: Any, timeout: float
    ) -> Any:
        async def ask() -> Any:
            return await handle.query(name, result_type=kind, rpc_timeout=timedelta(seconds=timeout))

        try:
            return await self._temporal(ref, f"query {name}", ask)
        except WorkflowQueryFailedError as err:
            raise ProviderError(
                grpc.StatusCode.INTERNAL, f"group {ref.group}: the group workflow failed query {name}: {err}"
            ) from err

    async def _temporal(self, ref: c.GroupRef, what: str, call: Callable[[], Awaitable[T]]) -> T:
        try:
            return await call()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                self.forget(ref)
            raise _rpc_failure(ref, what, err) from err


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
