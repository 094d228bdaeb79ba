"""The Temporal workflows: a group's size and its slots, each claim's lifecycle, law-3 releases.

Workflow code only: no I/O and no clocks (time comes from `workflow.now()`), decisions from `domain`, every side
effect an activity named in `api.contracts.Act`. The helper modules pass through the sandbox (one copy per process),
so none keeps module state: tests/test_hygiene.py enforces both.
"""
