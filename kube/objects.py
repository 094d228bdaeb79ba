"""Safe reads of a Kubernetes object's parts as the API returns them (a dict), for activities and watchers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

JSON = dict[str, Any]


def _part(obj: Mapping[str, Any] | None, name: str) -> JSON:
    part = (obj or {}).get(name)
    return part if isinstance(part, dict) else {}


def meta(obj: Mapping[str, Any] | None) -> JSON:
    return _part(obj, "metadata")


def spec(obj: Mapping[str, Any] | None) -> JSON:
    return _part(obj, "spec")


def status(obj: Mapping[str, Any] | None) -> JSON:
    return _part(obj, "status")
