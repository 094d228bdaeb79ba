"""The node state machine as a table, seeded from the input law, never from a stored state.

``TRANSITIONS`` says where an event takes the machine; ``CONSEQUENCES`` says what the same transition means
for the claim (as data, for the workflow to act on). Anything not in the table is an illegal transition.

The seed's ``ForceCleanup`` (a transitional state stuck past a lock timeout, reason ``StuckTransition``) has no
row: here every wait of a transition is a Temporal timer with its own bound (the Job timeout, registration,
the readiness gate, the boot deadline, the shutdown verification), so no transition can outlive its bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from api.names import ClaimPhase, ClaimReason, NodeEvent, NodeState
from domain import law

_S = NodeState
_E = NodeEvent

TRANSITIONS: Mapping[tuple[NodeState, NodeEvent], NodeState] = {
    (_S.SHUTDOWN, _E.START_NODE): _S.STARTINGUP,
    (_S.READY, _E.SHUTDOWN_NODE): _S.SHUTTINGDOWN,
    (_S.STARTINGUP, _E.JOB_COMPLETED): _S.READY,
    (_S.SHUTTINGDOWN, _E.JOB_COMPLETED): _S.SHUTDOWN,
    (_S.STARTINGUP, _E.JOB_FAILED): _S.SHUTDOWN,
    (_S.SHUTTINGDOWN, _E.JOB_FAILED): _S.READY,
    (_S.STARTINGUP, _E.JOB_TIMEOUT): _S.SHUTDOWN,
    (_S.SHUTTINGDOWN, _E.JOB_TIMEOUT): _S.READY,
}


@dataclass(frozen=True)
class Consequence:
    """What a transition means for the claim: the move it writes (if any), the reason, and a side note."""

    claim_phase: ClaimPhase | None
    reason: ClaimReason | None
    note: str


_P = ClaimPhase
_R = ClaimReason

# One entry per row of TRANSITIONS. claim_phase None: the transition writes no claim move by itself.
CONSEQUENCES: Mapping[tuple[NodeState, NodeEvent], Consequence] = {
    (_S.SHUTDOWN, _E.START_NODE): Consequence(_P.BOOTING, None, "creates the startup Job; pending -> booting"),
    (_S.READY, _E.SHUTDOWN_NODE): Consequence(
        None, None, "cordons, creates the shutdown Job, counts one shutdown attempt"
    ),
    (_S.STARTINGUP, _E.JOB_COMPLETED): Consequence(
        None, None, "the readiness gate answers: booting -> ready, or failed ReadinessGateTimeout"
    ),
    (_S.SHUTTINGDOWN, _E.JOB_COMPLETED): Consequence(
        _P.COMPLETED, None, "only once the machine is observed off; the reason comes from the request"
    ),
    (_S.STARTINGUP, _E.JOB_FAILED): Consequence(_P.FAILED, _R.STARTUP_JOB_FAILED, "the claim ends failed"),
    (_S.SHUTTINGDOWN, _E.JOB_FAILED): Consequence(None, None, "the claim stays; its shutdown attempt counts"),
    (_S.STARTINGUP, _E.JOB_TIMEOUT): Consequence(_P.FAILED, _R.STARTUP_JOB_TIMEOUT, "the claim ends failed"),
    (_S.SHUTTINGDOWN, _E.JOB_TIMEOUT): Consequence(
        None, None, "the claim stays; its shutdown attempt counts (a ShutdownJobTimeout Event)"
    ),
}


class IllegalTransition(Exception):
    """An event the current state has no row for; the machine stays where it is."""

    def __init__(self, state: NodeState, event: NodeEvent) -> None:
        super().__init__(f"illegal transition: {event} from {state}")
        self.state = state
        self.event = event


def fire(state: NodeState | str, event: NodeEvent | str) -> NodeState:
    """The next state for (state, event), or IllegalTransition."""
    key = (NodeState(state), NodeEvent(event))
    if key not in TRANSITIONS:
        raise IllegalTransition(*key)
    return TRANSITIONS[key]


def consequence(state: NodeState | str, event: NodeEvent | str) -> Consequence:
    """The claim side of a legal transition (IllegalTransition otherwise)."""
    key = (NodeState(state), NodeEvent(event))
    if key not in CONSEQUENCES:
        raise IllegalTransition(*key)
    return CONSEQUENCES[key]


def seed(i: law.Input) -> NodeState:
    """Where a pass starts: the law's state for the input, never a state read back off the slot."""
    return law.state(i)
