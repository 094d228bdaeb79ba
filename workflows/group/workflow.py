"""GroupWorkflow: the registered workflow, a thin shell around `workflows.group.group.Group`.

The sandbox imports this module afresh for every workflow it starts, while the group's code passes through it.
Handler names and argument types here are the workflow's public interface: the provider, the watchers and the
claims call them by these names.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from api import contracts as c
from workflows.claim.workflow import carried_state
from workflows.group.group import Group
from workflows.group.state import GroupState
from workflows.patches import Patch


@workflow.defn(name=c.WorkflowName.GROUP)
class GroupWorkflow:
    @workflow.init
    def __init__(self, ref: c.GroupRef, carried: dict[str, Any] | None = None) -> None:
        workflow.deprecate_patch(Patch.GROUP_GENERATION_3)  # 0.2's runs chose their generation here
        self.impl = Group(ref, carried_state(GroupState, carried))

    @workflow.run
    async def run(self, ref: c.GroupRef, carried: dict[str, Any] | None = None) -> None:
        await self.impl.run(ref, self.impl.s if carried is not None else None)

    # --- signals -----------------------------------------------------------------------------------------
    @workflow.signal(name=c.GroupSignal.CLAIM_CHANGED)
    def claim_changed(self, digest: c.ClaimDigest) -> None:
        self.impl.claim_changed(digest)

    @workflow.signal(name=c.GroupSignal.OBSERVE_SLOT)
    def observe_slot(self, obs: c.SlotObservation) -> None:
        self.impl.observe_slot(obs)

    @workflow.signal(name=c.GroupSignal.REFRESH)
    def refresh(self) -> None:
        self.impl.refresh()

    @workflow.signal(name=c.GroupSignal.RELEASE_FINISHED)
    def release_finished(self, done: c.SlotReleased) -> None:
        self.impl.release_finished(done)

    # --- cluster-autoscaler's writes ---------------------------------------------------------------------
    @workflow.update  # async: the method's name is its wire name (see tests/test_boundary.py)
    async def increase_size(self, delta: int) -> int:
        return await self.impl.increase_size(delta)

    @increase_size.validator
    def _validate_increase(self, delta: int) -> None:
        self.impl._validate_increase(delta)

    @workflow.update  # async: the method's name is its wire name (see tests/test_boundary.py)
    async def decrease_target_size(self, delta: int) -> int:
        return await self.impl.decrease_target_size(delta)

    @decrease_target_size.validator
    def _validate_decrease(self, delta: int) -> None:
        self.impl._validate_decrease(delta)

    @workflow.update  # async: the method's name is its wire name (see tests/test_boundary.py)
    async def delete_nodes(self, nodes: list[str]) -> int:
        return await self.impl.delete_nodes(nodes)

    @delete_nodes.validator
    def _validate_delete(self, nodes: list[str]) -> None:
        self.impl._validate_delete(nodes)

    @workflow.update  # async: the method's name is its wire name (see tests/test_boundary.py)
    async def wait_loaded(self, within_seconds: float) -> bool:
        """The provider's first call waits here for the group to have read its resources, instead of polling a
        Query: True once loaded, False when `within_seconds` passed first (bounded, so a continue-as-new that
        waits for all handlers never waits long).
        """
        state = self.impl.s
        state.updates += 1  # every accepted Update counts against the run's limit
        if not state.loaded:
            try:
                await workflow.wait_condition(
                    lambda: state.loaded,
                    timeout=timedelta(seconds=within_seconds),
                    timeout_summary="the group loaded, for the provider",
                )
            except TimeoutError:
                return False
        return True

    @wait_loaded.validator
    def _validate_wait_loaded(self, within_seconds: float) -> None:
        if within_seconds <= 0:
            message = f"wait_loaded needs a positive bound, got {within_seconds}"
            raise ApplicationError(message, type=c.ERR_INVALID_ARGUMENT, non_retryable=True)

    # --- cluster-autoscaler's reads ----------------------------------------------------------------------
    @workflow.query(name=c.GroupQuery.TARGET_SIZE)
    def target_size(self) -> int:
        return self.impl.target_size()

    @workflow.query(name=c.GroupQuery.INSTANCES)
    def instances(self) -> list[c.Instance]:
        return self.impl.instances()

    @workflow.query(name=c.GroupQuery.SNAPSHOT)
    def snapshot(self) -> dict[str, Any]:
        return self.impl.snapshot()
