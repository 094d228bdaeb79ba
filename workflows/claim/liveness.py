"""ready: the claim owns a serving machine until it is marked, superseded, or the machine is gone too long.

A machine observed off stamps MachineObservedOff and starts its clock; one that comes back clears it (a reboot
looks like this for minutes); one that stays off past one boot window ends the claim failed, MachineGone.
"""

from __future__ import annotations

from temporalio import workflow

from api.names import ClaimPhase, ClaimReason, ConditionType
from domain import claims
from domain.timings import TIMINGS
from workflows.claim.runtime import ClaimRuntime
from workflows.patches import Patch

# The truth read of a serving machine: watcher signals carry every change; this bounds a lost one.


async def serve(rt: ClaimRuntime) -> bool:
    """Hold a ready claim; True when the workflow should continue as new (its history grew long)."""
    s = rt.s
    grace = claims.machine_gone_grace()
    while s.phase == ClaimPhase.READY and not s.marked and not s.abandoned:
        if workflow.info().is_continue_as_new_suggested():
            return True
        if s.liveness_reads >= s.seed.reads_per_run:
            workflow.deprecate_patch(Patch.CONTINUE_AFTER_LIVENESS_READS)
            return True
        now = rt.now()
        if not s.power_on:
            if s.observed_off_since is None:
                s.observed_off_since = now
                s.set_condition(ConditionType.MACHINE_OBSERVED_OFF, True, "NodeNotReady", "machine observed off", now)
                await rt.project()
            gone_at = s.observed_off_since + grace
            if now >= gone_at:
                await rt.observe_now()
                if not s.power_on:
                    await rt.move(
                        ClaimPhase.FAILED,
                        ClaimReason.MACHINE_GONE,
                        f"machine observed off since {s.observed_off_since:%H:%M:%S}Z, past the grace of {grace}",
                        True,
                    )
                    return False
                continue
            rt.details(f"machine observed off; MachineGone at {gone_at:%H:%M:%S}Z unless it comes back")
            if not await rt.wait(
                lambda: s.power_on or s.marked or bool(s.abandoned),
                min(gone_at - now, TIMINGS.liveness_read_interval),
                "MachineGone grace",
            ):
                await rt.observe_now()
            continue
        if s.observed_off_since is not None:
            s.observed_off_since = None
            s.set_condition(ConditionType.MACHINE_OBSERVED_OFF, False, "NodeReady", "machine back on", now)
            await rt.project()
        rt.details("serving: the machine is on")
        if not await rt.wait(
            lambda: not s.power_on or s.marked or bool(s.abandoned),
            TIMINGS.liveness_read_interval,
            "liveness read",
        ):
            s.liveness_reads += 1
            await rt.observe_now()
    return False
