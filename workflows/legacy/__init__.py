"""Workflow code of earlier generations, frozen, so the runs they started keep replaying after an upgrade.

Each generation is a verbatim copy of the workflow code as it was released, with the Temporal decorators taken
off: the registered workflow classes (`workflows.claim.workflow`, `workflows.group.workflow`, `workflows.release`)
choose a generation once per run with `workflow.patched(...)` and hand every handler to it. A run that started
before the switch existed replays here; every new run takes the current code. Never edit a frozen generation;
delete it only when no run of it can be open (docs/upgrades.md says how to check).
"""
