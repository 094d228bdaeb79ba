"""ReleaseWorkflow: law 3 for a machine on with no live claim, in a slot that has had one.

It cordons the node, fires a shutdown Job owned by the slot alone, and ends once the machine is observed off,
with the same shutdown streak (and its reset) as a claim's scale-down. It is also how a claim's episode ends
when the claim itself could not end it (failed, or deleted, with its machine maybe on): it waits out that claim's
startup Job (a boot is reversed, never interrupted), and shuts down a machine the Job powered even if its
kubelet never showed it.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import SearchAttributeKey

from api import contracts as c
from api.names import EventReason, JobType
from workflows.handles import signal_group
from workflows.patches import Patch
from workflows.shutdown import JOB_OUTCOME_SUCCEEDED, ShutdownBook, monitor_job, shut_down
from workflows.verbs import Broken, SlotVerbs

KEY_GROUP = SearchAttributeKey.for_keyword(c.SA_GROUP)
KEY_SLOT = SearchAttributeKey.for_keyword(c.SA_SLOT)


@workflow.defn(name=c.WorkflowName.RELEASE)
class ReleaseWorkflow(SlotVerbs):
    @workflow.init
    def __init__(self, seed: c.ReleaseSeed) -> None:
        workflow.deprecate_patch(Patch.RELEASE_GENERATION_3)  # 0.2's runs chose their generation here
        self.seed = seed
        self._book = ShutdownBook()
        self.observation = c.Observation(power="on")
        self.aborted = False
        self.episode = ""
        self.powered = seed.powered
        self.was_seen_on = False
        self.off_verified = False

    @workflow.run
    async def run(self, seed: c.ReleaseSeed) -> bool:
        workflow.upsert_search_attributes([KEY_GROUP.value_set(seed.group), KEY_SLOT.value_set(seed.slot)])
        # A Job name of its own per episode: an earlier release's finished Job must not answer for this one.
        self.episode = c.release_episode(seed.slot, workflow.uuid4().hex)
        if seed.startup_job:
            self.details(f"letting startup Job {seed.startup_job} of claim {seed.claim} finish first")
            if await monitor_job(self, seed.startup_job, JobType.STARTUP) == JOB_OUTCOME_SUCCEEDED:
                self.powered = True
        self.details("machine on with no live claim: shutting it down")
        try:
            off = await shut_down(self)
        except Broken as err:
            await self.on_event(EventReason.SHUTDOWN_JOB_FAILED, f"the shutdown Job cannot be made: {err}", True)
            off = False
        self.details("machine observed off" if off else "release given up")
        if off and (self.was_seen_on or self.powered):
            await self.on_event(EventReason.MACHINE_RELEASED, "machine with no live claim observed off", False)
        await workflow.wait_condition(workflow.all_handlers_finished)
        try:
            await signal_group(
                seed.namespace,
                seed.group,
                c.GroupSignal.RELEASE_FINISHED,
                c.SlotReleased(seed.slot, off, self.observation),
            )
        except Exception as err:
            workflow.logger.info("could not tell group %s: %s", seed.group, err)
        return off

    @workflow.signal(name=c.ReleaseSignal.OBSERVE)
    def observe(self, observation: c.Observation) -> None:
        self.take(observation)

    @workflow.signal(name=c.ReleaseSignal.JOB_FINISHED)
    def job_finished(self, finished: c.JobFinished) -> None:
        self._book.finish(finished)

    @workflow.signal(name=c.ReleaseSignal.ABORT)
    def abort(self) -> None:
        self.aborted = True

    @workflow.update(name=c.ReleaseUpdate.RESET_SHUTDOWN_STREAK)
    def reset_shutdown_streak(self) -> int:
        before = self._book.attempts
        self._book.reset()
        return before

    # --- Verbs and ShutdownHost ----------------------------------------------------------------------------
    def slot_ref(self) -> c.SlotRef:
        return c.SlotRef(self.seed.namespace, self.seed.slot)

    def take(self, observation: c.Observation) -> bool:
        self.observation, changed = observation.replacing(self.observation)
        if self.power_on():
            self.was_seen_on, self.off_verified = True, False
        return changed

    @property
    def book(self) -> ShutdownBook:
        return self._book

    def power_on(self) -> bool:
        return self.observation.power == "on"

    def maybe_on(self) -> bool:
        return self.power_on() or (self.powered and not self.was_seen_on and not self.off_verified)

    def seen_on(self) -> bool:
        return self.was_seen_on

    def off_unseen(self) -> None:
        self.off_verified = True

    def interrupted(self) -> bool:
        return self.aborted

    def job_owner(self) -> str:
        return self.episode

    def claim_name(self) -> str:
        return ""  # a law-3 shutdown is owned by the slot alone

    async def on_attempt(self, job: str, started: str = "", fact: str = "") -> None:
        self.details(f"shutdown Job {job}, attempt {self._book.attempts}")
        if started:
            await self.on_event(EventReason.SCALE_DOWN_STARTED, started, False, fact=fact)

    async def on_event(
        self, reason: EventReason, message: str, warning: bool, last_words_of: str = "", fact: str = ""
    ) -> None:
        try:
            await self.write(
                c.Act.SLOT_EVENT,
                c.SlotEvent(self.seed.namespace, self.seed.slot, reason, message, warning, last_words_of, fact),
                f"event {reason} on slot {self.seed.slot}",
            )
        except Broken as err:
            workflow.logger.warning("event %s on slot %s not recorded: %s", reason, self.seed.slot, err)
