"""The group's bookkeeping when an owner of a slot ends: what it saw last, and a release whose id is still taken.

An observation the group sends on to a claim or a release that is ending is never heard by it; the owner's final
report carries its own last view, so the group can tell whether it holds a newer one that shows the machine on.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from api import contracts as c
from domain.timings import TIMINGS
from workflows.group.state import GroupState, SlotBook

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def seen(power: str, at: int) -> c.Observation:
    return c.Observation(power=power, usable=power == "on", exists=True, observed_at=T0 + timedelta(seconds=at))


def state_with_slot(observation: c.Observation) -> GroupState:
    s = GroupState("ns", "g", loaded=True)
    s.slots["s1"] = SlotBook(name="s1", node_name="s1", provider_id="homelab://ns/s1", observation=observation)
    return s


def final(observation: c.Observation | None, **kw: object) -> c.ClaimDigest:
    base: dict[str, object] = dict(
        name="s1-abc", slot="s1", group="g", phase="completed", attempt=1, call="IncreaseSize",
        requested_at=T0, finished_at=T0, machine_off=True, workflow_done=True,
        observation=observation,
    )  # fmt: skip
    base.update(kw)
    return c.ClaimDigest(**base)  # type: ignore[arg-type]


def test_an_on_the_group_heard_after_the_claim_last_looked_is_released() -> None:
    s = state_with_slot(seen("on", 10))
    s.remember(final(seen("off", 5)))
    assert s.slots["s1"].releasing and s.slots["s1"].release is not None


def test_a_claim_that_saw_off_last_keeps_its_view_and_a_stale_on_changes_nothing() -> None:
    s = state_with_slot(seen("on", 5))
    s.remember(final(seen("off", 10)))
    book = s.slots["s1"]
    assert not book.releasing and book.observation == seen("off", 10)
    assert seen("on", 7).older_than(book.observation), "a late 'on' from before the claim's end is dropped"


def test_a_handed_over_machine_is_not_released_by_the_group() -> None:
    s = state_with_slot(seen("on", 10))
    s.remember(final(seen("off", 5), hand_over=True, reason="Superseded", phase="failed"))
    assert not s.slots["s1"].releasing


def test_a_refused_release_waits_doubling_up_to_the_reload_interval() -> None:
    book = state_with_slot(seen("on", 0)).slots["s1"]
    seed = c.ReleaseSeed("ns", "s1", "g")
    waits: list[timedelta] = []
    for _ in range(12):
        book.release = None
        book.release_refused(seed, T0)
        assert book.release == seed and not book.release_due(T0)
        assert book.release_after is not None
        waits.append(book.release_after - T0)
    assert waits[:3] == [TIMINGS.release_restart_first * n for n in (1, 2, 4)]
    assert max(waits) == TIMINGS.reload_interval
    assert book.release_due(T0 + TIMINGS.reload_interval)
    book.release_started()
    assert book.release_after is None and book.release_restarts == 0


def test_a_taken_over_claim_a_newer_live_claim_outranks_is_started_and_superseded() -> None:
    """Its resource exists: dropped as never started, it stayed pending with no workflow (seed 3816984121)."""
    s = state_with_slot(seen("on", 10))
    s.remember(final(None, name="s1-new", phase="ready", requested_at=T0 + timedelta(minutes=5), workflow_done=False))
    seed = c.ClaimSeed(
        namespace="ns", name="by-hand", slot="s1", group="g", call="Manual", attempt=1, requested_at=T0,
        deadline_at=None, max_provision_seconds=600, ttl_seconds=60, create_resource=False,
    )  # fmt: skip
    s.book_claim(seed)
    assert "by-hand" not in s.claims and seed not in s.to_start, "booking alone drops the older claim"
    s.start_superseded(seed)
    assert seed in s.to_start and s.claims["by-hand"].reason == "Superseded"
    assert [(o.signal, o.arg) for o in s.outbox] == [(c.ClaimSignal.SUPERSEDED, "s1-new")]
    s.remember(final(None, name="by-hand", phase="pending", requested_at=T0, workflow_done=False))
    assert s.claims["by-hand"].reason == "Superseded", "a report sent before it heard changes nothing"
    assert s.slots["s1"].live_claim == "s1-new" and s.target_size() == 1
