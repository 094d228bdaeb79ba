"""GroupWorkflow: the registered workflow, and the choice of generation each run makes once.

The group itself is `workflows.group.group.Group`; a run started by an earlier release replays through the
frozen `workflows.legacy` generation. Handler names and argument types here are the workflow's public
interface: the provider, the watchers and the claims call them by these names.
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
from workflows.legacy.v2.group_state import GroupState as LegacyGroupState
from workflows.legacy.v2.group_workflow import LegacyGroup

# The marker of the current generation: a run whose history lacks it is a generation-2 run.
GENERATION_3 = "group-generation-3"


@workflow.defn(name=c.WorkflowName.GROUP)
class GroupWorkflow:
    @workflow.init
    def __init__(self, ref: c.GroupRef, carried: dict[str, Any] | None = None) -> None:
        self.impl: Group | LegacyGroup
        if workflow.patched(GENERATION_3):
            self.impl = Group(ref, carried_state(GroupState, carried))
        else:
            self.impl = LegacyGroup(ref, carried_state(LegacyGroupState, carried))

    @workflow.run
    async def run(self, ref: c.GroupRef, carried: dict[str, Any] | None = None) -> None:
        await self.impl.run(ref, self.impl.s if carried is not None else None)  # type: ignore[arg-type]

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
        waits for all handlers never waits long). Either generation keeps `loaded` in its state.
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
