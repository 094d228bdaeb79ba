"""What a claim resource must say, whatever Temporal lost: checks shared by the model (tests/model.py) and the chaos
suite (tests/chaos.py), over claim resources and their Events as the API returns them.

* every move Event follows a write that landed: the resource reached that move's phase (a terminal Event's exactly);
* a claim's finalizer is let go only with its terminal record (a committed claim holds it);
* once quiet, the phase, reason and conditions agree with what the machine did.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from api.names import FINALIZER_CLAIM, ClaimPhase, ClaimReason, ConditionType, EventReason
from domain import claims

JSON = Mapping[str, Any]

# The phase a move's Event says the claim reached (the one write it follows).
MOVE_PHASES: dict[str, ClaimPhase] = {
    EventReason.CLAIM_BOOTING: ClaimPhase.BOOTING,
    EventReason.CLAIM_READY: ClaimPhase.READY,
    EventReason.CLAIM_FAILED: ClaimPhase.FAILED,
    EventReason.CLAIM_SUPERSEDED: ClaimPhase.FAILED,
    EventReason.CLAIM_COMPLETED: ClaimPhase.COMPLETED,
    EventReason.CLAIM_CANCELLED: ClaimPhase.COMPLETED,
}
ORDER = {
    ClaimPhase.PENDING: 0,
    ClaimPhase.BOOTING: 1,
    ClaimPhase.READY: 2,
    ClaimPhase.FAILED: 3,
    ClaimPhase.COMPLETED: 3,
}
TERMINAL = (ClaimPhase.FAILED, ClaimPhase.COMPLETED)


def phase(claim: JSON) -> ClaimPhase | None:
    """The claim's phase (none yet is pending); None for one no contract accepts (judged by its own checks)."""
    value = (claim.get("status") or {}).get("phase") or ClaimPhase.PENDING
    return ClaimPhase(value) if value in set(ClaimPhase) else None


def name(claim: JSON) -> str:
    return str((claim.get("metadata") or {}).get("name") or "")


def held(claim: JSON) -> bool:
    return FINALIZER_CLAIM in ((claim.get("metadata") or {}).get("finalizers") or [])


def conditions(claim: JSON) -> dict[str, JSON]:
    return {str(cd.get("type")): cd for cd in (claim.get("status") or {}).get("conditions") or []}


def is_true(claim: JSON, kind: str) -> bool:
    return conditions(claim).get(kind, {}).get("status") == "True"


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if isinstance(value, str) and value else None


def events_without_their_write(claim: JSON, events: Iterable[JSON]) -> list[str]:
    """Move Events of this claim (by uid) whose write the resource does not show: it never reached that phase."""
    uid = (claim.get("metadata") or {}).get("uid")
    now = phase(claim)
    if now is None:
        return []
    found = []
    for event in events:
        moved = MOVE_PHASES.get(str(event.get("reason")))
        if moved is None or (event.get("involvedObject") or {}).get("uid") != uid:
            continue
        reached = now == moved if moved in TERMINAL else ORDER[now] >= ORDER[moved]
        if not reached:
            found.append(f"{name(claim)}: a {event['reason']} Event, and the resource says {now}")
    return found


class Finalizers:
    """Remembers which claims were seen holding the finalizer, so one let go while the claim is not terminal shows
    (at any instant: a committed claim, booting or ready, always holds it)."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()

    def let_go_early(self, resources: Iterable[JSON]) -> list[str]:
        found = []
        for claim in resources:
            key = (name(claim), str((claim.get("metadata") or {}).get("uid")))
            if held(claim):
                self.seen.add(key)
                continue
            if phase(claim) in (*TERMINAL, None):
                continue
            if key in self.seen or phase(claim) in (ClaimPhase.BOOTING, ClaimPhase.READY):
                found.append(f"{name(claim)} is {phase(claim)} without its finalizer")
        return found


def record_disagreements(claim: JSON, power: str | None) -> list[str]:
    """Once quiet: what the resource says against what its machine did (`power`: the slot's machine now, None when
    the slot is not the operator's). A claim still on its way (pending, booting) is the law check's to judge."""
    st, now, said = claim.get("status") or {}, phase(claim), name(claim)
    found = []
    reason = str(st.get("reason") or "")
    if now == ClaimPhase.READY:
        if power is not None and power != "on":
            found.append(f"{said}: ready, its machine {power}")
        if is_true(claim, ConditionType.MACHINE_OBSERVED_OFF) and power == "on":
            found.append(f"{said}: ready with its machine on, MachineObservedOff=True")
        if reason != ClaimReason.ADOPTED and not is_true(claim, ConditionType.READY):
            found.append(f"{said}: ready without Ready=True ({conditions(claim)})")
    elif now in TERMINAL:
        if not reason or reason not in {str(r) for r in ClaimReason}:
            found.append(f"{said}: {now} with reason {reason!r}")
        if is_true(claim, ConditionType.READY):
            found.append(f"{said}: {now} with Ready=True")
        finished = _time(st.get("finishedAt"))
        if finished is None:
            found.append(f"{said}: {now} without finishedAt")
        committed = is_true(claim, ConditionType.MACHINE_COMMITTED)
        if now == ClaimPhase.COMPLETED and committed and not is_true(claim, ConditionType.MACHINE_OBSERVED_OFF):
            found.append(f"{said}: completed ({reason}) without its machine observed off")
        if reason == ClaimReason.MACHINE_GONE:
            off = conditions(claim).get(ConditionType.MACHINE_OBSERVED_OFF, {})
            since = _time(off.get("lastTransitionTime"))
            if off.get("status") != "True" or since is None:
                found.append(f"{said}: MachineGone without MachineObservedOff=True")
            elif finished is not None and finished - since < claims.machine_gone_grace() - timedelta(seconds=1):
                found.append(f"{said}: MachineGone {finished - since} after its machine was seen off (early)")
    return found
