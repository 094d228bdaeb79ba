"""The input law: every row of the seed's table, agreement of state and report, exhaustiveness, predicates."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.names import ClaimPhase, NodeState, Operation, PowerState, Report
from domain import law
from domain.law import Input, derive, fires, power_of, state, unusable

P = ClaimPhase
ON, OFF = "on", "off"

# (id, claim_phase, marked, power, usable, report, state, fires) — one case per line of the seed's table,
# with the table's "—"/"any" columns spelled out where the line covers several inputs.
CASES: list[tuple[str, Any, bool, str, bool, Report, NodeState, Operation | None]] = [
    ("none-off", None, False, OFF, False, Report.OFF, NodeState.SHUTDOWN, None),
    ("none-on", None, False, ON, True, Report.DRAINING, NodeState.READY, Operation.SHUTDOWN_NODE),
    ("none-on-unusable", None, False, ON, False, Report.DRAINING, NodeState.READY, Operation.SHUTDOWN_NODE),
    ("pending-off", P.PENDING, False, OFF, False, Report.PENDING, NodeState.SHUTDOWN, Operation.START_NODE),
    ("pending-on", P.PENDING, False, ON, True, Report.BOOTING, NodeState.STARTINGUP, None),
    ("pending-on-unusable", P.PENDING, False, ON, False, Report.BOOTING, NodeState.STARTINGUP, None),
    ("booting-off", P.BOOTING, False, OFF, False, Report.BOOTING, NodeState.STARTINGUP, None),
    ("booting-on-unusable", P.BOOTING, False, ON, False, Report.BOOTING, NodeState.STARTINGUP, None),
    ("booting-on-usable", P.BOOTING, False, ON, True, Report.BOOTING, NodeState.STARTINGUP, None),
    ("booting-marked-on", P.BOOTING, True, ON, True, Report.BOOTING, NodeState.STARTINGUP, None),
    ("ready-on-usable", P.READY, False, ON, True, Report.READY, NodeState.READY, None),
    ("ready-on-unusable", P.READY, False, ON, False, Report.BOOTING, NodeState.STARTINGUP, None),
    ("ready-off", P.READY, False, OFF, False, Report.BOOTING, NodeState.STARTINGUP, None),
    ("marked-ready-on", P.READY, True, ON, True, Report.DRAINING, NodeState.READY, Operation.SHUTDOWN_NODE),
    (
        "marked-ready-on-cordoned",
        P.READY,
        True,
        ON,
        False,
        Report.DRAINING,
        NodeState.READY,
        Operation.SHUTDOWN_NODE,
    ),
    ("marked-ready-off", P.READY, True, OFF, False, Report.OFF, NodeState.SHUTDOWN, None),
    (
        "marked-pending-on",
        P.PENDING,
        True,
        ON,
        True,
        Report.DRAINING,
        NodeState.READY,
        Operation.SHUTDOWN_NODE,
    ),
    ("marked-pending-off", P.PENDING, True, OFF, False, Report.OFF, NodeState.SHUTDOWN, None),
    ("failed-on", P.FAILED, False, ON, True, Report.DRAINING, NodeState.READY, Operation.SHUTDOWN_NODE),
    (
        "completed-on",
        P.COMPLETED,
        False,
        ON,
        False,
        Report.DRAINING,
        NodeState.READY,
        Operation.SHUTDOWN_NODE,
    ),
    ("failed-off", P.FAILED, False, OFF, False, Report.OFF, NodeState.SHUTDOWN, None),
    ("completed-off", P.COMPLETED, True, OFF, False, Report.OFF, NodeState.SHUTDOWN, None),
]


@pytest.mark.parametrize(
    ("phase", "marked", "power", "usable", "report", "node_state", "op"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_input_law_row(
    phase: Any,
    marked: bool,
    power: str,
    usable: bool,
    report: Report,
    node_state: NodeState,
    op: Operation | None,
) -> None:
    i = Input(claim_phase=phase, marked=marked, power=power, usable=usable)
    assert derive(i) == report
    assert state(i) == node_state
    assert fires(i) == op


def test_interface_accepts_strings() -> None:
    i = Input(claim_phase=None, marked=False, power="off", usable=False)
    assert (derive(i), state(i), fires(i)) == ("off", "shutdown", None)
    j = Input(claim_phase="pending", marked=False, power="off", usable=False)
    assert j.claim_phase is ClaimPhase.PENDING and j.power is PowerState.OFF
    assert fires(j) == "StartNode"
    with pytest.raises(ValueError):
        Input(claim_phase="bogus", marked=False, power="off", usable=False)


# The agreement of report and state: which states each report may be seen with.
AGREEMENT: dict[Report, frozenset[NodeState]] = {
    Report.OFF: frozenset({NodeState.SHUTDOWN}),
    Report.PENDING: frozenset({NodeState.SHUTDOWN}),
    Report.BOOTING: frozenset({NodeState.STARTINGUP}),
    Report.READY: frozenset({NodeState.READY}),
    Report.DRAINING: frozenset({NodeState.READY, NodeState.SHUTTINGDOWN}),
}

ALLOWED_OPS: dict[NodeState, frozenset[Operation | None]] = {
    NodeState.SHUTDOWN: frozenset({None, Operation.START_NODE}),
    NodeState.READY: frozenset({None, Operation.SHUTDOWN_NODE}),
    NodeState.STARTINGUP: frozenset({None}),
    NodeState.SHUTTINGDOWN: frozenset({None}),
}

inputs = st.builds(
    Input,
    claim_phase=st.sampled_from([None, *ClaimPhase]),
    marked=st.booleans(),
    power=st.sampled_from(list(PowerState)),
    usable=st.booleans(),
)


@given(inputs)
def test_state_and_report_agree(i: Input) -> None:
    assert state(i) in AGREEMENT[derive(i)]
    # and the operation agrees with the state: StartNode only from shutdown, ShutdownNode only from ready
    assert fires(i) in ALLOWED_OPS[state(i)]


@given(inputs)
def test_marked_is_ignored_without_a_live_claim(i: Input) -> None:
    if i.claim_phase is None or i.claim_phase in law.TERMINAL:
        flipped = Input(i.claim_phase, not i.marked, i.power, i.usable)
        assert law.row(i) == law.row(flipped)


@given(inputs)
def test_no_claim_and_terminal_claim_are_the_same_row(i: Input) -> None:
    """A terminal claim is not a want: it reads exactly like no claim."""
    if i.claim_phase in law.TERMINAL:
        none = Input(None, i.marked, i.power, i.usable)
        assert (derive(i), state(i), fires(i)) == (derive(none), state(none), fires(none))


def test_every_input_has_exactly_one_row() -> None:
    assert len(law.ALL_KEYS) == 6 * 2 * 2 * 2
    assert set(law.LAW) == set(law.ALL_KEYS)
    # every row of the table is used
    assert {r.name for r in law.LAW.values()} == {r.name for r in law.ROWS}


def test_overlapping_rows_are_refused() -> None:
    dup = law.ROWS[0]
    with pytest.raises(AssertionError, match="covered by"):
        law._expand((*law.ROWS, dup))


# --- unusable / power_of ------------------------------------------------------------------------------

TAINTS = (("node.cilium.io/agent-not-ready", "NoExecute"),)


def node(
    ready: str | None = "True", taints: list[dict[str, str]] | None = None, cordoned: bool = False
) -> dict[str, Any]:
    conditions = [{"type": "MemoryPressure", "status": "False"}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready})
    spec: dict[str, Any] = {"taints": taints or []}
    if cordoned:
        spec["unschedulable"] = True
    return {"metadata": {"name": "n1"}, "spec": spec, "status": {"conditions": conditions}}


CILIUM = {"key": "node.cilium.io/agent-not-ready", "effect": "NoExecute"}


@pytest.mark.parametrize(
    ("n", "taints", "expected"),
    [
        pytest.param(None, TAINTS, True, id="no-node"),
        pytest.param(node(ready="False"), TAINTS, True, id="not-ready"),
        pytest.param(node(ready="Unknown"), TAINTS, True, id="unknown"),
        pytest.param(node(ready=None), TAINTS, True, id="no-ready-condition"),
        pytest.param(node(taints=[CILIUM]), TAINTS, True, id="readiness-taint"),
        pytest.param(node(taints=[CILIUM]), [CILIUM], True, id="readiness-taint-as-dict"),
        pytest.param(node(taints=[{**CILIUM, "effect": "NoSchedule"}]), TAINTS, False, id="other-effect"),
        pytest.param(node(taints=[{**CILIUM, "effect": "NoSchedule"}]), [(CILIUM["key"], None)], True, id="any-eff"),
        pytest.param(node(taints=[{"key": "x", "effect": "NoExecute"}]), TAINTS, False, id="other-key"),
        pytest.param(node(taints=[CILIUM]), (), False, id="no-readiness-taints-configured"),
        pytest.param(node(cordoned=True), TAINTS, True, id="cordoned"),
        pytest.param(node(), TAINTS, False, id="all-good"),
    ],
)
def test_unusable(n: dict[str, Any] | None, taints: Any, expected: bool) -> None:
    assert unusable(n, taints) is expected


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        pytest.param(None, PowerState.OFF, id="no-node"),
        pytest.param(node(ready="True"), PowerState.ON, id="ready"),
        pytest.param(node(ready="False"), PowerState.OFF, id="not-ready"),
        pytest.param(node(ready="Unknown"), PowerState.OFF, id="unknown"),
        pytest.param(node(ready=None), PowerState.OFF, id="no-condition"),
        pytest.param(node(cordoned=True, taints=[CILIUM]), PowerState.ON, id="cordoned-tainted-is-still-on"),
    ],
)
def test_power_of(n: dict[str, Any] | None, expected: PowerState) -> None:
    assert power_of(n) is expected


# --- phase predicates ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "live", "terminal", "boot_window"),
    [
        (None, True, False, True),
        ("pending", True, False, True),
        ("booting", True, False, True),
        ("ready", True, False, False),
        ("failed", False, True, False),
        ("completed", False, True, False),
    ],
)
def test_phase_predicates(phase: str | None, live: bool, terminal: bool, boot_window: bool) -> None:
    assert law.is_live(phase) is live
    assert law.is_terminal(phase) is terminal
    assert law.in_boot_window(phase) is boot_window
    assert law.wants_machine(phase, marked=False) is live
    assert law.wants_machine(phase, marked=True) is False


def test_unusable_reads_the_groups_taint_models() -> None:
    from api.v2alpha1 import Taint

    taints = [Taint(key="node.cilium.io/agent-not-ready", effect="NoExecute")]
    assert unusable(node(taints=[CILIUM]), taints) is True
    assert unusable(node(), taints) is False
