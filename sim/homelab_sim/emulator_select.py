"""Label and field selectors of the emulated Kubernetes API, as pure parse/match functions.

Stock kmock ignores selectors and returns everything, which would hide a wrong selector in the
operator; these implement the real grammar so a list or watch returns exactly what a cluster would.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Selector", "SelectorError", "parse_field_selector", "parse_label_selector"]


class SelectorError(ValueError):
    """An unparsable selector; the API server answers 400 BadRequest."""


@dataclass(frozen=True)
class _Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, Any]) -> bool:
        present = self.key in labels
        value = None if labels.get(self.key) is None else str(labels.get(self.key))
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        # "!=" and "notin" match objects without the label too, as in Kubernetes.
        return not present or value not in self.values


@dataclass(frozen=True)
class Selector:
    """A conjunction of requirements; the empty selector matches everything."""

    requirements: tuple[_Requirement, ...] = ()

    def matches(self, labels: Mapping[str, Any] | None) -> bool:
        return all(req.matches(labels or {}) for req in self.requirements)


_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_SET_RE = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s*\(([^)]*)\)\s*$")
_CMP_RE = re.compile(rf"^\s*({_KEY})\s*(==|!=|=)\s*([-A-Za-z0-9_.]*)\s*$")
_EXISTS_RE = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


def _split(text: str) -> list[str]:
    """Split on commas outside parentheses (``a in (x,y),b`` is two requirements)."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part for part in parts if part.strip()]


def parse_label_selector(text: str | None) -> Selector:
    """Parse ``a=b,a==b,a!=b,a in (x,y),a notin (x),a,!a`` into a Selector."""
    if not text:
        return Selector()
    requirements: list[_Requirement] = []
    for part in _split(text):
        if match := _SET_RE.match(part):
            values = tuple(v.strip() for v in match.group(3).split(",") if v.strip())
            requirements.append(_Requirement(match.group(1), match.group(2), values))
        elif match := _CMP_RE.match(part):
            op = "!=" if match.group(2) == "!=" else "="
            requirements.append(_Requirement(match.group(1), op, (match.group(3),)))
        elif match := _EXISTS_RE.match(part):
            requirements.append(_Requirement(match.group(2), "!exists" if match.group(1) else "exists"))
        else:
            raise SelectorError(f"unable to parse requirement: {part.strip()!r}")
    return Selector(tuple(requirements))


def _lookup(obj: Mapping[str, Any], dotted: str) -> str:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(text: str | None) -> Callable[[Mapping[str, Any]], bool]:
    """Parse ``metadata.name=x,metadata.namespace!=y,spec.nodeName==z`` into a predicate.

    Any dotted path is accepted (a real server allows only a per-kind list of fields; being more
    permissive here is harmless for tests and noted in the emulator's limitations).
    """
    checks: list[tuple[str, bool, str]] = []
    for part in _split(text or ""):
        match = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
        if not match:
            raise SelectorError(f"invalid field selector: {part.strip()!r}")
        checks.append((match.group(1), match.group(2) == "!=", match.group(3)))

    def predicate(obj: Mapping[str, Any]) -> bool:
        return all((_lookup(obj, field) == value) != negate for field, negate, value in checks)

    return predicate
