"""booting: the Job monitor, node registration (90 s) and the readiness gate (4 min), then ready.

A boot is reversed, never interrupted: a claim marked while booting lets its startup Job finish, then the
reversal (shutdown) takes over instead of the readiness gate.
"""

from __future__ import annotations

from api import contracts as c
from api.names import (
    NODE_REGISTRATION_TIMEOUT,
    READINESS_GATE_TIMEOUT,
    ClaimPhase,
    ClaimReason,
    EventReason,
    JobType,
)
from workflows.claim.runtime import ClaimRuntime
from workflows.shutdown import JOB_OUTCOME_FAILED, JOB_OUTCOME_TIMEOUT, monitor_job, poll_until


async def boot(rt: ClaimRuntime) -> None:
    """Drive a booting claim to ready, or to failed with the reason of the step that gave up."""
    s = rt.s
    if s.startup_job:
        outcome = await monitor_job(rt, s.startup_job, JobType.STARTUP, deadline_applies=True)
        if outcome == JOB_OUTCOME_FAILED:
            await rt.move(
                ClaimPhase.FAILED, ClaimReason.STARTUP_JOB_FAILED, f"startup Job {s.startup_job} failed", True
            )
            return
        if outcome == JOB_OUTCOME_TIMEOUT:
            await rt.move(
                ClaimPhase.FAILED,
                ClaimReason.STARTUP_JOB_TIMEOUT,
                f"startup Job {s.startup_job} did not finish in time",
                True,
            )
            return
    if s.marked or s.abandoned:
        return
    await rt.observe_now()

    def stop() -> bool:
        return s.marked or bool(s.abandoned)

    rt.details("waiting for the kubelet to register the node")
    if not await poll_until(
        rt,
        lambda: s.observation.exists,
        NODE_REGISTRATION_TIMEOUT,
        "node registration",
        stop,
        deadline_applies=True,
    ):
        if s.marked or s.abandoned:
            return
        await gate_timeout(rt, f"the node did not register within {NODE_REGISTRATION_TIMEOUT.seconds} s")
        return
    rt.details("readiness gate: waiting for Ready and the readiness taints to clear")
    if not await poll_until(
        rt,
        lambda: s.observation.gate_open,
        READINESS_GATE_TIMEOUT,
        "readiness gate",
        stop,
        deadline_applies=True,
    ):
        if s.marked or s.abandoned:
            return
        await gate_timeout(
            rt,
            f"the node was not Ready and free of readiness taints within {READINESS_GATE_TIMEOUT.seconds} s",
        )
        return
    slot = c.SlotRef(s.seed.namespace, s.seed.slot)
    await rt.write(c.Act.OPEN_GATE, slot, f"uncordon and taint the node of slot {s.seed.slot}")
    await rt.move(ClaimPhase.READY, message="the node is Ready and free of the readiness taints")


async def gate_timeout(rt: ClaimRuntime, message: str) -> None:
    """Uncordon anyway (a cordoned node is invisible to scale-down), warn on the slot, fail the claim."""
    s = rt.s
    slot = c.SlotRef(s.seed.namespace, s.seed.slot)
    await rt.write(c.Act.UNCORDON, slot, f"uncordon the node of slot {s.seed.slot} anyway")
    await rt.write(
        c.Act.SLOT_EVENT,
        c.SlotEvent(s.seed.namespace, s.seed.slot, EventReason.READINESS_GATE_TIMEOUT, message, True),
        "readiness gate timeout warning",
    )
    await rt.move(ClaimPhase.FAILED, ClaimReason.READINESS_GATE_TIMEOUT, message, True)
