"""The retirement rule: a workflow patch lives as long as a supported upgrade needs it, and no longer.

The supported upgrade is from the previous release (docs/upgrades.md). Every patch id is a member of
`workflows.patches.Patch` with the release that introduced it in `INTRODUCED`; a patch older than the previous
release may no longer be `patched` (its old branch serves only runs no supported upgrade brings: it becomes
`workflow.deprecate_patch`), and one older than two releases may not exist at all. `make test` fails on a patch past
its time, naming it and what to do.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from packaging.version import Version
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from homelab_autoscaler.temporal import DATA_CONVERTER
from tests import releases
from workflows.patches import INTRODUCED, LINE_0_2, Patch
from workflows.registry import WORKFLOWS

ROOT = Path(__file__).resolve().parent.parent
CALLS = ("patched", "deprecate_patch")  # workflow.patched(...), workflow.deprecate_patch(...)

Uses = dict[str, set[str]]  # patch id -> the calls that name it ("patched", "deprecate_patch")


def patch_calls(source: str, filename: str = "<snippet>") -> tuple[Uses, list[str]]:
    """The patch ids `source` names in `patched`/`deprecate_patch` calls, and every call that does not name one as
    `Patch.<MEMBER>` (a string literal, a constant of its own, an expression), as file:line."""
    uses: Uses = {}
    bad: list[str] = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name not in CALLS:
            continue
        arg = node.args[0] if node.args else None
        member = (
            arg.attr
            if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id == "Patch"
            else None
        )
        if member is None or member not in Patch.__members__:
            said = ast.unparse(arg) if arg is not None else ""
            bad.append(f"{filename}:{node.lineno}: {name}({said}) names no member of workflows.patches.Patch")
            continue
        uses.setdefault(str(Patch[member]), set()).add(name)
    return uses, bad


def tree_calls(root: Path = ROOT / "workflows") -> tuple[Uses, list[str]]:
    uses: Uses = {}
    bad: list[str] = []
    for path in sorted(root.rglob("*.py")):
        found, wrong = patch_calls(path.read_text(), str(path.relative_to(ROOT)))
        for patch, kinds in found.items():
            uses.setdefault(patch, set()).update(kinds)
        bad += wrong
    return uses, bad


def retirement(introduced: Mapping[str, str], uses: Uses, released: Iterable[str], building: str) -> list[str]:
    """What the rule finds wrong, one line each: `introduced` is the table (id -> release), `uses` what the workflows
    call, `released` the versions out, `building` the version being built."""
    line = releases.release_of(building)
    out = sorted(Version(v) for v in released if Version(v) < line)
    previous = out[-1] if out else None
    before = out[-2] if len(out) > 1 else None
    found = [f"{p}: called, but not in workflows.patches.INTRODUCED" for p in sorted(set(uses) - set(introduced))]
    for patch, release in sorted(introduced.items()):
        at = Version(release)
        kinds = uses.get(patch, set())
        if at != line and at not in out:
            found.append(f"{patch}: introduced in {release}, neither a release nor the version being built ({line})")
        if not kinds:
            found.append(f"{patch}: in the table, but no workflow calls it: delete its row")
        if before is not None and at < before:
            found.append(
                f"{patch}: introduced in {release}, older than two releases ({before}): delete its call and its row"
            )
        elif previous is not None and at < previous and "patched" in kinds:
            found.append(
                f"{patch}: introduced in {release}, older than the previous release ({previous}): fold its old branch"
                " and keep workflow.deprecate_patch"
            )
    return found


# --- the rule holds on this tree ----------------------------------------------------------------------------------
def test_every_patch_call_names_a_member_of_the_table() -> None:
    _, bad = tree_calls()
    assert not bad, "\n".join(bad)
    assert set(Patch) == set(INTRODUCED), "every Patch member has its release in INTRODUCED"


def test_no_patch_outlives_its_time() -> None:
    uses, _ = tree_calls()
    table = {str(p): r for p, r in INTRODUCED.items()}
    found = retirement(table, uses, [r.version for r in releases.RELEASES], releases.current())
    assert not found, "\n".join(found)


def test_release_0_3_0_folded_every_patch_of_the_0_2_line() -> None:
    """The baseline: no branch of the 0.2 line is left, only the markers its runs in flight need."""
    uses, _ = tree_calls()
    left = {str(p): uses.get(str(p)) for p, release in INTRODUCED.items() if release == LINE_0_2}
    assert all(kinds == {"deprecate_patch"} for kinds in left.values()), left


# --- the rule itself, on a synthetic table ------------------------------------------------------------------------
RELEASED = ["0.2.0", "0.3.0", "0.4.0"]


@pytest.mark.parametrize(
    ("release", "kinds", "building", "says"),
    [
        pytest.param("0.5.0", {"patched"}, "0.5.0.dev0", "", id="new-in-the-version-being-built"),
        pytest.param("0.4.0", {"patched"}, "0.5.0", "", id="from-the-previous-release-still-patched"),
        pytest.param("0.3.0", {"deprecate_patch"}, "0.5.0", "", id="older-than-previous-deprecated"),
        pytest.param("0.3.0", {"patched"}, "0.5.0", "older than the previous release (0.4.0)", id="older-patched"),
        pytest.param(
            "0.3.0", {"patched", "deprecate_patch"}, "0.5.0", "fold its old branch", id="older-patched-somewhere"
        ),
        pytest.param("0.2.0", {"deprecate_patch"}, "0.5.0", "older than two releases (0.3.0)", id="two-releases-old"),
        pytest.param("0.2.0", {"patched"}, "0.5.0", "delete its call and its row", id="two-releases-old-patched"),
        pytest.param("0.2.0", {"patched"}, "0.3.0", "", id="the-same-patch-two-releases-earlier"),
        pytest.param("0.4.0", set(), "0.5.0", "no workflow calls it", id="a-row-without-a-call"),
        pytest.param("0.6.0", {"patched"}, "0.5.0", "neither a release nor the version", id="a-future-release"),
        pytest.param("0.4.5", {"patched"}, "0.5.0", "neither a release nor the version", id="a-release-never-made"),
    ],
)
def test_the_rule(release: str, kinds: set[str], building: str, says: str) -> None:
    found = retirement({"x": release}, {"x": kinds} if kinds else {}, RELEASED, building)
    if not says:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith("x: ") and says in found[0], found


def test_a_call_without_a_row_is_found() -> None:
    assert retirement({}, {"y": {"patched"}}, RELEASED, "0.5.0") == [
        "y: called, but not in workflows.patches.INTRODUCED"
    ]


def test_the_first_release_keeps_everything_its_line_introduced() -> None:
    assert retirement({"x": "0.2.0a0"}, {"x": {"patched"}}, ["0.2.0a0"], "0.3.0") == []


@pytest.mark.parametrize(
    "snippet",
    [
        'workflow.patched("claim-generation-3")',
        'workflow.deprecate_patch("claim-generation-3")',
        "workflow.patched(GENERATION_3)",
        "workflow.patched(Patch.NO_SUCH_PATCH)",
        "workflow.patched(Other.CLAIM_GENERATION_3)",
        "workflow.patched()",
        "if first and workflow.patched(f'id-{n}'):\n    pass",
    ],
)
def test_the_scan_finds_a_patch_not_named_from_the_table(snippet: str) -> None:
    uses, (hit,) = patch_calls(snippet, "snippet.py")
    assert hit.startswith("snippet.py:") and not uses


def test_the_scan_reads_each_kind_of_call() -> None:
    source = (
        "if workflow.patched(Patch.TELL_BESIDE):\n    pass\n"
        "workflow.deprecate_patch(Patch.TELL_BESIDE)\nworkflow.deprecate_patch(Patch.SERIAL_RECORDS)\n"
    )
    assert patch_calls(source) == (
        {"claim-tells-group-beside-its-projection": {"patched", "deprecate_patch"}, "claim-records-one-at-a-time": {
            "deprecate_patch"
        }},
        [],
    )  # fmt: skip


# --- the rule's premise: a deprecated patch may go ----------------------------------------------------------------
async def test_this_releases_histories_replay_without_its_deprecated_patches(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the rule relies on: a run recorded with `deprecate_patch` replays on code that no longer calls it, so the
    release after next may delete the call. (A marker of `patched` may not go: Temporal refuses its history.)"""
    monkeypatch.setattr(workflow, "deprecate_patch", lambda _id: None)
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER, workflow_runner=UnsandboxedWorkflowRunner())
    tag = releases.history_tag()
    files = sorted((ROOT / "tests" / "histories").glob(f"{tag}-*.json"))
    picked = [f for f in files if f.stem.rsplit("-", 1)[0] in STORIES]
    assert len({f.stem.rsplit("-", 1)[0] for f in picked}) == len(STORIES), "record them with `make histories`"
    for f in picked:
        history = WorkflowHistory.from_json(f.stem, f.read_text())
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, f"{f.stem}: {result.replay_failure}"


# Stories whose runs pass most of the patches: a boot, a scale-down, a failed boot and its release, a take-over.
STORIES = {
    f"{releases.history_tag()}-{story}"
    for story in ("boot_ends_ready", "scale_down_ready", "startup_job_failed_says_why", "law3_release", "superseded",
                  "taken_over_shutdown_job", "group_continue_as_new")
}  # fmt: skip
