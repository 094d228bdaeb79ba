"""NodeClaimWorkflow: the registered workflow, and the choice of generation each run makes once.

The claim itself is `workflows.claim.claim.Claim`; a run started by an earlier release replays through the
frozen `workflows.legacy` generation instead. Every handler is handed to the generation the run chose, so the
handler names and argument types here are the workflow's public interface (docs/upgrades.md: never rename one).
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter
from temporalio import workflow

from api import contracts as c
from workflows.claim.claim import Claim
from workflows.claim.state import ClaimState
from workflows.legacy.v2.claim_state import ClaimState as LegacyClaimState
from workflows.legacy.v2.claim_workflow import LegacyClaim

# The marker of the current generation: a run whose history lacks it is a generation-2 run.
GENERATION_3 = "claim-generation-3"


def carried_state(kind: type[Any], carried: dict[str, Any] | None) -> Any:
    """The state a continued run carries, as the class of the generation that reads it."""
    return None if carried is None else TypeAdapter(kind).validate_python(carried)


@workflow.defn(name=c.WorkflowName.CLAIM)
class NodeClaimWorkflow:
    @workflow.init
    def __init__(self, seed: c.ClaimSeed, carried: dict[str, Any] | None = None) -> None:
        self.impl: Claim | LegacyClaim
        if workflow.patched(GENERATION_3):
            self.impl = Claim(seed, carried_state(ClaimState, carried))
        else:
            self.impl = LegacyClaim(seed, carried_state(LegacyClaimState, carried))

    @workflow.run
    async def run(self, seed: c.ClaimSeed, carried: dict[str, Any] | None = None) -> c.ClaimDigest:
        return await self.impl.run(seed, self.impl.s if carried is not None else None)  # type: ignore[arg-type]

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
        if isinstance(self.impl, Claim):  # a generation-2 run projects unnumbered: its edits cannot be told
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
