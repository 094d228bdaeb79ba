"""The verbs every workflow here is written in: activity calls with chosen policies, truth reads, bounded waits.

Activities are called by name (see `api.contracts.Act`), so no Kubernetes code is ever imported into a workflow.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from api import contracts as c
from domain.timings import TIMINGS

T = TypeVar("T")

# Writes must land eventually (a projection, a Job, a cordon): retry until they do, backing off to a minute.
# What retrying cannot fix (a slot that is gone, a malformed pod spec) the activity raises non-retryable.
WRITE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=1),
    non_retryable_error_types=["SlotDeleted", "InvalidPodSpec", "NotFound", "Invalid"],
)
# Reads feed a poll that runs again anyway: a few quick tries, then the poll's next turn.
READ_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=3,
)


class Deadline(Exception):
    """A wait that a workflow-wide deadline overtook (the claim's boot deadline)."""


class Verbs:
    """Time, details, activities and waits; subclasses say which slot they watch and when a deadline applies."""

    def deadline(self) -> datetime | None:
        """The instant that ends waits made with `deadline_applies=True` (none by default)."""
        return None

    @staticmethod
    def now() -> datetime:
        return workflow.now()

    def details(self, text: str) -> None:
        """One line in the Web UI that says what the workflow waits for right now."""
        workflow.set_current_details(text)

    async def write(self, name: str, arg: Any, summary: str) -> Any:
        return await workflow.execute_activity(
            name, arg, start_to_close_timeout=TIMINGS.write_timeout, retry_policy=WRITE_RETRY, summary=summary
        )

    async def write_in_boot_window(self, name: str, arg: Any, summary: str) -> Any:
        """A write the deadline may overtake: an API server that refuses it until then fails the claim."""
        handle = workflow.start_activity(
            name, arg, start_to_close_timeout=TIMINGS.write_timeout, retry_policy=WRITE_RETRY, summary=summary
        )
        try:
            await self.wait(handle.done, None, summary, deadline_applies=True)
        except Deadline:
            handle.cancel()
            raise
        return await handle

    async def read(self, name: str, arg: Any, result_type: type[T], summary: str) -> T | None:
        """A read that may fail: the caller's poll asks again, so a failure is an unknown, not an error."""
        try:
            # Called by name, the SDK types the result Any; its data converter decodes it into `result_type`.
            result: T = await workflow.execute_activity(
                name,
                arg,
                result_type=result_type,
                start_to_close_timeout=TIMINGS.read_timeout,
                retry_policy=READ_RETRY,
                summary=summary,
            )
            return result
        except ActivityError as err:
            workflow.logger.warning("%s failed: %s", summary, err.cause or err)
            return None

    async def wait(
        self,
        done: Callable[[], bool],
        timeout: timedelta | None,
        summary: str,
        *,
        deadline_applies: bool = False,
    ) -> bool:
        """Wait until `done()` or the timeout; True when done. With `deadline_applies`, the deadline raises."""
        end = None if timeout is None else self.now() + timeout
        deadline = self.deadline() if deadline_applies else None
        if deadline is not None and (end is None or deadline < end):
            end, summary = deadline, f"{summary} (deadline)"
        if done():
            return True
        if end is None or end > self.now():
            try:
                await workflow.wait_condition(
                    done,
                    timeout=None if end is None else end - self.now(),
                    timeout_summary=summary,
                )
                return True
            except TimeoutError:
                pass
        if deadline is not None and self.now() >= deadline:
            raise Deadline
        return False


class SlotVerbs(Verbs, ABC):
    """Verbs of a workflow that watches one slot's machine (a claim, a release)."""

    @abstractmethod
    def slot_ref(self) -> c.SlotRef:
        """The slot whose machine this workflow drives."""

    @abstractmethod
    def take(self, observation: c.Observation) -> bool:
        """Keep an observation unless it is stale; True when a decision input changed."""

    async def observe_now(self) -> bool:
        """Read the truth about the machine (a lost signal costs latency, never correctness)."""
        ref = self.slot_ref()
        obs = await self.read(c.Act.OBSERVE_SLOT, ref, c.Observation, f"observe slot {ref.slot}")
        return obs is not None and self.take(obs)
