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
from tests.test_network_policies import _template

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


def helm_template(values: dict[str, Any] | None = None, *, namespace: str = NS, check: bool = True,
                  api_versions: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """`helm template` of the chart as a user installs it (CRDs included), with `values` as a values file (and
    `api_versions` as kinds the cluster would serve)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="values-") as file:
        file.write(yaml.safe_dump(values or {}))
        file.flush()
        return _run([str(_tool("helm")), "template", "homelab-autoscaler", str(CHART), "--namespace", namespace,
                     "--include-crds", "--values", file.name,
                     *(a for v in api_versions for a in ("--api-versions", v))], check=check)  # fmt: skip


def chart(values: dict[str, Any] | None = None, *, namespace: str = NS,
          api_versions: tuple[str, ...] = ()) -> list[dict[str, Any]]:  # fmt: skip
    text = helm_template(values, namespace=namespace, api_versions=api_versions).stdout
    return [d for d in yaml.safe_load_all(text) if d]


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


# The chart names a Job by its Pod template's digest (an upgrade creates a new Job where the template changed);
# deploy/ by a fixed name (its upgrade deletes the Job before the apply, docs/upgrades.md).
JOB_DIGEST = re.compile(r"-[0-9a-f]{10}$")


def _key(doc: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = doc["metadata"]
    name = JOB_DIGEST.sub("", meta["name"]) if doc["kind"] == "Job" else meta["name"]
    return doc["apiVersion"], doc["kind"], meta.get("namespace", ""), name


def _comparable(doc: dict[str, Any]) -> Any:
    named = {**doc, "metadata": {**doc["metadata"], "name": _key(doc)[3]}}
    return _normalise(named)


def differences(deploy: list[dict[str, Any]], helm: list[dict[str, Any]]) -> list[str]:
    """What tells the two renders apart, object by object (a unified diff of each object that differs)."""
    ours = {_key(d): _comparable(d) for d in deploy}
    theirs = {_key(d): _comparable(d) for d in helm}
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


def _without_the_development_label_on_the_crds(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """deploy/overlays/dev-server labels every object development-only, its CRDs too; the chart's CRDs are files
    Helm applies untemplated (crds/), so that one label on them is the one thing the chart cannot render."""
    out = []
    for doc in docs:
        if doc["kind"] == "CustomResourceDefinition":
            doc = json.loads(json.dumps(doc))
            labels = doc["metadata"]["labels"]
            assert labels.pop(DEVELOPMENT_ONLY) == "true", doc["metadata"]["name"]
        out.append(doc)
    return out


# The kustomizations a user applies, and the values that ask the chart for the same install.
DEVELOPMENT_ONLY = "homelab-autoscaler.dev/development-only"
NO_BUNDLED: dict[str, Any] = {"bundled": {"enabled": False}}
DEV_SERVER: dict[str, Any] = {"temporal": {**NO_BUNDLED, "devServer": {"enabled": True}}}
TEMPORAL_CLUSTER = {
    "temporal": {
        **NO_BUNDLED,
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
    "overlays/dev-server": DEV_SERVER,
}


@pytest.mark.usefixtures("tools")
@pytest.mark.parametrize("path", VARIANTS)
def test_the_chart_renders_what_deploy_renders(path: str) -> None:
    """Object for object and field for field: the defaults against overlays/homelab, and the values of each other
    overlay against it. A change to deploy/ that the chart does not follow (or the reverse) fails here."""
    deploy = _without_the_namespace(kustomize(path))
    if path == "overlays/dev-server":
        deploy = _without_the_development_label_on_the_crds(deploy)
    helm = chart(VARIANTS[path])
    found = differences(deploy, helm)
    assert not found, f"the chart ({VARIANTS[path] or 'defaults'}) and deploy/{path} differ:\n" + "\n".join(found)


@pytest.mark.usefixtures("tools")
def test_the_default_install_is_temporal_on_postgresql_never_the_dev_server() -> None:
    """Temporal's guide calls start-dev and SQLite development-only: the chart's defaults render neither, and only
    the dev server's opt-in carries the development-only label."""
    text = helm_template().stdout
    assert "start-dev" not in text and "--db-filename" not in text and DEVELOPMENT_ONLY not in text
    kinds = {(d["kind"], d["metadata"]["name"]) for d in chart()
             if d["metadata"]["name"].startswith("temporal") and d["kind"] != "NetworkPolicy"}  # fmt: skip
    assert kinds == {
        ("StatefulSet", "temporal-postgresql"),
        ("Service", "temporal-postgresql"),
        ("Service", "temporal-postgresql-headless"),
        ("ConfigMap", "temporal-config"),
        ("Deployment", "temporal-server"),
        ("Service", "temporal-frontend"),
        ("Deployment", "temporal-web"),
        ("Service", "temporal-web"),
    }
    dev = helm_template(DEV_SERVER).stdout
    assert "start-dev" in dev and "temporal-postgresql" not in dev
    assert all(d["metadata"]["labels"][DEVELOPMENT_ONLY] == "true" for d in chart(DEV_SERVER)
               if d["kind"] != "CustomResourceDefinition")  # fmt: skip


@pytest.mark.usefixtures("tools")
def test_split_with_mtls_and_the_webhook_renders_what_the_components_render(tmp_path: Path) -> None:
    """Your own overlay as docs/install.md says to write one (split listed first, then temporal, so every role's
    Deployment gets the bundled Temporal's setup step; cert-manager after admission), with the homelab overlay's
    labels and image, against the same switches."""
    deploy = _deploy_dir()
    homelab = yaml.safe_load((deploy / "overlays" / "homelab" / "kustomization.yaml").read_text())
    kustomization = {
        "namespace": NS,
        "resources": [os.path.relpath(deploy / "base", tmp_path)],
        "components": [os.path.relpath(deploy / "components" / c, tmp_path) for c in ("split", "temporal",
                                                                                        "admission", "cert-manager")],
        "labels": homelab["labels"],
        "images": homelab["images"],
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


def _operator_containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The containers of `doc` that run a `homelab-autoscaler` command (its roles, and the bundled Temporal's setup
    step), not the Temporal and PostgreSQL images, nor the dev server's `temporal` CLI."""
    pod = doc["spec"]["template"]["spec"]
    for c in [*pod.get("initContainers", []), *pod["containers"]]:
        if c["name"] in ("homelab-autoscaler", "temporal-setup"):
            yield c


@functools.cache
def _command_variables(command: str) -> frozenset[str]:
    """The HOMELAB_AUTOSCALER_* variables `homelab-autoscaler <command>` reads: its sections' settings, and its own
    options' (temporal-setup's HOMELAB_AUTOSCALER_POD_NAMESPACE)."""
    from homelab_autoscaler import cli

    params = cli.build_cli().commands[command].params
    return frozenset(_role_variables(command) | {str(p.envvar) for p in params if isinstance(p.envvar, str)})


def _check_rendered(docs: list[dict[str, Any]]) -> None:
    """Every object valid for its kind, every HOMELAB_AUTOSCALER_* variable a setting of its container's command,
    and every variable the bundled server's configuration reads set in its container."""
    failures = []
    for doc in docs:
        try:
            validate(doc)
        except Exception as exc:
            failures.append(f"{doc['kind']} {doc['metadata']['name']}: {str(exc).splitlines()[0]}")
    for doc in _workloads(docs):
        for c in _operator_containers(doc):
            unknown = set(_env(c)) - _command_variables(c["args"][0])
            if unknown:
                failures.append(f"{doc['metadata']['name']}: not settings of `{c['args'][0]}`: {sorted(unknown)}")
    configs = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "temporal-config"]
    for config in configs:
        (server,) = _named(docs, "Deployment", "temporal-server")["spec"]["template"]["spec"]["containers"]
        read = set(re.findall(r'env "([A-Z_]+)"', config["data"]["config.yaml"]))
        # The TLS ones have defaults in the file (`| default "false"`), set only for an external PostgreSQL's TLS.
        unset = {name for name in read - set(_env(server)) if not name.startswith("POSTGRES_TLS_")}
        if unset:
            failures.append(f"temporal-server: its configuration reads {sorted(unset)}, its container sets none")
    assert not failures, "\n".join(failures)


def _named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def _container(doc: dict[str, Any], name: str) -> dict[str, Any]:
    pod = doc["spec"]["template"]["spec"]
    (c,) = [c for c in [*pod.get("initContainers", []), *pod["containers"]] if c["name"] == name]
    return dict(c)


PLACEMENT = {
    "nodeSelector": {"homelab.dev/infra": "true"},
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "homelab.dev/machine", "operator": "DoesNotExist"}]}]}}},
    "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}],
}  # fmt: skip
RESOURCES = {"requests": {"cpu": "200m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
# The bundled Temporal's images from a registry of the user's, each under another tag, so a mix-up shows.
IMAGES = {key: {"repository": f"registry.lan:5000/{key.lower()}", "tag": f"{key}-1"}
          for key in ("server", "adminTools", "ui", "postgresql")}  # fmt: skip
OPERATOR_IMAGE = "registry.lan:5000/homelab-autoscaler:v9"


def _common_values(split: bool) -> dict[str, Any]:
    return {
        "image": {"repository": "registry.lan:5000/homelab-autoscaler", "tag": "v9", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "lan-registry"}],
        "commonLabels": {"homelab.dev/owner": "me"},
        "operator": {**PLACEMENT, "resources": RESOURCES, "logLevel": "DEBUG", "podAnnotations": {"a.b/c": "d"},
                     "extraEnv": [{"name": "HOMELAB_AUTOSCALER_LOG_FORMAT", "value": "json"}]},
        "split": {"enabled": split, "worker": {"replicas": 3}},
    }  # fmt: skip


def _check_every_pod(docs: list[dict[str, Any]], split: bool) -> None:
    """What _common_values asks of every workload: placement, pull Secrets, annotations, labels, the operator's
    image, resources and settings."""
    for doc in _workloads(docs):
        pod = doc["spec"]["template"]["spec"]
        name = doc["metadata"]["name"]
        assert {k: pod.get(k) for k in PLACEMENT} == PLACEMENT, name
        assert pod["imagePullSecrets"] == [{"name": "lan-registry"}], name
        # Helm merges maps: a user's annotations join the default that keeps cluster-autoscaler from evicting it.
        assert doc["spec"]["template"]["metadata"]["annotations"] == {
            "a.b/c": "d", "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}, name  # fmt: skip
        for c in _operator_containers(doc):
            assert c["image"] == OPERATOR_IMAGE and c["imagePullPolicy"] == "Always", name
            if c["name"] == "homelab-autoscaler":
                assert c["resources"] == RESOURCES, name
                env = _env(c)
                assert env["HOMELAB_AUTOSCALER_LOG_LEVEL"] == "DEBUG", name
                assert env["HOMELAB_AUTOSCALER_LOG_FORMAT"] == "json", name
    if split:
        replicas = {d["metadata"]["name"]: d["spec"]["replicas"] for d in _workloads(docs)
                    if d["metadata"]["labels"]["app.kubernetes.io/name"] == "homelab-autoscaler"}  # fmt: skip
        assert replicas == {"homelab-autoscaler-worker": 3, "homelab-autoscaler-provider": 1,
                            "homelab-autoscaler-watch": 2}  # fmt: skip
    for doc in docs:
        if doc["kind"] != "CustomResourceDefinition":
            assert doc["metadata"]["labels"]["homelab.dev/owner"] == "me", doc["metadata"]["name"]


@pytest.mark.usefixtures("tools")
@pytest.mark.parametrize("split", [False, True], ids=["run", "split"])
def test_the_values_users_change_reach_every_pod(split: bool) -> None:
    """The bundled Temporal's images, resources, volume, placement, retention and password Secret, and the
    operator's values, each where it belongs."""
    values = _common_values(split)
    values["temporal"] = {"namespace": "homelab", "bundled": {
        **PLACEMENT, "podAnnotations": {"a.b/c": "d"}, "images": IMAGES, "retention": "30d",
        "postgresql": {"resources": RESOURCES, "passwordSecret": "my-pg",
                       "storage": {"size": "5Gi", "storageClassName": "local-path"}},
        "server": {"resources": {"requests": {"cpu": "1"}}}, "web": {"resources": {"limits": {"memory": "64Mi"}}},
    }}  # fmt: skip
    docs = chart(values)
    _check_rendered(docs)
    _check_every_pod(docs, split)
    workloads = {d["metadata"]["name"] for d in _workloads(docs)}
    operators = {"homelab-autoscaler-worker", "homelab-autoscaler-provider", "homelab-autoscaler-watch"} if split \
        else {"homelab-autoscaler"}  # fmt: skip
    assert workloads == operators | {"temporal-postgresql", "temporal-server", "temporal-web"}
    # Merged with the defaults, key by key, as Helm merges maps.
    pg = _named(docs, "StatefulSet", "temporal-postgresql")
    assert _container(pg, "postgresql")["image"] == "registry.lan:5000/postgresql:postgresql-1"
    assert _container(pg, "postgresql")["resources"] == RESOURCES
    (claim,) = pg["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "local-path"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    server = _named(docs, "Deployment", "temporal-server")
    assert _container(server, "server")["image"] == "registry.lan:5000/server:server-1"
    assert _container(server, "server")["resources"] == {"requests": {"cpu": "1", "memory": "256Mi"},
                                                         "limits": {"memory": "1Gi"}}  # fmt: skip
    assert _container(server, "schema")["image"] == "registry.lan:5000/admintools:adminTools-1"
    web = _named(docs, "Deployment", "temporal-web")
    assert _container(web, "web")["image"] == "registry.lan:5000/ui:ui-1"
    assert _container(web, "web")["resources"] == {"requests": {"cpu": "10m", "memory": "32Mi"},
                                                   "limits": {"memory": "64Mi"}}  # fmt: skip
    assert _env(_container(web, "web"))["TEMPORAL_DEFAULT_NAMESPACE"] == "homelab"
    # The password Secret: PostgreSQL's, the server's and its schema step's, the setup step's to create, the one
    # Secret the setup step may read.
    secret = {"secretKeyRef": {"name": "my-pg", "key": "password"}}
    assert _env(_container(pg, "postgresql"))["POSTGRES_PASSWORD"] == secret
    assert _env(_container(server, "server"))["POSTGRES_PWD"] == secret
    assert _env(_container(server, "schema"))["SQL_PASSWORD"] == secret
    role = _named(docs, "Role", "homelab-autoscaler-temporal-setup")
    assert [r["resourceNames"] for r in role["rules"] if "get" in r["verbs"]] == [["my-pg"]]
    for name in operators:
        setup = _container(_named(docs, "Deployment", name), "temporal-setup")
        assert setup["args"] == ["temporal-setup", "--retention", "30d", "--postgresql-secret", "my-pg"], name
        assert _env(setup)["HOMELAB_AUTOSCALER_TEMPORAL_NAMESPACE"] == "homelab", name


@pytest.mark.usefixtures("tools")
def test_the_development_only_dev_server_takes_its_own_values() -> None:
    values = {**_common_values(False), "temporal": {**NO_BUNDLED, "devServer": {
        "enabled": True, **PLACEMENT, "podAnnotations": {"a.b/c": "d"}, "resources": RESOURCES, "logLevel": "info",
        "storage": {"size": "5Gi", "storageClassName": "local-path"}}}}  # fmt: skip
    docs = chart(values)
    _check_rendered(docs)
    _check_every_pod(docs, False)
    assert {d["metadata"]["name"] for d in _workloads(docs)} == {"homelab-autoscaler", "temporal"}
    operator = _named(docs, "Deployment", "homelab-autoscaler")
    assert "initContainers" not in operator["spec"]["template"]["spec"], "the dev server needs no setup step"
    sts = _named(docs, "StatefulSet", "temporal")
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    # Temporal's own CLI from its admin-tools image, as that image's user: the operator's image has no dev server.
    assert c["command"] == ["temporal"] and c["image"] == "temporalio/admin-tools:1.32.1"
    assert c["resources"] == RESOURCES
    assert sts["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 1000
    assert c["args"][c["args"].index("--log-level") + 1] == "info"
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "local-path"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"


@pytest.mark.usefixtures("tools")
@pytest.mark.parametrize("split", [False, True])
def test_a_digest_pins_every_operator_container_over_the_tag(split: bool) -> None:
    """image.digest (one platform's image of the index, or the index) wins over the tag in every container that
    runs the operator's image, init containers too (issue 42: the arm64 image installed by its digest)."""
    digest = "sha256:" + "ab" * 32
    values = {**_common_values(split), "image": {**_common_values(split)["image"], "digest": digest}}
    docs = chart(values)
    containers = [c for doc in _workloads(docs) for c in _operator_containers(doc)]
    assert containers and {c["image"] for c in containers} == {f"registry.lan:5000/homelab-autoscaler@{digest}"}


EXTERNAL = {"host": "db.lan", "port": 15432, "user": "temporal_lab", "passwordSecret": "lab-db"}


@pytest.mark.usefixtures("tools")
@pytest.mark.parametrize("tls", ["none", "tls", "tls+ca"])
def test_the_bundled_server_on_an_external_postgresql(tls: str) -> None:
    """No PostgreSQL of the chart's: the server and its schema step reach the one given, with its user and Secret
    (TLS and a CA when asked); the setup step creates no Secret, so it has no Role to."""
    external: dict[str, Any] = {**EXTERNAL, "tls": {"enabled": tls != "none", "caSecret": "lab-db-ca" * (
        tls == "tls+ca")}}  # fmt: skip
    docs = chart({"temporal": {"externalPostgresql": external}})
    _check_rendered(docs)
    assert not [d for d in docs if d["kind"] == "StatefulSet"], "no PostgreSQL StatefulSet"
    assert not [d for d in docs if "postgresql" in d["metadata"]["name"] and d["kind"] != "NetworkPolicy"], (
        "no PostgreSQL Service"
    )
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    assert "temporal-postgresql" not in policies, "no policy for a database the chart does not run"
    (way,) = policies["temporal-server-to-postgresql"]["egress"]
    assert way["ports"] == [{"protocol": "TCP", "port": EXTERNAL["port"]}], way
    assert way["to"] == [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}], way
    assert not [d for d in docs if d["metadata"]["name"] == "homelab-autoscaler-temporal-setup"], "no Secret to make"
    server = _named(docs, "Deployment", "temporal-server")
    env, sql = _env(_container(server, "server")), _env(_container(server, "schema"))
    secret = {"secretKeyRef": {"name": "lab-db", "key": "password"}}
    assert {k: env[f"POSTGRES_{k}"] for k in ("HOST", "PORT", "USER", "PWD")} == {
        "HOST": "db.lan", "PORT": "15432", "USER": "temporal_lab", "PWD": secret}  # fmt: skip
    assert {k: sql[f"SQL_{k}"] for k in ("HOST", "PORT", "USER", "PASSWORD")} == {
        "HOST": "db.lan", "PORT": "15432", "USER": "temporal_lab", "PASSWORD": secret}  # fmt: skip
    ca = "/etc/temporal/postgresql-tls/ca.crt"
    assert env.get("POSTGRES_TLS_ENABLED") == sql.get("SQL_TLS") == ("true" if tls != "none" else None)
    assert env.get("POSTGRES_TLS_CA_FILE") == sql.get("SQL_TLS_CA_FILE") == (ca if tls == "tls+ca" else None)
    volumes = {v["name"]: v for v in server["spec"]["template"]["spec"]["volumes"]}
    if tls == "tls+ca":
        assert volumes["postgresql-tls"]["secret"]["secretName"] == "lab-db-ca"
        for name in ("server", "schema"):
            mounts = {m["name"]: m["mountPath"] for m in _container(server, name).get("volumeMounts", [])}
            assert mounts["postgresql-tls"] == str(Path(ca).parent), name
    else:
        assert "postgresql-tls" not in volumes
    setup = _container(_named(docs, "Deployment", "homelab-autoscaler"), "temporal-setup")
    assert setup["args"] == ["temporal-setup", "--retention", "7d"], "an external PostgreSQL's password is the user's"


@pytest.mark.usefixtures("tools")
def test_an_existing_temporal_with_an_api_key_and_no_bundled_temporal() -> None:
    values = {"temporal": {**NO_BUNDLED, "address": "my-ns.a1b2c.tmprl.cloud:7233",
                           "namespace": "my-ns.a1b2c", "apiKey": {"secretName": "temporal-cloud"},
                           "tls": {"serverName": "my-ns.a1b2c.tmprl.cloud"}}}  # fmt: skip
    docs = chart(values)
    _check_rendered(docs)
    assert not [d for d in docs if d["metadata"]["name"].startswith("temporal")], "no Temporal, no Services"
    assert not [d for d in docs if "temporal-setup" in d["metadata"]["name"]], "no setup step's Role"
    (dep,) = [d for d in docs if d["kind"] == "Deployment"]
    assert "initContainers" not in dep["spec"]["template"]["spec"], "an existing Temporal is set up by its owner"
    env = _env(dep["spec"]["template"]["spec"]["containers"][0])
    assert env["HOMELAB_AUTOSCALER_TEMPORAL_ADDRESS"] == "my-ns.a1b2c.tmprl.cloud:7233"
    assert env["HOMELAB_AUTOSCALER_TEMPORAL_API_KEY"] == {"secretKeyRef": {"name": "temporal-cloud", "key": "api-key"}}
    assert env["HOMELAB_AUTOSCALER_TEMPORAL_TLS_SERVER_NAME"] == "my-ns.a1b2c.tmprl.cloud"
    assert "HOMELAB_AUTOSCALER_TEMPORAL_TLS_CERT" not in env


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
    dep = _named(docs, "Deployment", "homelab-autoscaler")
    assert _env(dep["spec"]["template"]["spec"]["containers"][0])["HOMELAB_AUTOSCALER_NAMESPACES"] == ns
    # Named explicitly, the managed namespaces are the ones given (the default's are never written: deploy/'s).
    docs = chart({"split": {"enabled": True}, "operator": {"namespaces": ["lab-a", "lab-b"]}})
    managed = {d["metadata"]["name"]: _env(d["spec"]["template"]["spec"]["containers"][0]).get(
        "HOMELAB_AUTOSCALER_NAMESPACES") for d in docs if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/name"] == "homelab-autoscaler"}  # fmt: skip
    assert managed == {"homelab-autoscaler-worker": None, "homelab-autoscaler-provider": "lab-a,lab-b",
                       "homelab-autoscaler-watch": "lab-a,lab-b"}  # fmt: skip


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
    (
        {"temporal": {"bundled": {"postgresql": {"storage": {"size": "a lot"}}}}},
        "/temporal/bundled/postgresql/storage/size",
    ),
    ({"temporal": {"bundled": {"retention": "a week"}}}, "/temporal/bundled/retention"),
    ({"temporal": {"bundled": {"retention": "0d"}}}, "/temporal/bundled/retention"),
    ({"temporal": {"bundled": {"images": {"server": {"tag": ""}}}}}, "/temporal/bundled/images/server/tag"),
    ({"temporal": {"bundled": {"postgresql": {"passwordSecret": ""}}}}, "/temporal/bundled/postgresql/passwordSecret"),
    ({"temporal": {"externalPostgresql": {"port": 0}}}, "/temporal/externalPostgresql/port"),
    # One Temporal at a time, and each value of one only with it.
    ({"temporal": NO_BUNDLED}, "temporal.address"),
    ({"temporal": {"address": "temporal.example:7233"}}, "temporal.address"),
    (
        {"temporal": {"address": "temporal.example:7233", "devServer": {"enabled": True}, **NO_BUNDLED}},
        "temporal.address",
    ),
    ({"temporal": {"devServer": {"enabled": True}}}, "temporal.bundled.enabled and temporal.devServer.enabled"),
    ({"temporal": {"tls": {"secretName": "temporal-client-tls"}}}, "temporal.tls.secretName"),
    ({"temporal": {"apiKey": {"secretName": "temporal-cloud"}}}, "temporal.apiKey.secretName"),
    (
        {"temporal": {"externalPostgresql": EXTERNAL, "devServer": {"enabled": True}, **NO_BUNDLED}},
        "temporal.externalPostgresql.host",
    ),
    (
        {"temporal": {"externalPostgresql": {**EXTERNAL, "passwordSecret": ""}}},
        "temporal.externalPostgresql.passwordSecret",
    ),
    ({"temporal": {"externalPostgresql": {"passwordSecret": "lab-db"}}}, "temporal.externalPostgresql.host"),
    (
        {"temporal": {"externalPostgresql": {**EXTERNAL, "tls": {"caSecret": "lab-db-ca"}}}},
        "temporal.externalPostgresql.tls.enabled",
    ),
    ({"provider": {"plaintext": "yes"}}, "/provider/plaintext"),
    ({"networkPolicy": {"apiServerPorts": []}}, "/networkPolicy/apiServerPorts"),
    ({"networkPolicy": {"externalCIDRs": ["lan"]}}, "/networkPolicy/externalCIDRs/0"),
    ({"networkPolicy": {"providerFrom": [{"podSelectr": {}}]}}, "/networkPolicy/providerFrom/0"),
    ({"clusterAutoscaler": {"namespace": "Kube_System"}}, "/clusterAutoscaler/namespace"),
    ({"clusterAutoscaler": {"extraArgs": ["scale-down-enabled=false"]}}, "/clusterAutoscaler/extraArgs/0"),
    (
        {"clusterAutoscaler": {"enabled": True, "namespace": "kube-system"}, "certManager": {"enabled": True}},
        "clusterAutoscaler.namespace",
    ),
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


# --- scraping: a ServiceMonitor or annotations (issue 44) ----------------------------------------------------------
SERVICE_MONITOR = "monitoring.coreos.com/v1/ServiceMonitor"


@pytest.mark.usefixtures("tools")
def test_a_service_monitor_when_asked_for_and_the_cluster_serves_the_kind() -> None:
    """Asked for on a cluster with prometheus-operator's CRD: one ServiceMonitor of the metrics Service's port, with
    the labels a Prometheus selects by; asked for on a cluster without it: nothing (the install still succeeds)."""
    values = {"metrics": {"serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kps"}}}}
    (monitor,) = [d for d in chart(values, api_versions=(SERVICE_MONITOR,)) if d["kind"] == "ServiceMonitor"]
    assert monitor["metadata"]["namespace"] == NS and monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NS]}
    services = [
        d for d in chart(values) if d["kind"] == "Service" and d["metadata"]["name"] == "homelab-autoscaler-metrics"
    ]
    (service,) = services
    selected = monitor["spec"]["selector"]["matchLabels"]
    assert selected.items() <= service["metadata"]["labels"].items(), "the monitor selects the metrics Service"
    assert not [d for d in chart(values) if d["kind"] == "ServiceMonitor"], "no CRD, no ServiceMonitor"
    assert not [d for d in chart(api_versions=(SERVICE_MONITOR,)) if d["kind"] == "ServiceMonitor"], "off by default"


@pytest.mark.usefixtures("tools")
def test_scrape_annotations_on_the_metrics_service_when_asked_for() -> None:
    (service,) = [d for d in chart({"metrics": {"annotations": True}})
                  if d["kind"] == "Service" and d["metadata"]["name"] == "homelab-autoscaler-metrics"]  # fmt: skip
    assert service["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "9464", "prometheus.io/path": "/metrics"}  # fmt: skip
    assert service["spec"]["ports"][0]["port"] == 9464


@pytest.mark.usefixtures("tools")
def test_the_default_install_has_no_plaintext_provider_and_the_opt_out_is_the_components() -> None:
    """mTLS by default in both renders; `provider.plaintext` renders what components/plaintext renders."""
    for docs in (chart(), kustomize("overlays/homelab"), kustomize("overlays/split")):
        served = [d for d in _workloads(docs) for c in d["spec"]["template"]["spec"]["containers"]
                  if "HOMELAB_AUTOSCALER_PROVIDER_ADDRESS" in _env(c)]  # fmt: skip
        assert served
        for doc in served:
            (c,) = doc["spec"]["template"]["spec"]["containers"]
            env = _env(c)
            assert env["HOMELAB_AUTOSCALER_INSECURE"] == "false" and env["HOMELAB_AUTOSCALER_TLS_CA"], doc["metadata"]
    with tempfile.TemporaryDirectory(dir=_deploy_dir()) as folder:
        kustomization = {"resources": ["../overlays/homelab"], "components": ["../components/plaintext"]}
        (Path(folder) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        rendered = [d for d in yaml.safe_load_all(_run([str(_tool("kubectl")), "kustomize", folder]).stdout) if d]
    found = differences(_without_the_namespace(rendered), chart({"provider": {"plaintext": True}}))
    assert not found, "\n".join(found)


@pytest.mark.usefixtures("tools")
def test_every_role_is_probed_and_every_role_of_more_than_one_replica_has_a_disruption_budget() -> None:
    """The split install's worker too (its health endpoints on the pod IP); a PDB for each role run twice or more."""
    for values in ({}, {"split": {"enabled": True}}, {"split": {"enabled": True, "provider": {"replicas": 2}}}):
        docs = chart(values)
        budgets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodDisruptionBudget"}
        for doc in (d for d in docs if d["kind"] == "Deployment"):
            (c,) = doc["spec"]["template"]["spec"]["containers"]
            assert c.get("livenessProbe") and c.get("readinessProbe"), doc["metadata"]["name"]
            ours = doc["metadata"]["labels"].get("app.kubernetes.io/name") == "homelab-autoscaler"
            if ours and c.get("args") != ["temporal"] and "httpGet" in c["readinessProbe"]:
                assert _env(c)["HOMELAB_AUTOSCALER_HEALTH_HOST"] == "0.0.0.0", doc["metadata"]["name"]
            name = doc["metadata"]["name"]
            if doc["spec"]["replicas"] > 1:
                selector = budgets[name]["spec"]["selector"]["matchLabels"]
                assert selector == doc["spec"]["selector"]["matchLabels"], name
            else:
                assert name not in budgets, name


# --- upgrades: what a re-apply cannot change -------------------------------------------------------------------------
def _jobs(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {d["metadata"]["name"]: d["spec"]["template"] for d in docs if d["kind"] == "Job"}


def test_a_helm_upgrade_never_changes_the_template_of_a_job_it_keeps(tools: None) -> None:
    """A Job's Pod template is immutable, so `helm upgrade` to a new image failed on the certs Job (found by
    `make e2e-real`). Every Job of the chart either keeps its template through an upgrade or is a new one."""
    before = _jobs(chart())
    assert before, "the default install runs the certs Job"
    for change in ({"image": {"tag": "0.9.9"}}, {"imagePullSecrets": [{"name": "registry"}]}):
        after = _jobs(chart(change))
        kept = set(before) & set(after)
        assert all(before[n] == after[n] for n in kept), f"{change}: {kept} keeps its name with another template"
        assert set(after) - set(before), f"{change}: a new template, so a new Job that runs it"
    assert _jobs(chart()) == before, "the same values, the same Job: an upgrade changing nothing else leaves it"


def test_the_kustomize_upgrade_deletes_every_job_of_the_install_before_the_apply(tools: None) -> None:
    """deploy/ names its Jobs by a fixed name (kustomize cannot name by content): docs/upgrades.md's commands delete
    each one before `kubectl apply -k`, else the apply fails on its immutable template."""
    jobs = {d["metadata"]["name"] for path in ("overlays/homelab", "overlays/split")
            for d in kustomize(path) if d["kind"] == "Job"}  # fmt: skip
    assert jobs == {"homelab-autoscaler-certs"}, jobs
    text = (ROOT / "docs" / "upgrades.md").read_text()
    section = text[text.index("## Upgrading an install") :]
    for name in jobs:
        delete = f"kubectl -n homelab-autoscaler-system delete job {name} --ignore-not-found"
        assert delete in section and section.index(delete) < section.index("kubectl apply -k"), name


@pytest.mark.usefixtures("tools")
def test_network_policies_follow_their_values_and_can_be_left_out() -> None:
    """Who may call the provider and scrape the metrics, and the API server's ports, are the user's; off renders
    none (a cluster whose network enforces none, or whose own policies say it)."""
    assert not [d for d in chart({"networkPolicy": {"enabled": False}}) if d["kind"] == "NetworkPolicy"]
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "clusterapi-cluster-autoscaler"}}}  # fmt: skip
    values = {"networkPolicy": {"providerFrom": [peer], "apiServerPorts": [16443]}}
    policies = {d["metadata"]["name"]: d["spec"] for d in chart(values) if d["kind"] == "NetworkPolicy"}
    provider, metrics = policies["homelab-autoscaler"]["ingress"]
    assert provider == {"from": [peer], "ports": [{"protocol": "TCP", "port": 8086}]}
    assert metrics["ports"] == [{"protocol": "TCP", "port": 9464}]
    assert {"ports": [{"protocol": "TCP", "port": 16443}]} in policies["homelab-autoscaler"]["egress"]
    cluster = {d["metadata"]["name"]: d["spec"] for d in chart({"temporal": {**NO_BUNDLED,
               "address": "temporal.lab:17233"}}) if d["kind"] == "NetworkPolicy"}  # fmt: skip
    (way,) = cluster["homelab-autoscaler-to-temporal"]["egress"]
    assert way["ports"] == [{"protocol": "TCP", "port": 17233}]
    assert "temporal-server" not in cluster, "no policy for a Temporal the chart does not run"


# --- cluster-autoscaler from the chart ---------------------------------------------------------------------------
GENERATED = re.compile(r"^(cluster-autoscaler-cloud-config)-[a-z0-9]{10}$")
CHECKSUM = "checksum/cloud-config"


def _cluster_autoscalers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """cluster-autoscaler's objects of a render, comparable across the two: the chart names its cloud-config plainly
    and rolls the Deployment by a checksum, kustomize by the ConfigMap's hashed name; the file's comments aside."""
    out = []
    for doc in json.loads(json.dumps(docs)):
        meta = doc["metadata"]
        meta["name"] = GENERATED.sub(r"\1", meta["name"])
        if meta["name"] not in ("cluster-autoscaler", "homelab-cluster-autoscaler", "cluster-autoscaler-cloud-config"):
            continue
        if doc["kind"] == "ConfigMap":
            doc["data"] = {k: yaml.safe_load(v) for k, v in doc["data"].items()}
        if doc["kind"] == "Deployment":
            pod = doc["spec"]["template"]
            assert (CHECKSUM in pod["metadata"]["annotations"]) != any(
                GENERATED.match(v.get("configMap", {}).get("name", "")) for v in pod["spec"]["volumes"]
            ), "one of the two ways to roll it on a new cloud-config"
            pod["metadata"]["annotations"].pop(CHECKSUM, None)
            for volume in pod["spec"]["volumes"]:
                if "configMap" in volume:
                    volume["configMap"]["name"] = GENERATED.sub(r"\1", volume["configMap"]["name"])
        out.append(doc)
    return out


@pytest.mark.usefixtures("tools")
@pytest.mark.parametrize("plaintext", [False, True], ids=["mtls", "plaintext"])
def test_cluster_autoscaler_from_the_chart_is_deploys(plaintext: bool) -> None:
    """In the release's namespace, clusterAutoscaler renders what deploy/cluster-autoscaler/mtls (or /plaintext, with
    provider.plaintext) renders, object for object; off, the chart renders none of it."""
    deploy = _cluster_autoscalers(kustomize("cluster-autoscaler/plaintext" if plaintext else "cluster-autoscaler/mtls"))
    values = {"clusterAutoscaler": {"enabled": True}, "provider": {"plaintext": plaintext}}
    ours = _cluster_autoscalers(chart(values))
    assert {d["kind"] for d in ours} >= {"Deployment", "ConfigMap", "ClusterRole", "NetworkPolicy"}
    found = differences(deploy, ours)
    assert not found, "\n".join(found)
    assert not _cluster_autoscalers(chart())
    # A changed cloud-config rolls the Deployment: its checksum follows what the Pod reads.
    (mtls,) = [d for d in chart({"clusterAutoscaler": {"enabled": True}}) if d["kind"] == "Deployment"
               and d["metadata"]["name"] == "cluster-autoscaler"]  # fmt: skip
    (plain,) = [d for d in chart(values) if d["kind"] == "Deployment" and d["metadata"]["name"] == "cluster-autoscaler"]
    rolled = (
        mtls["spec"]["template"]["metadata"]["annotations"][CHECKSUM]
        != (plain["spec"]["template"]["metadata"]["annotations"][CHECKSUM])
    )
    assert rolled == plaintext


@pytest.mark.usefixtures("tools")
def test_cluster_autoscaler_in_another_namespace_is_whole_there_and_let_in() -> None:
    """clusterAutoscaler.namespace=kube-system: its objects there; its --namespace, its client certificate issued
    there by the certs step (which the chart grants there, and only that Secret); the cloud-config names the
    provider in the release's namespace; and the doors, read as the API defines them, let it (and nobody else of
    kube-system) reach the provider, with its own Pod isolated both ways."""
    from tests.netpol import Pod, allowed, isolated

    docs = chart({"clusterAutoscaler": {"enabled": True, "namespace": "kube-system",
                                        "extraArgs": ["--scale-down-enabled=false"]}})  # fmt: skip
    mine = _cluster_autoscalers(docs)
    assert {d["metadata"].get("namespace", "(cluster)") for d in mine} == {"kube-system", "(cluster)"}
    (deployment,) = [d for d in mine if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--namespace=kube-system" in container["args"] and container["args"][-1] == "--scale-down-enabled=false"
    (config,) = [d for d in mine if d["kind"] == "ConfigMap"]
    assert config["data"]["cloud-config.yaml"]["address"] == f"homelab-autoscaler-provider.{NS}.svc:8086"
    (binding,) = [d for d in mine if d["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "cluster-autoscaler", "namespace": "kube-system"}]
    # The certs step writes the client certificate where the Pod mounts it.
    jobs = [d for d in docs if d["kind"] in ("Job", "CronJob")]
    assert len(jobs) == 2
    for job in jobs:
        env = _env(_template(job)["spec"]["containers"][0])
        assert env["HOMELAB_AUTOSCALER_CERTS_CLIENT_NAMESPACE"] == "kube-system", job["metadata"]["name"]
    where = ("kube-system", "homelab-autoscaler-certs")
    grants = [d for d in docs if d["kind"] in ("Role", "RoleBinding")
              and (d["metadata"]["namespace"], d["metadata"]["name"]) == where]  # fmt: skip
    (role,) = [d for d in grants if d["kind"] == "Role"]
    assert role["rules"][1]["resourceNames"] == ["cluster-autoscaler-client-tls"]
    (certs_binding,) = [d for d in grants if d["kind"] == "RoleBinding"]
    certs_account = {"kind": "ServiceAccount", "name": "homelab-autoscaler-certs", "namespace": NS}
    assert certs_binding["subjects"] == [certs_account]
    # The doors.
    rules = [d for d in docs if d["kind"] == "NetworkPolicy"]
    autoscaler = Pod("kube-system", deployment["spec"]["template"]["metadata"]["labels"])
    other = Pod("kube-system", {"k8s-app": "kube-dns"})
    provider = Pod(NS, {"app.kubernetes.io/name": "homelab-autoscaler", "app.kubernetes.io/component": "operator"})
    assert isolated(rules, autoscaler) == {"Ingress", "Egress"}
    assert allowed(rules, autoscaler, provider, 8086)
    assert not allowed(rules, other, provider, 8086)
    assert not allowed(rules, Pod(NS, {"app": "curious"}), provider, 8086)
    # In its own namespace, the default providerFrom lets it in, and no grant elsewhere is made.
    here = chart({"clusterAutoscaler": {"enabled": True}})
    assert not [d for d in here if d["metadata"].get("namespace", NS) != NS and d["kind"] != "CustomResourceDefinition"]
    assert all("HOMELAB_AUTOSCALER_CERTS_CLIENT_NAMESPACE" not in _env(_template(j)["spec"]["containers"][0])
               for j in here if j["kind"] in ("Job", "CronJob"))  # fmt: skip
