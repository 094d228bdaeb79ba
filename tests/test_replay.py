"""Every recorded history must keep replaying: a change to a workflow's command sequence that is not behind
`workflow.patched()` fails here before it can break a running claim after an upgrade.

Each generation (`make histories TAG=vN`) is kept while workflows of that version may run; a patched change
must replay the older generations as they are. Deleting one is for a drained, intended incompatibility.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

import workflows.claim.claim as claim_module
import workflows.legacy.v2.claim_workflow as legacy_module
from api import contracts as c
from api.names import ClaimPhase
from homelab_autoscaler.temporal import DATA_CONVERTER, sandbox_runner
from workflows.registry import WORKFLOWS

HISTORIES = Path(__file__).parent / "histories"


def histories() -> list[WorkflowHistory]:
    files = sorted(HISTORIES.glob("*.json"))
    return [WorkflowHistory.from_json(f.stem, f.read_text()) for f in files]


def test_histories_are_recorded() -> None:
    found = histories()
    assert len(found) >= 20, "record them with `make histories TAG=<generation>`"
    types = {h.events[0].workflow_execution_started_event_attributes.workflow_type.name for h in found}
    assert types == {"GroupWorkflow", "NodeClaimWorkflow", "ReleaseWorkflow"}


# Every generation is replayed (600+ histories from v10): about 70 s of CPU, past the suite's 120 s default on a
# loaded 2-core box.
@pytest.mark.timeout(900)
async def test_every_recorded_history_replays() -> None:
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER, workflow_runner=sandbox_runner())
    for history in histories():
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, f"{history.workflow_id}: {result.replay_failure}"


@pytest.mark.parametrize(
    ("generation", "module"),
    [("", legacy_module), ("v3-", claim_module)],
    ids=["generation-2", "generation-3"],
)
async def test_a_changed_transition_without_a_patch_fails_replay(
    monkeypatch: pytest.MonkeyPatch, generation: str, module: Any
) -> None:
    """The replay test can fail, for each generation: a launch that skips the finalizer is caught."""

    async def launch_without_finalizer(rt: Any) -> None:
        s = rt.s
        job = c.job_name(s.seed.name, "startup", 1)
        await rt.write(
            c.Act.CREATE_JOB, c.JobRequest(s.seed.namespace, s.seed.slot, "startup", 1, s.seed.name, job), job
        )
        s.startup_job = job
        await rt.move(ClaimPhase.BOOTING, message=f"startup Job {job} created")

    monkeypatch.setattr(module, "launch", launch_without_finalizer)
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER, workflow_runner=UnsandboxedWorkflowRunner())
    booted = [h for h in histories() if h.workflow_id.startswith(f"{generation}boot_ends_ready") and _is_claim(h)]
    assert booted
    result = await replayer.replay_workflow(booted[0], raise_on_replay_failure=False)
    assert isinstance(result.replay_failure, workflow.NondeterminismError), result.replay_failure


def _is_claim(h: WorkflowHistory) -> bool:
    return h.events[0].workflow_execution_started_event_attributes.workflow_type.name == "NodeClaimWorkflow"
