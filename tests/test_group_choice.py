"""The slot-choice order, row by row: off before on, fewest recent activations, then name; busy slots never."""

from __future__ import annotations

import pytest

from api import contracts as c
from workflows.group.choice import ORDER, choose
from workflows.group.state import SlotBook


def book(name: str, *, power: str = "off", activations: int = 0, **busy: object) -> SlotBook:
    b = SlotBook(name=name, node_name=name, provider_id=f"homelab://ns/{name}", activations=activations)
    b.observation = c.Observation(power=power)
    for k, v in busy.items():
        setattr(b, k, v)
    return b


@pytest.mark.parametrize(
    ("slots", "expected"),
    [
        pytest.param([book("a", power="on"), book("b")], ["b", "a"], id="off-before-on"),
        pytest.param([book("a", activations=5), book("b", activations=1)], ["b", "a"], id="fewest-activations"),
        pytest.param([book("b"), book("a")], ["a", "b"], id="name-last"),
        pytest.param(
            [book("a", power="on", activations=0), book("b", power="off", activations=9)], ["b", "a"], id="power-first"
        ),
        pytest.param([book("a", live_claim="x"), book("b")], ["b"], id="live-claim-is-busy"),
        pytest.param([book("a", releasing=True), book("b")], ["b"], id="release-is-busy"),
        pytest.param([book("a", exists=False), book("b")], ["b"], id="deleted-slot"),
    ],
)
def test_choice_order(slots: list[SlotBook], expected: list[str]) -> None:
    assert [s.name for s in choose(slots, len(slots))] == expected


def test_choice_takes_at_most_count() -> None:
    assert [s.name for s in choose([book("c"), book("a"), book("b")], 2)] == ["a", "b"]


def test_order_is_documented_data() -> None:
    assert [name for name, _ in ORDER] == ["off first", "fewest recent activations", "name"]
