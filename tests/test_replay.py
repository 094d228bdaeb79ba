"""Every recorded history must keep replaying: a change to a workflow's command sequence that is not behind
`workflow.patched()` fails here before it can break a running claim after an upgrade.

The corpus is `make histories`: each release records its own (`r<release>-<story>-NN.json`, tests/releases.py). The
supported upgrade is from the previous release, so the corpus holds the previous release's histories and this
one's, and no older (docs/upgrades.md); a history of an older release is deleted with the patches it needed.
"""

from __future__ import annotations

import re
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


def histories(prefix: str = "") -> list[WorkflowHistory]:
    files = sorted(HISTORIES.glob(f"{prefix}*.json"))
    return [WorkflowHistory.from_json(f.stem, f.read_text()) for f in files]


def test_histories_are_recorded() -> None:
    found = histories(releases.history_tag())
    assert len(found) >= 20, "record them with `make histories`"
    types = {h.events[0].workflow_execution_started_event_attributes.workflow_type.name for h in found}
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


# Two releases' corpora of ~90 histories each: some 30 s of CPU, past the suite's 120 s default on a loaded 2-core box.
@pytest.mark.timeout(600)
async def test_every_recorded_history_replays() -> None:
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER, workflow_runner=sandbox_runner())
    for history in histories():
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, f"{history.workflow_id}: {result.replay_failure}"


async def test_a_changed_transition_without_a_patch_fails_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay test can fail: a launch that waits a second before it buys the machine (a timer more) is caught in
    this release's corpus."""

    async def launch_after_a_wait(rt: claim_module.Claim) -> None:
        await workflow.sleep(1)
        await launch(rt)  # the step the run calls, as it is

    monkeypatch.setattr(claim_module, "launch", launch_after_a_wait)
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER, workflow_runner=UnsandboxedWorkflowRunner())
    booted = [h for h in histories(f"{releases.history_tag()}-boot_ends_ready") if _is_claim(h)]
    assert booted
    result = await replayer.replay_workflow(booted[0], raise_on_replay_failure=False)
    assert isinstance(result.replay_failure, workflow.NondeterminismError), result.replay_failure


def _is_claim(h: WorkflowHistory) -> bool:
    return h.events[0].workflow_execution_started_event_attributes.workflow_type.name == "NodeClaimWorkflow"
