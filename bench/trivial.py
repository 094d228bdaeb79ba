"""The floors' workflows: as little as Temporal allows, run by a worker inside the bench on its own task queue."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow

FLOOR_QUEUE = "bench-floor"
TIMEOUT = timedelta(seconds=60)


@activity.defn
async def noop(n: int) -> int:
    return n


@workflow.defn
class OneActivity:
    """Started, one trivial activity, completed: what one claim's bookkeeping can at best cost."""

    @workflow.run
    async def run(self, n: int) -> int:
        return await workflow.execute_activity(noop, n, start_to_close_timeout=TIMEOUT)


@workflow.defn
class SignalTwoActivities:
    """Waits for one signal, then runs two trivial activities (a record and a notify, as a claim's move does)."""

    def __init__(self) -> None:
        self.signalled = False

    @workflow.run
    async def run(self) -> int:
        await workflow.wait_condition(lambda: self.signalled)
        await workflow.execute_activity(noop, 1, start_to_close_timeout=TIMEOUT)
        return await workflow.execute_activity(noop, 2, start_to_close_timeout=TIMEOUT)

    @workflow.signal
    def go(self) -> None:
        self.signalled = True

    @workflow.query
    def waiting(self) -> bool:
        return not self.signalled
