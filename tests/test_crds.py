"""The generated CRDs: fresh, structural, with the printer columns users rely on; the examples valid."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from api import names
from api.crds import CHART_CRD_DIR, CRD_DIR, CRD_FILES, crd_schemas, crds, render, render_chart, to_json_schema
from api.v2alpha1 import NodeClaim, load
from domain import claims

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "deploy" / "examples"

# Keys that may stand without a `type` in a structural schema node.
_UNTYPED_OK = ("x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields")


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node with its path."""
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}.*")


@pytest.mark.parametrize(("directory", "rendered"), [(CRD_DIR, render()), (CHART_CRD_DIR, render_chart())],
                         ids=["deploy", "chart"])  # fmt: skip
def test_committed_crds_are_fresh(directory: Path, rendered: dict[str, str]) -> None:
    """deploy/crds and the Helm chart's crds/ are both written by `make crds`, never by hand."""
    assert sorted(rendered) == sorted(CRD_FILES)
    assert sorted(p.name for p in directory.glob("*.yaml") if p.name != "kustomization.yaml") == sorted(CRD_FILES), (
        f"{directory} holds a file `make crds` does not write"
    )
    for name, text in rendered.items():
        path = directory / name
        assert path.exists(), f"{path} is missing: run `make crds`"
        assert path.read_text(encoding="utf-8") == text, f"{path} is stale: run `make crds`"


def test_the_charts_crds_are_deploys_with_the_install_label() -> None:
    """The chart installs the CRDs deploy/ installs: the same objects, with the label every object of it carries."""
    for name, text in render_chart().items():
        chart = yaml.safe_load(text)
        deploy = yaml.safe_load(render()[name])
        assert chart["metadata"]["labels"].pop("app.kubernetes.io/part-of") == "homelab-autoscaler"
        assert chart == deploy, name


def test_rendering_is_deterministic() -> None:
    assert render() == render()


@pytest.mark.parametrize("kind", [names.KIND_GROUP, names.KIND_NODE, names.KIND_NODECLAIM])
def test_schema_is_structural(kind: str) -> None:
    schema = crd_schemas()[kind]
    for path, node in walk(schema):
        assert "type" in node or any(node.get(key) for key in _UNTYPED_OK), f"{kind}{path}: no type"
        for key in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "title", "const"):
            assert key not in node, f"{kind}{path}: {key}"
        assert not ("properties" in node and "additionalProperties" in node), f"{kind}{path}"
        if "default" in node:
            assert node["default"] is not None, f"{kind}{path}: default null"
            assert not path.startswith(".status"), f"{kind}{path}: status defaults belong to the operator"
        if path.endswith(".conditions"):
            assert node["type"] == "array"
            assert node["x-kubernetes-list-type"] == "map"
            assert node["x-kubernetes-list-map-keys"] == ["type"]
            assert "type" in node["items"]["required"]
        if node.get("x-kubernetes-preserve-unknown-fields"):
            pytest.fail(f"{kind}{path}: nothing in our API is free-form")
    assert schema["properties"]["metadata"] == {"type": "object"}
    assert "conditions" in schema["properties"]["status"]["properties"]


def test_datetimes_durations_enums() -> None:
    schemas = crd_schemas()
    claim = schemas[names.KIND_NODECLAIM]["properties"]
    requested_at = claim["spec"]["properties"]["requestedAt"]
    assert requested_at == {
        "type": "string",
        "format": "date-time",
        "nullable": True,
        "description": requested_at["description"],
    }
    duration = claim["spec"]["properties"]["maxNodeProvisionTime"]
    assert duration["type"] == "string" and "pattern" in duration
    assert claim["status"]["properties"]["phase"]["enum"] == [p.value for p in names.ClaimPhase]
    assert claim["spec"]["properties"]["ttlSecondsAfterFinished"]["default"] == 3600
    group = schemas[names.KIND_GROUP]["properties"]["spec"]["properties"]
    assert group["minSize"]["minimum"] == 0 and group["minSize"]["default"] == 0
    assert group["scaleDownUtilizationThreshold"]["maximum"] == 1
    assert group["powerOffNodePolicy"]["default"] == "Delete"
    assert group["nodeReadinessTaints"]["default"] == [
        {"key": key, "effect": effect} for key, effect in names.DEFAULT_READINESS_TAINTS
    ]
    resources = schemas[names.KIND_NODE]["properties"]["spec"]["properties"]["startupPodSpec"]["properties"][
        "resources"
    ]
    assert resources["properties"]["requests"]["additionalProperties"]["type"] == "string"
    status = schemas[names.KIND_NODE]["properties"]["status"]["properties"]
    assert "activationsLast24H" in status
    assert set(status["recentTransitions"]["items"]["properties"]) == {"from", "to", "at"}


@pytest.mark.parametrize("kind", [names.KIND_GROUP, names.KIND_NODE, names.KIND_NODECLAIM])
def test_crd_envelope(kind: str) -> None:
    obj = crds()[kind]
    assert obj["apiVersion"] == "apiextensions.k8s.io/v1"
    spec = obj["spec"]
    assert obj["metadata"]["name"] == f"{spec['names']['plural']}.{names.GROUP}"
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == kind
    assert spec["names"]["categories"] == ["homelab"]
    [version] = spec["versions"]
    assert version["name"] == names.VERSION
    assert version["served"] is True and version["storage"] is True
    assert version["subresources"] == {"status": {}}


def test_short_names() -> None:
    objs = crds()
    assert objs[names.KIND_NODECLAIM]["spec"]["names"]["shortNames"] == ["nc"]
    assert objs[names.KIND_NODE]["spec"]["names"]["shortNames"] == ["hlnode"]
    assert objs[names.KIND_GROUP]["spec"]["names"]["shortNames"] == ["hlgroup"]


def columns(kind: str) -> list[tuple[str, str, str, int]]:
    version = crds()[kind]["spec"]["versions"][0]
    return [(c["name"], c["jsonPath"], c["type"], c.get("priority", 0)) for c in version["additionalPrinterColumns"]]


def test_printer_columns() -> None:
    age = ("Age", ".metadata.creationTimestamp", "date", 0)
    usage = [  # what it saved (issue 35): the share off and the energy saved; the energy used with -o wide
        ("Off%", ".status.usage.offPercent", "number", 0),
        ("Saved(Wh)", ".status.usage.energySavedWh", "number", 0),
        ("Used(Wh)", ".status.usage.energyUsedWh", "number", 1),
        ("Counted", ".status.usage.countedTo", "date", 0),  # the moment they are counted to (issue 44)
    ]
    assert columns(names.KIND_NODECLAIM) == [
        ("Node", ".spec.node", "string", 0),
        ("Group", ".spec.group", "string", 0),
        ("Phase", ".status.phase", "string", 0),
        ("Reason", ".status.reason", "string", 0),
        ("Attempt", ".status.attempt", "integer", 0),
        age,
        ("Deadline", ".spec.deadlineAt", "string", 1),  # a time ahead: a `date` column's age of it is <invalid>
        ("Finished", ".status.finishedAt", "date", 1),
    ]
    assert columns(names.KIND_NODE) == [
        ("Group", ".spec.group", "string", 0),
        ("Power", ".status.powerState", "string", 0),
        ("Phase", ".status.phase", "string", 0),
        ("Activations24h", ".status.activationsLast24H", "integer", 0),
        *usage,
        age,
    ]
    assert columns(names.KIND_GROUP) == [
        ("Slots", ".status.slots", "integer", 0),
        ("On", ".status.on", "integer", 0),
        ("Off", ".status.off", "integer", 0),
        ("Health", ".status.health", "string", 0),
        *usage,
        age,
    ]


def test_printer_column_paths_exist_in_schema() -> None:
    for kind, obj in crds().items():
        schema = obj["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for column in obj["spec"]["versions"][0]["additionalPrinterColumns"]:
            if column["jsonPath"].startswith(".metadata."):
                continue  # the server's own schema
            node = schema
            for part in column["jsonPath"].lstrip(".").split("."):
                node = node["properties"][part] if "properties" in node else {}
            assert node, f"{kind}: {column['jsonPath']} is not in the schema"


# --- examples ------------------------------------------------------------------------------------------


def example_objects(directory: Path = EXAMPLES_DIR) -> list[tuple[str, dict[str, Any]]]:
    """Every v2alpha1 document under deploy/examples; other documents (the simulator file) are skipped."""
    found = []
    for path in sorted(directory.rglob("*.yaml")):  # the slots are in power/, one per power method
        for index, doc in enumerate(yaml.safe_load_all(path.read_text(encoding="utf-8"))):
            if not isinstance(doc, dict) or doc.get("apiVersion") != names.API_VERSION:
                continue  # not one of our Kubernetes objects
            found.append((f"{path.relative_to(directory)}#{index}", doc))
    return found


EXAMPLES = example_objects()


# RFC 3339 as the API server checks `format: date-time` (jsonschema needs an extra package for it).
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
FORMATS = jsonschema.FormatChecker(formats=())


@FORMATS.checks("date-time", raises=ValueError)
def _is_date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _RFC3339.match(value):
        return False
    datetime.fromisoformat(value.replace("z", "Z").replace("t", "T"))
    return True


def validator(kind: str) -> jsonschema.protocols.Validator:
    schema = to_json_schema(crd_schemas()[kind])
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema, format_checker=FORMATS)


def test_examples_cover_every_kind() -> None:
    kinds = {doc["kind"] for _, doc in EXAMPLES}
    assert kinds == {names.KIND_GROUP, names.KIND_NODE, names.KIND_NODECLAIM}


@pytest.mark.parametrize(("where", "doc"), EXAMPLES, ids=[where for where, _ in EXAMPLES])
def test_example_valid(where: str, doc: dict[str, Any]) -> None:
    errors = [error.message for error in validator(doc["kind"]).iter_errors(doc)]
    assert errors == [], f"{where}: {errors}"
    model = load(doc)
    # what the operator would write back is valid against the CRD too
    dumped = model.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert [e.message for e in validator(doc["kind"]).iter_errors(dumped)] == []


CLAIM_EXAMPLES = [(where, doc) for where, doc in EXAMPLES if doc["kind"] == names.KIND_NODECLAIM]


@pytest.mark.parametrize(("where", "doc"), CLAIM_EXAMPLES, ids=[where for where, _ in CLAIM_EXAMPLES])
def test_example_claims_are_not_expired_when_applied(where: str, doc: dict[str, Any]) -> None:
    """Applied now, an example claim has a boot window ahead of it (a fixed date would fail it at once)."""
    claim = load(doc)
    assert isinstance(claim, NodeClaim)
    now = datetime.now(UTC)
    spec = claim.spec
    requested = spec.requested_at or now  # the operator takes an unset requestedAt from creationTimestamp
    assert requested <= now + timedelta(minutes=1), f"{where}: requestedAt is in the future"
    deadline = spec.deadline_at or claims.deadline_at(requested, spec.max_node_provision_time)
    assert deadline > now, f"{where}: the claim's deadline {deadline:%Y-%m-%d %H:%M}Z has passed"


def test_non_kubernetes_documents_are_skipped(tmp_path: Path) -> None:
    """deploy/examples/homelab.yaml (the simulator, not Kubernetes objects) must not be validated."""
    (tmp_path / "homelab.yaml").write_text("machines:\n  - name: m1\n---\napiVersion: v1\nkind: ConfigMap\n")
    (tmp_path / "claim.yaml").write_text(f"apiVersion: {names.API_VERSION}\nkind: NodeClaim\n---\n")
    assert [(where, doc["kind"]) for where, doc in example_objects(tmp_path)] == [("claim.yaml#0", "NodeClaim")]


def test_broken_example_fails_schema() -> None:
    group = copy.deepcopy(next(doc for _, doc in EXAMPLES if doc["kind"] == names.KIND_GROUP))
    group["spec"]["nodeTaints"] = [{"key": "k", "effect": "Sometimes"}]
    messages = [error.message for error in validator(names.KIND_GROUP).iter_errors(group)]
    assert any("Sometimes" in message for message in messages), messages


@pytest.mark.parametrize(
    ("kind", "mutate", "needle"),
    [
        (names.KIND_GROUP, lambda d: d["spec"].update(maxNodeProvisionTime="15 minutes"), "15 minutes"),
        (names.KIND_GROUP, lambda d: d["spec"].update(minSize=-1), "-1"),
        (names.KIND_GROUP, lambda d: d["spec"].pop("maxSize"), "maxSize"),
        (names.KIND_NODECLAIM, lambda d: d["spec"].update(requestedAt="yesterday"), "yesterday"),
        (names.KIND_NODECLAIM, lambda d: d["spec"].update(ttlSecondsAfterFinished=-5), "-5"),
        (names.KIND_NODE, lambda d: d["spec"]["startupPodSpec"].pop("image"), "image"),
    ],
)
def test_broken_examples_fail_schema(kind: str, mutate: Any, needle: str) -> None:
    doc = copy.deepcopy(next(doc for _, doc in EXAMPLES if doc["kind"] == kind))
    mutate(doc)
    messages = [error.message for error in validator(kind).iter_errors(doc)]
    assert any(needle in message for message in messages), messages


def test_nullable_translation() -> None:
    """`nullable` only adds null to the type: an enum still judges a null, as kube-openapi's validator does."""
    schema = {"type": "string", "nullable": True, "enum": ["a"], "x-kubernetes-list-type": "atomic"}
    assert to_json_schema(schema) == {"type": ["string", "null"], "enum": ["a"]}
    validator = jsonschema.Draft202012Validator(to_json_schema(schema))
    assert not validator.is_valid(None), "a null is not one of the enum's values"
    assert jsonschema.Draft202012Validator(to_json_schema({"type": "string", "nullable": True})).is_valid(None)


@pytest.mark.parametrize("kind", [names.KIND_GROUP, names.KIND_NODE, names.KIND_NODECLAIM])
def test_no_optional_enum_is_nullable(kind: str) -> None:
    """kube-openapi checks a null against `enum` even when the field is `nullable`, so a nullable enum without a
    null member only makes the API server refuse `field: null`; an optional enum is left non-nullable instead,
    and the server prunes the null (structural schemas prune nulls of non-nullable fields before validating).
    """
    for path, node in walk(crd_schemas()[kind]):
        assert not ("enum" in node and node.get("nullable")), f"{kind}{path}: nullable enum"
        assert None not in node.get("enum", []), f"{kind}{path}: null in an enum"
    tolerations = crd_schemas()[names.KIND_NODE]["properties"]["spec"]["properties"]["startupPodSpec"]
    assert "nullable" not in tolerations["properties"]["tolerations"]["items"]["properties"]["effect"]
