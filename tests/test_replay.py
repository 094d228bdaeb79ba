"""Every recorded history must keep replaying: a change to a workflow's command sequence that is not behind
`workflow.patched()` fails here before it can break a running claim after an upgrade.

The corpus is `make histories`: each release records its own (`r<release>-<story>-NN.json`, tests/releases.py). The
supported upgrade is from the previous release, so the corpus holds the previous release's histories and this
one's, and no older (docs/upgrades.md); a history of an older release is deleted with the patches it needed.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from packaging.version import Version
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

import workflows.claim.claim as claim_module
from homelab_autoscaler.temporal import DATA_CONVERTER, sandbox_runner
from tests import releases
from workflows.claim.launch import launch
from workflows.registry import WORKFLOWS

HISTORIES = Path(__file__).parent / "histories"
NAME = re.compile(r"r(?P<release>[^-]+)-(?P<story>[a-z0-9_]+)-\d\d")


# The corpus replays in this many parts, each a test of its own, so that pytest-xdist's workers share it (the whole
# corpus in one test was minutes on one core). Part i holds every PARTS-th file from the i-th on.
PARTS = 8


def history_files(prefix: str = "") -> list[Path]:
    return sorted(HISTORIES.glob(f"{prefix}*.json"))


def histories(files: list[Path]) -> list[WorkflowHistory]:
    """The recorded histories of `files`, parsed: the protobuf JSON parse is slow, so only those."""
    return [WorkflowHistory.from_json(f.stem, f.read_text()) for f in files]


def test_histories_are_recorded() -> None:
    found = history_files(releases.history_tag())
    assert len(found) >= 20, "record them with `make histories`"
    # The first event's workflow type, read as plain JSON (parsing the corpus as protobuf took 20 s).
    started = [json.loads(f.read_text())["events"][0] for f in found]
    types = {e["workflowExecutionStartedEventAttributes"]["workflowType"]["name"] for e in started}
    assert types == {"GroupWorkflow", "NodeClaimWorkflow", "ReleaseWorkflow"}


def too_old(names: list[str], current: str, released: tuple[releases.Release, ...]) -> list[str]:
    """The histories that name no release or one older than the previous release (nothing supported runs them)."""
    before = releases.previous(current, released)
    oldest = Version(before.version) if before is not None else releases.release_of(current)
    out = []
    for name in names:
        m = NAME.fullmatch(name)
        if m is None:
            out.append(f"{name}: not r<release>-<story>-NN (make histories names them)")
        elif Version(m["release"]) < oldest:
            out.append(f"{name}: release {m['release']} is older than the previous release {oldest}: delete it")
    return out


def test_the_corpus_holds_no_release_older_than_the_previous_one() -> None:
    found = too_old([f.stem for f in sorted(HISTORIES.glob("*.json"))], releases.current(), releases.RELEASES)
    assert not found, "\n".join(found)


def test_the_corpus_rule_can_fail() -> None:
    released = (releases.Release("0.3.0", "v0.3.0", "a" * 40), releases.Release("0.4.0", "v0.4.0", "b" * 40))
    names = ["r0.3.0-boot_ends_ready-00", "r0.4.0-boot_ends_ready-00", "r0.5.0-boot_ends_ready-00", "v10-adoption-01"]
    assert too_old(names, "0.5.0.dev0", released) == [
        "r0.3.0-boot_ends_ready-00: release 0.3.0 is older than the previous release 0.4.0: delete it",
        "v10-adoption-01: not r<release>-<story>-NN (make histories names them)",
    ]


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


async def test_a_changed_transition_without_a_patch_fails_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay test can fail: a launch that waits a second before it buys the machine (a timer more) is caught in
    this release's corpus."""

    async def launch_after_a_wait(rt: claim_module.Claim) -> None:
        await workflow.sleep(1)
        await launch(rt)  # the step the run calls, as it is

    monkeypatch.setattr(claim_module, "launch", launch_after_a_wait)
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER, workflow_runner=UnsandboxedWorkflowRunner())
    booted = [h for h in histories(history_files(f"{releases.history_tag()}-boot_ends_ready")) if _is_claim(h)]
    assert booted
    result = await replayer.replay_workflow(booted[0], raise_on_replay_failure=False)
    assert isinstance(result.replay_failure, workflow.NondeterminismError), result.replay_failure


def _is_claim(h: WorkflowHistory) -> bool:
    return h.events[0].workflow_execution_started_event_attributes.workflow_type.name == "NodeClaimWorkflow"
