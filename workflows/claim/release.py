"""The end of a machine's episode for a live claim: a marked claim is reversed (shut down, verified off).

A failed claim does not drain its own machine any more: it ends, and its group hands the machine to a release
(law 3: a terminal claim is not a want), which waits out a startup Job still running first.
"""

from __future__ import annotations

from api.names import ClaimPhase, ClaimReason, ConditionType, JobType
from workflows.claim.runtime import ClaimRuntime
from workflows.shutdown import JOB_OUTCOME_SUCCEEDED, monitor_job, shut_down


async def reverse(rt: ClaimRuntime) -> None:
    """A live claim marked for deletion: power the machine off, then complete with the request's reason.

    A boot is reversed, never interrupted: a startup Job still running is waited out first, and a machine that
    Job powered is shut down whether or not its kubelet has shown it yet.
    """
    s = rt.s
    if s.startup_running:
        rt.details(f"scale-down ({s.mark_reason}): letting the startup Job finish first")
        if await monitor_job(rt, s.startup_job, JobType.STARTUP, started=s.startup_started_at) == JOB_OUTCOME_SUCCEEDED:
            s.powered = True
    rt.details(f"scale-down ({s.mark_reason}): shutting the machine down")
    if not await shut_down(rt):
        return
    s.machine_off_verified = True
    s.set_condition(ConditionType.MACHINE_OBSERVED_OFF, True, "ShutdownVerified", "machine observed off", rt.now())
    await rt.move(ClaimPhase.COMPLETED, s.mark_reason or ClaimReason.NODE_DELETED, "machine observed off")
