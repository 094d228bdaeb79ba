"""The verbs every workflow here is written in: activity calls with chosen policies, truth reads, bounded waits.

Activities are called by name (see `api.contracts.Act`), so no Kubernetes code is ever imported into a workflow.
A write that no retry can fix surfaces as `Broken` (never as an exception that fails the workflow): each
workflow decides what it means for it.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError
from temporalio.exceptions import TimeoutError as CallTimedOut

from api import contracts as c
from api.names import Failure
from domain.timings import TIMINGS
from workflows.patches import Patch

T = TypeVar("T")

# Writes must land eventually (a projection, a Job, a cordon): retry until they do, backing off to a minute.
# What retrying cannot fix (a slot that is gone, a malformed pod spec) the activity raises non-retryable.
WRITE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=1),
    non_retryable_error_types=[str(f) for f in Failure],
)
NON_RETRYABLE = frozenset(WRITE_RETRY.non_retryable_error_types or ())
# A write whose retries the workflow makes itself, so that it can stop between two of them.
ONE_ATTEMPT = RetryPolicy(maximum_attempts=1, non_retryable_error_types=list(NON_RETRYABLE))
# Reads feed a poll that runs again anyway: a few quick tries, then the poll's next turn.
READ_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=3,
)


# Kubernetes writes and reads run as local activities: the worker that runs the workflow task runs the call and
# records its result in the task's completion, so no activity task goes through Temporal's server (three events, a
# task queue round trip and a workflow task less per call). Their retries are the SDK's: a backoff longer than
# TIMINGS.local_retry_threshold is a workflow timer (visible in the history, skipped by the time-skipping server),
# so no workflow task is held open while the API server is away.
# Local activities need the workflow cache: a worker that keeps none evicts a run while its local activity is in
# flight and cancels the call, at every task (the operator refuses `--cached-workflows 0`). The time-skipping test
# server moves no task off a dead worker's sticky queue, so the model's worker-restart examples run without a cache:
# a lab without a cache turns this off for its run (tests.lab.open_lab) and its calls are regular activities.
LOCAL_CALLS = True


def run_activity(
    name: str,
    arg: Any,
    *,
    timeout: timedelta,
    retry: RetryPolicy,
    summary: str,
    result_type: type | None = None,
) -> Awaitable[Any]:
    """One activity call: local, unless the worker keeps no workflow cache (`LOCAL_CALLS`)."""
    if LOCAL_CALLS:
        workflow.deprecate_patch(Patch.LOCAL_ACTIVITIES)
        return workflow.execute_local_activity(
            name,
            arg,
            result_type=result_type,
            start_to_close_timeout=timeout,
            retry_policy=retry,
            local_retry_threshold=TIMINGS.local_retry_threshold,
            summary=summary,
        )
    return workflow.execute_activity(
        name, arg, result_type=result_type, start_to_close_timeout=timeout, retry_policy=retry, summary=summary
    )


class Deadline(Exception):
    """A wait that a workflow-wide deadline overtook (the claim's boot deadline)."""


class Broken(Exception):
    """A write no retry can fix: `kind` is the activity's error type (a `Failure`, else "Unexpected")."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


# What a failed activity call raises: an `ActivityError` around its cause (a regular activity), or the cause
# itself (a local activity the SDK gives up on: the activity's `ApplicationError`, or a timeout).
CallFailed = (ActivityError, ApplicationError, CallTimedOut)


def broken(err: FailureError) -> Broken:
    """The `Broken` an activity failure stands for (its cause names the type when the activity raised it)."""
    cause = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, ApplicationError):
        return Broken(cause.type or "Unexpected", cause.message)
    return Broken("Unexpected", str(cause or err))


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
        """A write retried until it lands; what retrying cannot fix raises `Broken`."""
        try:
            return await run_activity(name, arg, timeout=TIMINGS.write_timeout, retry=WRITE_RETRY, summary=summary)
        except CallFailed as err:
            raise broken(err) from err

    async def write_all(self, writes: list[tuple[str, Any, str]]) -> list[Any]:
        """Independent writes at once (one workflow task schedules them all); the first `Broken` is raised."""
        results = await asyncio.gather(*(self.write(*w) for w in writes), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return results

    async def buy(
        self,
        name: str,
        arg: Any,
        summary: str,
        *,
        stop: Callable[[], bool],
        landed: Callable[[], Awaitable[bool]] | None = None,
    ) -> bool:
        """A write that buys a machine, given up the moment `stop()` turns true, even while it is being retried.

        True when the write landed. The retries are the workflow's own (one attempt per activity, a cancellable
        wait between), so a stop never races an attempt: the one in flight is waited out, and no other starts.
        When an attempt that failed may still have landed (a timeout, a lost answer), `landed()` reads the
        truth. The boot deadline raises `Deadline`.
        """
        delay = WRITE_RETRY.initial_interval
        uncertain = False
        while not stop():
            try:
                await run_activity(name, arg, timeout=TIMINGS.write_timeout, retry=ONE_ATTEMPT, summary=summary)
                return True
            except CallFailed as err:
                failure = broken(err)
                if failure.kind in NON_RETRYABLE:
                    raise failure from err
                uncertain = True
            await self.wait(stop, delay, f"{summary}: retry", deadline_applies=True)
            delay = min(delay * WRITE_RETRY.backoff_coefficient, WRITE_RETRY.maximum_interval or delay)
        return uncertain and landed is not None and await landed()

    async def read(self, name: str, arg: Any, result_type: type[T], summary: str) -> T | None:
        """A read that may fail: the caller's poll asks again, so a failure is an unknown, not an error."""
        try:
            # Called by name, the SDK types the result Any; its data converter decodes it into `result_type`.
            result: T = await run_activity(
                name, arg, result_type=result_type, timeout=TIMINGS.read_timeout, retry=READ_RETRY, summary=summary
            )
            return result
        except CallFailed as err:
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
