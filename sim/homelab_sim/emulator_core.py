"""Built-in kinds: their official schemas (from ``kubernetes-validate``) and the Go validation the schema lacks.

Schemas: ``kubernetes-validate`` ships the OpenAPI of every Kubernetes release as JSON Schema (draft 2020-12).
Its ``validate()`` stops at the first error and knows nothing of pruning or of decoding, so the emulator reads
the same files (the non-strict variant: unknown fields are the server's business, it prunes them) and converts
them into the structural form ``emulator_schema`` walks: ``type: [T, "null"]`` becomes ``T`` (a null decodes
to the zero value), ``IntOrString`` becomes ``x-kubernetes-int-or-string``, ``Quantity`` a string-or-number,
``metav1.Time`` / ``MicroTime`` get formats of their own so their Go parsing can be checked, and objects with
no declared fields (``RawExtension``, ``FieldsV1``) keep what they hold.

Version: 1.35, the oldest Kubernetes that cluster-autoscaler 1.35 (the oldest the provider speaks to) supports,
the same version ``tests/test_deploy.py`` validates the manifests against. Validating against the oldest
supported release means a field added later is pruned here, as it would be on that cluster.

The schemas are used for decoding only (types, integer ranges, times) and for pruning: their ``required``
lists come from ``+required`` markers that Go validation does not all enforce (a Node's ``status.nodeInfo``
fields are "required" there, yet a Node without them is accepted), so what kube-apiserver checks in Go (``ValidateJob``,
``validateNodeTaints``, ``ValidateEventCreate``, ``ValidateLeaseSpec``...) for the fields the operator and the
simulated homelab write is in ``KIND_CHECKS``. Not modelled: built-in defaulting (``SetDefaults_*``), list
uniqueness of built-in lists other than container names and taints, and update rules other than the Job's
immutable pod template.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
from collections.abc import Callable, Mapping
from typing import Any

from homelab_sim.emulator_errors import (
    FieldError,
    duplicate,
    invalid,
    not_supported,
    required,
    too_long,
)
from homelab_sim.emulator_meta import (
    dns1123_label,
    dns1123_subdomain,
    qualified_name,
    validate_finalizers,
    validate_labels,
)

__all__ = ["KIND_CHECKS", "KUBERNETES_VERSION", "core_schema", "object_meta_schema"]

KUBERNETES_VERSION = "1.35"
Obj = dict[str, Any]
Check = Callable[[Obj, Obj | None], list[FieldError]]
"""``check(new, old)`` → field errors; old is None on create."""

_DEFS_PREFIX = "io.k8s.apimachinery.pkg.apis.meta.v1."
_SPECIAL_REFS: dict[str, Obj] = {
    _DEFS_PREFIX + "Time": {"type": "string", "format": "k8s-time"},
    _DEFS_PREFIX + "MicroTime": {"type": "string", "format": "k8s-micro-time"},
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"x-kubernetes-int-or-string": True},
    "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": ["string", "number"]},
}
_KEPT = ("format", "required", "minLength", "maxLength", "pattern", "minimum", "maximum", "minItems", "maxItems")


def _schema_dir() -> Any:
    return (
        importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{KUBERNETES_VERSION}.0-local"
    )


@functools.cache
def _definitions() -> Mapping[str, Any]:
    defs: Mapping[str, Any] = json.loads((_schema_dir() / "_definitions.json").read_text())["$defs"]
    return defs


def _convert(node: Mapping[str, Any], memo: dict[str, Obj]) -> Obj:
    """One JSON Schema node in structural form (shared, possibly cyclic, dicts for ``$ref`` targets)."""
    ref = node.get("$ref")
    if isinstance(ref, str):
        name = ref.rsplit("/", 1)[1]
        if name in _SPECIAL_REFS:
            return dict(_SPECIAL_REFS[name])
        if name not in memo:
            memo[name] = {"x-go-type": name.rsplit(".", 1)[1]}
            memo[name].update(_convert(_definitions()[name], memo))
        return memo[name]
    out: Obj = {key: node[key] for key in _KEPT if key in node}
    kinds = node.get("type")
    kinds = [k for k in (kinds if isinstance(kinds, list) else [kinds]) if k not in (None, "null")]
    if kinds:
        out["type"] = kinds[0] if len(kinds) == 1 else kinds
    if "properties" in node:
        out["properties"] = {key: _convert(sub, memo) for key, sub in node["properties"].items()}
    extra = node.get("additionalProperties")
    if isinstance(extra, Mapping):
        out["additionalProperties"] = _convert(extra, memo)
    if isinstance(node.get("items"), Mapping):
        out["items"] = _convert(node["items"], memo)
    if "properties" not in out and "additionalProperties" not in out and out.get("type") in ("object", None):
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


@functools.cache
def core_schema(api_version: str, kind: str) -> Obj | None:
    """The structural schema of a built-in kind at ``KUBERNETES_VERSION``, or None when none is shipped."""
    group_version = api_version.split("/")
    stem = f"{group_version[0].split('.')[0]}-{group_version[1]}" if len(group_version) == 2 else api_version
    path = _schema_dir() / f"{kind.lower()}-{stem}.json"
    if not path.is_file():
        return None
    schema = _convert(json.loads(path.read_text()), {})
    schema["properties"]["apiVersion"] = {"type": "string"}
    schema["properties"]["kind"] = {"type": "string"}
    return schema


@functools.cache
def object_meta_schema() -> Obj:
    """``ObjectMeta`` in structural form: what a CRD's ``metadata`` keeps (the server owns its schema)."""
    return _convert({"$ref": f"#/$defs/{_DEFS_PREFIX}ObjectMeta"}, {})


# --- Go validation of the fields the operator writes ------------------------------------------------------


def _get(obj: Any, *path: str | int) -> Any:
    for part in path:
        if isinstance(part, int):
            obj = obj[part] if isinstance(obj, list) and len(obj) > part else None
        else:
            obj = obj.get(part) if isinstance(obj, Mapping) else None
    return obj


def _items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _nonnegative(obj: Obj, *path: str) -> list[FieldError]:
    """``ValidateNonnegativeField``."""
    value = _get(obj, *path)
    if isinstance(value, int) and value < 0:
        return [invalid(".".join(path), value, "must be greater than or equal to 0")]
    return []


def _positive(obj: Obj, *path: str) -> list[FieldError]:
    """``ValidatePositiveField`` style checks (``must be greater than 0``)."""
    value = _get(obj, *path)
    if isinstance(value, int) and value <= 0:
        return [invalid(".".join(path), value, "must be greater than 0")]
    return []


def _containers(spec: Any, path: str) -> list[FieldError]:
    """``validateContainers`` / ``validateVolumes``: DNS-label names, unique; an image; mounts of known volumes."""
    errors: list[FieldError] = []
    volumes: set[str] = set()
    for index, volume in enumerate(_items(_get(spec, "volumes"))):
        name = str(_get(volume, "name") or "")
        here = f"{path}.volumes[{index}].name"
        errors += [invalid(here, name, msg) for msg in dns1123_label(name)] if name else [required(here)]
        if name in volumes:
            errors.append(duplicate(here, name))
        volumes.add(name)
    if not _items(_get(spec, "containers")):
        errors.append(required(f"{path}.containers"))
    for list_name in ("initContainers", "containers"):
        names: set[str] = set()
        for index, container in enumerate(_items(_get(spec, list_name))):
            here = f"{path}.{list_name}[{index}]"
            name = str(_get(container, "name") or "")
            errors += (
                [invalid(f"{here}.name", name, msg) for msg in dns1123_label(name)]
                if name
                else [required(f"{here}.name")]
            )
            if name and name in names:
                errors.append(duplicate(f"{here}.name", name))
            names.add(name)
            if not _get(container, "image"):
                errors.append(required(f"{here}.image"))
            for env_index, env in enumerate(_items(_get(container, "env"))):
                if not _get(env, "name"):
                    errors.append(required(f"{here}.env[{env_index}].name"))
            for mount_index, mount in enumerate(_items(_get(container, "volumeMounts"))):
                mount_name = str(_get(mount, "name") or "")
                if mount_name not in volumes:
                    errors.append(
                        FieldError("FieldValueNotFound", f"{here}.volumeMounts[{mount_index}].name", mount_name)
                    )
    return errors


def check_job(new: Obj, old: Obj | None) -> list[FieldError]:
    """``ValidateJob`` / ``ValidateJobUpdate``: the pod template's labels and containers, a restart policy of
    OnFailure or Never, non-negative counts, and a template that cannot change once created.
    """
    # ValidatePodTemplateSpec names the template's labels `spec.template.labels` (its ObjectMeta is inline in Go)
    errors = validate_labels(_get(new, "spec", "template", "metadata", "labels"), "spec.template.labels")
    policy = _get(new, "spec", "template", "spec", "restartPolicy") or "Always"  # SetDefaults_PodSpec
    if policy not in ("OnFailure", "Never"):
        errors.append(not_supported("spec.template.spec.restartPolicy", policy, ["OnFailure", "Never"]))
    errors += _containers(_get(new, "spec", "template", "spec"), "spec.template.spec")
    for name in ("backoffLimit", "ttlSecondsAfterFinished", "completions", "parallelism"):
        errors += _nonnegative(new, "spec", name)
    errors += _positive(new, "spec", "activeDeadlineSeconds")
    if old is not None and _get(old, "spec", "template") != _get(new, "spec", "template"):
        errors.append(invalid("spec.template", _get(new, "spec", "template"), "field is immutable"))
    return _generated_selector(new) + errors


def _generated_selector(job: Obj) -> list[FieldError]:
    """``validateGeneratedSelector``: with a generated selector, the template's job-name and controller-uid labels
    must be the Job's own (a user's `job-name: mine` is refused, naming the label and what it must be)."""
    if _get(job, "spec", "manualSelector") is True:
        return []
    labels = _get(job, "spec", "template", "metadata", "labels")
    if not isinstance(labels, Mapping):
        return [required("spec.template.metadata.labels")]
    name, uid = str(_get(job, "metadata", "name") or ""), str(_get(job, "metadata", "uid") or "")
    wanted = {"controller-uid": uid, "batch.kubernetes.io/controller-uid": uid,
              "job-name": name, "batch.kubernetes.io/job-name": name}  # fmt: skip
    return [
        invalid(f"spec.template.metadata.labels[{key}]", dict(labels), f"must be '{value}'")
        for key, value in wanted.items()
        if key in labels and labels[key] != value
    ]


def check_node(new: Obj, old: Obj | None) -> list[FieldError]:
    """``validateNodeTaints``: qualified keys, label-like values, a known effect, unique (key, effect)."""
    errors: list[FieldError] = []
    seen: set[tuple[str, str]] = set()
    for index, taint in enumerate(_items(_get(new, "spec", "taints"))):
        here = f"spec.taints[{index}]"
        key, effect = str(_get(taint, "key") or ""), str(_get(taint, "effect") or "")
        errors += [invalid(f"{here}.key", key, msg) for msg in qualified_name(key)]
        value = _get(taint, "value")
        if value:
            errors += validate_labels({"x": value}, f"{here}.value")
        if not effect:
            errors.append(required(f"{here}.effect"))
        elif effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
            errors.append(not_supported(f"{here}.effect", effect, ["NoSchedule", "PreferNoSchedule", "NoExecute"]))
        if (key, effect) in seen:
            error = duplicate(here, taint)
            errors.append(
                FieldError(error.type, error.field, error.value, "taints must be unique by key and effect pair")
            )
        seen.add((key, effect))
    return errors


def check_core_event(new: Obj, old: Obj | None) -> list[FieldError]:
    """``legacyValidateEvent`` (core/v1): the involved object's namespace matches; with an eventTime, the
    reporting controller, instance and action are required.
    """
    errors: list[FieldError] = []
    namespace = str(_get(new, "metadata", "namespace") or "")
    involved = str(_get(new, "involvedObject", "namespace") or "")
    if not _get(new, "eventTime"):
        if (involved and involved != namespace) or (not involved and namespace not in ("", "default")):
            errors.append(invalid("involvedObject.namespace", involved, "does not match event.namespace"))
        return errors
    if not involved and namespace not in ("default", "kube-system"):
        errors.append(invalid("involvedObject.namespace", involved, "does not match event.namespace"))
    controller = str(_get(new, "reportingComponent") or "")
    errors += [required("reportingComponent")] if not controller else []
    errors += [invalid("reportingComponent", controller, msg) for msg in qualified_name(controller)]
    errors += _reporting(new)
    return errors


def _reporting(new: Obj) -> list[FieldError]:
    errors: list[FieldError] = []
    for name, limit in (("reportingInstance", 128), ("action", 128)):
        value = str(_get(new, name) or "")
        if not value:
            errors.append(required(name))
        elif len(value) > limit:
            errors.append(invalid(name, "", f"can have at most {limit} characters"))
    return errors


def check_events_event(new: Obj, old: Obj | None) -> list[FieldError]:
    """``ValidateEventCreate`` for events.k8s.io/v1: eventTime, type, reporting fields; no deprecated fields."""
    errors: list[FieldError] = []
    if not _get(new, "eventTime"):
        errors.append(required("eventTime"))
    kind = _get(new, "type")
    if kind not in ("Normal", "Warning"):
        errors.append(invalid("type", "", f"has invalid value: {kind or ''}"))
    controller = str(_get(new, "reportingController") or "")
    errors += [required("reportingController")] if not controller else []
    errors += [invalid("reportingController", controller, msg) for msg in qualified_name(controller)]
    errors += _reporting(new)
    if len(str(_get(new, "note") or "").encode()) > 1024:
        errors.append(too_long("note", 1024))
    for name in ("deprecatedFirstTimestamp", "deprecatedLastTimestamp", "deprecatedCount", "deprecatedSource"):
        if _get(new, name):
            errors.append(invalid(name, "", "needs to be unset"))
    return errors


def check_lease(new: Obj, old: Obj | None) -> list[FieldError]:
    """``ValidateLeaseSpec``: a positive duration, non-negative transitions."""
    return _positive(new, "spec", "leaseDurationSeconds") + _nonnegative(new, "spec", "leaseTransitions")


def check_namespace(new: Obj, old: Obj | None) -> list[FieldError]:
    """``ValidateNamespace``: spec.finalizers are qualified names or a standard finalizer."""
    return validate_finalizers(_get(new, "spec", "finalizers"), "spec.finalizers")


def check_configmap(new: Obj, old: Obj | None) -> list[FieldError]:
    """``ValidateConfigMap`` / ``ValidateSecret``: keys are ``IsConfigMapKey`` (≤253 of ``[-._a-zA-Z0-9]``)."""
    errors: list[FieldError] = []
    for field_name in ("data", "binaryData", "stringData"):
        for key in _get(new, field_name) or {}:
            ok = 0 < len(key) <= 253 and all(c.isascii() and (c.isalnum() or c in "-._") for c in key)
            if not ok or key in (".", ".."):
                detail = "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
                errors.append(invalid(f"{field_name}[{key}]", key, detail))
    return errors


KIND_CHECKS: dict[tuple[str, str], tuple[Callable[[str, bool], list[str]], tuple[Check, ...]]] = {
    ("batch", "Job"): (dns1123_subdomain, (check_job,)),
    ("", "Node"): (dns1123_subdomain, (check_node,)),
    ("", "Namespace"): (dns1123_label, (check_namespace,)),
    ("", "Event"): (dns1123_subdomain, (check_core_event,)),
    ("events.k8s.io", "Event"): (dns1123_subdomain, (check_events_event,)),
    ("coordination.k8s.io", "Lease"): (dns1123_subdomain, (check_lease,)),
    ("", "ConfigMap"): (dns1123_subdomain, (check_configmap,)),
    ("", "Secret"): (dns1123_subdomain, (check_configmap,)),
}
"""(group, kind) → (the kind's name rule, its Go checks). Kinds not listed: DNS-subdomain names, schema only."""
