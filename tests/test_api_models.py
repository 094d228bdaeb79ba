"""The v2alpha1 models: validation names the field, defaults match DESIGN.md, JSON round-trips by alias."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from api import names
from api.names import ClaimCall, ClaimPhase, ClaimReason, PowerOffNodePolicy, PowerState, Report, TaintEffect
from api.v2alpha1 import (
    ClaimDigest,
    Group,
    GroupSpec,
    Node,
    NodeClaim,
    NodeClaimSpec,
    NodeStatus,
    ObjectMeta,
    PodSpecTemplate,
    Transition,
    format_duration,
    load,
    parse_duration,
)

T0 = datetime(2025, 1, 1, 8, 0, tzinfo=UTC)


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


def pod(**extra: Any) -> dict[str, Any]:
    return {"image": "ghcr.io/homecluster/wol:1.0", **extra}


def node_spec(**extra: Any) -> dict[str, Any]:
    return {
        "group": "workers",
        "kubernetesNodeName": "worker-1",
        "startupPodSpec": pod(),
        "shutdownPodSpec": pod(),
        **extra,
    }


def errors_of(exc: pytest.ExceptionInfo[ValidationError]) -> str:
    """The full message a user sees: locations and texts."""
    return str(exc.value)


# --- durations -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected", "formatted"),
    [
        ("0", timedelta(0), "0s"),
        ("0s", timedelta(0), "0s"),
        ("90s", timedelta(seconds=90), "1m30s"),
        ("2m", timedelta(minutes=2), "2m0s"),
        ("15m0s", timedelta(minutes=15), "15m0s"),
        ("1h30m", timedelta(hours=1, minutes=30), "1h30m0s"),
        ("1.5h", timedelta(hours=1, minutes=30), "1h30m0s"),
        ("500ms", timedelta(milliseconds=500), "500ms"),
        ("1.5ms", timedelta(microseconds=1500), "1.5ms"),
        ("3us", timedelta(microseconds=3), "3µs"),
        ("3µs", timedelta(microseconds=3), "3µs"),
        ("2h0m0.25s", timedelta(hours=2, milliseconds=250), "2h0m0.25s"),
        ("1h1s", timedelta(hours=1, seconds=1), "1h0m1s"),
        ("36h", timedelta(hours=36), "36h0m0s"),
        (".5s", timedelta(milliseconds=500), "500ms"),
    ],
)
def test_duration_table(text: str, expected: timedelta, formatted: str) -> None:
    assert parse_duration(text) == expected
    assert format_duration(expected) == formatted
    assert parse_duration(formatted) == expected


@pytest.mark.parametrize(("seconds", "expected"), [(0, timedelta(0)), (90, timedelta(seconds=90))])
def test_duration_accepts_seconds(seconds: int, expected: timedelta) -> None:
    assert parse_duration(seconds) == expected


@pytest.mark.parametrize("bad", ["", "abc", "15", "10 m", "1d", "m", "1h-5m", "-5m", "5M", -1, True, [1]])
def test_duration_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize("bad", ["fifteen minutes", "15", "1d", "-5m", "5 m"])
def test_malformed_duration_names_field_and_value(bad: str) -> None:
    with pytest.raises(ValidationError) as exc:
        GroupSpec.model_validate({"maxSize": 1, "maxNodeProvisionTime": bad})
    text = errors_of(exc)
    assert "maxNodeProvisionTime" in text
    assert repr(bad) in text


def test_duration_on_claim_spec_rejects_malformed() -> None:
    with pytest.raises(ValidationError) as exc:
        NodeClaimSpec.model_validate(
            {"node": "n", "group": "g", "requestedAt": "2025-01-01T00:00:00Z", "maxNodeProvisionTime": "1x"}
        )
    assert "maxNodeProvisionTime" in errors_of(exc)


# --- Group ---------------------------------------------------------------------------------------------


def test_group_defaults() -> None:
    spec = GroupSpec.model_validate({"maxSize": 3})
    assert spec.min_size == 0
    assert spec.power_off_node_policy is PowerOffNodePolicy.DELETE
    assert [(t.key, t.effect.value) for t in spec.node_readiness_taints] == list(names.DEFAULT_READINESS_TAINTS)
    assert spec.node_readiness_taints[0].effect is TaintEffect.NO_EXECUTE
    assert spec.node_taints == []
    assert spec.max_node_provision_time is None


def test_group_readiness_taints_can_be_disabled() -> None:
    assert GroupSpec.model_validate({"maxSize": 1, "nodeReadinessTaints": []}).node_readiness_taints == []


def test_group_defaults_are_not_shared_between_instances() -> None:
    a = GroupSpec(max_size=1)
    b = GroupSpec(max_size=1)
    a.node_readiness_taints.clear()
    assert len(b.node_readiness_taints) == 1


@pytest.mark.parametrize("field", ["minSize", "maxSize"])
def test_negative_sizes_rejected(field: str) -> None:
    spec = {"minSize": 0, "maxSize": 1, field: -1}
    with pytest.raises(ValidationError) as exc:
        GroupSpec.model_validate(spec)
    assert field in errors_of(exc)


def test_min_above_max_names_both_fields() -> None:
    with pytest.raises(ValidationError) as exc:
        GroupSpec.model_validate({"minSize": 4, "maxSize": 2})
    text = errors_of(exc)
    assert "minSize" in text and "maxSize" in text


def test_max_size_required() -> None:
    with pytest.raises(ValidationError) as exc:
        GroupSpec.model_validate({})
    assert "maxSize" in errors_of(exc)


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_threshold_out_of_range(value: float) -> None:
    with pytest.raises(ValidationError) as exc:
        GroupSpec.model_validate({"maxSize": 1, "scaleDownUtilizationThreshold": value})
    assert "scaleDownUtilizationThreshold" in errors_of(exc)


def test_unknown_taint_effect_names_effect() -> None:
    with pytest.raises(ValidationError) as exc:
        GroupSpec.model_validate({"maxSize": 1, "nodeTaints": [{"key": "k", "effect": "Sometimes"}]})
    text = errors_of(exc)
    assert "nodeTaints" in text and "effect" in text


def test_unknown_power_off_policy() -> None:
    with pytest.raises(ValidationError) as exc:
        GroupSpec.model_validate({"maxSize": 1, "powerOffNodePolicy": "Explode"})
    assert "powerOffNodePolicy" in errors_of(exc)


def test_spec_typo_is_refused() -> None:
    with pytest.raises(ValidationError) as exc:
        GroupSpec.model_validate({"maxSize": 1, "maxNodeProvisonTime": "5m"})
    assert "maxNodeProvisonTime" in errors_of(exc)


def test_group_round_trip() -> None:
    obj = {
        "apiVersion": names.API_VERSION,
        "kind": "Group",
        "metadata": {
            "name": "workers",
            "namespace": "homelab",
            "uid": "1234",
            "resourceVersion": "42",
            "generation": 3,
            "creationTimestamp": "2025-01-01T08:00:00Z",
            "labels": {"a": "b"},
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {
            "minSize": 1,
            "maxSize": 3,
            "scaleDownUtilizationThreshold": 0.5,
            "scaleDownUnneededTime": "10m0s",
            "maxNodeProvisionTime": "15m0s",
            "zeroOrMaxNodeScaling": False,
            "nodeReadinessTaints": [{"key": "node.cilium.io/agent-not-ready", "effect": "NoExecute"}],
            "nodeTaints": [{"key": "homelab", "value": "true", "effect": "PreferNoSchedule"}],
            "powerOffNodePolicy": "Keep",
            "nodeLabels": {"pool": "workers"},
            "nodeCapacity": {"cpu": "4", "memory": "16Gi", "pods": "110"},
        },
        "status": {
            "slots": 3,
            "on": 1,
            "off": 2,
            "health": "healthy",
            "lastScaleAt": "2025-01-01T08:01:02.500000Z",
            "lastScaleAction": "IncreaseSize",
            "conditions": [
                {
                    "type": "Healthy",
                    "status": "True",
                    "reason": "AllSlotsReporting",
                    "message": "",
                    "lastTransitionTime": "2025-01-01T08:00:00Z",
                    "observedGeneration": 3,
                }
            ],
        },
    }
    group = Group.model_validate(obj)
    assert group.spec.max_node_provision_time == timedelta(minutes=15)
    assert group.metadata.creation_timestamp == T0
    assert dump(group) == obj
    assert Group.model_validate(dump(group)) == group


def test_metadata_extra_keys_kept_and_top_level_extra_ignored() -> None:
    group = Group.model_validate(
        {"kind": "Group", "metadata": {"name": "g", "managedFields": []}, "spec": {"maxSize": 1}, "junk": 1}
    )
    assert "junk" not in dump(group)
    assert dump(group)["metadata"] == {"name": "g"}


# --- Node (slot) ---------------------------------------------------------------------------------------


def test_volume_needs_a_source_and_error_names_volume() -> None:
    with pytest.raises(ValidationError) as exc:
        PodSpecTemplate.model_validate(pod(volumes=[{"name": "keys", "mountPath": "/keys"}]))
    text = errors_of(exc)
    assert "volumes" in text and "'keys'" in text


def test_volume_with_both_sources_rejected() -> None:
    volume = {"name": "both", "mountPath": "/x", "secretName": "s", "configMapName": "c"}
    with pytest.raises(ValidationError) as exc:
        Node.model_validate({"kind": "Node", "spec": node_spec(shutdownPodSpec=pod(volumes=[volume]))})
    text = errors_of(exc)
    assert "shutdownPodSpec.volumes.0" in text and "'both'" in text


def test_volume_defaults_read_only() -> None:
    spec = PodSpecTemplate.model_validate(pod(volumes=[{"name": "k", "mountPath": "/k", "secretName": "s"}]))
    assert spec.volumes[0].read_only is True


@pytest.mark.parametrize(
    ("field", "value"),
    [("ttlSecondsAfterFinished", -1), ("backoffLimit", -1), ("activeDeadlineSeconds", 0)],
)
def test_pod_spec_numbers_bounded(field: str, value: int) -> None:
    with pytest.raises(ValidationError) as exc:
        PodSpecTemplate.model_validate(pod(**{field: value}))
    assert field in errors_of(exc)


def test_pod_spec_image_required() -> None:
    with pytest.raises(ValidationError) as exc:
        Node.model_validate({"kind": "Node", "spec": node_spec(startupPodSpec={"command": ["x"]})})
    assert "startupPodSpec.image" in errors_of(exc)


def test_env_value_from_needs_exactly_one_ref() -> None:
    both = {
        "secretKeyRef": {"name": "s", "key": "k"},
        "configMapKeyRef": {"name": "c", "key": "k"},
    }
    with pytest.raises(ValidationError) as exc:
        PodSpecTemplate.model_validate(pod(env=[{"name": "A", "valueFrom": both}]))
    assert "env.0.valueFrom" in errors_of(exc)
    with pytest.raises(ValidationError):
        PodSpecTemplate.model_validate(pod(env=[{"name": "A", "valueFrom": {}}]))


def test_env_value_and_value_from_exclusive() -> None:
    ref = {"secretKeyRef": {"name": "s", "key": "k"}}
    with pytest.raises(ValidationError) as exc:
        PodSpecTemplate.model_validate(pod(env=[{"name": "A", "value": "x", "valueFrom": ref}]))
    assert "'A'" in errors_of(exc)


def test_env_from_needs_exactly_one_ref() -> None:
    with pytest.raises(ValidationError) as exc:
        PodSpecTemplate.model_validate(pod(envFrom=[{"prefix": "X_"}]))
    assert "envFrom" in errors_of(exc)


def test_pricing_non_negative() -> None:
    with pytest.raises(ValidationError) as exc:
        Node.model_validate({"kind": "Node", "spec": node_spec(pricing={"hourlyRate": -1})})
    assert "hourlyRate" in errors_of(exc)


def test_node_spec_has_no_power_intent() -> None:
    with pytest.raises(ValidationError) as exc:
        Node.model_validate({"kind": "Node", "spec": node_spec(powerState="on")})
    assert "powerState" in errors_of(exc)


def test_slot_status_attribute_names() -> None:
    """domain/history.py writes these by name with model_copy(update=...)."""
    assert list(NodeStatus.model_fields)[:10] == [
        "power_state",
        "phase",
        "last_transition_time",
        "previous_phase",
        "recent_transitions",
        "recent_activations",
        "activations_total",
        "activations_last_24h",
        "last_claim",
        "conditions",
    ]


def test_slot_status_model_copy_update() -> None:
    status = NodeStatus().model_copy(
        update={
            "phase": Report.BOOTING,
            "recent_transitions": [Transition(from_phase=Report.OFF, to_phase=Report.BOOTING, at=T0)],
            "activations_last_24h": 1,
        }
    )
    assert dump(status)["recentTransitions"] == [{"from": "off", "to": "booting", "at": "2025-01-01T08:00:00Z"}]
    assert dump(status)["activationsLast24H"] == 1


def test_node_round_trip() -> None:
    obj = {
        "apiVersion": names.API_VERSION,
        "kind": "Node",
        "metadata": {"name": "worker-1", "namespace": "homelab"},
        "spec": {
            "group": "workers",
            "kubernetesNodeName": "worker-1",
            "providerID": "homelab://homelab/worker-1",
            "startupPodSpec": {
                "image": "wol:1",
                "command": ["wakeonlan"],
                "args": ["aa:bb:cc:dd:ee:ff"],
                "env": [],
                "envFrom": [],
                "volumes": [],
                "nodeSelector": {},
                "tolerations": [],
            },
            "shutdownPodSpec": {
                "image": "ssh:1",
                "env": [
                    {"name": "USER", "value": "root"},
                    {"name": "PASS", "valueFrom": {"secretKeyRef": {"name": "s", "key": "password"}}},
                    {"name": "HOST", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "host"}}},
                ],
                "envFrom": [{"secretRef": {"name": "s"}}, {"prefix": "X_", "configMapRef": {"name": "c"}}],
                "volumes": [
                    {"name": "key", "mountPath": "/key", "secretName": "s", "readOnly": True},
                    {"name": "scripts", "mountPath": "/s", "configMapName": "c", "readOnly": False},
                ],
                "serviceAccount": "lifecycle",
                "resources": {"requests": {"cpu": "10m"}, "limits": {"memory": "64Mi"}},
                "ttlSecondsAfterFinished": 600,
                "activeDeadlineSeconds": 300,
                "backoffLimit": 0,
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}],
            },
            "pricing": {"hourlyRate": 0.25, "podRate": 0.01},
            "taintsToRemove": [
                {"key": "k", "effect": "NoExecute", "timeAdded": "2025-01-01T08:00:00Z"},
            ],
        },
        "status": {
            "powerState": "on",
            "phase": "ready",
            "lastTransitionTime": "2025-01-01T08:05:00Z",
            "previousPhase": "booting",
            "recentTransitions": [
                {"to": "booting", "at": "2025-01-01T08:00:00Z"},
                {"from": "booting", "to": "ready", "at": "2025-01-01T08:05:00Z"},
            ],
            "recentActivations": ["2025-01-01T08:00:00Z"],
            "activationsTotal": 7,
            "activationsLast24H": 1,
            "lastClaim": {
                "name": "worker-1-abc",
                "phase": "ready",
                "attempt": 1,
                "call": "IncreaseSize",
                "group": "workers",
                "requestedAt": "2025-01-01T08:00:00Z",
                "deadlineAt": "2025-01-01T08:12:10Z",
            },
            "conditions": [
                {
                    "type": "ScaleUpInFlight",
                    "status": "False",
                    "reason": "Ready",
                    "message": "machine is ready",
                    "lastTransitionTime": "2025-01-01T08:05:00Z",
                }
            ],
            "observedGeneration": 2,
        },
    }
    node = Node.model_validate(obj)
    assert node.spec.provider_id == "homelab://homelab/worker-1"
    assert node.status.power_state is PowerState.ON
    assert node.status.activations_last_24h == 1
    assert node.status.recent_transitions[0].from_phase is None
    assert node.status.recent_transitions[1].from_phase is Report.BOOTING
    assert node.status.recent_transitions[1].to_phase is Report.READY
    assert node.status.last_claim == ClaimDigest(
        name="worker-1-abc",
        phase=ClaimPhase.READY,
        attempt=1,
        call=ClaimCall.INCREASE_SIZE,
        group="workers",
        requested_at=T0,
        deadline_at=T0 + timedelta(minutes=12, seconds=10),
    )
    assert dump(node) == obj
    assert Node.model_validate(dump(node)) == node


def test_status_tolerates_unknown_fields() -> None:
    status = NodeStatus.model_validate({"phase": "off", "progress": "shutdown"})
    assert status.phase is Report.OFF


def test_naive_datetimes_taken_as_utc() -> None:
    row = Transition(to_phase=Report.OFF, at=datetime(2025, 1, 1, 8, 0))
    assert row.at == T0
    assert dump(row) == {"to": "off", "at": "2025-01-01T08:00:00Z"}


# --- NodeClaim -----------------------------------------------------------------------------------------


def claim_obj(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": names.API_VERSION,
        "kind": "NodeClaim",
        "metadata": {"name": "c1", "namespace": "homelab"},
        "spec": {"node": "worker-1", "group": "workers", "requestedAt": "2025-01-01T08:00:00Z", **spec},
    }


def test_claim_defaults() -> None:
    claim = NodeClaim.model_validate(claim_obj())
    assert claim.spec.ttl_seconds_after_finished == names.CLAIM_TTL_SECONDS_AFTER_FINISHED == 3600
    assert claim.spec.call is ClaimCall.MANUAL
    assert claim.spec.deadline_at is None
    assert claim.status.phase is None  # absent means pending
    assert claim.status.shutdown_attempts == 0


def test_claim_negative_ttl_rejected() -> None:
    with pytest.raises(ValidationError) as exc:
        NodeClaim.model_validate(claim_obj(ttlSecondsAfterFinished=-1))
    assert "ttlSecondsAfterFinished" in errors_of(exc)


def test_claim_attempt_at_least_one() -> None:
    obj = claim_obj()
    obj["status"] = {"attempt": 0}
    with pytest.raises(ValidationError) as exc:
        NodeClaim.model_validate(obj)
    assert "attempt" in errors_of(exc)


def test_claim_round_trip() -> None:
    obj = claim_obj(
        deadlineAt="2025-01-01T08:15:00Z",
        maxNodeProvisionTime="15m0s",
        ttlSecondsAfterFinished=600,
        call="IncreaseSize",
    )
    obj["status"] = {
        "phase": "failed",
        "reason": "DeadlineExceeded",
        "attempt": 2,
        "shutdownAttempts": 1,
        "lastShutdownAttemptAt": "2025-01-01T08:10:00Z",
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "DeadlineExceeded",
                "message": "no usable machine by the deadline",
                "lastTransitionTime": "2025-01-01T08:15:00Z",
            }
        ],
        "finishedAt": "2025-01-01T08:15:00Z",
        "message": "boot deadline passed",
    }
    claim = NodeClaim.model_validate(obj)
    assert claim.spec.max_node_provision_time == timedelta(minutes=15)
    assert claim.status.reason is ClaimReason.DEADLINE_EXCEEDED
    assert dump(claim) == obj
    assert NodeClaim.model_validate(dump(claim)) == claim


def test_claim_built_in_python_dumps_camel_case() -> None:
    claim = NodeClaim(
        metadata=ObjectMeta(name="c"),
        spec=NodeClaimSpec(
            node="n", group="g", requested_at=T0, max_node_provision_time=timedelta(minutes=12, seconds=10)
        ),
    )
    body = dump(claim)
    assert body["apiVersion"] == names.API_VERSION and body["kind"] == "NodeClaim"
    assert body["spec"]["maxNodeProvisionTime"] == "12m10s"
    assert body["spec"]["requestedAt"] == "2025-01-01T08:00:00Z"


def test_invalid_condition_status() -> None:
    obj = claim_obj()
    obj["status"] = {
        "conditions": [
            {"type": "Ready", "status": "Maybe", "reason": "X", "lastTransitionTime": "2025-01-01T00:00:00Z"}
        ]
    }
    with pytest.raises(ValidationError) as exc:
        NodeClaim.model_validate(obj)
    assert "conditions.0.status" in errors_of(exc)


# --- load ----------------------------------------------------------------------------------------------


def test_load_dispatches_on_kind() -> None:
    assert isinstance(load(claim_obj()), NodeClaim)
    assert isinstance(load({"apiVersion": names.API_VERSION, "kind": "Group", "spec": {"maxSize": 1}}), Group)
    assert isinstance(load({"apiVersion": names.API_VERSION, "kind": "Node", "spec": node_spec()}), Node)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"apiVersion": "infra.homecluster.dev/v1alpha1", "kind": "Node"}, "apiVersion"),
        ({"apiVersion": names.API_VERSION, "kind": "Pod"}, "unknown kind 'Pod'"),
        ({"apiVersion": names.API_VERSION}, "unknown kind None"),
    ],
)
def test_load_refuses_foreign_objects(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load(obj)
