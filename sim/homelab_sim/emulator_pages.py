"""List chunking and ``resourceVersionMatch`` as kube-apiserver answers them (pure helpers of the emulator).

``limit`` cuts a list into pages; the next page is asked for with the opaque ``continue`` token, which carries
the list's resourceVersion and the last key served (as etcd3's ``continueToken`` does: base64 of a small JSON
document). Unlike etcd, the emulator keeps no snapshot per list: a continued page shows the objects as they
are now, after the last key served, under the first page's resourceVersion. A token older than the
compaction point answers 410 Expired; a token that does not decode answers 400.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from homelab_sim.emulator_errors import ApiError, FieldError, forbidden, invalid_object, not_supported

__all__ = ["Cursor", "Page", "decode_continue", "paginate", "too_large_rv", "validate_list_options"]

_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list"
    " without the continue parameter, or use the continue token in this response to retrieve the remainder of"
    " the results. Continuing with the provided token results in an inconsistent list - objects that were"
    " created, modified, or deleted between the time the first chunk was returned and now may show up in the list."
)


@dataclass(frozen=True)
class Cursor:
    """A decoded continue token: the first page's resourceVersion and the last key it served."""

    rv: int
    start: str


@dataclass(frozen=True)
class Page:
    items: list[Any]
    next_token: str = ""
    remaining: int = 0


def encode_continue(rv: int, last_key: str) -> str:
    doc = {"v": "meta.k8s.io/v1", "rv": rv, "start": last_key + "\x00"}
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode().rstrip("=")


def decode_continue(token: str, compacted_below: int) -> Cursor:
    """The cursor of a token; 400 when it is not one, 410 when its resourceVersion was compacted."""
    try:
        doc = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        cursor = Cursor(int(doc["rv"]), str(doc["start"]).rstrip("\x00"))
        if doc.get("v") != "meta.k8s.io/v1" or cursor.rv <= 0:
            raise ValueError(f"unsupported continue token version {doc.get('v')!r}")
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise ApiError(400, "BadRequest", f"continue key is not valid: {exc}") from None
    if cursor.rv < compacted_below:
        raise ApiError(410, "Expired", _EXPIRED)
    return cursor


def validate_list_options(resource_version: str | None, match: str | None, token: str | None) -> None:
    """``ValidateListOptions`` (422 on ListOptions) and etcd3's refusal of a resourceVersion with continue."""
    errors: list[FieldError] = []
    if match:
        if not resource_version:
            errors.append(
                forbidden(
                    "resourceVersionMatch", "resourceVersionMatch is forbidden unless resourceVersion is provided"
                )
            )
        if token:
            errors.append(
                forbidden("resourceVersionMatch", "resourceVersionMatch is forbidden when continue is provided")
            )
        if match == "Exact" and resource_version == "0":
            errors.append(
                forbidden("resourceVersionMatch", 'resourceVersionMatch "exact" is forbidden for resourceVersion "0"')
            )
        elif match not in ("Exact", "NotOlderThan"):
            errors.append(not_supported("resourceVersionMatch", match, ["Exact", "NotOlderThan", ""]))
    if errors:
        raise invalid_object("ListOptions", "meta.k8s.io", "", errors)
    if token and resource_version not in (None, "", "0"):
        raise ApiError(400, "BadRequest", "specifying resource version is not allowed when using continue")
    if resource_version not in (None, ""):
        try:
            int(str(resource_version))
        except ValueError:
            raise ApiError(400, "BadRequest", f"invalid resourceVersion {resource_version!r}") from None


def too_large_rv(asked: int, current: int) -> ApiError:
    """504: a list at a resourceVersion the store has not reached (the real server waits 3 s first)."""
    return ApiError(
        504,
        "Timeout",
        f"Too large resource version: {asked}, current: {current}",
        {
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        },
    )


def paginate(
    items: Sequence[Any],
    key: Callable[[Any], str],
    limit: str | None,
    token: str | None,
    rv: int,
    *,
    ignore_limit: bool = False,
) -> Page:
    """One page of key-ordered ``items``: after the token's key, at most ``limit`` long, with the next token."""
    remaining = list(items)
    if token:
        start = decode_continue(token, 0).start
        remaining = [item for item in remaining if key(item) > start]
    try:
        size = int(limit or 0)
    except ValueError:
        raise ApiError(400, "BadRequest", f"invalid limit {limit!r}") from None
    if ignore_limit or size <= 0 or len(remaining) <= size:
        return Page(remaining)
    page = remaining[:size]
    return Page(page, encode_continue(rv, key(page[-1])), len(remaining) - size)
