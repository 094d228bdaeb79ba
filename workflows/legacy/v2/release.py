"""ReleaseWorkflow: law 3 for a machine on with no claim, in a slot whose last claim has ended.

It cordons the node, fires a shutdown Job owned by the slot alone, and ends once the machine is observed off,
with the same shutdown streak (and its reset) as a claim's scale-down.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import SearchAttributeKey

from api import contracts as c
from api.names import EventReason
from workflows.legacy.v2.shutdown import ShutdownBook, shut_down
from workflows.legacy.v2.verbs import SlotVerbs

KEY_GROUP = SearchAttributeKey.for_keyword(c.SA_GROUP)
KEY_SLOT = SearchAttributeKey.for_keyword(c.SA_SLOT)


class LegacyRelease(SlotVerbs):
    def __init__(self, seed: c.ReleaseSeed) -> None:
        self.seed = seed
        self._book = ShutdownBook()
        self.observation = c.Observation(power="on")
        self.aborted = False
        self.episode = ""

    async def run(self, seed: c.ReleaseSeed) -> bool:
        workflow.upsert_search_attributes([KEY_GROUP.value_set(seed.group), KEY_SLOT.value_set(seed.slot)])
        # A Job name of its own per episode: an earlier release's finished Job must not answer for this one.
        self.episode = f"{seed.slot}-release-{workflow.uuid4().hex[:5]}"
        self.details("machine on with no claim: shutting it down")
        off = await shut_down(self)
        self.details("machine observed off" if off else "release aborted")
        if off:
            await self.on_event(EventReason.MACHINE_RELEASED, "machine with no claim observed off", False)
        await workflow.wait_condition(workflow.all_handlers_finished)
        try:
            await workflow.get_external_workflow_handle(c.group_workflow_id(seed.namespace, seed.group)).signal(
                c.GroupSignal.RELEASE_FINISHED, c.SlotReleased(seed.slot, off)
            )
        except Exception as err:
            workflow.logger.info("could not tell group %s: %s", seed.group, err)
        return off

    def observe(self, observation: c.Observation) -> None:
        self.take(observation)

    def job_finished(self, finished: c.JobFinished) -> None:
        self._book.finished_jobs[finished.job] = finished.succeeded

    def abort(self) -> None:
        self.aborted = True

    def reset_shutdown_streak(self) -> int:
        before = self._book.attempts
        self._book.reset()
        return before

    # --- Verbs and ShutdownHost ----------------------------------------------------------------------------
    def slot_ref(self) -> c.SlotRef:
        return c.SlotRef(self.seed.namespace, self.seed.slot)

    def take(self, observation: c.Observation) -> bool:
        self.observation, changed = observation.replacing(self.observation)
        return changed

    @property
    def book(self) -> ShutdownBook:
        return self._book

    def power_on(self) -> bool:
        return self.observation.power == "on"

    def interrupted(self) -> bool:
        return self.aborted

    def job_owner(self) -> str:
        return self.episode

    def claim_name(self) -> str:
        return ""  # a law-3 shutdown is owned by the slot alone

    async def on_attempt(self, job: str) -> None:
        self.details(f"shutdown Job {job}, attempt {self._book.attempts}")

    async def on_event(self, reason: EventReason, message: str, warning: bool) -> None:
        await self.write(
            c.Act.SLOT_EVENT,
            c.SlotEvent(self.seed.namespace, self.seed.slot, reason, message, warning),
            f"event {reason} on slot {self.seed.slot}",
        )
