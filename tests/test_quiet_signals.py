"""A signal from one workflow to another that is not running yet is expected: one quiet line, no error look.

The group sends a claim its first observation before the claim's workflow has started (the first scale-up);
Temporal answers ExternalWorkflowExecutionNotFound. `workflows.handles.signal_outcome` logs that at DEBUG and says
the workflow is not running (the group forgets a live claim that is not: lost, it is taken over).
"""

from __future__ import annotations

import logging
import uuid

import pytest
from temporalio import workflow
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from api import contracts as c
from tests import lab
from workflows.handles import NOT_RUNNING, signal_outcome


@workflow.defn(sandboxed=False)
class SignalsAWorkflowNotRunning:
    """Signals a workflow id nobody started, as the group does a claim booked in the same task."""

    @workflow.run
    async def run(self, target: str) -> str:
        return await signal_outcome(target, c.ClaimSignal.OBSERVE, {"power": "on"})


async def test_a_signal_to_a_workflow_not_yet_started_is_one_debug_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="temporalio.workflow")
    async with (
        await WorkflowEnvironment.start_time_skipping(test_server_existing_path=lab.test_server_path()) as env,
        Worker(env.client, task_queue="quiet", workflows=[SignalsAWorkflowNotRunning]),
    ):
        target = f"claim-not-started-{uuid.uuid4().hex}"
        outcome = await env.client.execute_workflow(
            SignalsAWorkflowNotRunning.run, target, id=f"sender-{uuid.uuid4().hex}", task_queue="quiet"
        )
    assert outcome == NOT_RUNNING
    lines = [r for r in caplog.records if r.name == "temporalio.workflow" and target in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.DEBUG], [r.getMessage() for r in lines]
    assert "ExternalWorkflowExecutionNotFound" not in lines[0].getMessage()
    assert "not running" in lines[0].getMessage()
    loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and target in r.getMessage()]
    assert loud == []
