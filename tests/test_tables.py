"""The tables are whole: every number lives in TIMINGS, and every map keyed by an enum covers the enum.

A new enum member, a new failure type or a duration written into a module fails here, before it reaches a claim.
"""

from __future__ import annotations

import ast
import dataclasses
from datetime import timedelta
from pathlib import Path

import grpc

from api import contracts as c
from api.names import ClaimPhase, ClaimReason, Failure
from domain.timings import TIMINGS
from provider.errors import WORKFLOW_CODES
from workflows.claim.runtime import FAILURE_REASONS, MOVE_EVENTS
from workflows.group.state import ERROR_CODES, NOT_BOOT_FAILURES, OUT_OF_RESOURCES, error_of

ROOT = Path(__file__).resolve().parent.parent
# Where a rule's duration would hide.
RULE_PACKAGES = ("domain", "workflows", "activities", "watchers", "kube")
# Not a timing: the smallest step of a report's timestamps.
NOT_TIMINGS = {("domain/history.py", "RESOLUTION")}


def test_every_timing_is_positive_and_typed() -> None:
    for field in dataclasses.fields(TIMINGS):
        value = getattr(TIMINGS, field.name)
        assert isinstance(value, timedelta | int), field.name
        assert (value.total_seconds() if isinstance(value, timedelta) else value) >= 0, field.name


def module_level_durations(path: Path) -> list[str]:
    """Names bound at module level to `timedelta(...)`: a duration outside the table."""
    found = []
    for node in ast.parse(path.read_text()).body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        value = getattr(node, "value", None)
        if isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) == "timedelta":
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(t)}" for t in targets]
    return found


def test_no_duration_outside_the_timings_table() -> None:
    files = [p for pkg in RULE_PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    found = [hit for p in files if p.name != "timings.py" for hit in module_level_durations(p)]
    stray = [hit for hit in found if (hit.split(":")[0], hit.split(" ")[-1]) not in NOT_TIMINGS]
    assert not stray, f"durations outside domain/timings.py: {stray}"


def test_the_duration_finder_finds_one(tmp_path: Path) -> None:
    planted = ROOT / "domain" / "_planted_for_test.py"
    try:
        planted.write_text("from datetime import timedelta\nPOLL = timedelta(seconds=3)\n")
        assert module_level_durations(planted) == ["domain/_planted_for_test.py:2 POLL"]
    finally:
        planted.unlink()


def test_every_claim_phase_has_its_event() -> None:
    assert set(MOVE_EVENTS) == set(ClaimPhase)


def test_every_failure_type_has_a_claim_reason() -> None:
    assert set(FAILURE_REASONS) == set(Failure)


def test_every_claim_reason_is_an_error_code_or_no_failure() -> None:
    kinds = [set(ERROR_CODES), set(OUT_OF_RESOURCES), set(NOT_BOOT_FAILURES)]
    assert set().union(*kinds) == set(ClaimReason), set(ClaimReason) - set().union(*kinds)
    assert sum(len(k) for k in kinds) == len(ClaimReason), "a reason is in two tables"
    codes = [error_of(r)[0] for r in ERROR_CODES] + [error_of(r)[0] for r in OUT_OF_RESOURCES]
    assert len(set(codes)) == len(codes), "two reasons share an error code"


def test_every_refusal_of_the_group_has_a_grpc_code() -> None:
    refusals = {v for k, v in vars(c).items() if k.startswith("ERR_")}
    assert set(WORKFLOW_CODES) == refusals
    assert grpc.StatusCode.OK not in WORKFLOW_CODES.values()
