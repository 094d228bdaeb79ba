"""pending: the attempt bound, a cancel, and StartNode (the one write that commits a machine).

A cancel wins until a machine is bought: it is checked before each write that commits one (the finalizer,
the startup Job) and while either is being retried; a write already under way is waited out, and when its
outcome is unknown the startup Job is read, so a cancelled claim never leaves a Job behind it.
"""

from __future__ import annotations

from temporalio import workflow

from api import contracts as c
from api.names import ClaimPhase, ClaimReason, EventReason, JobType, Operation
from domain import claims, law
from domain.timings import TIMINGS
from workflows.claim.runtime import ClaimRuntime
from workflows.patches import Patch
from workflows.verbs import Broken, Deadline


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

    def stop() -> bool:
        return s.marked or bool(s.abandoned)

    if s.startup_job:
        # Taken over with the startup Job a lost run made: the machine is bought already, whatever
        # has been asked since. It is held and its boot goes on (or is reversed), never cancelled as unbought.
        if not s.finalizer:
            await rt.write(c.Act.ADD_FINALIZER, rt.claim_ref(), f"add the finalizer to claim {seed.name}")
            s.finalizer = not s.resource_gone
        await rt.move(ClaimPhase.BOOTING, message=f"startup Job {s.startup_job} created before its workflow was lost")
        return
    rt.details("committing the machine: finalizer, then the startup Job")
    if not s.finalizer:  # a claim the group created has held it since its creation
        ref = rt.claim_ref()
        if not await rt.buy(c.Act.ADD_FINALIZER, ref, f"add the finalizer to claim {seed.name}", stop=stop):
            await _not_bought(rt)
            return
        s.finalizer = True
    if stop():
        await _not_bought(rt)
        return
    if law.fires(s.law_input()) is not Operation.START_NODE:
        # The machine is already on (powered by hand, or a release still in flight): nothing to start, so the
        # claim commits to it and goes straight to the registration and readiness checks.
        s.powered = True
        await rt.move(ClaimPhase.BOOTING, message="machine already on; no startup Job")
        return
    job = c.job_name(seed.name, JobType.STARTUP, 1)

    async def job_state() -> c.JobStatus | None:
        return await rt.read(c.Act.READ_JOB, c.JobRef(seed.namespace, job), c.JobStatus, f"read startup Job {job}")

    async def job_exists() -> bool:
        status = await job_state()
        return status is not None and status.state != c.JOB_MISSING

    s.startup_job = job  # named before it is asked for: a boot whose Job may exist is never forgotten
    try:
        bought = await rt.buy(
            c.Act.CREATE_JOB,
            c.JobRequest(seed.namespace, seed.slot, JobType.STARTUP, 1, seed.name, job),
            f"startup Job {job}",
            stop=stop,
            landed=job_exists,
        )
    except (Deadline, Broken):
        # The claim fails before it knows its Job was made: a Job that is not there is not named in its ClaimFailed,
        # and its release does not wait for it. One the read cannot rule out stays named.
        workflow.deprecate_patch(Patch.SETTLE_UNBOUGHT_JOB)
        if (found := await job_state()) and found.state == c.JOB_MISSING:
            s.startup_job = ""
        raise
    if not bought:
        s.startup_job = ""
        await _not_bought(rt)
        return
    await rt.move(ClaimPhase.BOOTING, message=f"startup Job {job} created")


async def _not_bought(rt: ClaimRuntime) -> None:
    """No machine was committed: a superseded or slot-less claim fails (the run says why), a marked one cancels."""
    if rt.s.marked and not rt.s.abandoned:
        await cancel(rt)


async def cancel(rt: ClaimRuntime) -> None:
    """Cancelling a pending claim is deleting it: nothing is in flight, and the target drops on that write."""
    s = rt.s
    s.phase = claims.move(s.phase, ClaimPhase.COMPLETED)
    s.reason = s.mark_reason or ClaimReason.CANCELLED_BY_DECREASE_TARGET_SIZE
    s.message = f"cancelled while pending ({s.reason}); no machine was bought"
    s.finished_at = rt.now()
    s.collect_now = True  # the claim deletes its own resource: nothing for the group to collect
    rt.search_attributes()
    await rt.notify_group(final=True)
    # Its Event carries the attempt's numbers, as every move's does (the Job is named only if one was made).
    said = claims.move_message(
        ClaimPhase.COMPLETED, s.reason, s.message, s.seed, s.startup_job, s.deadline_at, s.finished_at
    )
    await rt.project(EventReason.CLAIM_CANCELLED, said)
    if not s.resource_gone:
        await rt.write(c.Act.DELETE_CLAIM, rt.claim_ref(), f"delete cancelled claim {s.seed.name}")
    s.resource_gone = True
    s.finalizer = False
