"""The end of a machine's episode: a marked claim is reversed, a failed one with its machine on is drained.

Both run ShutdownNode through the shared driver and end with the machine observed off; the claim's
finalizer comes off once nothing more will be done for it.
"""

from __future__ import annotations

from api import contracts as c
from api.names import ClaimPhase, ClaimReason, ConditionType, JobType
from workflows.legacy.v2.claim_runtime import ClaimRuntime
from workflows.legacy.v2.shutdown import monitor_job, shut_down


async def reverse(rt: ClaimRuntime) -> None:
    """A live claim marked for deletion: power the machine off, then complete with the request's reason."""
    s = rt.s
    rt.details(f"scale-down ({s.mark_reason}): shutting the machine down")
    if not await shut_down(rt):
        return
    _observed_off(rt)
    await rt.move(ClaimPhase.COMPLETED, s.mark_reason or ClaimReason.NODE_DELETED, "machine observed off")
    await release_finalizer(rt)
    if s.mark_reason == ClaimReason.DELETED_BY_HAND:
        s.resource_gone = True  # its deletion was waiting on this finalizer alone


async def drain(rt: ClaimRuntime) -> None:
    """A terminal claim whose machine is on is not a want: wait out its startup Job, then power it off."""
    s = rt.s
    if s.startup_job and s.startup_job not in s.book.finished_jobs:
        await monitor_job(rt, s.startup_job, JobType.STARTUP)
    await rt.observe_now()
    if s.power_on and not s.abandoned:
        rt.details(f"claim {s.phase} ({s.reason}) with the machine on: forced shutdown")
        if await shut_down(rt):
            _observed_off(rt)
            await rt.project()
    elif not s.power_on:
        s.machine_off_verified = True
    await release_finalizer(rt)
    await rt.notify_group()


def _observed_off(rt: ClaimRuntime) -> None:
    s = rt.s
    s.machine_off_verified = True
    s.set_condition(ConditionType.MACHINE_OBSERVED_OFF, True, "ShutdownVerified", "machine observed off", rt.now())


async def release_finalizer(rt: ClaimRuntime) -> None:
    s = rt.s
    if s.resource_gone:
        return
    await rt.write(
        c.Act.RELEASE_CLAIM,
        c.ClaimRef(s.seed.namespace, s.seed.name),
        f"remove the finalizer of {s.seed.name}",
    )
