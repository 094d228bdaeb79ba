"""Patch algorithms of the emulated Kubernetes API: merge, JSON and (approximated) strategic merge.

They live apart from the server so that they can be unit-tested as pure functions and so that the
emulator's request handling stays readable. All functions are pure: they never mutate their inputs.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = [
    "SMP_MERGE_KEYS",
    "SMP_SET_LISTS",
    "PatchError",
    "json_patch",
    "merge_patch",
    "strategic_merge_patch",
]


class PatchError(Exception):
    """A patch that cannot be applied; the API server answers 422 (or the given status)."""

    def __init__(self, message: str, status: int = 422, reason: str = "Invalid") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: ``null`` deletes, lists and scalars replace, dicts merge recursively.

    A dict patched onto a scalar (or vice versa) replaces it, as the RFC says (stock kmock answers 500).
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result: dict[str, Any] = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# Strategic-merge-patch list rules for the built-in fields the operator (and kubectl) patches.
# Paths ignore list indices: ("spec", "template", "spec", "containers", "env") is the env of any container.
# Every other list is replaced whole, exactly like merge patch (this matches real behaviour for e.g.
# ``spec.taints`` of a Node, which has no patch strategy and is replaced whole).
SMP_MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
    ("metadata", "ownerReferences"): "uid",
    ("spec", "containers"): "name",
    ("spec", "initContainers"): "name",
    ("spec", "volumes"): "name",
    ("spec", "tolerations"): "key",
    ("spec", "containers", "env"): "name",
    ("spec", "containers", "volumeMounts"): "mountPath",
    ("spec", "containers", "ports"): "containerPort",
    ("spec", "template", "spec", "containers"): "name",
    ("spec", "template", "spec", "initContainers"): "name",
    ("spec", "template", "spec", "volumes"): "name",
    ("spec", "template", "spec", "containers", "env"): "name",
    ("spec", "template", "spec", "containers", "volumeMounts"): "mountPath",
}
# Lists of scalars with patchStrategy=merge: the patch's items are added (set union, order kept).
SMP_SET_LISTS: frozenset[tuple[str, ...]] = frozenset({("metadata", "finalizers")})


def strategic_merge_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """An approximation of Kubernetes' strategic merge patch for built-in kinds.

    Implemented: merge lists by the keys in ``SMP_MERGE_KEYS`` (``status.conditions`` by ``type``,
    ``metadata.ownerReferences`` by ``uid``, containers/volumes/env by name…), set-union for
    ``metadata.finalizers``, the ``$patch: delete`` directive on keyed list items, ``$patch: replace``
    on maps, ``$deleteFromPrimitiveList/<field>``; ``$setElementOrder/…`` and ``$retainKeys`` are
    accepted and ignored. Everything else behaves like RFC 7386 merge patch.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result: dict[str, Any] = copy.deepcopy(target) if isinstance(target, dict) else {}
    deletions: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            deletions[key.split("/", 1)[1]] = list(value or [])
            continue
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        child = (*path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and child in SMP_MERGE_KEYS:
            result[key] = _merge_keyed_list(result.get(key), value, SMP_MERGE_KEYS[child], child)
        elif isinstance(value, list) and child in SMP_SET_LISTS:
            existing = list(result.get(key) or [])
            result[key] = existing + [item for item in value if item not in existing]
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value, child)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = copy.deepcopy(value)
    for key, removed in deletions.items():
        if isinstance(result.get(key), list):
            result[key] = [item for item in result[key] if item not in removed]
    return result


def _merge_keyed_list(target: Any, patch: list[Any], merge_key: str, path: tuple[str, ...]) -> list[Any]:
    result: list[Any] = copy.deepcopy(target) if isinstance(target, list) else []
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            result.append(copy.deepcopy(item))
            continue
        index = next(
            (i for i, old in enumerate(result) if isinstance(old, dict) and old.get(merge_key) == item[merge_key]),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append({k: copy.deepcopy(v) for k, v in item.items() if k != "$patch"})
        else:
            result[index] = strategic_merge_patch(result[index], item, path)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"invalid JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _resolve(doc: Any, parts: list[str]) -> Any:
    for part in parts:
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            raise PatchError(f"path /{'/'.join(parts)} does not exist")
    return doc


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _resolve(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise PatchError(f"index {last} out of range")
    else:
        raise PatchError(f"cannot add at /{'/'.join(parts)}")
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent = _resolve(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise PatchError(f"path /{'/'.join(parts)} does not exist")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test); a failed ``test`` raises 422."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be a list of operations", status=400, reason="BadRequest")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"malformed JSON patch operation {op!r}", status=400, reason="BadRequest")
        kind, parts = op["op"], _pointer(op["path"])
        if kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, parts)
        elif kind == "replace":
            _resolve(doc, parts)
            doc = _add(_remove(doc, parts) if parts else doc, parts, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from", ""))
            value = copy.deepcopy(_resolve(doc, source))
            if kind == "move":
                doc = _remove(doc, source)
            doc = _add(doc, parts, value)
        elif kind == "test":
            if _resolve(doc, parts) != op.get("value"):
                raise PatchError(f"test operation failed at {op['path']}")
        else:
            raise PatchError(f"unknown JSON patch operation {kind!r}", status=400, reason="BadRequest")
    return doc
