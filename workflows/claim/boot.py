"""booting: the Job monitor, node registration (90 s) and the readiness gate (4 min), then ready.

A boot is reversed, never interrupted: a claim marked while booting lets its startup Job finish, then the
reversal (shutdown) takes over instead of the readiness gate.
"""

from __future__ import annotations

from temporalio import workflow

from api import contracts as c
from api.names import (
    ClaimPhase,
    ClaimReason,
    EventReason,
    JobType,
    NodeEvent,
    NodeState,
)
from domain import fsm
from domain.timings import TIMINGS
from workflows.claim.runtime import ClaimRuntime
from workflows.patches import Patch
from workflows.shutdown import (
    JOB_OUTCOME_FAILED,
    JOB_OUTCOME_SUCCEEDED,
    JOB_OUTCOME_TIMEOUT,
    job_exit,
    monitor_job,
    poll_until,
)
from workflows.verbs import Broken

# A startup Job that ended badly, as an event of the node state machine, and how the claim says it.
JOB_EVENTS: dict[str, tuple[NodeEvent, str]] = {
    JOB_OUTCOME_FAILED: (NodeEvent.JOB_FAILED, "failed"),
    JOB_OUTCOME_TIMEOUT: (NodeEvent.JOB_TIMEOUT, "did not finish in time"),
}


async def boot(rt: ClaimRuntime) -> None:
    """Drive a booting claim to ready, or to failed with the reason of the step that gave up."""
    s = rt.s
    if s.startup_job:
        outcome = await monitor_job(
            rt, s.startup_job, JobType.STARTUP, started=s.startup_started_at, deadline_applies=True
        )
        if outcome == JOB_OUTCOME_SUCCEEDED:
            s.powered = True
        if outcome in JOB_EVENTS:
            event, said = JOB_EVENTS[outcome]
            # The node state machine's table says what a failed or timed-out startup Job means for the claim.
            ends = fsm.consequence(NodeState.STARTINGUP, event)
            assert ends.claim_phase is not None and ends.reason is not None
            # How its Pod ended (exit code, reason) is read and said in the claim's message; the activity that records
            # the failure adds the Pod's words.
            message = f"startup Job {s.startup_job} {said}"
            workflow.deprecate_patch(Patch.FAILED_JOB_SAYS_WHY)
            ended = await job_exit(rt, s.startup_job, JobType.STARTUP)
            message += f": {ended.said()}" if ended is not None else ""
            s.failed_job = s.startup_job
            await rt.move(ends.claim_phase, ends.reason, message, True, s.failed_job)
            return
    if s.marked or s.abandoned:
        return
    if s.observation.gate_open:
        # The watchers already said the node is Ready and free of the readiness taints: a read after the startup
        # Job (there to catch a lost signal) could only repeat it, at the cost of an activity and a workflow task.
        workflow.deprecate_patch(Patch.TRUST_OPEN_GATE)
    else:
        await rt.observe_now()

    def stop() -> bool:
        return s.marked or bool(s.abandoned)

    rt.details("waiting for the kubelet to register the node")
    if not await poll_until(
        rt,
        lambda: s.observation.exists,
        TIMINGS.node_registration_timeout,
        "node registration",
        stop,
        deadline_applies=True,
    ):
        if s.marked or s.abandoned:
            return
        await gate_timeout(rt, f"the node did not register within {TIMINGS.node_registration_timeout.seconds} s")
        return
    rt.details("readiness gate: waiting for Ready and the readiness taints to clear")
    if not await poll_until(
        rt,
        lambda: s.observation.gate_open,
        TIMINGS.readiness_gate_timeout,
        "readiness gate",
        stop,
        deadline_applies=True,
    ):
        if s.marked or s.abandoned:
            return
        await gate_timeout(
            rt,
            f"the node was not Ready and free of readiness taints within {TIMINGS.readiness_gate_timeout.seconds} s",
        )
        return
    slot = c.SlotRef(s.seed.namespace, s.seed.slot)
    try:
        await rt.write(c.Act.OPEN_GATE, slot, f"uncordon and taint the node of slot {s.seed.slot}")
    except Broken as err:  # the node cannot be opened (its slot lost its node name): it cannot take work
        await rt.move(ClaimPhase.FAILED, ClaimReason.READINESS_GATE_TIMEOUT, f"the gate could not open: {err}", True)
        return
    await rt.move(ClaimPhase.READY, message="the node is Ready and free of the readiness taints")


async def gate_timeout(rt: ClaimRuntime, message: str) -> None:
    """Uncordon anyway (a cordoned node is invisible to scale-down), warn on the slot, fail the claim."""
    s = rt.s
    slot = c.SlotRef(s.seed.namespace, s.seed.slot)
    try:
        await rt.write_all(
            [
                (c.Act.UNCORDON, slot, f"uncordon the node of slot {s.seed.slot} anyway"),
                (
                    c.Act.SLOT_EVENT,
                    c.SlotEvent(s.seed.namespace, s.seed.slot, EventReason.READINESS_GATE_TIMEOUT, message, True),
                    "readiness gate timeout warning",
                ),
            ]
        )
    except Broken as err:
        message = f"{message} (and the node could not be uncordoned: {err})"
    await rt.move(ClaimPhase.FAILED, ClaimReason.READINESS_GATE_TIMEOUT, message, True)
