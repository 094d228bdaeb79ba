"""The node state machine: every legal row, every illegal pair, the claim consequences, the seed."""

from __future__ import annotations

import itertools

import pytest

from api.names import ClaimPhase, ClaimReason, NodeEvent, NodeState
from domain import fsm, law
from domain.fsm import IllegalTransition, fire

S, E = NodeState, NodeEvent

LEGAL = [
    (S.SHUTDOWN, E.START_NODE, S.STARTINGUP),
    (S.READY, E.SHUTDOWN_NODE, S.SHUTTINGDOWN),
    (S.STARTINGUP, E.JOB_COMPLETED, S.READY),
    (S.SHUTTINGDOWN, E.JOB_COMPLETED, S.SHUTDOWN),
    (S.STARTINGUP, E.JOB_FAILED, S.SHUTDOWN),
    (S.SHUTTINGDOWN, E.JOB_FAILED, S.READY),
    (S.STARTINGUP, E.JOB_TIMEOUT, S.SHUTDOWN),
    (S.SHUTTINGDOWN, E.JOB_TIMEOUT, S.READY),
]
LEGAL_KEYS = {(s, e) for s, e, _ in LEGAL}
ILLEGAL = [(s, e) for s, e in itertools.product(S, E) if (s, e) not in LEGAL_KEYS]


@pytest.mark.parametrize(("state", "event", "expected"), LEGAL, ids=[f"{s}-{e}" for s, e, _ in LEGAL])
def test_legal_transition(state: NodeState, event: NodeEvent, expected: NodeState) -> None:
    assert fire(state, event) is expected
    assert fire(str(state), str(event)) is expected


@pytest.mark.parametrize(("state", "event"), ILLEGAL, ids=[f"{s}-{e}" for s, e in ILLEGAL])
def test_illegal_transition(state: NodeState, event: NodeEvent) -> None:
    with pytest.raises(IllegalTransition) as err:
        fire(state, event)
    assert str(state) in str(err.value) and str(event) in str(err.value)
    with pytest.raises(IllegalTransition):
        fsm.consequence(state, event)


def test_table_is_exactly_the_seed() -> None:
    """The seed's rows, less ForceCleanup: every transition here is bounded by its own timer (docs/decisions.md)."""
    assert dict(fsm.TRANSITIONS) == {(s, e): n for s, e, n in LEGAL}
    assert len(ILLEGAL) == 4 * 5 - 8
    assert set(fsm.CONSEQUENCES) == set(fsm.TRANSITIONS)


@pytest.mark.parametrize(
    ("state", "event", "phase", "reason"),
    [
        (S.SHUTDOWN, E.START_NODE, ClaimPhase.BOOTING, None),
        (S.STARTINGUP, E.JOB_FAILED, ClaimPhase.FAILED, ClaimReason.STARTUP_JOB_FAILED),
        (S.STARTINGUP, E.JOB_TIMEOUT, ClaimPhase.FAILED, ClaimReason.STARTUP_JOB_TIMEOUT),
        (S.SHUTTINGDOWN, E.JOB_TIMEOUT, None, None),
        (S.SHUTTINGDOWN, E.JOB_FAILED, None, None),
        (S.SHUTTINGDOWN, E.JOB_COMPLETED, ClaimPhase.COMPLETED, None),
    ],
)
def test_consequences(state: NodeState, event: NodeEvent, phase: ClaimPhase | None, reason: ClaimReason | None) -> None:
    c = fsm.consequence(state, event)
    assert (c.claim_phase, c.reason) == (phase, reason)


def test_seed_is_the_law() -> None:
    for phase, marked, power, usable in law.ALL_KEYS:
        i = law.Input(phase, marked, power, usable)
        assert fsm.seed(i) is law.state(i)


def test_the_law_fires_only_legal_events() -> None:
    """Whatever the law fires is a legal event from the state it seeds."""
    for key in law.ALL_KEYS:
        i = law.Input(*key)
        op = law.fires(i)
        if op is not None:
            fire(fsm.seed(i), NodeEvent(op))
