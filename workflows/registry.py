"""The workflows one worker registers, in one list so the worker, the replayer and the tests agree."""

from __future__ import annotations

from workflows.claim.workflow import NodeClaimWorkflow
from workflows.group.workflow import GroupWorkflow
from workflows.release import ReleaseWorkflow

WORKFLOWS = [GroupWorkflow, NodeClaimWorkflow, ReleaseWorkflow]
