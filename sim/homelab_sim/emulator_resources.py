"""The resources the emulated API server serves: the three CRDs plus the built-ins the operator uses.

Resources are keyed by (group, version, plural) so that ``infra.homecluster.dev/v2alpha1 nodes``
(the slot CRD) and core ``v1 nodes`` never collide.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from api.crds import crds as _generated_crds

__all__ = ["CRD_GROUP", "CRD_VERSION", "DEFAULT_RESOURCES", "PODS", "ResKey", "ResourceSpec"]

CRD_GROUP = "infra.homecluster.dev"
CRD_VERSION = "v2alpha1"

ResKey = tuple[str, str, str]  # (group, version, plural); group "" is the core API
PODS: ResKey = ("", "v1", "pods")

_ALL_VERBS = frozenset({"get", "list", "watch", "create", "patch", "update", "delete", "deletecollection"})


@dataclass(frozen=True)
class ResourceSpec:
    """How one resource behaves in the emulator.

    ``status_subresource`` separates ``/status`` writes from main-resource writes (as a CRD with
    ``subresources.status`` or a built-in with a status strategy does). ``strip_status_on_create``
    mirrors the API server dropping ``status`` from a create (true for CRs and Jobs, false for Nodes,
    whose kubelet registers them with a status). ``custom`` resources refuse strategic merge patch (415).
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool = False
    strip_status_on_create: bool = False
    custom: bool = False
    verbs: frozenset[str] = _ALL_VERBS
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = field(default=())
    # additionalPrinterColumns of a CRD ({name, type, jsonPath, priority}), served to `kubectl get` as a Table.
    printer_columns: tuple[Mapping[str, Any], ...] = ()

    @property
    def key(self) -> ResKey:
        return (self.group, self.version, self.plural)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()


@cache
def crds() -> dict[str, dict[str, Any]]:
    return _generated_crds()


def _crd(plural: str, kind: str) -> ResourceSpec:
    """A CRD served as our generated CustomResourceDefinition declares it: short names and printer columns."""
    version = crds()[kind]["spec"]["versions"][0]
    short_names = tuple(crds()[kind]["spec"]["names"]["shortNames"])
    return ResourceSpec(
        CRD_GROUP,
        CRD_VERSION,
        plural,
        kind,
        namespaced=True,
        status_subresource=True,
        strip_status_on_create=True,
        custom=True,
        short_names=short_names,
        categories=("homelab",),
        printer_columns=tuple(version.get("additionalPrinterColumns") or ()),
    )


DEFAULT_RESOURCES: tuple[ResourceSpec, ...] = (
    _crd("groups", "Group"),
    _crd("nodes", "Node"),
    _crd("nodeclaims", "NodeClaim"),
    ResourceSpec("", "v1", "nodes", "Node", namespaced=False, status_subresource=True, short_names=("no",)),
    ResourceSpec("", "v1", "namespaces", "Namespace", namespaced=False, status_subresource=True),
    ResourceSpec("", "v1", "events", "Event", namespaced=True, short_names=("ev",)),
    ResourceSpec(
        "",
        "v1",
        "pods",
        "Pod",
        namespaced=True,
        status_subresource=True,
        verbs=frozenset({"get", "list", "watch", "create", "delete"}),
        short_names=("po",),
        categories=("all",),
    ),
    ResourceSpec("", "v1", "configmaps", "ConfigMap", namespaced=True, short_names=("cm",)),
    ResourceSpec("", "v1", "secrets", "Secret", namespaced=True),
    ResourceSpec("batch", "v1", "jobs", "Job", namespaced=True, status_subresource=True, strip_status_on_create=True),
    ResourceSpec("events.k8s.io", "v1", "events", "Event", namespaced=True, short_names=("ev",)),
    ResourceSpec("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True),
    ResourceSpec(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        namespaced=True,
        status_subresource=True,
        short_names=("pdb",),
    ),
    # Validating admission webhooks (emulator_webhooks): the emulator calls the ones stored here.
    ResourceSpec(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        namespaced=False,
    ),
)
