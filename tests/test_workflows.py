"""The claim lifecycle, one test per behaviour: time-skipping Temporal, real activities, the simulated homelab.

No watcher runs here: every claim reaches its end through its own timer-driven reads, which is also the proof
that a lost signal only costs latency.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
from homelab_sim.emulator import Fault
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from api import contracts as c
from api import names
from domain.timings import TIMINGS
from homelab_autoscaler.claims import timeline
from tests.drain_objects import budget, pod
from tests.lab import (
    NS,
    SECRET,
    WORDS,
    activity_calls,
    apply_claim,
    claimable,
    cond,
    failing_boot,
    history_text,
    homelab,
    job_creates,
    no_claims,
    now,
    one_claim,
    open_lab,
    seed_last_claim,
    slot,
    slot_free,
    status_if,
    uncordoned_before_cordoned,
)
from workflows.group.workflow import GroupWorkflow

MIN = 60.0


# --- boots -------------------------------------------------------------------------------------------------
async def test_boot_ends_ready() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        name = await one_claim(lab)
        st = await lab.wait_phase(name, "ready", within=3 * MIN)
        assert st["attempt"] == 1
        res = lab.claim_resource(name)
        assert res is not None
        assert res["status"]["phase"] == "ready"
        assert "deadlineAt" not in res["spec"]
        assert "infra.homecluster.dev/claim" in res["metadata"]["finalizers"]
        node = lab.node("s1")
        assert node is not None and not node["spec"].get("unschedulable")
        assert node["spec"]["providerID"] == f"homelab://{NS}/s1"
        assert [j["metadata"]["name"] for j in lab.jobs("s1")] == [f"{name}-startup"]
        reasons = [e["reason"] for e in lab.events(name)]
        assert reasons[:3] == ["ClaimCreated", "ClaimBooting", "ClaimReady"]
        snap = await lab.snapshot()
        assert snap["targetSize"] == 1
        instances = await lab.group().query(GroupWorkflow.instances)
        assert [(i.slot, i.state) for i in instances] == [("s1", "running")]
        await lab.record("boot_ends_ready")


async def test_a_boot_told_its_node_is_ready_goes_on_without_reading_it_and_tells_the_group_beside_each_record() -> (
    None
):
    """A move's word to the group is a call in the workflow task that schedules its record, not a signal command
    (the server's acknowledgement of one woke the claim for a task of its own); and a boot the watchers already
    told of a Ready node does not read the node again when its startup Job ends (an activity and a task per boot)."""
    async with open_lab(homelab([slot("s1")])) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "booting", within=MIN, step=0.1)
        handle = lab.client.get_workflow_handle(c.claim_workflow_id(NS, name))
        ready = c.Observation(power="on", usable=True, exists=True, gate_open=True, observed_at=now())
        await handle.signal(c.ClaimSignal.OBSERVE, ready)
        await lab.wait_phase(name, "ready", within=3 * MIN)
        events = (await handle.fetch_history()).events
        await lab.record("boot_told_ready")
        held = await lab.group().query(GroupWorkflow.instances)
    assert [(i.slot, i.state) for i in held] == [("s1", "running")], "the group heard the ready move"
    kinds = list(zip((e.event_type for e in events), activity_calls(events), strict=True))
    assert not any(
        t
        in (
            EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED,
            EventType.EVENT_TYPE_EXTERNAL_WORKFLOW_EXECUTION_SIGNALED,
        )
        for t, _ in kinds
    ), "no signal command, no task woken by its acknowledgement"
    told = [i for i, (_, a) in enumerate(kinds) if a == c.Act.TELL_GROUP]
    assert len(told) >= 2, "booting and ready each told the group"
    for i in told:
        start = max(j for j in range(i) if kinds[j][0] == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
        scheduled = EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED  # the next task (none: the history ends there)
        end = next((j for j in range(i, len(kinds)) if kinds[j][0] == scheduled), len(kinds))
        batch = [a for _, a in kinds[start:end] if a]
        # Local activities let one task run several calls: the record is among them.
        assert c.Act.RECORD_CLAIM in batch, f"event {i + 1}: the word to the group and its record in one task: {batch}"
    after_booting = [a for _, a in kinds[told[0] :] if a]
    assert c.Act.OPEN_GATE in after_booting


async def test_startup_job_failed() -> None:
    async with open_lab(homelab([slot("s1", startupJobFails=True)])) as lab:
        name = await one_claim(lab)
        st = await lab.wait_phase(name, "failed", within=3 * MIN)
        assert st["reason"] == "StartupJobFailed"
        await lab.wait_heard(name, "failed")
        instances = await lab.group().query(GroupWorkflow.instances)
        assert instances[0].error_code == "startup-job-failed"
        # The errored instance stays in the target until cluster-autoscaler deletes it: its scale-up is still in
        # flight, so it backs the group off (the real cluster-autoscaler retried at once when it left at once).
        assert (await lab.snapshot())["targetSize"] == 1
        # cluster-autoscaler deletes the instance it saw fail: the error is forgotten, nothing else changes.
        assert await lab.group().execute_update(GroupWorkflow.delete_nodes, [instances[0].id]) == 0
        assert await lab.group().query(GroupWorkflow.instances) == []
        await lab.record("startup_job_failed")


async def test_a_failed_boot_says_why_where_people_look_and_no_history_holds_the_pods_words() -> None:
    """Issue 23: the exit code and reason travel with the failure (the claim's message, its Event, its Ready
    condition, cluster-autoscaler's error, the workflow's Failed close with where the last words are, without a stack
    trace); the Pod's words reach the claim's status and Event only, never a workflow history."""
    async with open_lab(homelab([failing_boot("s1")])) as lab:
        name = await one_claim(lab)
        st = await lab.wait_phase(name, "failed", within=3 * MIN)
        assert st["reason"] == "StartupJobFailed"
        job = f"{name}-startup"
        said = f"startup Job {job} failed: exit code 3 (Error)"
        assert st["message"] == said, st["message"]
        res = lab.claim_resource(name)
        assert res is not None
        message = res["status"]["message"]
        assert message.startswith(said) and WORDS in message and SECRET in message, message
        (ready,) = [cd for cd in res["status"]["conditions"] if cd["type"] == "Ready"]
        assert (ready["status"], ready["reason"], ready["message"]) == ("False", "StartupJobFailed", said), ready
        (failed,) = [e["message"] for e in lab.events(name) if e["reason"] == "ClaimFailed"]
        assert failed.startswith(said) and WORDS in failed, failed
        await lab.wait_heard(name, "failed")
        (instance,) = await lab.group().query(GroupWorkflow.instances)
        assert said in instance.error_message, instance.error_message
        # The Failed close: the reason leads, the exit code follows, then where the last words are; no stack trace.
        history = await lab.claim(name).fetch_history()
        (closed,) = [e for e in history.events if e.HasField("workflow_execution_failed_event_attributes")]
        failure = closed.workflow_execution_failed_event_attributes.failure
        assert failure.message.startswith(f"StartupJobFailed: {said}"), failure.message
        assert f"kubectl -n {NS} describe nodeclaim {name}" in failure.message
        assert f"kubectl -n {NS} logs job/{job}" in failure.message
        assert failure.stack_trace == "", failure.stack_trace
        # `claims show` ends with it: the cause, and where the last words are.
        where = (
            f"The Pod's last words (its termination message, kept out of this history: it may hold secrets) are the "
            f"claim's status.message: kubectl -n {NS} describe nodeclaim {name}; its whole output: "
            f"kubectl -n {NS} logs job/{job}"
        )
        closing = timeline(history)[-1]
        assert closing.endswith(f"closed: failed (StartupJobFailed): {said}. {where}"), closing
        histories = await lab.histories()
        assert len(histories) >= 2
        leaks = [h.workflow_id for h in histories if SECRET in history_text(h) or WORDS in history_text(h)]
        assert not leaks, f"the Pod's words in the history of {leaks}"
        await lab.record("startup_job_failed_says_why")


async def test_a_decrease_forgets_an_errored_instance_and_refuses_past_it() -> None:
    async with open_lab(homelab([slot("s1", startupJobFails=True)])) as lab:
        failed = await one_claim(lab)
        await lab.wait_phase(failed, "failed", within=3 * MIN)
        await lab.wait_heard(failed, "failed")  # a decrease before the group heard it found no errored instance
        assert (await lab.snapshot())["targetSize"] == 1
        # Past the errored instance (and no pending claim) there is nothing to decrease: refused, nothing changed.
        with pytest.raises(WorkflowUpdateFailedError):
            await lab.group().execute_update(GroupWorkflow.decrease_target_size, -2)
        assert await lab.group().execute_update(GroupWorkflow.decrease_target_size, -1) == 0
        assert await lab.group().query(GroupWorkflow.instances) == []


async def test_a_failed_machines_release_keeps_its_errored_instance_in_the_target() -> None:
    """The soak's seed 3934560059: a failed boot whose machine was then released (law 3) left the target while the
    release ran and came back when it ended, past maxSize (target 5 of max 4). Now the errored instance holds its slot
    through the release: IncreaseSize counts it and takes other slots, and the target never passes maxSize."""
    async with open_lab(homelab([slot("s1", taintNeverClears=True), slot("s2"), slot("s3")], maxSize=2)) as lab:
        failed = await one_claim(lab)
        await lab.wait_phase(failed, "failed", within=8 * MIN, step=15)

        async def releasing() -> bool:
            return bool((await lab.snapshot())["slots"]["s1"]["releasing"])

        await lab.until(releasing, within=2 * MIN, step=1, what="s1's machine released")
        assert (await lab.snapshot())["targetSize"] == 1, "the errored instance counts while its machine is released"
        (instance,) = await lab.group().query(GroupWorkflow.instances)
        assert (instance.slot, instance.claim, instance.error_code) == ("s1", failed, "readiness-timeout"), instance
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await lab.increase(2)
        assert "size 1 + 2 would exceed maxSize 2" in str(refused.value.cause), refused.value.cause
        assert await lab.increase(1) == 2
        live = {d["slot"] for d in (await lab.snapshot())["claims"].values() if d["phase"] in ("pending", "booting")}
        assert live == {"s2"}, "IncreaseSize takes a slot no failure holds"

        async def released() -> bool:
            return not await releasing()

        await lab.until(released, within=10 * MIN, step=15, what="s1's release ended")
        assert (await lab.snapshot())["targetSize"] == 2, "the target never passes maxSize when the release ends"
        # cluster-autoscaler deletes the errored instance: the slot is free for the next scale-up.
        assert await lab.group().execute_update(GroupWorkflow.delete_nodes, [instance.id]) == 1
        assert await lab.increase(1) == 2


async def test_an_errored_instance_replaced_by_a_new_claim_on_its_slot_never_comes_back() -> None:
    """A failed claim's errored instance is hidden while a newer claim lives on its slot; it came back when that claim
    ended (a successful boot and scale-down later, cluster-autoscaler saw the old failure again, and the target grew
    by one without an IncreaseSize). The new claim replaces it for good."""
    async with open_lab(homelab([slot("s1", startupJobFails=True)], maxSize=2)) as lab:
        failed = await one_claim(lab)
        await lab.wait_phase(failed, "failed", within=3 * MIN)
        assert (await lab.snapshot())["targetSize"] == 1
        lab.lab.set_fault("s1", "startupJobFails", False)
        assert await lab.increase(1) == 1, "the new claim takes the failed slot's place"
        second = next(n for n in await lab.claim_names() if n != failed)
        await lab.wait_phase(second, "ready", within=3 * MIN)
        (instance,) = await lab.group().query(GroupWorkflow.instances)
        assert await lab.group().execute_update(GroupWorkflow.delete_nodes, [instance.id]) == 0
        await lab.wait_phase(second, "completed", within=6 * MIN, step=10)
        assert (await lab.snapshot())["targetSize"] == 0, "the old failure came back as an errored instance"
        assert await lab.group().query(GroupWorkflow.instances) == []


async def test_startup_job_timed_out() -> None:
    async with open_lab(homelab([slot("s1", jobHangs=True)])) as lab:
        name = await one_claim(lab)
        st = await lab.wait_phase(name, "failed", within=8 * MIN, step=30)
        assert st["reason"] == "StartupJobTimeout"
        await lab.record("startup_job_timed_out")


async def test_node_never_registers() -> None:
    async with open_lab(homelab([slot("s1", neverBoots=True)])) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "booting", within=MIN)
        st = await lab.wait_phase(name, "failed", within=4 * MIN, step=10)
        assert st["reason"] == "ReadinessGateTimeout"
        assert "did not register" in st["message"]
        await lab.record("node_never_registers")


async def test_readiness_gate_times_out_then_forced_shutdown_and_next_attempt() -> None:
    async with open_lab(homelab([slot("s1", taintNeverClears=True)])) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "booting", within=MIN)
        # Someone cordons the new node meanwhile: the gate's timeout uncordons it anyway.
        lab.lab.call(lambda h: h.emulator.patch_object("v1", "nodes", None, "s1", {"spec": {"unschedulable": True}}))
        st = await lab.wait_phase(name, "failed", within=8 * MIN, step=15)
        assert st["reason"] == "ReadinessGateTimeout"
        assert uncordoned_before_cordoned(lab, "s1"), "uncordoned anyway, before the forced shutdown cordons it"
        assert any(e["reason"] == "ReadinessGateTimeout" for e in lab.events("s1"))
        # The failed claim is not a want: its machine is released (law 3), shut down and verified off.
        await lab.until(lambda: lab.lab.power("s1") == "off", within=6 * MIN, what="forced shutdown")
        assert [j["metadata"]["name"] for j in lab.jobs("s1") if j["metadata"]["labels"]["type"] == "shutdown"]
        # The next claim on the slot is attempt 2.
        await lab.until(lambda: slot_free(lab, "s1"), within=3 * MIN, what="slot free")
        assert await lab.increase(1) == 1
        second = [n for n in await lab.claim_names() if n != name]
        assert (await lab.status(second[0]))["attempt"] == 2
        lab.extra_history_ids = (c.release_workflow_id(NS, "s1"),)
        await lab.record("readiness_gate_times_out")


# --- deadlines and attempts --------------------------------------------------------------------------------
async def test_deadline_exceeded_while_pending() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        lab.lab.emulator.faults.append(
            Fault(match=lambda r: r.plural == "jobs" and r.verb == "create", status=503, times=None)
        )
        name = await one_claim(lab)
        st = await lab.wait_phase(name, "failed", within=15 * MIN, step=30)
        assert st["reason"] == "DeadlineExceeded"
        assert lab.jobs("s1") == []
        await lab.record("deadline_exceeded_while_pending")


async def test_deadline_exceeded_while_booting_then_forced_shutdown() -> None:
    async with open_lab(homelab([slot("s1", taintNeverClears=True)])) as lab:
        # The API server refuses Job creation for about nine minutes: the boot starts late, and its readiness
        # gate is still open when the 12m10s deadline passes, with the machine up.
        lab.lab.emulator.faults.append(
            Fault(match=lambda r: r.plural == "jobs" and r.verb == "create", status=503, times=14)
        )
        name = await one_claim(lab)
        await lab.wait_phase(name, "booting", within=12 * MIN, step=30)
        st = await lab.wait_phase(name, "failed", within=6 * MIN, step=15)
        assert st["reason"] == "DeadlineExceeded"
        await lab.until(lambda: lab.lab.power("s1") == "off", within=6 * MIN, what="forced shutdown")
        await lab.record("deadline_exceeded_while_booting")


async def test_attempt_limit_reached_before_a_machine_is_bought() -> None:
    async with open_lab(homelab([slot("s1", startupJobFails=True)])) as lab:
        await lab.start_group()
        names: list[str] = []
        for attempt in range(1, TIMINGS.max_consecutive_attempts + 1):
            await lab.until(lambda: slot_free(lab, "s1"), within=5 * MIN, what="slot free")
            await lab.increase(1)
            name = next(n for n in await lab.claim_names() if n not in names)
            names.append(name)
            st = await lab.wait_phase(name, "failed", within=3 * MIN)
            assert st["attempt"] == attempt
        assert len([j for j in lab.jobs("s1") if j["metadata"]["labels"]["type"] == "startup"]) == 3
        # The slot's next claim would be past the limit: slot choice skips it, and a group with no slot left
        # answers no-capacity, naming the slot and why, instead of making a claim that fails on arrival.
        await lab.until(lambda: slot_free(lab, "s1"), within=5 * MIN, what="slot free")
        assert (await lab.snapshot())["slots"]["s1"]["claimable"] is False
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await lab.increase(1)
        cause = refused.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == c.ERR_NO_CAPACITY
        assert "s1: AttemptLimitReached" in cause.message
        # cluster-autoscaler hears the last failure as missing capacity, and backs off the group.
        (instance,) = await lab.group().query(GroupWorkflow.instances)
        assert (instance.error_class, instance.error_code) == (1, "no-capacity") or instance.error_class == 99
        await lab.record("attempt_limit")


async def test_a_hand_applied_claim_older_than_its_slots_live_claim_is_superseded_not_left_pending() -> None:
    """Found by the model (seed 3816984121): a claim taken over on a slot a newer live claim holds was dropped as
    never started (its resource stayed pending with no workflow), and over maxSize the group's task failed on it."""
    async with open_lab(homelab([slot("s1"), slot("s2")], maxSize=1)) as lab:
        await lab.start_group()
        assert await lab.increase(1) == 1
        (live,) = await lab.claim_names()
        await lab.wait_phase(live, "ready", within=3 * MIN)
        slot_name = (lab.claim_resource(live) or {})["spec"]["node"]
        apply_claim(lab, "older", slot_name, requestedAt="2020-01-01T00:00:00Z")
        await lab.group().signal(GroupWorkflow.refresh)
        st = await lab.wait_phase("older", "failed", within=MIN, step=5)
        assert st["reason"] == "Superseded"
        snap = await lab.snapshot()
        assert snap["targetSize"] == 1 and snap["slots"][slot_name]["liveClaim"] == live
        assert await lab.phase(live) == "ready"
        await lab.record("taken_over_superseded")


async def test_a_hand_applied_claim_past_the_limit_fails_before_a_machine_is_bought() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        seed_last_claim(lab, "s1", phase="failed", attempt=TIMINGS.max_consecutive_attempts)
        await lab.start_group()
        apply_claim(lab, "s1-by-hand", "s1")
        await lab.group().signal(GroupWorkflow.refresh)
        st = await lab.wait_phase("s1-by-hand", "failed", within=MIN, step=5)
        assert (st["attempt"], st["reason"]) == (TIMINGS.max_consecutive_attempts + 1, "AttemptLimitExceeded")
        assert lab.jobs("s1") == []
        await lab.wait_heard("s1-by-hand", "failed")
        (instance,) = await lab.group().query(GroupWorkflow.instances)
        assert (instance.error_class, instance.error_code) == (1, "no-capacity")


async def test_the_reset_attempts_annotation_restarts_the_streak() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        seed_last_claim(lab, "s1", phase="failed", attempt=TIMINGS.max_consecutive_attempts)
        await lab.start_group()
        assert (await lab.snapshot())["slots"]["s1"]["claimable"] is False
        annotation = {"metadata": {"annotations": {"infra.homecluster.dev/reset-attempts": "2099-01-01T00:00:00Z"}}}
        lab.lab.call(lambda h: h.emulator.patch_object("infra.homecluster.dev/v2alpha1", "nodes", NS, "s1", annotation))
        await lab.group().signal(GroupWorkflow.refresh)
        await lab.until(lambda: claimable(lab, "s1"), within=MIN, step=5, what="claimable again")
        assert await lab.increase(1) == 1
        (name,) = await lab.claim_names()
        st = await lab.wait_phase(name, "ready", within=3 * MIN)
        assert st["attempt"] == 1


async def test_deadline_cleared_on_ready() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "ready", within=3 * MIN)
        await lab.advance(40 * MIN)
        st = await lab.status(name)
        assert st["phase"] == "ready" and st["deadlineAt"] is None
        await lab.record("deadline_cleared_on_ready")


# --- scale-down --------------------------------------------------------------------------------------------
async def test_cancel_a_pending_claim() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        lab.lab.emulator.faults.append(
            Fault(match=lambda r: r.plural == "jobs" and r.verb == "create", status=503, times=None)
        )
        name = await one_claim(lab)
        assert await lab.phase(name) == "pending"
        assert await lab.group().execute_update(GroupWorkflow.decrease_target_size, -1) == 0
        await lab.until(lambda: lab.claim_resource(name) is None, within=2 * MIN, what="claim deleted")
        assert (await lab.snapshot())["targetSize"] == 0
        await lab.record("cancel_pending")


async def test_decrease_refuses_a_booting_claim() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "ready", within=3 * MIN)
        with pytest.raises(WorkflowUpdateFailedError):
            await lab.group().execute_update(GroupWorkflow.decrease_target_size, -1)
        assert (await lab.snapshot())["targetSize"] == 1


async def test_delete_a_booting_claim_is_reversed_then_completed() -> None:
    async with open_lab(homelab([slot("s1", taintNeverClears=True)])) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "booting", within=MIN)
        assert lab.lab.power("s1") == "on"
        assert await lab.group().execute_update(GroupWorkflow.delete_nodes, [f"homelab://{NS}/s1"]) == 0
        st = await lab.wait_phase(name, "completed", within=5 * MIN, step=10)
        assert st["reason"] == "NodeDeleted"
        assert lab.lab.power("s1") == "off"
        res = lab.claim_resource(name)
        assert res is not None and not res["metadata"].get("finalizers")
        await lab.record("delete_booting")


async def test_scale_down_of_a_ready_claim() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "ready", within=3 * MIN)
        assert await lab.group().execute_update(GroupWorkflow.delete_nodes, ["s1"]) == 0
        instances = await lab.group().query(GroupWorkflow.instances)
        assert [i.state for i in instances] == ["deleting"]
        st = await lab.wait_phase(name, "completed", within=5 * MIN, step=10)
        assert st["reason"] == "NodeDeleted" and st["shutdownAttempts"] == 1
        assert cond(st, "MachineObservedOff")
        node = lab.node("s1")
        assert node is not None and node["spec"].get("unschedulable") is True
        assert sorted(j["metadata"]["labels"]["type"] for j in lab.jobs("s1")) == ["shutdown", "startup"]
        # `kubectl describe nodeclaim` shows where the scale-down began: one Event, with its node and its Job
        events = lab.events(name)
        reasons = [e["reason"] for e in events]
        assert reasons.count("ScaleDownStarted") == 1, reasons
        assert reasons.index("ClaimReady") < reasons.index("ScaleDownStarted") < reasons.index("ClaimCompleted")
        (started,) = [e["message"] for e in events if e["reason"] == "ScaleDownStarted"]
        assert f"{name}-shutdown" in started and "cordoned" in started, started
        # The write budget of a lifecycle: the claim is created holding its finalizer (no separate write), and
        # it records its status once per move, once when marked, and once with its shutdown Job.
        history = await lab.claim(name).fetch_history()
        acts = Counter(a for a in activity_calls(history.events) if a)
        assert acts[c.Act.CREATE_CLAIM_HELD] == 1 and acts[c.Act.ADD_FINALIZER] == 0, acts
        assert acts[c.Act.RECORD_CLAIM] == 5 and acts[c.Act.CREATE_JOB] == 2 and acts[c.Act.CORDON] == 1, acts
        await lab.record("scale_down_ready")


class HoldTheEnd(Interceptor):
    """Holds a claim's terminal record (the write that lets its finalizer go) until the test lets it land: the
    workflow task that made the claim's last move is still running then, and nothing of it is committed."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.go = asyncio.Event()

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _HeldEnd(next, self)


class _HeldEnd(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, hold: HoldTheEnd) -> None:
        super().__init__(next)
        self.hold = hold

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        write = input.args[0] if input.args else None
        last = isinstance(write, c.StatusWrite) and write.release_finalizer
        if activity.info().activity_type == c.Act.RECORD_CLAIM and last and not self.hold.reached.is_set():
            self.hold.reached.set()
            await self.hold.go.wait()
        return await super().execute_activity(input)


async def test_a_claims_end_reaches_its_group_only_once_the_task_that_made_it_is_committed() -> None:
    """The group frees a slot, books releases and lists failures on a claim's end: it must hear only an end the
    claim's history holds. Told by a local call, from inside the task that made the move, the end reached the group
    before that task was committed: a worker killed then leaves the slot free (a second claim boots on the machine)
    while the claim's task runs again elsewhere from its last committed state, on newer inputs (that machine on), and
    may go another way. The end is a signal command of the task that made it: the server sends it once that task is
    committed, once."""
    hold = HoldTheEnd()
    async with open_lab(homelab([slot("s1")])) as lab:
        lab.interceptors = [hold]
        await lab.restart_worker()
        name = await one_claim(lab)
        await lab.wait_phase(name, "ready", within=3 * MIN)
        assert await lab.group().execute_update(GroupWorkflow.delete_nodes, ["s1"]) == 0
        ending = asyncio.ensure_future(lab.wait_phase(name, "completed", within=5 * MIN, step=10))
        try:
            await asyncio.wait_for(hold.reached.wait(), timeout=120)
            # The claim's last task is running its terminal record: its move is not committed anywhere yet.
            assert (await lab.claim(name).describe()).status == WorkflowExecutionStatus.RUNNING
            snap = await lab.snapshot()
            try:
                placed: int | str = await lab.increase(1)
            except WorkflowUpdateFailedError as err:
                placed = err.cause.type if isinstance(err.cause, ApplicationError) and err.cause.type else str(err)
            assert placed == c.ERR_NO_CAPACITY, f"a second claim on the machine: {(await lab.snapshot())['claims']}"
            assert snap["slots"]["s1"]["liveClaim"] == name, f"the group heard an end not committed: {snap}"
        finally:
            hold.go.set()
        st = await ending
        assert st["reason"] == "NodeDeleted"
        await lab.until(lambda: slot_free(lab, "s1"), within=MIN, step=5, what="the end heard by the group")
        history = await lab.claim(name).fetch_history()
        signalled = EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED
        assert [e.event_type for e in history.events].count(signalled) == 1, "the end is one signal command"


async def test_a_word_from_a_run_lost_with_temporals_state_does_not_keep_the_group_from_taking_its_claim_over() -> None:
    """A live move is told by a local call: one in flight when Temporal's database is wiped reaches the group's new
    run (the client retries it into the new server). Taken as news, it put the claim in the group's books before
    the group's first read, and the read then took over only claims it did not hold: the claim was left with no
    workflow behind it. The group hears only claims it tracks; the read takes this one over from its resource."""
    async with open_lab(homelab([slot("s1")])) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "ready", within=3 * MIN)
        late = c.ClaimDigest(name=name, slot="s1", group="g", phase="ready", attempt=1, call="IncreaseSize")
        await lab.lose_temporal()
        # The word arrives before the new run's first read of the group (the first thing it does).
        await lab.client.start_workflow(
            GroupWorkflow.run,
            args=[c.GroupRef(NS, "g"), None],
            id=c.group_workflow_id(NS, "g"),
            task_queue=c.TASK_QUEUE,
            start_signal=c.GroupSignal.CLAIM_CHANGED,
            start_signal_args=[late],
        )
        st = await lab.wait_phase(name, "ready", within=MIN)
        assert st["attempt"] == 1
        assert "ClaimTakenOver" in [e["reason"] for e in lab.events(name)]
        snap = await lab.snapshot()
        assert snap["slots"]["s1"]["liveClaim"] == name and snap["targetSize"] == 1


async def test_a_failed_shutdown_job_says_why_and_the_completion_cites_the_job_that_ended_it() -> None:
    """A shutdown Job that fails says its exit code in its Warning, with its Pod's words; ClaimCompleted names the
    shutdown Job of the last attempt (it named the claim's startup Job, long finished)."""
    async with open_lab(homelab([slot("s1", shutdownJobFails=True)])) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "ready", within=3 * MIN)
        assert await lab.group().execute_update(GroupWorkflow.delete_nodes, ["s1"]) == 0

        async def warned() -> list[str]:
            return [e["message"] for e in lab.events(name) if e["reason"] == "ShutdownJobFailed"]

        first = (await lab.until(warned, within=5 * MIN, step=10, what="a ShutdownJobFailed Warning"))[0]
        assert first.startswith(f"shutdown Job {name}-shutdown failed: exit code 1 (Error) (attempt 1 of "), first
        assert "fault shutdownJobFails is set" in first, first
        lab.lab.set_fault("s1", "shutdownJobFails", False)
        st = await lab.wait_phase(name, "completed", within=10 * MIN, step=15)
        last = st["shutdownAttempts"]
        assert last >= 2
        (done,) = [e["message"] for e in lab.events(name) if e["reason"] == "ClaimCompleted"]
        assert f"Job {name}-shutdown-{last}," in done and "startup" not in done, done
        texts = [history_text(h) for h in await lab.histories()]
        assert not [t for t in texts if "fault shutdownJobFails is set" in t], "the Pod's words in a history"
        await lab.record("shutdown_job_failed_says_why")


async def test_shutdown_that_does_not_power_off_pauses_and_resumes() -> None:
    async with open_lab(homelab([slot("s1", shutdownDoesNothing=True)])) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "ready", within=3 * MIN)
        await lab.group().execute_update(GroupWorkflow.delete_nodes, ["s1"])
        await lab.until(
            lambda: status_if(lab, name, lambda s: s["shutdownAttempts"] == TIMINGS.max_consecutive_attempts),
            within=25 * MIN,
            step=30,
            what="three shutdown attempts",
        )
        await lab.until(
            lambda: any(e["reason"] == "ShutdownAttemptLimitReached" for e in lab.events(name)),
            within=5 * MIN,
            step=30,
            what="the pause is reported",
        )
        await lab.advance(10 * MIN)
        assert (await lab.status(name))["shutdownAttempts"] == TIMINGS.max_consecutive_attempts, "paused"
        assert await lab.phase(name) == "ready"
        # After the 30-minute grace the streak restarts by itself.
        await lab.until(
            lambda: status_if(lab, name, lambda s: s["shutdownAttempts"] == 1), within=40 * MIN, step=60, what="resume"
        )
        await lab.until(
            lambda: status_if(lab, name, lambda s: s["shutdownAttempts"] == TIMINGS.max_consecutive_attempts),
            within=25 * MIN,
            step=30,
            what="spent again",
        )
        # The reset Update resumes it at once, and with the script fixed the machine goes off.
        lab.lab.set_fault("s1", "shutdownDoesNothing", False)
        assert await lab.claim(name).execute_update(c.ClaimUpdate.RESET_SHUTDOWN_STREAK, result_type=int) == 3
        st = await lab.wait_phase(name, "completed", within=10 * MIN, step=15)
        assert st["reason"] == "NodeDeleted"
        await lab.record("shutdown_streak")


# --- liveness ----------------------------------------------------------------------------------------------
async def test_machine_gone_short_flap_keeps_the_claim_long_outage_fails_it() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "ready", within=3 * MIN)
        lab.lab.die("s1")
        await lab.until(
            lambda: status_if(lab, name, lambda s: cond(s, "MachineObservedOff")), within=6 * MIN, what="seen off"
        )
        lab.lab.power_on_by_hand("s1")
        await lab.until(
            lambda: status_if(lab, name, lambda s: not cond(s, "MachineObservedOff")), within=6 * MIN, what="back"
        )
        assert await lab.phase(name) == "ready"
        lab.lab.die("s1")
        st = await lab.wait_phase(name, "failed", within=25 * MIN, step=60)
        assert st["reason"] == "MachineGone"
        await lab.record("machine_gone")


async def test_two_live_claims_on_one_slot_newest_wins() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        first = await one_claim(lab)
        await lab.wait_phase(first, "ready", within=3 * MIN)
        res = lab.claim_resource(first)
        assert res is not None
        second = "s1-by-hand"
        body = {
            "apiVersion": "infra.homecluster.dev/v2alpha1",
            "kind": "NodeClaim",
            "metadata": {"name": second, "namespace": NS},
            "spec": {**res["spec"], "requestedAt": "2099-01-01T00:00:00Z", "call": "Manual"},
        }
        lab.lab.call(lambda h: h.emulator.put_object("infra.homecluster.dev/v2alpha1", "nodeclaims", body, NS))
        await lab.group().signal(GroupWorkflow.refresh)
        st = await lab.wait_phase(first, "failed", within=2 * MIN, step=5)
        assert st["reason"] == "Superseded"
        assert await lab.phase(second) in ("booting", "ready")
        assert lab.lab.power("s1") == "on", "the machine is handed over, not powered off"
        await lab.record("superseded")


async def test_adoption_of_a_running_machine() -> None:
    async with open_lab(homelab([slot("s1", initially_on=True), slot("s2")])) as lab:
        await lab.start_group()
        names = await lab.until(lambda: lab.claim_names(), within=MIN, step=5, what="adopted claim")
        st = await lab.status(names[0])
        assert (st["phase"], st["reason"], st["call"], st["slot"]) == ("ready", "Adopted", "Adopted", "s1")
        assert lab.lab.power("s1") == "on"
        assert [j for j in lab.jobs() if j["metadata"]["labels"]["type"] == "shutdown"] == []
        assert (await lab.snapshot())["targetSize"] == 1
        await lab.record("adoption")


async def test_law_3_release_of_a_machine_on_with_no_claim() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "ready", within=3 * MIN)
        await lab.group().execute_update(GroupWorkflow.delete_nodes, ["s1"])
        await lab.wait_phase(name, "completed", within=5 * MIN, step=10)
        lab.lab.power_on_by_hand("s1")
        observation = c.Observation(power="on", usable=False, exists=True, gate_open=True, observed_at=now())
        await lab.group().signal(GroupWorkflow.observe_slot, c.SlotObservation("s1", observation))
        lab.extra_history_ids = (c.release_workflow_id(NS, "s1"),)
        await lab.until(lambda: lab.lab.power("s1") == "off", within=5 * MIN, what="released")
        release_jobs = [j for j in lab.jobs("s1") if "-release-" in j["metadata"]["name"]]
        assert len(release_jobs) == 1
        owners = release_jobs[0]["metadata"]["ownerReferences"]
        assert [o["kind"] for o in owners] == ["Node"]
        await lab.record("law3_release")


# --- durability --------------------------------------------------------------------------------------------
async def test_a_retried_job_creation_never_makes_a_second_job() -> None:
    async with open_lab(homelab([slot("s1")]), kube_timeout=0.5) as lab:
        # The first create is applied after the client gave up: the retry must find it, not make another.
        lab.lab.emulator.faults.append(
            Fault(match=lambda r: r.plural == "jobs" and r.verb == "create", status=None, delay=1.0, times=1)
        )
        name = await one_claim(lab)
        await lab.wait_phase(name, "ready", within=3 * MIN)
        assert len(job_creates(lab)) >= 2
        assert len(lab.jobs("s1")) == 1
        await lab.record("job_retry")


async def test_a_lost_signal_only_delays_the_claim() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        name = await one_claim(lab)
        # No watcher signals anything: the Job monitor's 30-second read and the gate's reads carry the claim.
        await lab.advance(20)
        assert await lab.phase(name) == "booting"
        await lab.wait_phase(name, "ready", within=2 * MIN, step=10)


async def test_a_signal_moves_the_claim_before_its_poll() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        name = await one_claim(lab)
        await lab.until(lambda: status_if(lab, name, lambda s: s["phase"] == "booting"), within=10, step=1)
        await lab.claim(name).signal(c.ClaimSignal.JOB_FINISHED, c.JobFinished(f"{name}-startup", True))
        await lab.wait_phase(name, "ready", within=20, step=1)


# --- helpers -----------------------------------------------------------------------------------------------


# --- long lives: continue-as-new, collection, restarts -------------------------------------------------------
async def test_group_continues_as_new_and_keeps_its_claims() -> None:
    from workflows.group.state import GroupState

    async with open_lab(homelab([slot("s1"), slot("s2"), slot("s3")])) as lab:
        first = await lab.client.start_workflow(
            GroupWorkflow.run,
            args=[c.GroupRef(NS, "g"), GroupState(NS, "g", updates_per_run=2)],
            id=c.group_workflow_id(NS, "g"),
            task_queue=c.TASK_QUEUE,
        )
        first_run = first.result_run_id
        assert await lab.increase(1) == 1
        assert await lab.increase(1) == 2

        async def new_run() -> bool:
            return (await lab.group().describe()).run_id != first_run

        await lab.until(new_run, within=MIN, step=1, what="continued as new")
        snap = await lab.snapshot()
        assert snap["targetSize"] == 2 and len(snap["claims"]) == 2
        assert await lab.increase(1) == 3
        for name in await lab.claim_names():
            await lab.wait_phase(name, "ready", within=3 * MIN)
        await lab.record("group_continue_as_new")


async def test_ready_claim_continues_as_new_and_keeps_serving() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        await lab.start_group()
        now = await lab.env.get_current_time()
        seed = c.ClaimSeed(NS, "s1-long", "s1", "g", "Manual", 1, now, None, 730.0, 3600, reads_per_run=2)
        handle = await lab.client.start_workflow(
            c.WorkflowName.CLAIM, args=[seed, None], id=c.claim_workflow_id(NS, "s1-long"), task_queue=c.TASK_QUEUE
        )
        first_run = handle.result_run_id
        await lab.wait_phase("s1-long", "ready", within=3 * MIN)

        async def new_run() -> bool:
            return (await lab.claim("s1-long").describe()).run_id != first_run

        await lab.until(new_run, within=30 * MIN, step=60, what="continued as new")
        assert await lab.phase("s1-long") == "ready"
        await lab.group().execute_update(GroupWorkflow.delete_nodes, ["s1"])
        st = await lab.wait_phase("s1-long", "completed", within=5 * MIN, step=10)
        assert st["reason"] == "NodeDeleted"
        wid = c.claim_workflow_id(NS, "s1-long")
        lab.extra_history_ids = (f"{wid}@{first_run}", wid)
        await lab.record("claim_continue_as_new")


async def test_ttl_collects_a_finished_claim_and_ends_its_workflow() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "ready", within=3 * MIN)
        await lab.group().execute_update(GroupWorkflow.delete_nodes, ["s1"])
        await lab.wait_phase(name, "completed", within=5 * MIN, step=10)
        await lab.advance(50 * MIN)
        assert lab.claim_resource(name) is not None, "kept until the TTL"
        await lab.until(lambda: lab.claim_resource(name) is None, within=15 * MIN, step=60, what="collected")
        digest = await lab.client.get_workflow_handle(c.claim_workflow_id(NS, name), result_type=c.ClaimDigest).result()
        assert digest.workflow_done and digest.phase == "completed"
        await lab.until(lambda: no_claims(lab), within=MIN, step=5, what="the group forgot the claim")
        lab.extra_history_ids = (c.claim_workflow_id(NS, name),)
        await lab.record("ttl_collection")


async def test_a_machine_on_in_a_used_slot_is_released_not_adopted() -> None:
    async with open_lab(homelab([slot("s1", initially_on=True)])) as lab:
        seed_last_claim(lab, "s1", phase="completed", attempt=1)
        await lab.start_group()
        lab.extra_history_ids = (c.release_workflow_id(NS, "s1"),)
        await lab.until(lambda: lab.lab.power("s1") == "off", within=5 * MIN, what="released")
        assert await lab.claim_names() == []
        await lab.record("used_slot_released")


async def test_attempts_are_seeded_from_the_slot_after_a_restart() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        seed_last_claim(lab, "s1", phase="failed", attempt=TIMINGS.max_consecutive_attempts - 1)
        name = await one_claim(lab)
        st = await lab.wait_phase(name, "ready", within=3 * MIN)
        assert st["attempt"] == TIMINGS.max_consecutive_attempts


# --- the drain before dark ---------------------------------------------------------------------------------
async def test_a_drain_a_budget_blocks_keeps_the_machine_on_says_why_once_and_goes_on_once_it_is_relaxed() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "ready", within=3 * MIN)
        node = lab.node("s1")
        assert node is not None
        node_name = node["metadata"]["name"]
        lab.lab.call(lambda h: h.emulator.put_object("v1", "pods", pod("web-1", node_name, NS)))
        lab.lab.call(lambda h: h.emulator.put_object("v1", "pods", pod("batch-1", node_name, NS, app="batch")))
        pdb = budget("web", NS, maxUnavailable=0)
        lab.lab.call(lambda h: h.emulator.put_object("policy/v1", "poddisruptionbudgets", pdb))
        assert await lab.group().execute_update(GroupWorkflow.delete_nodes, ["s1"]) == 0
        # The unprotected Pod goes at once; the protected one holds the machine on past the 10-minute bound.
        await lab.until(lambda: not lab.pod("batch-1"), within=MIN, step=5, what="the free Pod evicted")
        await lab.until(
            lambda: any(e["reason"] == "DrainBlocked" for e in lab.events(name)),
            within=12 * MIN,
            step=30,
            what="the blocked drain is said",
        )
        await lab.advance(10 * MIN)
        assert [j["metadata"]["labels"]["type"] for j in lab.jobs("s1")] == ["startup"], "no shutdown Job"
        assert lab.lab.power("s1") == "on" and await lab.phase(name) == "ready"
        assert [i.state for i in await lab.group().query(GroupWorkflow.instances)] == ["deleting"]
        for obj in (name, "s1"):
            (said,) = [e for e in lab.events(obj) if e["reason"] == "DrainBlocked"]
            assert said["type"] == "Warning" and "web-1" in said["message"], said
            assert f"PodDisruptionBudget {NS}/web" in said["message"] and "0 disruptions allowed" in said["message"]
        history = await lab.claim(name).fetch_history()
        assert "web-1" not in history_text(history), "no Pod name in a history"
        # The budget relaxed, the power-off follows.
        lab.lab.call(lambda h: h.emulator.delete_object("policy/v1", "poddisruptionbudgets", NS, "web"))
        st = await lab.wait_phase(name, "completed", within=10 * MIN, step=15)
        assert st["reason"] == "NodeDeleted" and lab.pod("web-1") is None
        await lab.record("drain_blocked_by_a_budget")


async def test_a_do_not_disrupt_pod_blocks_the_power_off_until_a_person_forces_it() -> None:
    async with open_lab(homelab([slot("s1")])) as lab:
        name = await one_claim(lab)
        await lab.wait_phase(name, "ready", within=3 * MIN)
        node = lab.node("s1")
        assert node is not None
        held = pod("keep-1", node["metadata"]["name"], NS, annotations={names.ANNOTATION_DO_NOT_DISRUPT: "true"})
        lab.lab.call(lambda h: h.emulator.put_object("v1", "pods", held))
        assert await lab.group().execute_update(GroupWorkflow.delete_nodes, ["s1"]) == 0
        await lab.advance(15 * MIN)
        assert lab.pod("keep-1") is not None and lab.lab.power("s1") == "on"
        assert [j["metadata"]["labels"]["type"] for j in lab.jobs("s1")] == ["startup"]
        force = {"metadata": {"annotations": {names.ANNOTATION_FORCE_DRAIN: "true"}}}
        lab.lab.call(lambda h: h.emulator.patch_object("infra.homecluster.dev/v2alpha1", "nodes", NS, "s1", force))
        st = await lab.wait_phase(name, "completed", within=10 * MIN, step=15)
        assert st["reason"] == "NodeDeleted" and lab.pod("keep-1") is None
        slot_res = lab.lab.call(lambda h: h.emulator.get_object("infra.homecluster.dev/v2alpha1", "nodes", NS, "s1"))
        assert slot_res is not None
        assert names.ANNOTATION_FORCE_DRAIN not in (slot_res["metadata"].get("annotations") or {}), "used once"
