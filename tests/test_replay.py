"""Every recorded history must keep replaying: a change to a workflow's command sequence that is not behind
`workflow.patched()` fails here before it can break a running claim after an upgrade.

Each generation (`make histories TAG=vN`) is kept while workflows of that version may run; a patched change
must replay the older generations as they are. Deleting one is for a drained, intended incompatibility.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
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
# The corpus replays in this many parts, each a test of its own, so that pytest-xdist's workers share it (the whole
# corpus in one test was minutes on one core). Part i holds every PARTS-th file from the i-th on.
PARTS = 8


def history_files() -> list[Path]:
    return sorted(HISTORIES.glob("*.json"))


def histories(files: list[Path] | None = None) -> list[WorkflowHistory]:
    """The recorded histories of `files` (all by default), parsed: the protobuf JSON parse is slow, so only those."""
    return [WorkflowHistory.from_json(f.stem, f.read_text()) for f in (history_files() if files is None else files)]


def test_histories_are_recorded() -> None:
    found = history_files()
    assert len(found) >= 20, "record them with `make histories TAG=<generation>`"
    # The first event's workflow type, read as plain JSON (parsing 34 MB of histories as protobuf took 20 s).
    started = [json.loads(f.read_text())["events"][0] for f in found]
    types = {e["workflowExecutionStartedEventAttributes"]["workflowType"]["name"] for e in started}
    assert types == {"GroupWorkflow", "NodeClaimWorkflow", "ReleaseWorkflow"}


async def each(found: list[WorkflowHistory]) -> AsyncIterator[WorkflowHistory]:
    for history in found:
        yield history


@pytest.mark.long
@pytest.mark.parametrize("part", range(PARTS), ids=lambda i: f"part-{i + 1}-of-{PARTS}")
async def test_every_recorded_history_replays(part: int) -> None:
    files = history_files()[part::PARTS]
    assert files, f"part {part + 1} of {PARTS} holds no history"
    found = histories(files)
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER, workflow_runner=sandbox_runner())
    # One replay worker for the part (a worker per history cost a second of real time each on a busy machine).
    results = await replayer.replay_workflows(each(found), raise_on_replay_failure=False)
    by_run = {h.run_id: h.workflow_id for h in found}
    assert len(by_run) == len(found), "two recorded histories of one run"
    failures = {f"{by_run.get(run, run)} (run {run})": err for run, err in results.replay_failures.items()}
    assert not failures, "\n".join(f"{where}: {err}" for where, err in failures.items())


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
    files = [f for f in history_files() if f.stem.startswith(f"{generation}boot_ends_ready")]
    booted = [h for h in histories(files) if _is_claim(h)]
    assert booted
    result = await replayer.replay_workflow(booted[0], raise_on_replay_failure=False)
    assert isinstance(result.replay_failure, workflow.NondeterminismError), result.replay_failure


def _is_claim(h: WorkflowHistory) -> bool:
    return h.events[0].workflow_execution_started_event_attributes.workflow_type.name == "NodeClaimWorkflow"
