"""The one activity that reaches Temporal instead of Kubernetes: a claim telling its group a live move.

Sent from the worker, as a local activity, the signal costs the claim one marker in the workflow task that made the
move; sent as a workflow command it cost two events and a workflow task of its own when the server acknowledged it.
It runs before that task is committed, and again if the task is lost: a claim's end, on which the group frees the
slot, stays a signal command (workflows.claim.runtime.notify_group).
"""

from __future__ import annotations

import logging

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.service import RPCError, RPCStatusCode

from api import contracts as c
from api.names import Failure
from domain.timings import TIMINGS

log = logging.getLogger(__name__)


@activity.defn(name=c.Act.TELL_GROUP)
async def tell_group(tell: c.GroupTell) -> None:
    """Signal `claim_changed` to the group's workflow (its current run); a group that does not run is NotFound,
    which no retry fixes. Only a live move is told so (the end is a signal command): the group frees nothing on one,
    and keeps the newest digest per claim, so a repeat, or a word of a task that was lost, is overtaken by the next."""
    group_id = c.group_workflow_id(tell.namespace, tell.group)
    handle = activity.client().get_workflow_handle(group_id)
    try:
        await handle.signal(c.GroupSignal.CLAIM_CHANGED, tell.digest, rpc_timeout=TIMINGS.tell_group_rpc_timeout)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            # Expected (the group's run was lost with Temporal's state, and its next run takes the claim over from
            # its resource): the claim logs it in one line; no traceback.
            raise ApplicationError(
                f"group workflow {group_id} is not running",
                type=Failure.NOT_FOUND,
                non_retryable=True,
                category=ApplicationErrorCategory.BENIGN,
            ) from None
        # Temporal out of reach (an outage, a restart): retried like any activity, said in one line, no traceback.
        info = activity.info()
        log.info("%s (attempt %d of %s) will be retried: %s", info.activity_type, info.attempt, info.workflow_id, err)
        raise ApplicationError(
            f"signal to {group_id}: {err}", type="TemporalUnavailable", category=ApplicationErrorCategory.BENIGN
        ) from None
