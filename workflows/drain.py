"""The drain before dark: between the cordon and the shutdown Job, the node's Pods leave through the Eviction API.

The decision is here, the calls are activities (`Act.DRAIN` rounds). Rounds repeat with a growing pause until
nothing but DaemonSet, mirror and finished Pods is left. Past the group's bound the drain says once, in a Warning
on the claim and the slot, which Pods are in the way and why, and goes on: a blocked drain leaves the machine on,
and only a person's force annotation (read by each round) or the Pods leaving ends it. No Pod name is carried.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from temporalio import workflow

from api import contracts as c
from domain.timings import TIMINGS
from workflows.verbs import Broken

if TYPE_CHECKING:
    from workflows.shutdown import ShutdownHost


def drain_fact(owner: str) -> str:
    """What DrainBlocked says, once per power-off of a claim (or a release episode), whichever run says it."""
    return f"{owner}: drain blocked"


def _waited(seconds: int) -> str:
    minutes, rest = divmod(seconds, 60)
    return f"{minutes}m{rest}s" if minutes and rest else (f"{minutes}m" if minutes else f"{rest}s")


async def drain(host: ShutdownHost) -> bool:
    """Drain the host's slot's node; True once it is drained (or the machine went off meanwhile), False when the
    host was interrupted (a superseded claim, an aborted release): the machine is someone else's now."""
    slot = host.slot_ref()
    owner = host.job_owner() or slot.slot
    request = c.DrainRequest(slot.namespace, slot.slot, host.claim_name())
    started = host.now()
    pause = TIMINGS.drain_poll_first
    warned = False
    while True:
        if host.interrupted():
            return False
        if not host.maybe_on():
            return True
        found: c.DrainRound | None = await host.read(
            c.Act.DRAIN, request, c.DrainRound, f"drain the node of slot {slot.slot}"
        )
        if found is not None and found.done:
            return True
        waited = host.now() - started
        if found is not None:
            host.details(
                f"draining the node: {found.left} Pods left ({found.refused} refused by a budget, "
                f"{found.held} held by an annotation{', forced' if found.forced else ''})"
            )
            if not warned and waited >= timedelta(seconds=found.bound_seconds):
                warned = True
                said = c.DrainBlocked(
                    slot.namespace,
                    slot.slot,
                    host.claim_name(),
                    _waited(int(waited.total_seconds())),
                    found.left,
                    drain_fact(owner),
                )
                try:
                    await host.write(c.Act.DRAIN_BLOCKED, said, f"say why the drain of slot {slot.slot} is blocked")
                except Broken as err:  # the slot is gone: its workflow hears of it; nothing to say it on
                    workflow.logger.warning("drain of slot %s: warning not recorded: %s", slot.slot, err)
        await host.wait(lambda: host.interrupted() or not host.maybe_on(), pause, "drain: the next round")
        pause = min(pause * 2, TIMINGS.drain_poll_max)
