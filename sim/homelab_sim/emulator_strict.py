"""Strict mode of the emulator: refuse, prune and default what a real kube-apiserver refuses, prunes, defaults.

``Admission.admit`` is the one call the emulator makes at its write chokepoints (create, update, patch — on
the resulting object, before it is stored). In the server's order:

1. decode — built-in kinds only: a value of the wrong type, an out-of-range integer or an unparsable
   ``metav1.Time``/``MicroTime`` (``RFC3339Micro``: exactly six fraction digits) fails the typed decode: 400.
2. prune — unknown fields are dropped. ``fieldValidation`` decides what the client hears: ``Warn`` (the
   server's default since 1.23 and what the ``kubernetes`` Python client gets, as it sends no
   ``fieldValidation``) adds a ``Warning`` header per field, ``Ignore`` says nothing, ``Strict`` (kubectl's
   default) refuses with 400 ``strict decoding error``.
3. default — custom resources: the CRD schema's defaults (also applied on every read, see ``Admission.read``).
4. validate — ``ValidateObjectMeta`` with the kind's name rule, the schema (CRDs: ``emulator_schema`` with CEL
   and ratcheting; built-ins: the ``kubernetes-validate`` schema), and the kind's Go checks
   (``emulator_core.KIND_CHECKS``). Any error refuses the whole write with 422 ``Invalid``.

Custom resources are judged by the CRDs generated from ``api/`` (the same as ``deploy/crds``); their
``metadata`` by the ``ObjectMeta`` schema. Strict mode is on for every emulator whose constructor is not told
otherwise; ``HOMELAB_EMULATOR_STRICT=0`` turns that default off (a test that must store what a real server
refuses stores it with the emulator's direct helpers instead, which skip admission).
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from homelab_sim.emulator_core import KIND_CHECKS, core_schema, object_meta_schema
from homelab_sim.emulator_errors import bad_request, invalid_object
from homelab_sim.emulator_meta import dns1123_subdomain, validate_object_meta
from homelab_sim.emulator_resources import ResourceSpec, crds
from homelab_sim.emulator_schema import MISSING, Outcome, apply_defaults, prune, validate

__all__ = ["STRICT_ENV", "Admission", "Admitted", "strict_by_default"]

STRICT_ENV = "HOMELAB_EMULATOR_STRICT"
Obj = dict[str, Any]
FIELD_VALIDATIONS = ("Ignore", "Warn", "Strict")


def strict_by_default() -> bool:
    """Whether emulators are strict unless told otherwise: yes, unless ``HOMELAB_EMULATOR_STRICT`` says 0, false,
    no or off (the operator must meet what a real API server refuses wherever it runs against the emulator).
    """
    return os.environ.get(STRICT_ENV, "").strip().lower() not in ("0", "false", "no", "off")


@dataclass(frozen=True)
class Admitted:
    """An admitted write: the object to store and the warnings for the response's ``Warning`` headers."""

    obj: Obj
    warnings: tuple[str, ...] = ()


@functools.cache
def _crd_schema(kind: str) -> Obj | None:
    """A CRD's openAPIV3Schema with ``metadata`` replaced by ``ObjectMeta`` (as the server treats it)."""
    crd = crds().get(kind)
    if crd is None:
        return None
    schema: Obj = copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = object_meta_schema()
    return schema


class Admission:
    """The strict write path and read path for every resource an emulator serves."""

    def schema(self, spec: ResourceSpec) -> Obj | None:
        if spec.custom:
            return _crd_schema(spec.kind)
        return core_schema(spec.api_version, spec.kind)

    def admit(
        self,
        spec: ResourceSpec,
        new: Obj,
        old: Obj | None,
        field_validation: str | None = None,
        subresource: str | None = None,
    ) -> Admitted:
        """Decode, prune, default and validate ``new`` (``old``: the stored object of an update); raise ApiError.

        A built-in kind's ``/status`` write is not judged by the kind's spec checks (``ValidateJobUpdateStatus``
        and its kin look at metadata and status only).
        """
        mode = field_validation or "Warn"
        if mode not in FIELD_VALIDATIONS:
            raise bad_request(f"fieldValidation: Unsupported value: {mode!r}: supported values: Ignore, Warn, Strict")
        schema = self.schema(spec)
        out = Outcome()
        obj = copy.deepcopy(new)
        if schema is not None:
            if spec.custom:
                validate(object_meta_schema(), obj.get("metadata"), "metadata", out, decode=True)
            else:
                validate(schema, obj, "", out, decode=True)
            if out.undecodable:
                kind = spec.kind
                raise bad_request(
                    f'{kind} in version "{spec.version}" cannot be handled as a {kind}: {out.undecodable[0]}'
                )
            obj = prune(schema, obj, "", out)
            if out.unknown and mode == "Strict":
                raise bad_request("strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in out.unknown))
            if spec.custom:
                obj = apply_defaults(schema, obj)
        errors = self._errors(spec, schema, obj, old, status_write=subresource == "status")
        if errors.errors:
            name = str((obj.get("metadata") or {}).get("name") or "")
            raise invalid_object(spec.kind, spec.group, name, errors.errors)
        warnings = () if mode == "Ignore" else tuple(f'unknown field "{path}"' for path in out.unknown)
        return Admitted(obj, warnings)

    def _errors(
        self, spec: ResourceSpec, schema: Obj | None, obj: Obj, old: Obj | None, *, status_write: bool
    ) -> Outcome:
        name_rule, checks = KIND_CHECKS.get((spec.group, spec.kind), (dns1123_subdomain, ()))
        meta = obj.get("metadata")
        out = Outcome(
            errors=validate_object_meta(
                meta if isinstance(meta, Mapping) else {}, name_rule, namespaced=spec.namespaced
            )
        )
        if schema is not None and spec.custom:
            body = {k: v for k, v in obj.items() if k != "metadata"}
            rest = {k: v for k, v in schema.items() if k != "properties"}
            rest["properties"] = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
            rest["required"] = [k for k in schema.get("required", []) if k != "metadata"]
            before = MISSING if old is None else {k: v for k, v in old.items() if k != "metadata"}
            validate(rest, body, "", out, old=before)
        for check in () if status_write else checks:
            out.errors += check(obj, old)
        return out

    def read(self, spec: ResourceSpec, obj: Obj) -> Obj:
        """An object as a read returns it: custom resources get their defaults (the server defaults when it
        decodes from etcd too, so an object stored before a default existed reads with it).
        """
        schema = self.schema(spec) if spec.custom else None
        if schema is None or not isinstance(obj, dict):
            return obj
        return dict(apply_defaults(schema, copy.deepcopy(obj)))
