"""Typed errors, so callers decide on retry from a class instead of an HTTP status buried in a message."""

from __future__ import annotations

import json
from typing import Any


class KubeError(Exception):
    """Any failure of a Kubernetes call; `status` is the HTTP status (0 when there was no answer)."""

    retryable = False

    def __init__(self, message: str, *, status: int = 0, reason: str = "", causes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.causes = causes  # the Status's details.causes messages (an eviction's refusal names its budget here)


class NotFound(KubeError):
    """The object (or its resource type) does not exist."""


class AlreadyExists(KubeError):
    """A create found an object of that name."""


class Conflict(KubeError):
    """A write carried a stale resourceVersion; re-read and decide again."""

    retryable = True


class Invalid(KubeError):
    """The API server refused the body (422); retrying the same body cannot help."""


class Forbidden(KubeError):
    """RBAC or authentication refused the call."""


class Gone(KubeError):
    """A watch or list asked for a resourceVersion the server no longer has (410)."""


class Transient(KubeError):
    """5xx, 429, a timeout or a dropped connection: the same call may succeed later."""

    retryable = True


def from_api_exception(exc: Any, what: str) -> KubeError:
    """Map a `kubernetes.client.ApiException` to a typed error whose message names the object."""
    status = int(getattr(exc, "status", 0) or 0)
    reason = ""
    causes: tuple[str, ...] = ()
    message = str(getattr(exc, "reason", "") or "")
    body = getattr(exc, "body", None)
    if body:
        try:
            doc = json.loads(body)
            reason = str(doc.get("reason", "") or "")
            message = str(doc.get("message", "") or message)
            found = (doc.get("details") or {}).get("causes") or []
            causes = tuple(str(c.get("message", "")) for c in found if isinstance(c, dict) and c.get("message"))
        except (ValueError, AttributeError):
            message = str(body)[:300]
    text = f"{what}: HTTP {status} {reason}: {message}".rstrip(": ")
    cls: type[KubeError]
    if status == 404:
        cls = NotFound
    elif status == 409 and reason == "AlreadyExists":
        cls = AlreadyExists
    elif status == 409:
        cls = Conflict
    elif status == 422 or status == 400 or status == 415:
        cls = Invalid
    elif status in (401, 403):
        cls = Forbidden
    elif status == 410:
        cls = Gone
    elif status == 429 or status >= 500 or status == 0:
        cls = Transient
    else:
        cls = KubeError
    return cls(text, status=status, reason=reason, causes=causes)
