"""Strict mode of the API emulator, through the real ``kubernetes`` client over HTTP: one test per rule.

Each docstring names the kube-apiserver function or documented behaviour it pins, so a difference from a real
cluster can be checked against the source. Reads (pagination, resourceVersionMatch) and ``kubectl get``
tables are here too: they are also "what a real server answers" rather than operator semantics.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from homelab_sim.emulator import EmulatorServer, KubeEmulator
from homelab_sim.emulator_tables import human_duration
from kubernetes import client
from kubernetes.client.exceptions import ApiException

G, V = "infra.homecluster.dev", "v2alpha1"
GV = f"{G}/{V}"
NS = "homelab"
NOW = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
Obj = dict[str, Any]


@pytest.fixture
def srv() -> Iterator[EmulatorServer]:
    with EmulatorServer(clock=lambda: NOW, strict=True) as server:
        yield server


@pytest.fixture
def api(srv: EmulatorServer) -> Iterator[client.ApiClient]:
    with srv.api_client() as api_client:
        yield api_client


@pytest.fixture
def co(api: client.ApiClient) -> Any:
    return client.CustomObjectsApi(api)


@pytest.fixture
def batch(api: client.ApiClient) -> Any:
    return client.BatchV1Api(api)


@pytest.fixture
def core(api: client.ApiClient) -> Any:
    return client.CoreV1Api(api)


def group(name: str = "g1", **spec: Any) -> Obj:
    return {"apiVersion": GV, "kind": "Group", "metadata": {"name": name}, "spec": {"maxSize": 3, **spec}}


def claim(name: str = "c1", **spec: Any) -> Obj:
    base = {"node": "n1", "group": "g1", "requestedAt": "2030-01-02T03:04:05Z"}
    return {"apiVersion": GV, "kind": "NodeClaim", "metadata": {"name": name}, "spec": {**base, **spec}}


def job(name: str = "j1", **template_spec: Any) -> Obj:
    pod = {"restartPolicy": "Never", "containers": [{"name": "power", "image": "busybox"}], **template_spec}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {"template": {"spec": pod}}}


def refused(call: Any, *args: Any, **kwargs: Any) -> tuple[int, Obj]:
    """(HTTP status, Status body) of a call that must fail."""
    with pytest.raises(ApiException) as exc:
        call(*args, **kwargs)
    return exc.value.status, json.loads(exc.value.body or "{}")


NOT_CHECKED = "some validation rules were not checked because the object was invalid"


def causes(body: Obj) -> list[tuple[str, str]]:
    """The schema's causes; the one a real server adds when CEL rules were skipped for them is left out (its own
    test below), so these read the same whether or not the schema carries rules."""
    return [(c["reason"], c["field"]) for c in body["details"]["causes"] if NOT_CHECKED not in c.get("message", "")]


def http(srv: EmulatorServer, method: str, path: str, body: Any = None, accept: str = "") -> tuple[int, Obj, Any]:
    """A raw request (status, JSON body, headers): for what the typed client refuses to send or hides."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(srv.url + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if accept:
        request.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read() or b"{}"), response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}"), exc.headers


# --- the mode itself ------------------------------------------------------------------------------------


def test_strict_is_on_by_default_and_off_with_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every emulator is strict unless its constructor says otherwise or HOMELAB_EMULATOR_STRICT=0."""
    monkeypatch.delenv("HOMELAB_EMULATOR_STRICT", raising=False)
    assert KubeEmulator().strict
    for off in ("0", "false", "off"):
        monkeypatch.setenv("HOMELAB_EMULATOR_STRICT", off)
        assert not KubeEmulator().strict
        assert KubeEmulator(strict=True).strict
    monkeypatch.setenv("HOMELAB_EMULATOR_STRICT", "1")
    assert KubeEmulator().strict
    assert not KubeEmulator(strict=False).strict


def test_the_direct_helpers_store_past_admission(srv: EmulatorServer) -> None:
    """``put_object``/``patch_object`` stand for what etcd already holds (a test's malformed object); the
    simulated controllers' ``patch_object(..., admit=True)`` is judged like a client's write.
    """
    from homelab_sim.emulator import ApiError

    srv.call(lambda e: e.put_object(GV, "groups", group(maxSize="many"), NS))
    stored = srv.call(lambda e: e.patch_object(GV, "groups", NS, "g1", {"spec": {"bogus": 1}}))
    assert stored["spec"] == {"maxSize": "many", "bogus": 1}
    with pytest.raises(ApiError) as exc:
        srv.call(lambda e: e.patch_object(GV, "groups", NS, "g1", {"spec": {"minSize": 1}}, admit=True))
    assert exc.value.status == 422


def test_a_refused_write_stores_nothing_and_tells_no_one(srv: EmulatorServer, co: Any) -> None:
    """Validation runs before storage (``rest.BeforeCreate`` / ``Update``): no object, no rv, no watch event."""
    heard: list[str] = []
    srv.call(lambda e: e.listeners.append(lambda kind, *_: heard.append(kind)))
    before = srv.call(lambda e: e.resource_version)
    status, _ = refused(co.create_namespaced_custom_object, G, V, NS, "groups", group(minSize=5, maxSize=1))
    assert status == 422
    assert srv.call(lambda e: (e.resource_version, e.objects_of(GV, "groups"))) == (before, [])
    assert heard == []


def test_the_422_body_is_a_real_invalid_status(co: Any) -> None:
    """``apierrors.NewInvalid``: ``<Kind>.<group> "<name>" is invalid: [<field>: <body>, ...]`` and one cause each."""
    status, body = refused(co.create_namespaced_custom_object, G, V, NS, "nodeclaims", claim(call="X", node=""))
    assert status == 422 and body["reason"] == "Invalid"
    assert body["message"] == (
        'NodeClaim.infra.homecluster.dev "c1" is invalid: [spec.node: Invalid value: "": spec.node in body should'
        ' be at least 1 chars long, spec.call: Unsupported value: "X": supported values: "IncreaseSize", "Adopted",'
        ' "Manual", <nil>: Invalid value: "null": some validation rules were not checked because the object was'
        " invalid; correct the existing errors to complete validation]"
    )
    assert body["details"]["name"] == "c1" and body["details"]["group"] == G and body["details"]["kind"] == "NodeClaim"
    assert body["details"]["causes"][1] == {
        "reason": "FieldValueNotSupported",
        "message": 'Unsupported value: "X": supported values: "IncreaseSize", "Adopted", "Manual"',
        "field": "spec.call",
    }


# --- CRD schemas ----------------------------------------------------------------------------------------


def test_unknown_fields_are_pruned_with_a_warning(srv: EmulatorServer) -> None:
    """Structural pruning with fieldValidation=Warn (the server default): dropped, one ``Warning`` header each."""
    body = group()
    body["spec"]["bogus"] = 1
    body["extra"] = {"a": 1}
    status, stored, headers = http(srv, "POST", f"/apis/{GV}/namespaces/{NS}/groups", body)
    assert status == 201
    assert "bogus" not in stored["spec"] and "extra" not in stored
    assert sorted(headers.get_all("Warning")) == [
        '299 - "unknown field \\"extra\\""',
        '299 - "unknown field \\"spec.bogus\\""',
    ]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_apply_without_validation_prunes_a_typo_that_last_applied_keeps(
    srv: EmulatorServer, tmp_path: Any
) -> None:
    """``kubectl apply --validate=false`` sends ``fieldValidation=Ignore``: the typo is pruned silently, and the
    client-side apply annotation (``kubectl.kubernetes.io/last-applied-configuration``) keeps the document as
    written, which is where the operator finds the typo (``kube.views.pruned_field``, docs/decisions.md).
    """
    from kube import views

    manifest = tmp_path / "slot.yaml"
    manifest.write_text(
        f"apiVersion: {GV}\nkind: Node\nmetadata:\n  name: s1\n  namespace: {NS}\nspec:\n  group: g1\n"
        "  kubernetesNodeName: s1\n  startupPodSpec:\n    image: x\n    comand: [wake]\n"
        "  shutdownPodSpec:\n    image: x\n"
    )
    env = {**os.environ, "KUBECONFIG": os.devnull, "HOME": str(tmp_path)}  # kubectl caches under $HOME
    command = ["kubectl", "--server", srv.url, "apply", "--validate=false", "-f", str(manifest)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    (create,) = [r for r in srv.emulator.requests if r.verb == "create" and r.plural == "nodes"]
    assert create.params["fieldValidation"] == "Ignore"
    stored = srv.call(lambda e: e.get_object(GV, "nodes", NS, "s1"))
    assert stored is not None and stored["spec"]["startupPodSpec"] == {"image": "x"}
    assert views.slot_problem(stored).startswith("spec.startupPodSpec.comand: unknown field")


def test_field_validation_strict_refuses_unknown_fields(srv: EmulatorServer) -> None:
    """fieldValidation=Strict (kubectl's default): 400 ``strict decoding error: unknown field``."""
    body = group()
    body["spec"]["bogus"] = 1
    status, answer, _ = http(srv, "POST", f"/apis/{GV}/namespaces/{NS}/groups?fieldValidation=Strict", body)
    assert (status, answer["reason"]) == (400, "BadRequest")
    assert answer["message"] == 'strict decoding error: unknown field "spec.bogus"'


def test_preserve_unknown_fields_keeps_them(srv: EmulatorServer) -> None:
    """``x-kubernetes-preserve-unknown-fields`` (here ObjectMeta's ``FieldsV1``-like free objects are kept)."""
    from homelab_sim.emulator_schema import Outcome, prune

    schema = {
        "type": "object",
        "properties": {"free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    }
    out = Outcome()
    assert prune(schema, {"free": {"any": {"thing": 1}}, "gone": 1}, "", out) == {"free": {"any": {"thing": 1}}}
    assert out.unknown == ["gone"]


def test_defaults_are_applied_on_create(co: Any) -> None:
    """CRD structural defaulting on the request: missing fields get the schema's ``default``."""
    stored = co.create_namespaced_custom_object(G, V, NS, "groups", group())
    assert stored["spec"]["minSize"] == 0
    assert stored["spec"]["powerOffNodePolicy"] == "Delete"
    assert stored["spec"]["nodeReadinessTaints"] == [{"key": "node.cilium.io/agent-not-ready", "effect": "NoExecute"}]


def test_defaults_are_applied_on_read(srv: EmulatorServer, co: Any) -> None:
    """Defaulting also happens when decoding from etcd: an object stored without a default reads with it."""
    srv.call(lambda e: e.put_object(GV, "nodeclaims", claim(), namespace=NS))
    assert co.get_namespaced_custom_object(G, V, NS, "nodeclaims", "c1")["spec"]["ttlSecondsAfterFinished"] == 3600
    listed = co.list_namespaced_custom_object(G, V, NS, "nodeclaims")["items"]
    assert listed[0]["spec"]["call"] == "Manual"


def test_null_in_a_non_nullable_field_is_pruned_then_defaulted(co: Any) -> None:
    """ "null values for fields that don't specify nullable are pruned before defaulting" (CRD docs)."""
    stored = co.create_namespaced_custom_object(G, V, NS, "groups", group(minSize=None))
    assert stored["spec"]["minSize"] == 0


def test_null_in_a_nullable_enum_must_be_listed() -> None:
    """kube-openapi validates a nullable field's null against its ``enum``: without null listed, it is refused."""
    from homelab_sim.emulator_schema import Outcome, validate

    out = Outcome()
    validate({"type": "string", "nullable": True, "enum": ["a", "b"]}, None, "status.phase", out)
    assert [(e.type, e.field) for e in out.errors] == [("FieldValueNotSupported", "status.phase")]
    out = Outcome()
    validate({"type": "string", "nullable": True, "enum": ["a", None]}, None, "status.phase", out)
    assert out.errors == []


def test_null_in_an_optional_enum_of_our_crds_is_pruned(co: Any) -> None:
    """Our optional enums are not nullable (api/crds.py), so a null is pruned before validation (the CRD docs'
    null pruning) instead of being refused as an unlisted enum value: `effect:` left empty in YAML, or a
    status writer's null phase.
    """
    pod = {"image": "x", "tolerations": [{"key": "k", "operator": "Exists", "effect": None}]}
    spec = {"group": "g1", "kubernetesNodeName": "n1", "startupPodSpec": pod, "shutdownPodSpec": {"image": "x"}}
    slot = co.create_namespaced_custom_object(
        G, V, NS, "nodes", {"apiVersion": GV, "kind": "Node", "metadata": {"name": "n1"}, "spec": spec}
    )
    assert slot["spec"]["startupPodSpec"]["tolerations"] == [{"key": "k", "operator": "Exists"}]
    co.create_namespaced_custom_object(G, V, NS, "nodeclaims", claim())
    current = co.get_namespaced_custom_object(G, V, NS, "nodeclaims", "c1")
    current["status"] = {"phase": None, "attempt": 1}
    written = co.replace_namespaced_custom_object_status(G, V, NS, "nodeclaims", "c1", current)
    assert written["status"] == {"attempt": 1}


def test_required(co: Any) -> None:
    """OpenAPI ``required`` → ``field.Required``."""
    body = claim()
    del body["spec"]["node"]
    status, answer = refused(co.create_namespaced_custom_object, G, V, NS, "nodeclaims", body)
    assert (status, causes(answer)) == (422, [("FieldValueRequired", "spec.node")])


def test_type(co: Any) -> None:
    """OpenAPI ``type`` → ``field.TypeInvalid`` ("in body must be of type integer")."""
    status, answer = refused(co.create_namespaced_custom_object, G, V, NS, "groups", group(maxSize="three"))
    assert (status, causes(answer)[0]) == (422, ("FieldValueTypeInvalid", "spec.maxSize"))
    assert 'spec.maxSize in body must be of type integer: "string"' in answer["message"]


def test_minimum_and_maximum(co: Any) -> None:
    """OpenAPI ``minimum``/``maximum`` (kube-openapi ``MinimumNativeType``): "should be greater than or equal to"."""
    status, answer = refused(
        co.create_namespaced_custom_object, G, V, NS, "groups", group(maxSize=-1, scaleDownUtilizationThreshold=1.5)
    )
    assert status == 422
    assert "spec.maxSize in body should be greater than or equal to 0" in answer["message"]
    assert "spec.scaleDownUtilizationThreshold in body should be less than or equal to 1" in answer["message"]


def test_min_length(co: Any) -> None:
    """OpenAPI ``minLength``: "should be at least 1 chars long"."""
    _, answer = refused(co.create_namespaced_custom_object, G, V, NS, "nodeclaims", claim(group=""))
    assert causes(answer) == [("FieldValueInvalid", "spec.group")]


def test_max_length_is_too_long(srv: EmulatorServer, co: Any) -> None:
    """OpenAPI ``maxLength`` → ``field.TooLongMaxLength``."""
    co.create_namespaced_custom_object(G, V, NS, "nodeclaims", claim())
    condition = {"type": "Ready", "status": "True", "reason": "R", "lastTransitionTime": "2030-01-02T03:04:05Z"}
    condition["message"] = "x" * 32769
    status, answer = refused(
        co.patch_namespaced_custom_object_status, G, V, NS, "nodeclaims", "c1", {"status": {"conditions": [condition]}}
    )
    assert (status, causes(answer)) == (422, [("FieldValueTooLong", "status.conditions[0].message")])


def test_pattern(co: Any) -> None:
    """OpenAPI ``pattern``: "in body should match '<pattern>'" (here the Go duration of maxNodeProvisionTime)."""
    _, answer = refused(co.create_namespaced_custom_object, G, V, NS, "groups", group(maxNodeProvisionTime="5 minutes"))
    # a pattern error does not block CEL (not one of apiextensions' hasBlockingErr types): the duration bound's rule
    # runs too, and cannot parse the value either
    assert set(causes(answer)) == {("FieldValueInvalid", "spec.maxNodeProvisionTime")}
    assert "should match" in answer["message"]


def test_date_time_format(co: Any) -> None:
    """OpenAPI ``format: date-time`` (kube-openapi ``strfmt.IsDateTime``)."""
    _, answer = refused(co.create_namespaced_custom_object, G, V, NS, "nodeclaims", claim(requestedAt="yesterday"))
    assert causes(answer) == [("FieldValueTypeInvalid", "spec.requestedAt")]
    assert co.create_namespaced_custom_object(G, V, NS, "nodeclaims", claim(requestedAt="2030-01-02T03:04:05.5+02:00"))


def test_list_map_keys_are_unique(co: Any) -> None:
    """``x-kubernetes-list-type: map``: a second item with the same keys → ``field.Duplicate``."""
    co.create_namespaced_custom_object(G, V, NS, "nodeclaims", claim())
    ready = {"type": "Ready", "status": "True", "reason": "R", "lastTransitionTime": "2030-01-02T03:04:05Z"}
    status, answer = refused(
        co.patch_namespaced_custom_object_status,
        G,
        V,
        NS,
        "nodeclaims",
        "c1",
        {"status": {"conditions": [ready, ready]}},
    )
    assert (status, causes(answer)) == (422, [("FieldValueDuplicate", "status.conditions[1]")])


def test_min_and_max_items_and_set_uniqueness() -> None:
    """``minItems``/``maxItems`` (``field.TooMany``) and ``x-kubernetes-list-type: set`` duplicates."""
    from homelab_sim.emulator_schema import Outcome, validate

    schema = {
        "type": "array",
        "minItems": 1,
        "maxItems": 2,
        "x-kubernetes-list-type": "set",
        "items": {"type": "string"},
    }
    out = Outcome()
    validate(schema, ["a", "a", "b"], "spec.l", out)
    assert [(e.type, e.field) for e in out.errors] == [
        ("FieldValueTooMany", "spec.l"),
        ("FieldValueDuplicate", "spec.l[1]"),
    ]
    out = Outcome()
    validate(schema, [], "spec.l", out)
    assert [e.detail for e in out.errors] == ["spec.l in body should have at least 1 items"]


def test_int_or_string_and_embedded_resource() -> None:
    """``x-kubernetes-int-or-string`` takes both (not a bool); an embedded resource needs apiVersion and kind."""
    from homelab_sim.emulator_schema import Outcome, validate

    schema = {
        "type": "object",
        "properties": {
            "port": {"x-kubernetes-int-or-string": True},
            "obj": {
                "type": "object",
                "x-kubernetes-embedded-resource": True,
                "x-kubernetes-preserve-unknown-fields": True,
            },
        },
    }
    out = Outcome()
    validate(schema, {"port": "http", "obj": {"apiVersion": "v1", "kind": "Pod"}}, "spec", out)
    assert out.errors == []
    validate(schema, {"port": True, "obj": {"kind": "Pod"}}, "spec", out)
    assert [(e.type, e.field) for e in out.errors] == [
        ("FieldValueTypeInvalid", "spec.port"),
        ("FieldValueRequired", "spec.obj.apiVersion"),
    ]


def test_cel_rule(co: Any) -> None:
    """``x-kubernetes-validations``: a false rule → ``field.Invalid(path, <type>, message)``."""
    _, answer = refused(co.create_namespaced_custom_object, G, V, NS, "groups", group(minSize=5, maxSize=1))
    assert answer["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "object": minSize must not exceed maxSize',
            "field": "spec",
        }
    ]


def test_cel_rules_on_list_items(srv: EmulatorServer, co: Any, examples: dict[str, list[Obj]]) -> None:
    """Rules under ``items`` run for each item (a slot's env: exactly one of secretKeyRef or configMapKeyRef)."""
    slot = next(d for d in examples["nodes"] if d["kind"] == "Node")
    slot["spec"]["startupPodSpec"]["env"] = [{"name": "X", "valueFrom": {}}]
    slot["metadata"]["namespace"] = NS
    _, answer = refused(co.create_namespaced_custom_object, G, V, NS, "nodes", slot)
    assert answer["details"]["causes"][0]["field"] == "spec.startupPodSpec.env[0].valueFrom"
    assert "exactly one of secretKeyRef or configMapKeyRef" in answer["message"]


def test_cel_transition_rule_message_expression_reason_and_field_path() -> None:
    """Transition rules see ``oldSelf`` only on update; ``messageExpression``, ``reason``, ``fieldPath`` apply."""
    from homelab_sim.emulator_schema import Outcome, validate

    rule = {
        "rule": "self.size >= oldSelf.size",
        "messageExpression": "'may not shrink from ' + string(oldSelf.size)",
        "reason": "FieldValueForbidden",
        "fieldPath": ".size",
    }
    schema = {"type": "object", "properties": {"size": {"type": "integer"}}, "x-kubernetes-validations": [rule]}
    out = Outcome()
    validate(schema, {"size": 1}, "spec", out)
    assert out.errors == []
    validate(schema, {"size": 1}, "spec", out, old={"size": 2})
    assert [str(e) for e in out.errors] == ["spec.size: Forbidden: may not shrink from 2"]


def test_cel_is_skipped_after_a_blocking_schema_error(co: Any) -> None:
    """apiextensions ``hasBlockingErr``: after a type error the rules are not run, and the server says so."""
    _, answer = refused(co.create_namespaced_custom_object, G, V, NS, "groups", group(maxSize="x", minSize=5))
    assert "some validation rules were not checked because the object was invalid" in answer["message"]
    assert "minSize must not exceed maxSize" not in answer["message"]


def test_status_writes_are_judged_on_status_and_ratchet_the_rest(srv: EmulatorServer, co: Any) -> None:
    """The status subresource writes status only; CRDValidationRatcheting lets an unchanged invalid value stand."""
    legacy = claim(call="Legacy")
    srv.call(lambda e: e.put_object(GV, "nodeclaims", legacy, namespace=NS))
    co.patch_namespaced_custom_object_status(G, V, NS, "nodeclaims", "c1", {"status": {"attempt": 1}})
    co.patch_namespaced_custom_object(G, V, NS, "nodeclaims", "c1", {"spec": {"node": "n2"}})
    _, answer = refused(
        co.patch_namespaced_custom_object_status, G, V, NS, "nodeclaims", "c1", {"status": {"attempt": 0}}
    )
    assert causes(answer) == [("FieldValueInvalid", "status.attempt")]
    _, answer = refused(co.patch_namespaced_custom_object, G, V, NS, "nodeclaims", "c1", {"spec": {"call": "Other"}})
    assert causes(answer) == [("FieldValueNotSupported", "spec.call")]


# --- metadata -------------------------------------------------------------------------------------------


def test_name_is_a_dns_subdomain(co: Any) -> None:
    """``ValidateObjectMeta`` with ``NameIsDNSSubdomain`` (apimachinery ``IsDNS1123Subdomain``)."""
    _, answer = refused(co.create_namespaced_custom_object, G, V, NS, "groups", group("Bad_Name"))
    assert causes(answer) == [("FieldValueInvalid", "metadata.name")]
    assert "a lowercase RFC 1123 subdomain must consist of" in answer["message"]
    _, answer = refused(co.create_namespaced_custom_object, G, V, NS, "groups", group("a" * 254))
    assert "must be no more than 253 characters" in answer["message"]


def test_generate_name_is_validated_as_a_prefix(co: Any) -> None:
    """``ValidateObjectMeta``: generateName by the name rule with prefix=true (a trailing '-' is fine)."""
    body = group()
    body["metadata"] = {"generateName": "g-"}
    assert co.create_namespaced_custom_object(G, V, NS, "groups", body)["metadata"]["name"].startswith("g-")
    body["metadata"] = {"generateName": "G_"}
    _, answer = refused(co.create_namespaced_custom_object, G, V, NS, "groups", body)
    assert ("FieldValueInvalid", "metadata.generateName") in causes(answer)


def test_job_name_is_at_most_63_characters(batch: Any) -> None:
    """The name becomes the ``job-name`` labels the Job strategy puts on the template, so a longer one is refused
    there (twice in the causes, once in the message: the aggregate drops repeats). Checked on kube-apiserver
    1.35.4: no error on ``metadata.name`` itself, and "bytes"."""
    name = "j" * 64
    status, answer = refused(batch.create_namespaced_job, NS, job(name))
    assert status == 422
    assert answer["message"] == (
        f'Job.batch "{name}" is invalid: spec.template.labels: Invalid value: "{name}": must be no more than 63 bytes'
    )
    assert causes(answer) == [("FieldValueInvalid", "spec.template.labels")] * 2
    assert batch.create_namespaced_job(NS, job("j" * 63))


def test_a_job_name_label_that_is_not_the_jobs_is_refused(batch: Any) -> None:
    """``validateGeneratedSelector`` (checked on kube-apiserver 1.35.4): the template's `job-name` is the Job's."""
    body = job("j1")
    body["spec"]["template"]["metadata"] = {"labels": {"job-name": "mine"}}
    _, answer = refused(batch.create_namespaced_job, NS, body)
    assert causes(answer) == [("FieldValueInvalid", "spec.template.metadata.labels[job-name]")]
    assert answer["message"].endswith('"job-name":"mine"}: must be \'j1\''), answer["message"]
    body["spec"]["template"]["metadata"] = {"labels": {"job-name": "j1"}}
    assert batch.create_namespaced_job(NS, body)


def test_namespace_name_is_a_dns_label(core: Any) -> None:
    """``ValidateNamespace`` uses ``NameIsDNSLabel``: no dots."""
    _, answer = refused(core.create_namespace, {"metadata": {"name": "a.b"}})
    assert "a lowercase RFC 1123 label must consist of" in answer["message"]
    assert core.create_namespace({"metadata": {"name": "ab"}})


def test_label_keys_are_qualified_names(co: Any) -> None:
    """``ValidateLabels`` → ``ValidateLabelName`` (``IsQualifiedName``): prefix a DNS subdomain, name ≤63."""
    for key, words in (
        ("bad key", "name part must consist of"),
        ("Bad_Prefix/x", "prefix part a lowercase RFC 1123"),
        ("example.com/" + "x" * 64, "name part must be no more than 63 bytes"),
    ):
        body = group()
        body["metadata"]["labels"] = {key: "v"}
        _, answer = refused(co.create_namespaced_custom_object, G, V, NS, "groups", body)
        assert causes(answer) == [("FieldValueInvalid", "metadata.labels")] and words in answer["message"], key


def test_label_values(co: Any) -> None:
    """``IsValidLabelValue``: empty, or ≤63 alphanumerics with ``-_.`` inside."""
    body = group()
    body["metadata"]["labels"] = {"a": "", "b": "x" * 64, "c": "-x"}
    _, answer = refused(co.create_namespaced_custom_object, G, V, NS, "groups", body)
    assert len(answer["details"]["causes"]) == 2
    assert "must be no more than 63 bytes" in answer["message"] and "a valid label must be" in answer["message"]


def test_annotations_total_size(co: Any) -> None:
    """``ValidateAnnotations``: keys are qualified names; 256 KiB in total (``TotalAnnotationSizeLimitB``).

    Too long is one of apiextensions' ``hasBlockingErr`` types, so the Group's CEL rules are then skipped.
    """
    body = group()
    body["metadata"]["annotations"] = {"a": "x" * (256 * 1024)}
    _, answer = refused(co.create_namespaced_custom_object, G, V, NS, "groups", body)
    assert [(c["reason"], c["field"]) for c in answer["details"]["causes"]] == [
        ("FieldValueTooLong", "metadata.annotations"),
        ("FieldValueInvalid", "<nil>"),
    ]


def test_finalizer_names(co: Any) -> None:
    """``validateFinalizerName``: a qualified name with a '/', unless a standard one (kubernetes, orphan, ...)."""
    body = group()
    body["metadata"]["finalizers"] = ["example.com/hold", "orphan", "my-finalizer"]
    _, answer = refused(co.create_namespaced_custom_object, G, V, NS, "groups", body)
    assert answer["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "field": "metadata.finalizers[2]",
            "message": 'Invalid value: "my-finalizer": name is neither a standard finalizer name nor is it fully'
            " qualified",
        }
    ]


def test_owner_references(batch: Any) -> None:
    """``ValidateOwnerReferences``: uid required, at most one controller."""
    body = job()
    ref = {"apiVersion": GV, "kind": "NodeClaim", "name": "c1", "controller": True}
    body["metadata"]["ownerReferences"] = [{**ref, "uid": "u1"}, {**ref, "uid": ""}]
    _, answer = refused(batch.create_namespaced_job, NS, body)
    assert ("FieldValueInvalid", "metadata.ownerReferences[1].uid") in causes(answer)
    assert ("FieldValueInvalid", "metadata.ownerReferences") in causes(answer)


# --- built-in kinds (kubernetes-validate schemas and Go validation) -------------------------------------


def test_core_unknown_fields_are_pruned(srv: EmulatorServer) -> None:
    """Built-in kinds prune unknown fields too (fieldValidation=Warn): the Job keeps only what batch/v1 has."""
    body = job()
    body["spec"]["template"]["spec"]["containers"][0]["powerLevel"] = 9000
    status, stored, headers = http(srv, "POST", f"/apis/batch/v1/namespaces/{NS}/jobs", body)
    assert status == 201 and "powerLevel" not in stored["spec"]["template"]["spec"]["containers"][0]
    assert headers.get_all("Warning") == ['299 - "unknown field \\"spec.template.spec.containers[0].powerLevel\\""']


def test_core_type_mismatch_is_a_400_decode_error(srv: EmulatorServer) -> None:
    """A typed Go struct cannot decode a string into int32: 400 "cannot be handled as a Job"."""
    body = job()
    body["spec"]["backoffLimit"] = "six"
    status, answer, _ = http(srv, "POST", f"/apis/batch/v1/namespaces/{NS}/jobs", body)
    assert (status, answer["reason"]) == (400, "BadRequest")
    assert answer["message"].startswith('Job in version "v1" cannot be handled as a Job: json: cannot unmarshal string')


def test_job_pod_template(batch: Any) -> None:
    """``ValidateJob`` / ``ValidatePodTemplateSpec``: restartPolicy OnFailure|Never, template labels, containers."""
    body = job(restartPolicy="Always")
    body["spec"]["template"]["metadata"] = {"labels": {"bad key": "x"}}
    body["spec"]["template"]["spec"]["containers"].append({"name": "Power_2"})
    _, answer = refused(batch.create_namespaced_job, NS, body)
    assert sorted(causes(answer)) == [
        ("FieldValueInvalid", "spec.template.labels"),
        ("FieldValueInvalid", "spec.template.spec.containers[1].name"),
        ("FieldValueNotSupported", "spec.template.spec.restartPolicy"),
        ("FieldValueRequired", "spec.template.spec.containers[1].image"),
    ]


def test_job_template_is_immutable(batch: Any) -> None:
    """``ValidateJobUpdate``: spec.template cannot change."""
    batch.create_namespaced_job(NS, job())
    patch = {"spec": {"template": {"spec": {"containers": [{"name": "power", "image": "other"}]}}}}
    _, answer = refused(batch.patch_namespaced_job, "j1", NS, patch)
    assert causes(answer) == [("FieldValueInvalid", "spec.template")]


def test_lease_micro_time_needs_microseconds(srv: EmulatorServer) -> None:
    """``metav1.MicroTime.UnmarshalJSON`` parses ``RFC3339Micro``: no six-digit fraction → 400 on decode."""
    lease: dict[str, Any] = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "leader"}}
    lease["spec"] = {"holderIdentity": "a", "renewTime": "2030-01-02T03:04:05Z", "leaseDurationSeconds": 15}
    status, answer, _ = http(srv, "POST", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", lease)
    assert (status, answer["reason"]) == (400, "BadRequest")
    assert 'cannot parse "Z" as ".000000"' in answer["message"]
    lease["spec"]["renewTime"] = "2030-01-02T03:04:05.123456Z"
    assert http(srv, "POST", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", lease)[0] == 201


def test_lease_spec(srv: EmulatorServer) -> None:
    """``ValidateLeaseSpec``: leaseDurationSeconds must be greater than 0."""
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "leader"}}
    lease["spec"] = {"leaseDurationSeconds": 0}
    status, answer, _ = http(srv, "POST", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", lease)
    assert status == 422 and causes(answer) == [("FieldValueInvalid", "spec.leaseDurationSeconds")]


def test_time_fields_take_rfc3339(core: Any, srv: EmulatorServer) -> None:
    """``metav1.Time.UnmarshalJSON`` parses RFC 3339 (a fraction is accepted); anything else is a 400."""
    event: dict[str, Any] = {
        "metadata": {"name": "e1", "namespace": NS},
        "involvedObject": {"kind": "Node", "name": "n1", "namespace": NS},
        "reason": "R",
        "firstTimestamp": "2030-01-02T03:04:05.5Z",
    }
    assert core.create_namespaced_event(NS, event)
    event["metadata"]["name"], event["firstTimestamp"] = "e2", "2030-01-02 03:04"
    status, _, _ = http(srv, "POST", f"/api/v1/namespaces/{NS}/events", event)
    assert status == 400


def test_core_event_namespace_must_match(core: Any) -> None:
    """``legacyValidateEvent``: involvedObject.namespace "does not match event.namespace"."""
    event = {"metadata": {"name": "e1"}, "involvedObject": {"kind": "Node", "name": "n1", "namespace": "other"}}
    _, answer = refused(core.create_namespaced_event, NS, event)
    assert causes(answer) == [("FieldValueInvalid", "involvedObject.namespace")]


def test_events_k8s_io_events_need_reporting_fields(srv: EmulatorServer) -> None:
    """``ValidateEventCreate`` for events.k8s.io/v1: eventTime, reportingController, reportingInstance, action."""
    event = {"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e1"}, "type": "Normal"}
    status, answer, _ = http(srv, "POST", f"/apis/events.k8s.io/v1/namespaces/{NS}/events", event)
    assert status == 422
    assert {f for _, f in causes(answer)} == {"action", "eventTime", "reportingController", "reportingInstance"}


def test_node_taints(core: Any, srv: EmulatorServer) -> None:
    """``validateNodeTaints``: a known effect, and unique by (key, effect)."""
    srv.call(lambda e: e.put_object("v1", "nodes", {"metadata": {"name": "n1"}}))
    taint = {"key": "a", "effect": "NoSchedule"}
    _, answer = refused(
        core.patch_node, "n1", {"spec": {"taints": [{"key": "b", "effect": "Sometimes"}, taint, taint]}}
    )
    assert causes(answer) == [
        ("FieldValueNotSupported", "spec.taints[0].effect"),
        ("FieldValueDuplicate", "spec.taints[2]"),
    ]


# --- reads ----------------------------------------------------------------------------------------------


def test_lists_page_with_limit_and_continue(co: Any) -> None:
    """``limit``/``continue`` (API concepts, "Retrieving large results sets in chunks"): every object once."""
    for i in range(5):
        co.create_namespaced_custom_object(G, V, NS, "nodeclaims", claim(f"c{i}"))
    first = co.list_namespaced_custom_object(G, V, NS, "nodeclaims", limit=2)
    assert [i["metadata"]["name"] for i in first["items"]] == ["c0", "c1"]
    assert first["metadata"]["remainingItemCount"] == 3
    names, token = [], first["metadata"]["continue"]
    while token:
        page = co.list_namespaced_custom_object(G, V, NS, "nodeclaims", limit=2, _continue=token)
        assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        names += [i["metadata"]["name"] for i in page["items"]]
        token = page["metadata"].get("continue")
    assert names == ["c2", "c3", "c4"]


def test_a_bad_continue_token_is_400_and_a_compacted_one_410(srv: EmulatorServer, co: Any) -> None:
    """etcd3 ``decodeContinue``: 400 for garbage; 410 Expired once the token's revision is compacted."""
    for i in range(3):
        co.create_namespaced_custom_object(G, V, NS, "nodeclaims", claim(f"c{i}"))
    assert refused(co.list_namespaced_custom_object, G, V, NS, "nodeclaims", _continue="garbage!")[0] == 400
    token = co.list_namespaced_custom_object(G, V, NS, "nodeclaims", limit=1)["metadata"]["continue"]

    def compact(emulator: KubeEmulator) -> None:
        emulator.compacted_below = emulator.resource_version + 1

    srv.call(compact)
    status, answer = refused(co.list_namespaced_custom_object, G, V, NS, "nodeclaims", _continue=token)
    assert (status, answer["reason"]) == (410, "Expired")


def test_resource_version_match(co: Any) -> None:
    """``ValidateListOptions`` and list semantics: Exact serves that revision, NotOlderThan a newer one."""
    mark = co.create_namespaced_custom_object(G, V, NS, "nodeclaims", claim("c1"))["metadata"]["resourceVersion"]
    co.create_namespaced_custom_object(G, V, NS, "nodeclaims", claim("c2"))
    exact = co.list_namespaced_custom_object(
        G, V, NS, "nodeclaims", resource_version=mark, resource_version_match="Exact"
    )
    assert [i["metadata"]["name"] for i in exact["items"]] == ["c1"]
    assert exact["metadata"]["resourceVersion"] == mark
    newer = co.list_namespaced_custom_object(
        G, V, NS, "nodeclaims", resource_version=mark, resource_version_match="NotOlderThan"
    )
    assert len(newer["items"]) == 2
    status, answer = refused(co.list_namespaced_custom_object, G, V, NS, "nodeclaims", resource_version_match="Exact")
    assert (status, answer["message"]) == (
        422,
        'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden'
        " unless resourceVersion is provided",
    )
    status, answer = refused(
        co.list_namespaced_custom_object, G, V, NS, "nodeclaims", resource_version="999", resource_version_match="Exact"
    )
    assert (status, answer["message"]) == (504, "Too large resource version: 999, current: 2")


# --- kubectl tables -------------------------------------------------------------------------------------


def _table(srv: EmulatorServer, path: str) -> tuple[list[str], list[list[Any]]]:
    status, doc, _ = http(srv, "GET", path, accept="application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
    assert status == 200 and doc["kind"] == "Table"
    shown = [i for i, c in enumerate(doc["columnDefinitions"]) if c["priority"] == 0]
    return [doc["columnDefinitions"][i]["name"] for i in shown], [[r["cells"][i] for i in shown] for r in doc["rows"]]


def test_job_table(srv: EmulatorServer) -> None:
    """``printJob``: NAME, STATUS, COMPLETIONS, DURATION, AGE."""
    done = job("done")
    done["spec"]["completions"] = 1
    done["metadata"]["creationTimestamp"] = "2030-01-02T02:04:05Z"
    done["status"] = {
        "succeeded": 1,
        "startTime": "2030-01-02T02:04:05Z",
        "completionTime": "2030-01-02T02:06:10Z",
        "conditions": [{"type": "Complete", "status": "True"}],
    }
    srv.call(lambda e: e.put_object("batch/v1", "jobs", done, namespace=NS))
    srv.call(lambda e: e.put_object("batch/v1", "jobs", job("running"), namespace=NS))
    columns, rows = _table(srv, f"/apis/batch/v1/namespaces/{NS}/jobs")
    assert columns == ["Name", "Status", "Completions", "Duration", "Age"]
    assert rows == [["done", "Complete", "1/1", "2m5s", "60m"], ["running", "Running", "0/1", "", "0s"]]


def test_event_table(srv: EmulatorServer) -> None:
    """``printEvent``: LAST SEEN, TYPE, REASON, OBJECT, MESSAGE (no NAME column by default)."""
    event = {
        "metadata": {"name": "e1"},
        "involvedObject": {"kind": "NodeClaim", "name": "c1", "namespace": NS},
        "type": "Normal",
        "reason": "ClaimCreated",
        "message": " created ",
        "firstTimestamp": "2030-01-02T03:00:05Z",
        "lastTimestamp": "2030-01-02T03:03:05Z",
    }
    srv.call(lambda e: e.put_object("v1", "events", event, namespace=NS))
    columns, rows = _table(srv, f"/api/v1/namespaces/{NS}/events")
    assert columns == ["Last Seen", "Type", "Reason", "Object", "Message"]
    assert rows == [["60s", "Normal", "ClaimCreated", "nodeclaim/c1", "created"]]


def test_node_and_lease_tables(srv: EmulatorServer) -> None:
    """``printNode`` (NAME, STATUS, ROLES, AGE, VERSION) and ``printLease`` (NAME, HOLDER, AGE)."""
    node = {
        "metadata": {
            "name": "n1",
            "labels": {"node-role.kubernetes.io/worker": ""},
            "creationTimestamp": "2030-01-01T03:04:05Z",
        },
        "spec": {"unschedulable": True},
        "status": {"conditions": [{"type": "Ready", "status": "True"}], "nodeInfo": {"kubeletVersion": "v1.35.0"}},
    }
    srv.call(lambda e: e.put_object("v1", "nodes", node))
    assert _table(srv, "/api/v1/nodes") == (
        ["Name", "Status", "Roles", "Age", "Version"],
        [["n1", "Ready,SchedulingDisabled", "worker", "24h", "v1.35.0"]],
    )
    lease = {"metadata": {"name": "leader"}, "spec": {"holderIdentity": "replica-a"}}
    srv.call(lambda e: e.put_object("coordination.k8s.io/v1", "leases", lease, namespace=NS))
    assert _table(srv, f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases") == (
        ["Name", "Holder", "Age"],
        [["leader", "replica-a", "0s"]],
    )


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-5, "<invalid>"),
        (59, "59s"),
        (119, "119s"),
        (125, "2m5s"),
        (600, "10m"),
        (3 * 3600 + 60, "3h1m"),
        (30 * 3600, "30h"),
        (50 * 3600, "2d2h"),
        (9 * 86400, "9d"),
        (800 * 86400, "2y70d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_human_duration(seconds: int, shown: str) -> None:
    """apimachinery ``duration.HumanDuration``, the age format of every table."""
    assert human_duration(seconds) == shown
