"""The Helm chart (charts/homelab-autoscaler) renders what deploy/ renders, refuses a bad value by its name, and
follows the project's version.

Rendering needs `helm` and `kubectl`, both built by `make cluster-bins` (tests/realcluster/build.sh) into the
cluster-bins cache: `make test` skips those tests and names the missing binary when they are not built yet, and
`make e2e-real`, which builds them first, runs this file again with HOMELAB_E2E_REAL=1, under which a missing binary
fails instead. The chart is rendered as `helm template --include-crds` renders it, deploy/ as `kubectl kustomize`.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import subprocess
import tempfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.realcluster.cluster import bin_dir
from tests.test_deploy import _deploy_dir, _role_variables, validate

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "homelab-autoscaler"
NS = "homelab-autoscaler-system"
REQUIRED = os.environ.get("HOMELAB_E2E_REAL", "") not in ("", "0")


def _tool(name: str) -> Path | None:
    path = bin_dir() / name
    return path if path.is_file() else None


def _tools_problem() -> str | None:
    missing = [name for name in ("helm", "kubectl") if _tool(name) is None]
    if not missing:
        return None
    return f"{' and '.join(missing)} not built in {bin_dir()}: `make cluster-bins` builds them (Go >= 1.26)"


TOOLS_PROBLEM = _tools_problem()


@pytest.fixture
def tools() -> None:
    """Skip (in `make test`) or fail (under `make e2e-real`, which builds them) when helm or kubectl is missing."""
    if TOOLS_PROBLEM is None:
        return
    if REQUIRED:
        pytest.fail(f"make e2e-real must render the chart: {TOOLS_PROBLEM}")
    pytest.skip(TOOLS_PROBLEM)


HELM_HOME = tempfile.TemporaryDirectory(prefix="homelab-chart-helm-")  # removed when the run ends


def _run(args: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """A helm or kubectl command, with helm's own directories kept out of the user's home."""
    home = Path(HELM_HOME.name)
    env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data"), "KUBECONFIG": os.devnull}  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False)
    if check and done.returncode != 0:
        raise AssertionError(f"`{' '.join(args)}` failed ({done.returncode}):\n{done.stderr}")
    return done


def helm_template(values: dict[str, Any] | None = None, *, namespace: str = NS,
                  check: bool = True) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`helm template` of the chart as a user installs it (CRDs included), with `values` as a values file."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="values-") as file:
        file.write(yaml.safe_dump(values or {}))
        file.flush()
        return _run([str(_tool("helm")), "template", "homelab-autoscaler", str(CHART), "--namespace", namespace,
                     "--include-crds", "--values", file.name], check=check)  # fmt: skip


def chart(values: dict[str, Any] | None = None, *, namespace: str = NS) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(helm_template(values, namespace=namespace).stdout) if d]


@functools.cache
def _kustomize_text(path: str) -> str:
    return _run([str(_tool("kubectl")), "kustomize", str(_deploy_dir() / path)]).stdout


def kustomize(path: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(_kustomize_text(path)) if d]


# --- comparing two renders ----------------------------------------------------------------------------------
# Lists whose items Kubernetes merges by name, so their order means nothing (env would, through $(VAR) references:
# `_normalise` refuses to sort an env that has one). kustomize's strategic merge puts a patch's entries first; the
# chart writes them where they read best.
BY_NAME = {"containers", "initContainers", "env", "ports", "volumeMounts", "volumes"}


def _normalise(node: Any, key: str = "") -> Any:
    if isinstance(node, dict):
        return {k: _normalise(v, k) for k, v in node.items()}
    if isinstance(node, list):
        items = [_normalise(item) for item in node]
        if key in BY_NAME and all(isinstance(i, dict) and "name" in i for i in items):
            names = [i["name"] for i in items]
            assert len(names) == len(set(names)), f"{key} names an entry twice: {names}"
            if key == "env":
                refs = [i["name"] for i in items if "$(" in str(i.get("value", ""))]
                assert not refs, f"env order matters once a value refers to another ({refs}): compare it in order"
            return sorted(items, key=lambda i: str(i["name"]))
        return items
    return node


def _key(doc: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = doc["metadata"]
    return doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"]


def differences(deploy: list[dict[str, Any]], helm: list[dict[str, Any]]) -> list[str]:
    """What tells the two renders apart, object by object (a unified diff of each object that differs)."""
    ours = {_key(d): _normalise(d) for d in deploy}
    theirs = {_key(d): _normalise(d) for d in helm}
    assert len(ours) == len(deploy) and len(theirs) == len(helm), "a render holds an object twice"
    found = [f"only in deploy/: {k}" for k in sorted(set(ours) - set(theirs))]
    found += [f"only in the chart: {k}" for k in sorted(set(theirs) - set(ours))]
    for k in sorted(set(ours) & set(theirs)):
        if ours[k] != theirs[k]:
            a = yaml.safe_dump(ours[k], sort_keys=True).splitlines()
            b = yaml.safe_dump(theirs[k], sort_keys=True).splitlines()
            diff = "\n".join(difflib.unified_diff(a, b, "deploy/", "chart", lineterm="", n=2))
            found.append(f"{k}:\n{diff}")
    return found


def _without_the_namespace(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """deploy/ renders the Namespace; the chart leaves it to `--create-namespace`, so that `helm uninstall` never
    deletes the namespace and with it every Group, slot and claim in it."""
    namespaces = [d for d in docs if d["kind"] == "Namespace"]
    assert [d["metadata"]["name"] for d in namespaces] == [NS]
    return [d for d in docs if d["kind"] != "Namespace"]


# The kustomizations a user applies, and the values that ask the chart for the same install.
TEMPORAL_CLUSTER = {
    "temporal": {
        "devServer": {"enabled": False},
        "address": "temporal-frontend.temporal.svc.cluster.local:7233",
        "namespace": "homelab",
        "tls": {"secretName": "temporal-client-tls"},
    }
}
VARIANTS: dict[str, dict[str, Any]] = {
    "overlays/homelab": {},
    "overlays/homelab-mtls": {"certManager": {"enabled": True}, "admission": {"enabled": True}},
    "overlays/split": {"split": {"enabled": True}},
    "overlays/temporal-cluster": TEMPORAL_CLUSTER,
}


@pytest.mark.usefixtures("tools")
@pytest.mark.parametrize("path", VARIANTS)
def test_the_chart_renders_what_deploy_renders(path: str) -> None:
    """Object for object and field for field: the defaults against overlays/homelab, and the values of each other
    overlay against it. A change to deploy/ that the chart does not follow (or the reverse) fails here."""
    deploy = _without_the_namespace(kustomize(path))
    helm = chart(VARIANTS[path])
    found = differences(deploy, helm)
    assert not found, f"the chart ({VARIANTS[path] or 'defaults'}) and deploy/{path} differ:\n" + "\n".join(found)


@pytest.mark.usefixtures("tools")
def test_split_with_mtls_and_the_webhook_renders_what_the_components_render(tmp_path: Path) -> None:
    """docs/install.md's combination of components (split listed first) against the same three switches."""
    deploy = _deploy_dir()
    kustomization = {
        "namespace": NS,
        "resources": [os.path.relpath(deploy / "overlays" / "homelab", tmp_path)],
        "components": [os.path.relpath(deploy / "components" / c, tmp_path) for c in ("split", "cert-manager",
                                                                                        "admission")],
    }  # fmt: skip
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    rendered = [d for d in yaml.safe_load_all(_run([str(_tool("kubectl")), "kustomize", str(tmp_path)]).stdout) if d]
    values = {"split": {"enabled": True}, "certManager": {"enabled": True}, "admission": {"enabled": True}}
    found = differences(_without_the_namespace(rendered), chart(values))
    assert not found, "\n".join(found)


@pytest.mark.usefixtures("tools")
def test_helm_lint_finds_nothing_to_warn_of() -> None:
    done = _run([str(_tool("helm")), "lint", "--strict", str(CHART)], check=False)
    assert done.returncode == 0 and "[WARNING]" not in done.stdout, done.stdout + done.stderr


# --- values users change ------------------------------------------------------------------------------------
def _workloads(docs: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    yield from (d for d in docs if d["kind"] in ("Deployment", "StatefulSet"))


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _check_rendered(docs: list[dict[str, Any]]) -> None:
    """Every object valid for its kind, and every HOMELAB_AUTOSCALER_* variable a setting of its container's role."""
    failures = []
    for doc in docs:
        try:
            validate(doc)
        except Exception as exc:
            failures.append(f"{doc['kind']} {doc['metadata']['name']}: {str(exc).splitlines()[0]}")
    for doc in _workloads(docs):
        for c in doc["spec"]["template"]["spec"]["containers"]:
            if c.get("command") == ["temporal"]:
                continue
            unknown = set(_env(c)) - _role_variables(c["args"][0])
            if unknown:
                failures.append(f"{doc['metadata']['name']}: not settings of `{c['args'][0]}`: {sorted(unknown)}")
    assert not failures, "\n".join(failures)


PLACEMENT = {
    "nodeSelector": {"homelab.dev/infra": "true"},
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "homelab.dev/machine", "operator": "DoesNotExist"}]}]}}},
    "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}],
}  # fmt: skip
RESOURCES = {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


@pytest.mark.usefixtures("tools")
@pytest.mark.parametrize("split", [False, True], ids=["run", "split"])
def test_the_values_users_change_reach_every_pod(split: bool) -> None:
    values = {
        "image": {"repository": "registry.lan:5000/homelab-autoscaler", "tag": "v9", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "lan-registry"}],
        "commonLabels": {"homelab.dev/owner": "me"},
        "operator": {**PLACEMENT, "resources": RESOURCES, "logLevel": "DEBUG", "podAnnotations": {"a.b/c": "d"},
                     "extraEnv": [{"name": "HOMELAB_AUTOSCALER_LOG_FORMAT", "value": "json"}]},
        "temporal": {"devServer": {**PLACEMENT, "resources": RESOURCES, "logLevel": "info",
                                   "storage": {"size": "5Gi", "storageClassName": "local-path"}}},
        "split": {"enabled": split, "worker": {"replicas": 3}},
    }  # fmt: skip
    docs = chart(values)
    _check_rendered(docs)
    workloads = list(_workloads(docs))
    assert len(workloads) == (4 if split else 2)
    for doc in workloads:
        pod = doc["spec"]["template"]["spec"]
        name = doc["metadata"]["name"]
        assert {k: pod.get(k) for k in PLACEMENT} == PLACEMENT, name
        assert pod["imagePullSecrets"] == [{"name": "lan-registry"}], name
        (c,) = pod["containers"]
        assert c["image"] == "registry.lan:5000/homelab-autoscaler:v9" and c["imagePullPolicy"] == "Always", name
        assert c["resources"] == RESOURCES, name
        if c.get("command") == ["temporal"]:
            assert c["args"][c["args"].index("--log-level") + 1] == "info"
            (claim,) = doc["spec"]["volumeClaimTemplates"]
            assert claim["spec"]["storageClassName"] == "local-path"
            assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
        else:
            env = _env(c)
            assert env["HOMELAB_AUTOSCALER_LOG_LEVEL"] == "DEBUG" and env["HOMELAB_AUTOSCALER_LOG_FORMAT"] == "json"
            # Helm merges maps: a user's annotations join the default that keeps cluster-autoscaler from evicting it.
            assert doc["spec"]["template"]["metadata"]["annotations"] == {
                "a.b/c": "d", "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}  # fmt: skip
    if split:
        replicas = {d["metadata"]["name"]: d["spec"]["replicas"] for d in workloads if d["kind"] == "Deployment"}
        assert replicas == {"homelab-autoscaler-worker": 3, "homelab-autoscaler-provider": 1,
                            "homelab-autoscaler-watch": 2}  # fmt: skip
    for doc in docs:
        if doc["kind"] != "CustomResourceDefinition":
            assert doc["metadata"]["labels"]["homelab.dev/owner"] == "me", doc["metadata"]["name"]


@pytest.mark.usefixtures("tools")
def test_an_install_in_another_namespace_is_whole_there() -> None:
    """Everything that names the namespace follows the release's: the objects, the RBAC subjects, the certificates'
    DNS names, the webhook's exemption of the operator, and the namespaces the operator manages."""
    ns = "homelab"
    values = {"certManager": {"enabled": True}, "admission": {"enabled": True}}
    docs = chart(values, namespace=ns)
    _check_rendered(docs)
    text = yaml.safe_dump_all(docs)
    assert NS not in text, "the default namespace is written somewhere"
    for doc in docs:
        if doc["kind"] not in ("CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                               "ValidatingWebhookConfiguration"):  # fmt: skip
            assert doc["metadata"]["namespace"] == ns, doc["metadata"]["name"]
    (vwc,) = [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    (spared,) = [c["expression"] for c in vwc["webhooks"][0]["matchConditions"] if c["name"] == "not-the-operator"]
    assert spared == f"request.userInfo.username != 'system:serviceaccount:{ns}:homelab-autoscaler'"
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    assert _env(dep["spec"]["template"]["spec"]["containers"][0])["HOMELAB_AUTOSCALER_NAMESPACES"] == ns
    # Named explicitly, the managed namespaces are the ones given (the default's are never written: deploy/'s).
    docs = chart({"split": {"enabled": True}, "operator": {"namespaces": ["lab-a", "lab-b"]}})
    managed = {d["metadata"]["name"]: _env(d["spec"]["template"]["spec"]["containers"][0]).get(
        "HOMELAB_AUTOSCALER_NAMESPACES") for d in docs if d["kind"] == "Deployment"}  # fmt: skip
    assert managed == {"homelab-autoscaler-worker": None, "homelab-autoscaler-provider": "lab-a,lab-b",
                       "homelab-autoscaler-watch": "lab-a,lab-b"}  # fmt: skip


@pytest.mark.usefixtures("tools")
def test_an_existing_temporal_with_an_api_key_and_no_dev_server() -> None:
    values = {"temporal": {"devServer": {"enabled": False}, "address": "my-ns.a1b2c.tmprl.cloud:7233",
                           "namespace": "my-ns.a1b2c", "apiKey": {"secretName": "temporal-cloud"},
                           "tls": {"serverName": "my-ns.a1b2c.tmprl.cloud"}}}  # fmt: skip
    docs = chart(values)
    _check_rendered(docs)
    assert not [d for d in docs if d["metadata"]["name"].startswith("temporal")], "no dev server, no Services"
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    env = _env(dep["spec"]["template"]["spec"]["containers"][0])
    assert env["HOMELAB_AUTOSCALER_TEMPORAL_ADDRESS"] == "my-ns.a1b2c.tmprl.cloud:7233"
    assert env["HOMELAB_AUTOSCALER_TEMPORAL_API_KEY"] == {"secretKeyRef": {"name": "temporal-cloud", "key": "api-key"}}
    assert env["HOMELAB_AUTOSCALER_TEMPORAL_TLS_SERVER_NAME"] == "my-ns.a1b2c.tmprl.cloud"
    assert "HOMELAB_AUTOSCALER_TEMPORAL_TLS_CERT" not in env


# --- bad values ---------------------------------------------------------------------------------------------
BAD_VALUES = [
    ({"image": {"tag": 1}}, "/image/tag"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"spilt": {"enabled": True}}, "spilt"),
    ({"operator": {"logLevel": "LOUD"}}, "/operator/logLevel"),
    ({"operator": {"namespaces": ["Lab_A"]}}, "/operator/namespaces/0"),
    ({"operator": {"resources": {"requests": {"cpu": "lots"}}}}, "/operator/resources/requests/cpu"),
    ({"operator": {"tolerations": [{"key": "a", "efect": "NoSchedule"}]}}, "efect"),
    ({"split": {"worker": {"replicas": -1}}}, "/split/worker/replicas"),
    ({"temporal": {"address": "no-port"}}, "/temporal/address"),
    ({"temporal": {"devServer": {"storage": {"size": "a lot"}}}}, "/temporal/devServer/storage/size"),
    ({"temporal": {"devServer": {"enabled": False}}}, "temporal.address"),
    ({"temporal": {"address": "temporal.example:7233"}}, "temporal.address"),
    ({"admission": {"enabled": True}}, "admission.enabled"),
]


@pytest.mark.usefixtures("tools")
@pytest.mark.parametrize(("values", "named"), BAD_VALUES, ids=[n for _, n in BAD_VALUES])
def test_a_bad_value_is_refused_naming_it(values: dict[str, Any], named: str) -> None:
    done = helm_template(values, check=False)
    assert done.returncode != 0 and not done.stdout.strip(), f"{values} was rendered:\n{done.stdout[:500]}"
    assert named in done.stderr, f"the refusal of {values} does not name {named}:\n{done.stderr}"


# --- without helm: the files themselves ----------------------------------------------------------------------
SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def test_the_defaults_satisfy_the_schema() -> None:
    jsonschema.validators.validator_for(SCHEMA)(SCHEMA).validate(VALUES)


def _keys(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        yield f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _keys(value, f"{prefix}{key}.")


def _schema_keys(schema: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, bool]]:
    """Every key the schema names, and whether its value is a closed object (one whose keys it names too)."""
    for key, node in schema.get("properties", {}).items():
        if "$ref" in node:
            node = SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[1]]
        closed = node.get("additionalProperties") is False
        yield f"{prefix}{key}", closed
        if closed:
            yield from _schema_keys(node, f"{prefix}{key}.")


def test_every_value_has_a_default_and_a_schema() -> None:
    """values.yaml documents every value the schema accepts, and the schema closes every object values.yaml has
    (but the open ones: resources, affinity, labels)."""
    named = dict(_schema_keys(SCHEMA))
    del named["global"]
    defaults = {k for k in _keys(VALUES) if "." not in k or named.get(k.rsplit(".", 1)[0], False)}
    assert defaults == set(named)


def _semver(version: str) -> str:
    """The project's PEP 440 version as SemVer, which Helm requires of a chart: 0.2.0a0 is 0.2.0-alpha.0, the
    development version after a release (0.4.0.dev0) is 0.4.0-dev.0."""
    m = re.fullmatch(r"(\d+\.\d+\.\d+)(?:(a|b|rc|\.dev)(\d+))?", version)
    assert m, f"{version}: teach _semver this form of version"
    if not m[2]:
        return m[1]
    return f"{m[1]}-{ {'a': 'alpha', 'b': 'beta', 'rc': 'rc', '.dev': 'dev'}[m[2]] }.{m[3]}"


def test_the_chart_is_the_projects_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["appVersion"] == project, "appVersion is the image's tag: the project's version as written"
    assert meta["version"] == _semver(project), f"Chart.yaml `version: {_semver(project)}` (SemVer of {project})"
    assert (
        _semver("1.2.3") == "1.2.3" and _semver("1.0.0rc2") == "1.0.0-rc.2" and _semver("0.4.0.dev0") == "0.4.0-dev.0"
    )


def test_every_kustomization_names_the_image_of_this_version() -> None:
    """The chart's default image is `appVersion`; deploy/'s are the `newTag`s, which a release bumps with it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    released = yaml.safe_load((CHART / "values.yaml").read_text())["image"]["repository"]
    tags = {
        str(path.relative_to(ROOT)): entry.get("newTag")
        for path in sorted((ROOT / "deploy").rglob("kustomization.yaml"))
        for entry in (yaml.safe_load(path.read_text()) or {}).get("images", [])
        if entry.get("newName") == released
    }
    assert len(tags) >= 4, tags
    assert set(tags.values()) == {project}, tags
