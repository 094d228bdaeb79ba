"""API errors of the emulated Kubernetes API server, rendered as the real server renders them.

``ApiError`` is any failure as a ``v1 Status`` body. ``FieldError`` mirrors apimachinery's ``field.Error``
(``pkg/util/validation/field``), so a refused write reads like a real one: a 422 ``Invalid`` Status whose
message aggregates ``<field>: <Type>: <value>: <detail>`` lines and whose ``details.causes`` carry one entry
per field error (``reason`` = the error type, ``field``, ``message`` = the body without the field).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "OMIT",
    "ApiError",
    "FieldError",
    "bad_request",
    "duplicate",
    "forbidden",
    "invalid",
    "invalid_object",
    "not_supported",
    "required",
    "too_long",
    "too_many",
    "type_invalid",
]

Obj = dict[str, Any]


class ApiError(Exception):
    """An API failure rendered as a ``v1 Status`` body (``reason`` is what clients switch on)."""

    def __init__(self, status: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.details = dict(details or {})

    def body(self) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": self.details,
            "code": self.status,
        }


class _Omit:
    """The bad value is not printed (``field.omitValue``)."""

    def __repr__(self) -> str:
        return "OMIT"


OMIT: Any = _Omit()

# field.ErrorType → its String(); the types whose body never shows the value (field.Error.ErrorBody).
_TYPE_TEXT = {
    "FieldValueNotFound": "Not found",
    "FieldValueRequired": "Required value",
    "FieldValueDuplicate": "Duplicate value",
    "FieldValueInvalid": "Invalid value",
    "FieldValueTypeInvalid": "Invalid value",
    "FieldValueNotSupported": "Unsupported value",
    "FieldValueForbidden": "Forbidden",
    "FieldValueTooLong": "Too long",
    "FieldValueTooMany": "Too many",
    "InternalError": "Internal error",
}
_NO_VALUE = frozenset({"FieldValueRequired", "FieldValueForbidden", "FieldValueTooLong", "InternalError"})


def go_value(value: Any) -> str:
    """A bad value as Go prints it in a field error: strings quoted (%q), scalars plain, the rest as JSON."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class FieldError:
    """One ``field.Error``: its type (the StatusCause reason), the field path, the bad value and a detail."""

    type: str
    field: str
    value: Any = OMIT
    detail: str = ""

    def body(self) -> str:
        text = _TYPE_TEXT[self.type]
        if self.type not in _NO_VALUE and self.value is not OMIT:
            text = f"{text}: {go_value(self.value)}"
        return f"{text}: {self.detail}" if self.detail else text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError("FieldValueInvalid", field, value, detail)


def type_invalid(field: str, value: Any, detail: str) -> FieldError:
    return FieldError("FieldValueTypeInvalid", field, value, detail)


def required(field: str, detail: str = "") -> FieldError:
    return FieldError("FieldValueRequired", field, OMIT, detail)


def forbidden(field: str, detail: str) -> FieldError:
    return FieldError("FieldValueForbidden", field, OMIT, detail)


def duplicate(field: str, value: Any) -> FieldError:
    return FieldError("FieldValueDuplicate", field, value)


def too_long(field: str, limit: int) -> FieldError:
    return FieldError("FieldValueTooLong", field, OMIT, f"may not be more than {limit} bytes")


def too_many(field: str, actual: int, limit: int) -> FieldError:
    return FieldError("FieldValueTooMany", field, actual, f"must have at most {limit} items")


def not_supported(field: str, value: Any, supported: Sequence[Any]) -> FieldError:
    listed = ", ".join(go_value(v) for v in supported)
    return FieldError("FieldValueNotSupported", field, value, f"supported values: {listed}")


def invalid_object(kind: str, group: str, name: str, errors: Iterable[FieldError]) -> ApiError:
    """``apierrors.NewInvalid``: 422 with the aggregated message (repeats dropped, as ``ToAggregate`` does) and one
    cause per error, repeats kept (as kube-apiserver 1.35.4 sends them)."""
    every = list(errors)
    unique: list[FieldError] = []
    for error in every:
        if str(error) not in {str(e) for e in unique}:
            unique.append(error)
    qualified = f"{kind}.{group}" if group else kind
    aggregate = str(unique[0]) if len(unique) == 1 else "[" + ", ".join(map(str, unique)) + "]"
    details: Obj = {"name": name, "kind": kind}
    if group:
        details["group"] = group
    details["causes"] = [{"reason": e.type, "message": e.body(), "field": e.field} for e in every]
    return ApiError(422, "Invalid", f'{qualified} "{name}" is invalid: {aggregate}', details)


def bad_request(message: str) -> ApiError:
    """400 BadRequest: the body could not be decoded into the kind (a type mismatch, an unparsable time...)."""
    return ApiError(400, "BadRequest", message)
