"""Signals from one workflow to another, typed by the handler tables in `api.contracts`.

A workflow cannot import the workflow it signals (the group starts claims; claims signal the group), so the
name comes from the receiver's table, and the type checker refuses a name from another workflow's.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from api import contracts as c


async def signal_group(namespace: str, group: str, name: c.GroupSignal, arg: Any) -> None:
    """Signal a group workflow (a claim's move, a release's end); errors are the caller's to judge."""
    await workflow.get_external_workflow_handle(c.group_workflow_id(namespace, group)).signal(name, arg)


#: The failure type of a signal to a workflow that is not running: not started yet, or ended.
EXTERNAL_NOT_FOUND = "ExternalWorkflowExecutionNotFound"


DELIVERED, NOT_RUNNING, NOT_DELIVERED = "delivered", "not running", "not delivered"


async def signal_outcome(workflow_id: str, signal: c.ClaimSignal | c.ReleaseSignal, arg: Any = None) -> str:
    """Signal another workflow, never raising: DELIVERED, NOT_RUNNING (no run of that id runs) or NOT_DELIVERED.

    A workflow that is not running yet (a claim booked in this task, started after its first observation) or
    any more is expected, so that is one DEBUG line; anything else one INFO line. The commands are the same.
    """
    handle = workflow.get_external_workflow_handle(workflow_id)
    try:
        if arg is None:
            await handle.signal(signal)
        else:
            await handle.signal(signal, arg)
    except Exception as err:
        if isinstance(err, ApplicationError) and err.type == EXTERNAL_NOT_FOUND:
            workflow.logger.debug("signal %s to %s dropped: that workflow is not running", signal, workflow_id)
            return NOT_RUNNING
        workflow.logger.info("signal %s to %s not delivered: %s", signal, workflow_id, err)
        return NOT_DELIVERED
    return DELIVERED
