"""The lifecycle Job a slot's pod spec becomes: a pure builder, so every field of the Job is unit-tested.

The operator builds the Job itself (rather than accepting one) so it can bound it: `backoffLimit` and
`activeDeadlineSeconds` are always set, so every Job ends and its claim's monitor always gets an answer.
"""

from __future__ import annotations

from typing import Any

from api import names
from api.names import JobType
from api.v2alpha1 import EnvVar, Node, PodSpecTemplate, VolumeMount

JSON = dict[str, Any]

CONTAINER_NAME = "power"
ENV_SLOT = "HOMELAB_SLOT"
ENV_NODE_NAME = "HOMELAB_NODE_NAME"
ENV_OPERATION = "HOMELAB_OPERATION"
RESERVED_ENV = frozenset({ENV_SLOT, ENV_NODE_NAME, ENV_OPERATION})
DEFAULT_TERMINATION_MESSAGE_POLICY = "FallbackToLogsOnError"


def pod_spec_field(job_type: JobType | str) -> str:
    """The slot's field (JSON name) holding the pod spec of an operation."""
    return "startupPodSpec" if JobType(job_type) is JobType.STARTUP else "shutdownPodSpec"


def pod_spec_of(slot: Node, job_type: JobType | str) -> PodSpecTemplate:
    """The slot's startup or shutdown pod spec (the model requires both, so a slot that parsed has it)."""
    return slot.spec.startup_pod_spec if JobType(job_type) is JobType.STARTUP else slot.spec.shutdown_pod_spec


def job_labels(slot: str, job_type: JobType | str, claim_name: str) -> dict[str, str]:
    """The labels of a lifecycle Job and its Pod, for selecting them (`kubectl get jobs -l ...`).

    Names are label values here, bounded to 63 characters (`names.label_value`); the full names are in the
    owner references, which is where the watchers read them.
    """
    labels = {
        names.LABEL_NODE: names.label_value(slot),
        names.LABEL_JOB_TYPE: str(JobType(job_type)),
        names.LABEL_MANAGED_BY: names.MANAGED_BY,
    }
    if claim_name:
        labels[names.LABEL_NODECLAIM] = names.label_value(claim_name)
    return labels


def owner_references(slot: Node, claim_name: str, claim_uid: str) -> list[JSON]:
    """The claim controls its Jobs and the slot is a second owner; a law-3 release is the slot's alone.

    Garbage collection takes a Job once all its owners are gone (deleting a slot takes the claims, then the Jobs);
    until then the Job's own `ttlSecondsAfterFinished` cleans it up.
    """
    slot_ref: JSON = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND_NODE,
        "name": slot.metadata.name,
        "uid": slot.metadata.uid,
    }
    if not claim_name:
        return [{**slot_ref, "controller": True, "blockOwnerDeletion": True}]
    claim_ref: JSON = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND_NODECLAIM,
        "name": claim_name,
        "uid": claim_uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    return [claim_ref, slot_ref]


def _env(items: list[EnvVar]) -> list[JSON]:
    out: list[JSON] = []
    for item in items:
        if item.name in RESERVED_ENV:  # the operator's facts win over a user's guess at them
            continue
        out.append(item.model_dump(by_alias=True, exclude_none=True, mode="json"))
    return out


def _volumes(mounts: list[VolumeMount]) -> tuple[list[JSON], list[JSON]]:
    volumes: list[JSON] = []
    volume_mounts: list[JSON] = []
    for m in mounts:
        if m.secret_name is not None:
            volumes.append({"name": m.name, "secret": {"secretName": m.secret_name}})
        else:
            volumes.append({"name": m.name, "configMap": {"name": m.config_map_name}})
        volume_mounts.append({"name": m.name, "mountPath": m.mount_path, "readOnly": m.read_only})
    return volumes, volume_mounts


def build_job(
    slot: Node, job_type: JobType | str, name: str, claim_name: str, claim_uid: str, attempt: int = 0
) -> JSON:
    """The batch/v1 Job that runs the slot's `job_type` pod spec under the deterministic `name`.

    `claim_name` empty means a law-3 release (the slot alone owns the Job). `attempt` (a shutdown Job's number in
    its streak) is annotated on the Job, so a run that takes the claim over counts it once. A `job_type` that is
    not startup or shutdown raises ValueError.
    """
    kind = JobType(job_type)
    pod = pod_spec_of(slot, kind)
    slot_name = str(slot.metadata.name)
    labels = job_labels(slot_name, kind, claim_name)
    env = [
        *_env(pod.env),
        {"name": ENV_SLOT, "value": slot_name},
        {"name": ENV_NODE_NAME, "value": slot.spec.kubernetes_node_name},
        {"name": ENV_OPERATION, "value": str(kind)},
    ]
    volumes, volume_mounts = _volumes(pod.volumes)
    container: JSON = {
        "name": CONTAINER_NAME,
        "image": pod.image,
        "env": env,
        # A failed power script's last lines become its terminated state's message, which the operator reads.
        "terminationMessagePolicy": pod.termination_message_policy or DEFAULT_TERMINATION_MESSAGE_POLICY,
    }
    if pod.command is not None:
        container["command"] = list(pod.command)
    if pod.args is not None:
        container["args"] = list(pod.args)
    if pod.env_from:
        container["envFrom"] = [e.model_dump(by_alias=True, exclude_none=True, mode="json") for e in pod.env_from]
    if pod.resources is not None:
        resources = {k: dict(v) for k, v in (("requests", pod.resources.requests), ("limits", pod.resources.limits))}
        container["resources"] = {k: v for k, v in resources.items() if v}
    if volume_mounts:
        container["volumeMounts"] = volume_mounts
    pod_spec: JSON = {"restartPolicy": "Never", "containers": [container]}
    if volumes:
        pod_spec["volumes"] = volumes
    if pod.service_account:
        pod_spec["serviceAccountName"] = pod.service_account
    if pod.node_selector:
        pod_spec["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in pod.tolerations]
    if pod.host_network:
        pod_spec["hostNetwork"] = True
    # A host-network pod keeps cluster DNS unless told otherwise (Kubernetes' ClusterFirst would drop it for one).
    dns_policy = pod.dns_policy or ("ClusterFirstWithHostNet" if pod.host_network else None)
    if dns_policy is not None:
        pod_spec["dnsPolicy"] = dns_policy
    metadata: JSON = {
        "name": name,
        "namespace": slot.metadata.namespace,
        "labels": labels,
        "ownerReferences": owner_references(slot, claim_name, claim_uid),
    }
    if attempt > 0:
        metadata["annotations"] = {names.ANNOTATION_SHUTDOWN_ATTEMPT: str(attempt)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": pod.backoff_limit if pod.backoff_limit is not None else names.JOB_BACKOFF_LIMIT,
            "activeDeadlineSeconds": (
                pod.active_deadline_seconds
                if pod.active_deadline_seconds is not None
                else int(names.JOB_TIMEOUT.total_seconds())
            ),
            "ttlSecondsAfterFinished": (
                pod.ttl_seconds_after_finished
                if pod.ttl_seconds_after_finished is not None
                else names.JOB_TTL_SECONDS_AFTER_FINISHED
            ),
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }
