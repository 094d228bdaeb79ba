"""One exception type for every refusal, carrying the gRPC code cluster-autoscaler will act on.

cluster-autoscaler treats UNIMPLEMENTED as "optional call not offered" and every other code as a hard error,
so the code is chosen deliberately at each raise site and the message always names the group or node.
"""

from __future__ import annotations

import grpc

from api import contracts as c

# The group workflow refuses Updates with an ApplicationError of one of these types.
WORKFLOW_CODES: dict[str, grpc.StatusCode] = {
    c.ERR_INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    c.ERR_FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    c.ERR_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    c.ERR_NO_CAPACITY: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


class ProviderError(Exception):
    """A call answered with a non-OK status; `message` is what the caller (and cluster-autoscaler's log) sees."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> ProviderError:
    return ProviderError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ProviderError:
    return ProviderError(grpc.StatusCode.NOT_FOUND, message)


def precondition(message: str) -> ProviderError:
    return ProviderError(grpc.StatusCode.FAILED_PRECONDITION, message)


def unimplemented(message: str) -> ProviderError:
    return ProviderError(grpc.StatusCode.UNIMPLEMENTED, message)


def unavailable(message: str) -> ProviderError:
    return ProviderError(grpc.StatusCode.UNAVAILABLE, message)
