"""NodeClaimWorkflow: the registered workflow, a thin shell around `workflows.claim.claim.Claim`.

The sandbox imports this module afresh for every workflow it starts, while the claim's code passes through it
(homelab_autoscaler.temporal.PASSTHROUGH), so the shell stays small. Its handler names and argument types are the
workflow's public interface (docs/upgrades.md: never rename one).
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from temporalio import workflow

from api import contracts as c
from workflows.claim.claim import Claim
from workflows.claim.state import ClaimState
from workflows.patches import Patch


def carried_state(kind: type[Any], carried: dict[str, Any] | None) -> Any:
    """The state a continued run carries (a field it no longer knows is left out)."""
    return None if carried is None else TypeAdapter(kind).validate_python(carried)


@workflow.defn(name=c.WorkflowName.CLAIM)
class NodeClaimWorkflow:
    @workflow.init
    def __init__(self, seed: c.ClaimSeed, carried: dict[str, Any] | None = None) -> None:
        workflow.deprecate_patch(Patch.CLAIM_GENERATION_3)  # 0.2's runs chose their generation here
        self.impl = Claim(seed, carried_state(ClaimState, carried))

    @workflow.run
    async def run(self, seed: c.ClaimSeed, carried: dict[str, Any] | None = None) -> c.ClaimDigest:
        return await self.impl.run(seed, self.impl.s if carried is not None else None)

    @workflow.signal(name=c.ClaimSignal.OBSERVE)
    def observe(self, observation: c.Observation) -> None:
        self.impl.observe(observation)

    @workflow.signal(name=c.ClaimSignal.JOB_FINISHED)
    def job_finished(self, finished: c.JobFinished) -> None:
        self.impl.job_finished(finished)

    @workflow.signal(name=c.ClaimSignal.MARK_FOR_DELETION)
    async def mark_for_deletion(self, request: c.MarkRequest) -> None:
        await self.impl.mark_for_deletion(request)

    @workflow.signal(name=c.ClaimSignal.SUPERSEDED)
    def superseded(self, by: str) -> None:
        self.impl.superseded(by)

    @workflow.signal(name=c.ClaimSignal.SLOT_DELETED)
    def slot_deleted(self) -> None:
        self.impl.slot_deleted()

    @workflow.signal(name=c.ClaimSignal.STATUS_EDITED)
    async def status_edited(self, edit: c.StatusEdit) -> None:
        await self.impl.status_edited(edit)

    @workflow.update  # async: the method's name is its wire name (see tests/test_boundary.py)
    async def reset_shutdown_streak(self) -> int:
        return await self.impl.reset_shutdown_streak()

    @workflow.query(name=c.ClaimQuery.STATUS)
    def status(self) -> dict[str, Any]:
        return self.impl.status()

    @workflow.query(name=c.ClaimQuery.DIGEST)
    def digest(self) -> c.ClaimDigest:
        return self.impl.digest()
