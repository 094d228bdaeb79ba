"""Signals from one workflow to another, typed by the handler tables in `api.contracts`.

A workflow cannot import the workflow it signals (the group starts claims; claims signal the group), so the
name comes from the receiver's table, and the type checker refuses a name from another workflow's.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

from api import contracts as c


async def signal_group(namespace: str, group: str, name: c.GroupSignal, arg: Any) -> None:
    """Signal a group workflow (a claim's move, a release's end); errors are the caller's to judge."""
    await workflow.get_external_workflow_handle(c.group_workflow_id(namespace, group)).signal(name, arg)


async def signal_peer(workflow_id: str, name: c.ClaimSignal | c.ReleaseSignal, arg: Any = None) -> None:
    """Signal a claim or a release the group started: with no argument when the handler takes none."""
    handle = workflow.get_external_workflow_handle(workflow_id)
    if arg is None:
        await handle.signal(name)
    else:
        await handle.signal(name, arg)
