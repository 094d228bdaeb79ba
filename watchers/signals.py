"""The watchers' side of Temporal: signals to the claim, release and group workflows, and two small reads.

Signal names come from the receiver's table in `api.contracts`, so a sender cannot name another workflow's.

Every call swallows "no such workflow" (a claim that already ended, a release that is over): the watchers
report what they saw, and a workflow that is gone has nothing left to learn. `sent` keeps what was delivered,
in order, so the debounce can be checked by counting.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from api import contracts as c
from domain.timings import TIMINGS

log = logging.getLogger(__name__)

SENT_KEPT = 10_000  # the log of delivered signals is for counting in tests and debugging, not a history
# Reads must not hold a watcher up when no worker answers: the report then falls back to the resource alone.


class SignalSink(Protocol):
    """What the dispatcher and the report writer need from Temporal (`Signals` is the real one)."""

    async def claim(self, namespace: str, claim: str, signal: c.ClaimSignal, arg: Any = None) -> bool: ...

    async def release(self, namespace: str, slot: str, signal: c.ReleaseSignal, arg: Any = None) -> bool: ...

    async def group(
        self, namespace: str, group: str, signal: c.GroupSignal, arg: Any = None, *, start: bool = True
    ) -> bool: ...

    async def claim_running(self, namespace: str, claim: str) -> bool: ...

    async def start_claim(self, seed: c.ClaimSeed) -> bool: ...

    def count(self, signal: str | None = None, workflow_id: str | None = None) -> int: ...


@dataclass
class Signals:
    """Signals over a Temporal client; `sent` lists (workflow id, signal) of every delivered signal."""

    client: Client
    task_queue: str = c.TASK_QUEUE
    sent: deque[tuple[str, str]] = field(default_factory=lambda: deque(maxlen=SENT_KEPT))

    async def _signal(self, workflow_id: str, signal: c.AnySignal, arg: Any = None) -> bool:
        handle = self.client.get_workflow_handle(workflow_id)
        try:
            if arg is None:
                await handle.signal(signal)
            else:
                await handle.signal(signal, arg)
        except RPCError as err:
            log.info("signal %s to %s not delivered: %s", signal, workflow_id, err)
            return False
        self.sent.append((workflow_id, signal))
        return True

    async def claim(self, namespace: str, claim: str, signal: c.ClaimSignal, arg: Any = None) -> bool:
        return await self._signal(c.claim_workflow_id(namespace, claim), signal, arg)

    async def release(self, namespace: str, slot: str, signal: c.ReleaseSignal, arg: Any = None) -> bool:
        return await self._signal(c.release_workflow_id(namespace, slot), signal, arg)

    async def group(
        self, namespace: str, group: str, signal: c.GroupSignal, arg: Any = None, *, start: bool = True
    ) -> bool:
        """Signal a group workflow; with `start`, signal-with-start it, so a Group never waits for a provider
        call to have its workflow (the workflow's first act is to load the group anyway).
        """
        workflow_id = c.group_workflow_id(namespace, group)
        if not start:
            return await self._signal(workflow_id, signal, arg)
        try:
            await self.client.start_workflow(
                c.WorkflowName.GROUP,
                args=[c.GroupRef(namespace, group), None],
                id=workflow_id,
                task_queue=self.task_queue,
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                start_signal=signal,
                start_signal_args=[] if arg is None else [arg],
                static_summary=f"group {group} in {namespace}",
            )
        except RPCError as err:
            log.warning("signal-with-start %s to %s failed: %s", signal, workflow_id, err)
            return False
        self.sent.append((workflow_id, signal))
        return True

    async def claim_running(self, namespace: str, claim: str) -> bool:
        """Whether a workflow runs this claim: a claim resource with none was applied by hand (or left over)."""
        try:
            desc = await self.client.get_workflow_handle(c.claim_workflow_id(namespace, claim)).describe(
                rpc_timeout=TIMINGS.watcher_query_timeout
            )
        except RPCError:
            return False
        return desc.status is not None and desc.status.name == "RUNNING"

    async def start_claim(self, seed: c.ClaimSeed) -> bool:
        """Start the workflow of a claim no group takes (its seed says why it fails); False when it runs already or
        Temporal did not answer (the next check asks again)."""
        workflow_id = c.claim_workflow_id(seed.namespace, seed.name)
        try:
            await self.client.start_workflow(
                c.WorkflowName.CLAIM,
                args=[seed, None],
                id=workflow_id,
                task_queue=self.task_queue,
                static_summary=f"claim {seed.name}: {seed.refused_message}",
            )
        except (RPCError, WorkflowAlreadyStartedError) as err:
            log.info("claim %s not started: %s", workflow_id, err)
            return False
        return True

    def count(self, signal: str | None = None, workflow_id: str | None = None) -> int:
        return sum(
            1 for w, s in self.sent if (signal is None or s == signal) and (workflow_id is None or w == workflow_id)
        )
