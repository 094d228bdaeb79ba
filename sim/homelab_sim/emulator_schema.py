"""Structural OpenAPI v3 schemas applied to an object the way kube-apiserver applies a CRD's schema.

Three passes, in the server's order: ``prune`` (unknown fields and ``null`` in non-nullable fields are
dropped, except under ``x-kubernetes-preserve-unknown-fields``), ``apply_defaults`` (missing properties of
present objects get their ``default``), then ``validate`` (kube-openapi's type, enum, bounds, length,
pattern, items, format and required checks, the ``x-kubernetes-*`` list and int-or-string rules, and the
``x-kubernetes-validations`` CEL rules). Messages follow apiextensions' ``ConvertToFieldErrors``.

``validate`` ratchets like CRDValidationRatcheting (on by default since 1.30): a subtree whose value equals
the old object's correlated value is not re-validated, so a status write never fails on spec and an
unchanged legacy value survives an unrelated write. Old values are correlated through object properties,
``map`` lists (by their keys) and ``set`` lists (by value); items of atomic lists are not correlated.

The same engine serves built-in kinds (``decode=True``): the schemas of ``kubernetes-validate`` converted
by ``emulator_core``. There a value of the wrong type, an out-of-range int32/int64 or an unparsable
``metav1.Time``/``MicroTime`` is a decoding failure of the typed Go struct (400 BadRequest), not a 422.

CEL: rules are compiled and evaluated by ``cel-expr-python`` (Google's CEL runtime, the C++ ``cel-cpp`` core)
with ``self`` and, for transition rules, ``oldSelf``; ``number`` values are doubles and ``date-time`` strings
are timestamps, as Kubernetes types them. ``messageExpression``, ``reason`` and ``fieldPath`` are honoured.
Not modelled: the Kubernetes CEL extension libraries (``quantity``, ``url``, ``ip``, ``cidr``, ``isSorted``
...; a rule using one fails as an evaluation error), ``optionalOldSelf`` (such rules are skipped on create),
the cost budget, and access to ``self.metadata`` beyond what the object holds.
"""

from __future__ import annotations

import base64
import binascii
import copy
import datetime
import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from homelab_sim.emulator_errors import (
    FieldError,
    duplicate,
    forbidden,
    invalid,
    not_supported,
    required,
    too_long,
    too_many,
    type_invalid,
)

__all__ = ["MISSING", "Outcome", "apply_defaults", "child", "prune", "validate"]

Schema = Mapping[str, Any]
MISSING: Any = object()
"""No old value at this path (a create, or a field the old object lacked)."""

_DATE_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
_GO_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})")
_UUID = re.compile(r"(?i)[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}")
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
_GO_TYPES = {"int32": "int32", "int64": "int64", "double": "float64", "float": "float32"}
_CEL_REASONS = {
    "FieldValueInvalid",
    "FieldValueForbidden",
    "FieldValueRequired",
    "FieldValueDuplicate",
}


@dataclass
class Outcome:
    """What one pass found: field errors (422), pruned paths (warnings) and decoding failures (400)."""

    errors: list[FieldError] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    undecodable: list[str] = field(default_factory=list)


def child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def type_name(value: Any) -> str:
    """The JSON type of a value as the validators name it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _types(schema: Schema) -> list[str]:
    kind = schema.get("type")
    if kind is None:
        return []
    return list(kind) if isinstance(kind, list) else [kind]


def _has_type(value: Any, kind: str) -> bool:
    actual = type_name(value)
    return actual == kind or (kind == "number" and actual == "integer")


def _sub(schema: Schema, key: str) -> Schema | None:
    """The schema of property ``key`` of an object node (a declared property, or the map's value schema)."""
    props = schema.get("properties")
    if isinstance(props, Mapping) and key in props:
        sub: Schema = props[key]
        return sub
    extra = schema.get("additionalProperties")
    return extra if isinstance(extra, Mapping) else None


def _keeps_unknown(schema: Schema) -> bool:
    return bool(schema.get("x-kubernetes-preserve-unknown-fields")) or schema.get("additionalProperties") is True


# --- pruning and defaulting -----------------------------------------------------------------------------


def prune(schema: Schema, value: Any, path: str, out: Outcome) -> Any:
    """A copy of ``value`` without the fields the schema does not declare (their paths go to ``out.unknown``)."""
    if isinstance(value, dict):
        result: dict[str, Any] = {}
        embedded = bool(schema.get("x-kubernetes-embedded-resource"))
        for key, item in value.items():
            here = child(path, key)
            sub = _sub(schema, key)
            if sub is None and not (_keeps_unknown(schema) or (embedded and key in ("apiVersion", "kind", "metadata"))):
                out.unknown.append(here)
                continue
            if item is None and sub is not None and not sub.get("nullable"):
                continue  # null in a non-nullable field is pruned, then defaulted
            result[key] = prune(sub, item, here, out) if sub is not None else copy.deepcopy(item)
        return result
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, Mapping):
        return [prune(items, item, f"{path}[{i}]", out) for i, item in enumerate(value)]
    return copy.deepcopy(value)


def apply_defaults(schema: Schema, value: Any) -> Any:
    """Fill missing properties of every present object with their schema ``default`` (in place, returned)."""
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
        for key, item in value.items():
            sub = _sub(schema, key)
            if sub is not None:
                value[key] = apply_defaults(sub, item)
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, Mapping):
        for index, item in enumerate(value):
            value[index] = apply_defaults(items, item)
    return value


# --- validation -----------------------------------------------------------------------------------------


@dataclass
class _Context:
    out: Outcome
    decode: bool
    ratchet: bool
    go_type: str = ""
    rules: bool = False  # the CEL pass: walk the object, evaluate x-kubernetes-validations only


# apiextensions' hasBlockingErr: after one of these, CEL rules are not evaluated at all.
_BLOCKING = frozenset(
    {"FieldValueNotSupported", "FieldValueRequired", "FieldValueTooLong", "FieldValueTooMany", "FieldValueTypeInvalid"}
)


def validate(schema: Schema, value: Any, path: str, out: Outcome, *, old: Any = MISSING, decode: bool = False) -> None:
    """Check ``value`` against ``schema``, then its CEL rules; errors go to ``out`` (``decode``: see module doc)."""
    ctx = _Context(out, decode, ratchet=not decode)
    _validate(schema, value, path, old, ctx)
    if decode:
        return
    if not _has_rules(schema):
        return
    if any(error.type in _BLOCKING for error in out.errors):
        detail = (
            "some validation rules were not checked because the object was invalid;"
            " correct the existing errors to complete validation"
        )
        out.errors.append(invalid("<nil>", "null", detail))
        return
    _validate(schema, value, path, old, _Context(out, decode, ratchet=True, rules=True))


def _validate(schema: Schema, value: Any, path: str, old: Any, ctx: _Context) -> None:
    if ctx.ratchet and old is not MISSING and old == value:
        return
    ctx = _Context(ctx.out, ctx.decode, ctx.ratchet, schema.get("x-go-type") or ctx.go_type, ctx.rules)
    if ctx.rules:
        _walk_rules(schema, value, path, old, ctx)
        return
    if value is None:
        if ctx.decode:
            return  # null decodes to the Go zero value
        if schema.get("nullable"):
            _check_enum(schema, value, path, ctx)
        elif _types(schema):
            _type_error(path, value, "/".join(_types(schema)), ctx)
        return
    if not _check_type(schema, value, path, ctx):
        return
    _check_enum(schema, value, path, ctx)
    if isinstance(value, str):
        _check_string(schema, value, path, ctx)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _check_number(schema, value, path, ctx)
    elif isinstance(value, list):
        _check_array(schema, value, path, old, ctx)
    elif isinstance(value, dict):
        _check_object(schema, value, path, old, ctx)
    _check_combinators(schema, value, path, old, ctx)


def _has_rules(schema: Any) -> bool:
    """Whether any node of a (possibly cyclic) schema carries x-kubernetes-validations."""
    seen: set[int] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Mapping):
            if node.get("x-kubernetes-validations"):
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _walk_rules(schema: Schema, value: Any, path: str, old: Any, ctx: _Context) -> None:
    """The CEL pass: rules of this node, then of its children (correlated with old values as validation is)."""
    if value is None:
        return
    if schema.get("x-kubernetes-validations"):
        _check_rules(schema, value, path, old, ctx)
    if isinstance(value, dict):
        olds = old if isinstance(old, dict) else {}
        for key, item in value.items():
            sub = _sub(schema, key)
            if sub is not None:
                _validate(sub, item, child(path, key), olds.get(key, MISSING), ctx)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for index, item in enumerate(value):
            _validate(schema["items"], item, f"{path}[{index}]", _correlate(schema, item, old), ctx)


def _correlate(schema: Schema, item: Any, old: Any) -> Any:
    """The old item an array item is compared with: by key in a map list, by value in a set, none otherwise."""
    olds = old if isinstance(old, list) else []
    list_type = schema.get("x-kubernetes-list-type")
    keys = list(schema.get("x-kubernetes-list-map-keys") or [])
    if list_type == "map" and keys and isinstance(item, dict):
        marker = {key: item.get(key) for key in keys}
        return next((o for o in olds if isinstance(o, dict) and {k: o.get(k) for k in keys} == marker), MISSING)
    if list_type == "set" and item in olds:
        return item
    return MISSING


def _type_error(path: str, value: Any, wanted: str, ctx: _Context) -> None:
    actual = type_name(value)
    if ctx.decode:
        owner = f"{ctx.go_type}." if ctx.go_type else ""
        detail = f"cannot unmarshal {actual} into Go struct field {owner}{path} of type {wanted}"
        ctx.out.undecodable.append(f"json: {detail}")
    else:
        ctx.out.errors.append(type_invalid(path, actual, f'{path} in body must be of type {wanted}: "{actual}"'))


def _check_type(schema: Schema, value: Any, path: str, ctx: _Context) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        if isinstance(value, str) or type_name(value) == "integer":
            return True
        _type_error(path, value, "integer,string" if not ctx.decode else "IntOrString", ctx)
        return False
    kinds = _types(schema)
    if not kinds or any(_has_type(value, kind) for kind in kinds):
        return True
    wanted = "/".join(kinds)
    if ctx.decode:
        wanted = _GO_TYPES.get(str(schema.get("format")), wanted)
    _type_error(path, value, wanted, ctx)
    return False


def _check_enum(schema: Schema, value: Any, path: str, ctx: _Context) -> None:
    allowed = schema.get("enum")
    if allowed and value not in allowed:
        ctx.out.errors.append(not_supported(path, "null" if value is None else value, allowed))


def _go_time_error(value: str, micro: bool) -> str | None:
    """Why Go's ``time.Parse`` of a metav1.Time (RFC 3339) or MicroTime (exactly 6 fraction digits) fails."""
    layout = "2006-01-02T15:04:05.000000Z07:00" if micro else "2006-01-02T15:04:05Z07:00"
    match = _GO_RFC3339.fullmatch(value)
    if match is not None and micro and (match.group(7) is None or len(match.group(7)) != 7):
        rest = value[19:]
        return f'parsing time "{value}" as "{layout}": cannot parse "{rest}" as ".000000"'
    if match is None or _calendar(match) is None:
        return f'parsing time "{value}" as "{layout}": cannot parse "{value}" as "{layout}"'
    return None


def _calendar(match: re.Match[str]) -> datetime.datetime | None:
    try:
        year, month, day, hour, minute, second = (int(match.group(i)) for i in range(1, 7))
        return datetime.datetime(year, month, day, hour, minute, second)
    except ValueError:
        return None


def _format_ok(fmt: str, value: str) -> bool:
    """kube-openapi's string formats that CRDs may use (unknown formats are ignored, as the server does)."""
    if fmt == "date-time":
        match = _DATE_TIME.fullmatch(value)
        return match is not None and _calendar(match) is not None
    if fmt == "date":
        try:
            datetime.date.fromisoformat(value)
        except ValueError:
            return False
        return len(value) == 10
    if fmt == "byte":
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return False
        return True
    if fmt == "uuid":
        return _UUID.fullmatch(value) is not None
    return True


def _check_string(schema: Schema, value: str, path: str, ctx: _Context) -> None:
    fmt = str(schema.get("format") or "")
    if fmt in ("k8s-time", "k8s-micro-time"):
        problem = _go_time_error(value, micro=fmt == "k8s-micro-time")
        if problem:
            ctx.out.undecodable.append(problem)
        return
    if not ctx.decode and fmt and not _format_ok(fmt, value):
        ctx.out.errors.append(type_invalid(path, value, f'{path} in body must be of type {fmt}: "{value}"'))
    if "minLength" in schema and len(value) < int(schema["minLength"]):
        ctx.out.errors.append(
            invalid(path, value, f"{path} in body should be at least {schema['minLength']} chars long")
        )
    if "maxLength" in schema and len(value) > int(schema["maxLength"]):
        ctx.out.errors.append(too_long(path, int(schema["maxLength"])))
    pattern = schema.get("pattern")
    if pattern and _regex(str(pattern)).search(value) is None:
        ctx.out.errors.append(invalid(path, value, f"{path} in body should match '{pattern}'"))


@functools.cache
def _regex(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def _number(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _check_number(schema: Schema, value: float, path: str, ctx: _Context) -> None:
    fmt = str(schema.get("format") or "")
    if ctx.decode and fmt in _INT_RANGES and not (_INT_RANGES[fmt][0] <= value <= _INT_RANGES[fmt][1]):
        owner = f"{ctx.go_type}." if ctx.go_type else ""
        ctx.out.undecodable.append(
            f"json: cannot unmarshal number {_number(value)} into Go struct field {owner}{path} of type {fmt}"
        )
        return
    checks: list[tuple[str, Callable[[float, float], bool], str]] = [
        ("minimum", lambda v, m: v < m, "greater than or equal to"),
        ("maximum", lambda v, m: v > m, "less than or equal to"),
    ]
    for key, fails, words in checks:
        if key not in schema:
            continue
        bound = float(schema[key])
        exclusive = bool(schema.get(f"exclusive{key.capitalize()}"))
        if fails(value, bound) or (exclusive and value == bound):
            words = words.replace(" or equal to", "") if exclusive else words
            detail = f"{path} in body should be {words} {_number(schema[key])}"
            ctx.out.errors.append(invalid(path, value, detail))
    step = schema.get("multipleOf")
    if step and not math.isclose(value / float(step), round(value / float(step))):
        ctx.out.errors.append(invalid(path, value, f"{path} in body should be a multiple of {_number(step)}"))


def _check_array(schema: Schema, value: list[Any], path: str, old: Any, ctx: _Context) -> None:
    if "minItems" in schema and len(value) < int(schema["minItems"]):
        ctx.out.errors.append(
            invalid(path, len(value), f"{path} in body should have at least {schema['minItems']} items")
        )
    if "maxItems" in schema and len(value) > int(schema["maxItems"]):
        ctx.out.errors.append(too_many(path, len(value), int(schema["maxItems"])))
    list_type = schema.get("x-kubernetes-list-type")
    keys = list(schema.get("x-kubernetes-list-map-keys") or [])
    seen: list[Any] = []
    for index, item in enumerate(value):
        here = f"{path}[{index}]"
        marker: Any = {key: item.get(key) for key in keys} if list_type == "map" and isinstance(item, dict) else item
        correlated = _correlate(schema, item, old)
        if list_type in ("map", "set") and not ctx.decode:
            if marker in seen:
                ctx.out.errors.append(duplicate(here, marker))
            seen.append(marker)
        items = schema.get("items")
        if isinstance(items, Mapping):
            _validate(items, item, here, correlated, ctx)


def _check_object(schema: Schema, value: dict[str, Any], path: str, old: Any, ctx: _Context) -> None:
    for name in schema.get("required") or []:
        if name not in value:
            ctx.out.errors.append(required(child(path, name)))
    if schema.get("x-kubernetes-embedded-resource") and not ctx.decode:
        for name in ("apiVersion", "kind"):
            if not value.get(name):
                ctx.out.errors.append(required(child(path, name), "must not be empty"))
    olds = old if isinstance(old, dict) else {}
    for key, item in value.items():
        sub = _sub(schema, key)
        if sub is not None:
            _validate(sub, item, child(path, key), olds.get(key, MISSING), ctx)
    if "minProperties" in schema and len(value) < int(schema["minProperties"]):
        detail = f"{path} in body should have at least {schema['minProperties']} properties"
        ctx.out.errors.append(invalid(path, len(value), detail))
    if "maxProperties" in schema and len(value) > int(schema["maxProperties"]):
        ctx.out.errors.append(too_many(path, len(value), int(schema["maxProperties"])))


def _check_combinators(schema: Schema, value: Any, path: str, old: Any, ctx: _Context) -> None:
    """allOf / anyOf / oneOf / not (value validations only, as structural schemas allow)."""

    def errors_of(sub: Schema) -> list[FieldError]:
        probe = _Context(Outcome(), ctx.decode, ratchet=False, go_type=ctx.go_type)
        _validate(sub, value, path, MISSING, probe)
        return probe.out.errors + [invalid(path, value, msg) for msg in probe.out.undecodable]

    for sub in schema.get("allOf") or []:
        ctx.out.errors += errors_of(sub)
    for key in ("anyOf", "oneOf"):
        subs = schema.get(key) or []
        if not subs:
            continue
        passing = sum(1 for sub in subs if not errors_of(sub))
        if passing == 0 or (key == "oneOf" and passing > 1):
            how = "one and only one" if key == "oneOf" else "at least one"
            detail = f"{path} in body must validate {how} schema ({key})"
            ctx.out.errors.append(invalid(path, value, detail))
    if isinstance(schema.get("not"), Mapping) and not errors_of(schema["not"]):
        ctx.out.errors.append(invalid(path, value, f"{path} in body must not validate the schema (not)"))


# --- CEL ------------------------------------------------------------------------------------------------


@functools.cache
def _cel() -> ModuleType:
    """The CEL runtime, imported on first use: it is a test/simulation extra, and only strict mode needs it."""
    from cel_expr_python import cel

    assert isinstance(cel, ModuleType)  # an extension module; untyped to mypy (the package has no py.typed)
    return cel


@functools.cache
def _env() -> Any:
    cel = _cel()
    return cel.NewEnv(variables={"self": cel.Type.DYN, "oldSelf": cel.Type.DYN})


@functools.cache
def _program(expression: str) -> Any:
    return _env().compile(expression)


def _cel_value(schema: Schema | None, value: Any) -> Any:
    """The value as Kubernetes types it for CEL: numbers are doubles, date-time strings timestamps."""
    if schema is None:
        return value
    if isinstance(value, dict):
        return {k: _cel_value(_sub(schema, k), v) for k, v in value.items()}
    items = schema.get("items")
    if isinstance(value, list):
        return [_cel_value(items if isinstance(items, Mapping) else None, v) for v in value]
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if schema.get("format") == "date-time" and isinstance(value, str):
        with_zone = value[:-1] + "+00:00" if value[-1:] in "Zz" else value
        try:
            return datetime.datetime.fromisoformat(with_zone)
        except ValueError:
            return value
    return value


def _evaluate(expression: str, data: Mapping[str, Any]) -> tuple[Any, str | None]:
    """(result, None) or (None, the evaluation error as cel-go words it where the wording differs)."""
    try:
        result = _program(expression).eval(data=dict(data))
    except RuntimeError as exc:
        return None, str(exc)
    if result.type() == _cel().Type.ERROR:
        text = str(result.value())
        missing = re.search(r'Key not found in map : "?([^"]*)"?', text)
        return None, f"no such key: {missing.group(1)}" if missing else text
    return result.plain_value(), None


def _check_rules(schema: Schema, value: Any, path: str, old: Any, ctx: _Context) -> None:
    kind = "integer" if schema.get("x-kubernetes-int-or-string") else str(schema.get("type") or type_name(value))
    data = {"self": _cel_value(schema, value)}
    if old is not MISSING:
        data["oldSelf"] = _cel_value(schema, old)
    for rule in schema.get("x-kubernetes-validations") or []:
        expression = str(rule["rule"])
        if re.search(r"\boldSelf\b", expression) and old is MISSING:
            continue  # a transition rule: only on updates that have a correlated old value
        result, error = _evaluate(expression, data)
        described = str(rule.get("message") or "").strip() or expression.strip()
        if error is not None:
            ctx.out.errors.append(invalid(path, kind, f"{error} evaluating rule: {described}"))
            continue
        if result is True:
            continue
        message = str(rule.get("message") or "").strip() or f"failed rule: {described}"
        if rule.get("messageExpression"):
            custom, failed = _evaluate(str(rule["messageExpression"]), data)
            if failed is None and isinstance(custom, str) and custom.strip():
                message = custom.strip()
        where = path + str(rule["fieldPath"]) if rule.get("fieldPath") else path
        reason = str(rule.get("reason") or "FieldValueInvalid")
        if reason not in _CEL_REASONS or reason == "FieldValueInvalid":
            ctx.out.errors.append(invalid(where, kind, message))
        elif reason == "FieldValueForbidden":
            ctx.out.errors.append(forbidden(where, message))
        elif reason == "FieldValueRequired":
            ctx.out.errors.append(required(where, message))
        else:
            ctx.out.errors.append(FieldError("FieldValueDuplicate", where, kind, message))
