"""Which free slot a new claim takes: only slots whose claim could boot; off before on, fewest recent
activations next, name last.

The order is data (`ORDER`), so the rule is read in one line and tested row by row. A slot whose spec cannot
power it, or whose next claim would be past the attempt limit, is never chosen: a claim placed there is a
failure known in advance, and cluster-autoscaler would back off the whole group for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from workflows.group.state import SlotBook

# Each entry ranks slots on one criterion; earlier entries decide first.
ORDER: tuple[tuple[str, Callable[[SlotBook], object]], ...] = (
    ("off first", lambda s: 0 if s.observation.power == "off" else 1),
    ("fewest recent activations", lambda s: s.activations),
    ("name", lambda s: s.name),
)


def rank(slot: SlotBook) -> tuple[object, ...]:
    return tuple(key(slot) for _, key in ORDER)


def choose(slots: Iterable[SlotBook], count: int) -> list[SlotBook]:
    """The `count` best free slots that can take a claim (fewer when there are not enough)."""
    return sorted((s for s in slots if s.free and s.claimability().ok), key=rank)[:count]


def unclaimable(slots: Iterable[SlotBook]) -> list[str]:
    """Why each free slot that cannot take a claim is skipped ("worker-3: AttemptLimitReached (...)")."""
    found = []
    for s in sorted(slots, key=lambda b: b.name):
        why = s.claimability()
        if s.free and not why.ok:
            found.append(f"{s.name}: {why.reason} ({why.message})")
    return found
