"""pending: the attempt bound, a cancel, and StartNode (the one write that commits a machine)."""

from __future__ import annotations

from api import contracts as c
from api.names import ClaimPhase, ClaimReason, EventReason, JobType, Operation
from domain import claims, law
from domain.timings import TIMINGS
from workflows.legacy.v2.claim_runtime import ClaimRuntime


async def launch(rt: ClaimRuntime) -> None:
    """Move a pending claim on: failed past the attempt bound, completed when cancelled, else booting."""
    s = rt.s
    seed = s.seed
    if claims.attempt_limit_exceeded(seed.attempt):
        await rt.move(
            ClaimPhase.FAILED,
            ClaimReason.ATTEMPT_LIMIT_EXCEEDED,
            f"attempt {seed.attempt} is past the limit of {TIMINGS.max_consecutive_attempts} consecutive attempts; "
            "no machine was bought",
            warning=True,
        )
        return
    await rt.observe_now()
    if s.abandoned:
        return
    if s.marked:
        await cancel(rt)
        return
    ref = c.ClaimRef(seed.namespace, seed.name)
    rt.details("committing the machine: finalizer, then the startup Job")
    await rt.write_in_boot_window(c.Act.ADD_FINALIZER, ref, f"add the finalizer to claim {seed.name}")
    if law.fires(s.law_input()) is Operation.START_NODE:
        job = c.job_name(seed.name, JobType.STARTUP, 1)
        await rt.write_in_boot_window(
            c.Act.CREATE_JOB,
            c.JobRequest(seed.namespace, seed.slot, JobType.STARTUP, 1, seed.name, job),
            f"startup Job {job}",
        )
        s.startup_job = job
        await rt.move(ClaimPhase.BOOTING, message=f"startup Job {job} created")
    else:
        # The machine is already on (powered by hand, or a release still in flight): nothing to start, so the
        # claim commits to it and goes straight to the registration and readiness checks.
        await rt.move(ClaimPhase.BOOTING, message="machine already on; no startup Job")


async def cancel(rt: ClaimRuntime) -> None:
    """Cancelling a pending claim is deleting it: nothing is in flight, and the target drops on that write."""
    s = rt.s
    ref = c.ClaimRef(s.seed.namespace, s.seed.name)
    s.phase = claims.move(s.phase, ClaimPhase.COMPLETED)
    s.reason = s.mark_reason or ClaimReason.CANCELLED_BY_DECREASE_TARGET_SIZE
    s.finished_at = rt.now()
    s.machine_off_verified = not s.power_on
    rt.search_attributes()
    await rt.project(EventReason.CLAIM_CANCELLED, f"cancelled while pending ({s.reason})")
    await rt.write(c.Act.DELETE_CLAIM, ref, f"delete cancelled claim {s.seed.name}")
    s.resource_gone = True
    await rt.notify_group()
