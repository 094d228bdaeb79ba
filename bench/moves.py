"""Workflow tasks per claim move, read from a claim's history: what a boot and a lifecycle cost the worker.

A workflow task is the unit the worker pays for (a poll, a replay or cache hit, a completion the server persists);
the floor's one-activity workflow takes 2. A claim's moves are its `ClaimPhase` search attribute upserts, so the
tasks are counted between them: a task belongs to the move its commands carry, or to the next move.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

from api import contracts as c

COMPLETED = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
UPSERT = EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES


def _phase(event: HistoryEvent) -> str:
    """The phase a search attribute upsert records ("" when it records none)."""
    fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
    if c.SA_PHASE not in fields:
        return ""
    try:
        return str(json.loads(fields[c.SA_PHASE].data))
    except ValueError:
        return ""


@dataclass
class Moves:
    """Per move (`booting`, `ready`, ..., in order), the workflow tasks up to and including the one that made it;
    `after` the tasks after the last move (the run's close); `events` every event."""

    tasks: list[tuple[str, int]] = field(default_factory=list)
    after: int = 0
    events: int = 0

    @property
    def total(self) -> int:
        return sum(n for _, n in self.tasks) + self.after

    def upto(self, phase: str) -> int:
        """Tasks from the run's start to the move to `phase` (all of them when it never moved there)."""
        out = 0
        for moved, n in self.tasks:
            out += n
            if moved == phase:
                return out
        return self.total

    def text(self) -> str:
        moves = ", ".join(f"→{phase} {n}" for phase, n in self.tasks)
        return f"{moves}, close {self.after}"


def moves(events: Sequence[HistoryEvent]) -> Moves:
    out = Moves(events=len(events))
    since = 0  # tasks completed since the last move
    for e in events:
        if e.event_type == COMPLETED:
            since += 1
        elif e.event_type == UPSERT and (phase := _phase(e)):
            if out.tasks and out.tasks[-1][0] == phase:  # the same phase upserted again: no move
                continue
            out.tasks.append((phase, since))
            since = 0
    out.after = since
    return out


def tasks(events: Sequence[HistoryEvent]) -> int:
    """Workflow tasks completed in a history."""
    return sum(1 for e in events if e.event_type == COMPLETED)
