"""Object metadata rules of the API server (apimachinery ``pkg/util/validation`` and ``ValidateObjectMeta``).

Pure functions with the real messages, so a refused name or label reads exactly like kube-apiserver's answer.
Each function names the Go function it mirrors.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from homelab_sim.emulator_errors import FieldError, invalid, required, too_long

__all__ = [
    "NameRule",
    "dns1123_label",
    "dns1123_subdomain",
    "job_name",
    "qualified_name",
    "validate_labels",
    "validate_object_meta",
]

NameRule = Callable[[str, bool], list[str]]
"""``ValidateNameFunc(name, prefix)``: the messages why ``name`` is not a valid name (prefix: a generateName)."""

_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = rf"{_LABEL}(\.{_LABEL})*"
_QUALIFIED = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_LABEL_VALUE = rf"({_QUALIFIED})?"
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and"
    " end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is"
    f" '{_LABEL}')"
)
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must"
    " start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is"
    f" '{_SUBDOMAIN}')"
)
_QUALIFIED_MSG = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric"
    f" character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '{_QUALIFIED}')"
)
_LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must"
    " start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used"
    f" for validation is '{_LABEL_VALUE}')"
)
_STANDARD_FINALIZERS = frozenset({"kubernetes", "orphan", "foregroundDeletion"})
TOTAL_ANNOTATION_SIZE = 256 * 1024  # apimachinery TotalAnnotationSizeLimitB


def _too_long(limit: int) -> str:
    return f"must be no more than {limit} characters"


def _too_many_bytes(limit: int) -> str:
    """What 1.35 says of a label value or a qualified name's name part (checked on a real kube-apiserver 1.35.4;
    DNS names still say characters)."""
    return f"must be no more than {limit} bytes"


def dns1123_label(value: str, prefix: bool = False) -> list[str]:
    """``IsDNS1123Label`` (``NameIsDNSLabel`` when used as a name rule; a generateName may end in '-')."""
    value = value[:-1] if prefix and value.endswith("-") else value
    errors = [_too_long(63)] if len(value) > 63 else []
    if not re.fullmatch(_LABEL, value):
        errors.append(_LABEL_MSG)
    return errors


def dns1123_subdomain(value: str, prefix: bool = False) -> list[str]:
    """``IsDNS1123Subdomain`` (``NameIsDNSSubdomain`` when used as a name rule)."""
    value = value[:-1] if prefix and value.endswith("-") else value
    errors = [_too_long(253)] if len(value) > 253 else []
    if not re.fullmatch(_SUBDOMAIN, value):
        errors.append(_SUBDOMAIN_MSG)
    return errors


def job_name(value: str, prefix: bool = False) -> list[str]:
    """What a Job's name must be for the Job to be created: a DNS subdomain that also fits the ``job-name`` labels
    the Job strategy puts on its template (so at most 63). The server's name rule itself is the subdomain's; the
    label check refuses a longer name (``spec.template.labels``)."""
    errors = dns1123_subdomain(value, prefix)
    if not prefix:
        errors += label_value(value)
    return errors


def qualified_name(value: str) -> list[str]:
    """``IsQualifiedName``: an optional DNS-subdomain prefix and '/', then a name part of ≤63 characters."""
    parts = value.split("/")
    if len(parts) == 1:
        name = parts[0]
        errors: list[str] = []
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            errors = ["prefix part must be non-empty"]
        else:
            errors = ["prefix part " + msg for msg in dns1123_subdomain(prefix)]
    else:
        return [
            "a qualified name " + _QUALIFIED_MSG + " with an optional DNS subdomain prefix and '/' (e.g."
            " 'example.com/MyName')"
        ]
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part " + _too_many_bytes(63))
    if name and not re.fullmatch(_QUALIFIED, name):
        errors.append("name part " + _QUALIFIED_MSG)
    return errors


def label_value(value: str) -> list[str]:
    """``IsValidLabelValue``: empty, or ≤63 bytes of the qualified-name alphabet."""
    errors = [_too_many_bytes(63)] if len(value) > 63 else []
    if not re.fullmatch(_LABEL_VALUE, value):
        errors.append(_LABEL_VALUE_MSG)
    return errors


def validate_labels(labels: Any, path: str) -> list[FieldError]:
    """``ValidateLabels``: every key a qualified name, every value a label value (errors name the map)."""
    if not isinstance(labels, Mapping):
        return []
    errors = [invalid(path, key, msg) for key in labels for msg in qualified_name(str(key))]
    for value in labels.values():
        errors += [invalid(path, value, msg) for msg in label_value(str(value))]
    return errors


def validate_annotations(annotations: Any, path: str) -> list[FieldError]:
    """``ValidateAnnotations``: keys are qualified names (compared lower-cased), 256 KiB in total."""
    if not isinstance(annotations, Mapping):
        return []
    errors = [invalid(path, key, msg) for key in annotations for msg in qualified_name(str(key).lower())]
    size = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
    if size > TOTAL_ANNOTATION_SIZE:
        errors.append(too_long(path, TOTAL_ANNOTATION_SIZE))
    return errors


def validate_finalizers(finalizers: Any, path: str) -> list[FieldError]:
    """``ValidateFinalizers`` / ``validateFinalizerName``: qualified, and with a '/' unless a standard one."""
    errors: list[FieldError] = []
    for index, name in enumerate(finalizers if isinstance(finalizers, list) else []):
        here = f"{path}[{index}]"
        problems = qualified_name(str(name))
        errors += [invalid(here, name, msg) for msg in problems]
        if not problems and "/" not in str(name) and name not in _STANDARD_FINALIZERS:
            errors.append(invalid(here, name, "name is neither a standard finalizer name nor is it fully qualified"))
    return errors


def validate_owner_references(refs: Any, path: str) -> list[FieldError]:
    """``ValidateOwnerReferences``: apiVersion, kind, name, uid set; at most one controller."""
    errors: list[FieldError] = []
    controllers = []
    for index, ref in enumerate(refs if isinstance(refs, list) else []):
        if not isinstance(ref, Mapping):
            continue
        here = f"{path}[{index}]"
        if not str(ref.get("apiVersion") or "").rpartition("/")[2]:
            errors.append(invalid(f"{here}.apiVersion", ref.get("apiVersion", ""), "version must not be empty"))
        if not ref.get("kind"):
            errors.append(invalid(f"{here}.kind", ref.get("kind", ""), "must not be empty"))
        if not ref.get("name"):
            errors.append(invalid(f"{here}.name", ref.get("name", ""), "must not be empty"))
        if not ref.get("uid"):
            errors.append(invalid(f"{here}.uid", ref.get("uid", ""), "must not be empty"))
        if ref.get("controller") is True:
            controllers.append(f"{ref.get('kind')}/{ref.get('name')}")
    if len(controllers) > 1:
        found = " and ".join(controllers)
        detail = f'Only one reference can have Controller set to true. Found "true" in references for {found}'
        errors.append(invalid(path, refs, detail))
    return errors


def validate_object_meta(meta: Mapping[str, Any], name_rule: NameRule, *, namespaced: bool) -> list[FieldError]:
    """``ValidateObjectMeta``: name (or generateName) by the kind's rule, namespace, labels, annotations,
    finalizers and owner references.
    """
    errors: list[FieldError] = []
    generate = meta.get("generateName")
    if generate:
        errors += [invalid("metadata.generateName", generate, msg) for msg in name_rule(str(generate), True)]
    name = meta.get("name")
    if not name:
        errors.append(required("metadata.name", "name or generateName is required"))
    else:
        errors += [invalid("metadata.name", name, msg) for msg in name_rule(str(name), False)]
    namespace = meta.get("namespace")
    if namespaced and namespace:
        errors += [invalid("metadata.namespace", namespace, msg) for msg in dns1123_label(str(namespace))]
    errors += validate_labels(meta.get("labels"), "metadata.labels")
    errors += validate_annotations(meta.get("annotations"), "metadata.annotations")
    errors += validate_finalizers(meta.get("finalizers"), "metadata.finalizers")
    errors += validate_owner_references(meta.get("ownerReferences"), "metadata.ownerReferences")
    return errors
