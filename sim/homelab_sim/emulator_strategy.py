"""What kube-apiserver's registry strategies do to an object on create, before it is validated and stored.

Only what a person sees through kubectl is modelled: a Job gets the selector and pod-template labels the Job
strategy generates (``pkg/registry/batch/job/strategy.go``, ``generateSelector``), so ``kubectl logs job/<name>``
and ``kubectl describe job`` find its Pods the way they do on a cluster, and the defaults ``describe`` prints.
Other kinds' defaulting (``SetDefaults_*``) is not modelled. Each behaviour was checked on kube-apiserver 1.35.4.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "CONTROLLER_UID_LABEL",
    "DEFAULT_STORED",
    "JOB_NAME_LABEL",
    "LEGACY_CONTROLLER_UID_LABEL",
    "LEGACY_JOB_NAME_LABEL",
    "PREPARE_FOR_CREATE",
]

Obj = dict[str, Any]

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
LEGACY_JOB_NAME_LABEL = "job-name"
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"
LEGACY_CONTROLLER_UID_LABEL = "controller-uid"


def _dict(parent: Obj, key: str) -> Obj:
    value = parent.get(key)
    if not isinstance(value, dict):
        value = parent[key] = {}
    return value


def prepare_job(job: Obj) -> None:
    """``SetDefaults_Job`` for what ``kubectl describe job`` shows (one completion at a time, NonIndexed, not
    suspended, 6 retries), then ``generateSelector`` unless ``spec.manualSelector``: the template carries the Job's
    name and uid under the legacy and the ``batch.kubernetes.io/`` keys (a label the user set is kept, and refused
    by validation when it differs), and the selector matches the uid.
    """
    spec = _dict(job, "spec")
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed")
    meta = _dict(job, "metadata")
    if spec.get("manualSelector") is not True:
        labels = _dict(_dict(_dict(spec, "template"), "metadata"), "labels")
        for key in (LEGACY_JOB_NAME_LABEL, JOB_NAME_LABEL):
            labels.setdefault(key, str(meta.get("name") or ""))
        for key in (LEGACY_CONTROLLER_UID_LABEL, CONTROLLER_UID_LABEL):
            labels.setdefault(key, str(meta.get("uid") or ""))
        match = _dict(_dict(spec, "selector"), "matchLabels")
        match.setdefault(CONTROLLER_UID_LABEL, str(meta.get("uid") or ""))


def default_job_labels(job: Obj) -> None:
    """``SetDefaults_Job``'s labels: a Job with none shows its template's. Applied to what is stored, after
    validation: kube-apiserver 1.35.4 defaults them when it decodes the stored Job (so the generated labels are
    among them, and a create is never refused for them)."""
    meta = _dict(job, "metadata")
    template_labels = (((job.get("spec") or {}).get("template") or {}).get("metadata") or {}).get("labels")
    if template_labels and not meta.get("labels"):
        meta["labels"] = dict(template_labels)


PREPARE_FOR_CREATE: dict[tuple[str, str, str], Callable[[Obj], None]] = {("batch", "v1", "jobs"): prepare_job}
"""(group, version, plural) → the strategy's ``PrepareForCreate`` (run after the uid is assigned)."""
DEFAULT_STORED: dict[tuple[str, str, str], Callable[[Obj], None]] = {("batch", "v1", "jobs"): default_job_labels}
"""(group, version, plural) → defaults the server applies to a created object after validating it."""
