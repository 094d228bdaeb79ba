"""Expected activity failures, said in one line: an API server that is briefly busy is not an incident.

The SDK logs every failed activity attempt at WARNING with its traceback; under an API brownout that buries the
log. A retryable Kubernetes error (5xx, 429, a timeout, a stale resourceVersion) leaves the activity as a *benign*
application error of the same type, so the workflow decides exactly as before (`workflows.verbs.broken` reads the
type), the SDK logs it at DEBUG, and this module says it at INFO in one line. Anything else keeps its traceback.
"""

from __future__ import annotations

import logging
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from kube.errors import KubeError

log = logging.getLogger(__name__)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except KubeError as err:
            if not err.retryable:
                raise
            info = activity.info()
            log.info("%s (attempt %d of %s) will be retried: %s", info.activity_type, info.attempt,
                     info.workflow_id, err)  # fmt: skip
            raise ApplicationError(
                str(err), type=type(err).__name__, category=ApplicationErrorCategory.BENIGN
            ) from None


class ExpectedFailures(Interceptor):
    """The worker interceptor that turns retryable Kubernetes errors into benign, one-line failures."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)
