"""Which free slot a new claim takes: off before on, fewest recent activations next, name last.

The order is data (`ORDER`), so the rule is read in one line and tested row by row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from workflows.legacy.v2.group_state import SlotBook

# Each entry ranks slots on one criterion; earlier entries decide first.
ORDER: tuple[tuple[str, Callable[[SlotBook], object]], ...] = (
    ("off first", lambda s: 0 if s.observation.power == "off" else 1),
    ("fewest recent activations", lambda s: s.activations),
    ("name", lambda s: s.name),
)


def rank(slot: SlotBook) -> tuple[object, ...]:
    return tuple(key(slot) for _, key in ORDER)


def choose(slots: Iterable[SlotBook], count: int) -> list[SlotBook]:
    """The `count` best free slots (fewer when there are not enough)."""
    return sorted((s for s in slots if s.free), key=rank)[:count]
