"""The manifests under deploy/: every kustomization renders, every object is valid, and what the Deployments
ask of the operator (subcommand, flags, HOMELAB_AUTOSCALER_* variables) exists in the operator.

Rendering needs `kubectl` (its built-in `kubectl kustomize`); without it these tests skip and say so.
Built-in kinds are validated against the official Kubernetes JSON schemas shipped by the
`kubernetes-validate` package (offline, strict: unknown fields fail); our CRD-backed objects against the
schemas generated from api/v2alpha1.py; cert-manager objects, whose schemas are not available offline,
against the few fields these manifests rely on.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from api import names
from api.crds import crd_schemas, to_json_schema

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUBERNETES_VERSION = "1.35"  # the oldest Kubernetes cluster-autoscaler 1.35 supports

# Every kustomization a user applies (the components are rendered through the overlays that use them).
KUSTOMIZATIONS = [
    "base",
    "rbac",
    "overlays/homelab",
    "overlays/dev-server",
    "overlays/homelab-mtls",
    "overlays/split",
    "overlays/temporal-cluster",
    "overlays/external-postgresql",
    "cluster-autoscaler/plaintext",
    "cluster-autoscaler/mtls",
    "kind",
]

# deploy/crds/ is generated (`make crds`); the base includes it as a directory, which kustomize accepts only
# with a kustomization.yaml there. This is its content.
CRDS_KUSTOMIZATION = (
    "apiVersion: kustomize.config.k8s.io/v1beta1\n"
    "kind: Kustomization\n"
    "resources:\n"
    "  - groups.yaml\n"
    "  - nodes.yaml\n"
    "  - nodeclaims.yaml\n"
)


def _kustomize_problem() -> str | None:
    """Why `kubectl kustomize` cannot render deploy/ here, or None. Components and `labels` need kustomize v5."""
    if shutil.which("kubectl") is None:
        return "kubectl is not installed: `kubectl kustomize` (kustomize v5+) renders deploy/"
    try:
        out = subprocess.run(
            ["kubectl", "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=30
        )
        version = json.loads(out.stdout).get("kustomizeVersion", "")
    except (subprocess.SubprocessError, OSError, ValueError):
        return "`kubectl version --client` failed"
    major = re.match(r"v(\d+)", version)
    if not major or int(major[1]) < 5:
        return f"kubectl embeds kustomize {version or 'of unknown version'}; deploy/ needs v5+ (kubectl 1.27 or newer)"
    return None


KUSTOMIZE_PROBLEM = _kustomize_problem()
needs_kubectl = pytest.mark.skipif(KUSTOMIZE_PROBLEM is not None, reason=str(KUSTOMIZE_PROBLEM))


@functools.cache
def _deploy_dir() -> Path:
    """deploy/ itself, or a staged copy of it with deploy/crds/kustomization.yaml added when that is missing."""
    if (DEPLOY / "crds" / "kustomization.yaml").exists():
        return DEPLOY
    staged = Path(tempfile.mkdtemp(prefix="homelab-autoscaler-deploy-")) / "deploy"
    shutil.copytree(DEPLOY, staged)
    (staged / "crds" / "kustomization.yaml").write_text(CRDS_KUSTOMIZATION)
    return staged


@functools.cache
def _render_text(path: str) -> str:
    result = subprocess.run(
        ["kubectl", "kustomize", str(_deploy_dir() / path)], capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0:
        raise AssertionError(f"`kubectl kustomize deploy/{path}` failed:\n{result.stderr}")
    return result.stdout


@functools.cache
def _rendered(path: str) -> list[dict[str, Any]]:
    """Parsed once: PyYAML's pure-Python parse of the rendered CRDs was most of this module's CPU time."""
    return [doc for doc in yaml.safe_load_all(_render_text(path)) if doc]


def render(path: str) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize deploy/<path>` produces (a fresh copy each call)."""
    return copy.deepcopy(_rendered(path))


def objects_of(kind: str, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def operators(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's own Deployments (not the bundled Temporal's)."""
    return [d for d in objects_of("Deployment", docs)
            if d["metadata"]["labels"].get("app.kubernetes.io/name") == "homelab-autoscaler"]  # fmt: skip


def containers(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(workload name, container) for every container of every Deployment, StatefulSet and Job."""
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            pod = doc["spec"]["template"]["spec"]
            for c in [*pod.get("initContainers", []), *pod["containers"]]:
                yield doc["metadata"]["name"], c


# --- the CRDs' own kustomization ----------------------------------------------------------------------------
def test_the_crds_directory_is_a_kustomization() -> None:
    path = DEPLOY / "crds" / "kustomization.yaml"
    assert path.exists(), (
        "deploy/crds/kustomization.yaml is missing, so `kubectl kustomize deploy/overlays/homelab` fails. "
        f"Add it with this content (the other tests here render a staged copy that has it):\n{CRDS_KUSTOMIZATION}"
    )
    listed = yaml.safe_load(path.read_text())["resources"]
    from api.crds import CRD_FILES

    assert sorted(listed) == sorted(CRD_FILES), "deploy/crds/kustomization.yaml must list exactly the generated CRDs"


# --- rendering and schemas ----------------------------------------------------------------------------------
@needs_kubectl
@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_renders(path: str) -> None:
    docs = render(path)
    assert docs, f"deploy/{path} rendered nothing"
    keys = [(d["apiVersion"], d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(keys) == len(set(keys)), f"deploy/{path} renders an object twice"


@functools.cache
def _crd_validators() -> dict[str, jsonschema.protocols.Validator]:
    out: dict[str, jsonschema.protocols.Validator] = {}
    for kind, schema in crd_schemas().items():
        js = to_json_schema(schema)
        out[kind] = jsonschema.validators.validator_for(js)(js)
    return out


# cert-manager's schemas are not available offline: the fields these manifests rely on, checked by hand.
CERT_MANAGER_REQUIRED: dict[str, list[tuple[str, ...]]] = {
    "Issuer": [("spec",)],
    "Certificate": [("spec", "secretName"), ("spec", "issuerRef", "name"), ("spec", "issuerRef", "kind")],
}


def validate(doc: dict[str, Any]) -> None:
    """Raise when `doc` is not a valid object of its kind."""
    import kubernetes_validate

    group = doc["apiVersion"].split("/")[0] if "/" in doc["apiVersion"] else ""
    if group == names.GROUP:
        errors = sorted(_crd_validators()[doc["kind"]].iter_errors(doc), key=lambda e: list(e.path))
        if errors:
            raise AssertionError("; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5]))
        return
    if group == "cert-manager.io":
        for path in CERT_MANAGER_REQUIRED[doc["kind"]]:
            node: Any = doc
            for key in path:
                assert isinstance(node, dict) and key in node, f"{doc['kind']} lacks {'.'.join(path)}"
                node = node[key]
        return
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@needs_kubectl
@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_every_rendered_object_is_valid(path: str) -> None:
    failures = []
    for doc in render(path):
        try:
            validate(doc)
        except Exception as exc:
            failures.append(f"{doc['kind']} {doc['metadata']['name']}: {str(exc).splitlines()[0]}")
    assert not failures, f"deploy/{path}:\n" + "\n".join(failures)


def test_the_validator_refuses_what_the_api_server_would() -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "template": {"spec": {"containers": [{"name": "a", "image": "b", "argz": []}]}}},
    }
    with pytest.raises(Exception, match="argz"):
        validate(deployment)
    group = {"apiVersion": names.API_VERSION, "kind": names.KIND_GROUP, "metadata": {"name": "g"}, "spec": {}}
    with pytest.raises(AssertionError, match="maxSize"):
        validate(group)


# --- the homelab install is complete ------------------------------------------------------------------------
@needs_kubectl
def test_the_homelab_overlay_is_a_complete_install() -> None:
    docs = render("overlays/homelab")
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for wanted in [
        ("Namespace", "homelab-autoscaler-system"),
        ("CustomResourceDefinition", f"{names.PLURAL_GROUPS}.{names.GROUP}"),
        ("CustomResourceDefinition", f"{names.PLURAL_NODES}.{names.GROUP}"),
        ("CustomResourceDefinition", f"{names.PLURAL_NODECLAIMS}.{names.GROUP}"),
        ("ServiceAccount", "homelab-autoscaler"),
        ("ClusterRole", "homelab-autoscaler"),
        ("ClusterRoleBinding", "homelab-autoscaler"),
        ("Role", "homelab-autoscaler-leader-election"),
        ("Deployment", "homelab-autoscaler"),
        ("Service", "homelab-autoscaler-provider"),
        ("StatefulSet", "temporal-postgresql"),
        ("Deployment", "temporal-server"),
        ("Deployment", "temporal-web"),
        ("ConfigMap", "temporal-config"),
        ("Role", "homelab-autoscaler-temporal-setup"),
        ("Service", "temporal-postgresql"),
        ("Service", "temporal-frontend"),
        ("Service", "temporal-web"),
    ]:
        assert wanted in kinds, f"the homelab install lacks {wanted}"
    for doc in docs:
        if doc["kind"] not in ("Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"].get("namespace") == "homelab-autoscaler-system", doc["metadata"]["name"]


@needs_kubectl
@pytest.mark.parametrize("path", ["overlays/homelab", "overlays/split", "overlays/homelab-mtls"])
def test_the_default_installs_run_temporal_on_postgresql_never_the_dev_server(path: str) -> None:
    """Temporal's guide calls start-dev and SQLite development-only: no install a user keeps may carry them."""
    text = _render_text(path)
    assert "start-dev" not in text and "--db-filename" not in text, f"deploy/{path} runs the dev server"
    docs = render(path)
    (server,) = [d for d in objects_of("Deployment", docs) if d["metadata"]["name"] == "temporal-server"]
    (postgresql,) = objects_of("StatefulSet", docs)
    assert postgresql["metadata"]["name"] == "temporal-postgresql"
    assert server["spec"]["strategy"]["type"] == "Recreate", "a migration never runs under an old server"


def _bundled() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    docs = render("overlays/homelab")
    (server,) = [d for d in objects_of("Deployment", docs) if d["metadata"]["name"] == "temporal-server"]
    (postgresql,) = objects_of("StatefulSet", docs)
    (config,) = [d for d in objects_of("ConfigMap", docs) if d["metadata"]["name"] == "temporal-config"]
    return server, postgresql, config, docs


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


@needs_kubectl
def test_the_bundled_server_reads_its_rendered_configuration_and_the_password_from_the_secret() -> None:
    server, postgresql, config, _ = _bundled()
    pod = server["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[0] == "/usr/local/bin/temporal-server" and command[-1] == "start"
    path = Path(command[command.index("--config-file") + 1])
    (mount,) = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == "temporal-config" and path.name in config["data"]
    text = config["data"][path.name]
    assert text.startswith("# enable-template"), "the server renders {{ env ... }} only in a marked file"
    env = _env(container)
    for name in re.findall(r'env "([A-Z_]+)"', text):
        assert name in env or name.startswith("POSTGRES_TLS_"), f"the config reads {name}, the Pod does not set it"
    rendered = yaml.safe_load(re.sub(r"\{\{[^}]*\}\}", "x", text))
    assert rendered["persistence"]["numHistoryShards"] == 4, "fixed for the life of the database: say so if changed"
    stores = rendered["persistence"]["datastores"]
    assert {s["sql"]["databaseName"] for s in stores.values()} == {"temporal", "temporal_visibility"}
    assert all(s["sql"]["pluginName"] == "postgres12" for s in stores.values())
    for name, service in rendered["services"].items():
        assert service["rpc"]["membershipPort"] < 32768, f"{name}: cluster_membership keeps ports in a smallint"
    secret = env["POSTGRES_PWD"]["secretKeyRef"]
    (pg,) = postgresql["spec"]["template"]["spec"]["containers"]
    assert _env(pg)["POSTGRES_PASSWORD"]["secretKeyRef"] == secret
    dynamic = Path(rendered["dynamicConfigClient"]["filepath"])
    assert dynamic.parent == path.parent and dynamic.name in config["data"]


@needs_kubectl
def test_the_schema_is_migrated_before_the_server_starts_and_the_setup_runs_before_the_operator() -> None:
    server, _, _, docs = _bundled()
    (schema,) = server["spec"]["template"]["spec"]["initContainers"]
    script = schema["args"][0]
    for db, name in (("temporal", "postgresql/v12/temporal"), ("temporal_visibility", "postgresql/v12/visibility")):
        assert f"--db {db} setup-schema -v 0.0" in script
        assert f"--db {db} update-schema --schema-name {name}" in script
    assert 'grep -q "already exists"' in script, "a second run finds the databases and goes on"
    assert _env(schema)["SQL_PASSWORD"] == _env(server["spec"]["template"]["spec"]["containers"][0])["POSTGRES_PWD"]
    (operator,) = [d for d in objects_of("Deployment", docs) if d["metadata"]["name"] == "homelab-autoscaler"]
    (setup,) = operator["spec"]["template"]["spec"]["initContainers"]
    args = setup["args"]
    assert args[0] == "temporal-setup" and setup["image"] == operator["spec"]["template"]["spec"]["containers"][0][
        "image"]  # fmt: skip
    secret = _env(schema)["SQL_PASSWORD"]["secretKeyRef"]["name"]
    assert args[args.index("--postgresql-secret") + 1] == secret
    assert _env(setup)["HOMELAB_AUTOSCALER_TEMPORAL_NAMESPACE"] == _env(
        operator["spec"]["template"]["spec"]["containers"][0])["HOMELAB_AUTOSCALER_TEMPORAL_NAMESPACE"]  # fmt: skip
    (role,) = [d for d in objects_of("Role", docs) if d["metadata"]["name"] == "homelab-autoscaler-temporal-setup"]
    reads = [r for r in role["rules"] if "get" in r["verbs"]]
    assert reads and all(r.get("resourceNames") == [secret] for r in reads), "it reads only its own Secret"
    split = render("overlays/split")
    for dep in objects_of("Deployment", split):
        if dep["metadata"]["labels"].get("app.kubernetes.io/name") == "homelab-autoscaler":
            names_ = [c["name"] for c in dep["spec"]["template"]["spec"].get("initContainers", [])]
            assert names_ == ["temporal-setup"], dep["metadata"]["name"]


@needs_kubectl
def test_the_bundled_temporal_names_the_official_images_pinned_by_version() -> None:
    _, _, _, docs = _bundled()
    images = {c["image"] for name, c in containers(docs) if not c["image"].endswith("homelab-autoscaler:0.4.0.dev0")}
    official = {i.rsplit(":", 1)[0]: i.rsplit(":", 1)[1] for i in images}
    assert set(official) == {"temporalio/server", "temporalio/admin-tools", "temporalio/ui", "postgres"}, images
    assert all(re.fullmatch(r"\d+\.\d+(\.\d+)?(-bookworm)?", tag) for tag in official.values()), official
    assert official["temporalio/server"] == official["temporalio/admin-tools"], "the tool migrates to its server's"


@needs_kubectl
def test_the_dev_server_overlay_is_labelled_development_only_and_registers_the_search_attributes() -> None:
    from api.contracts import SEARCH_ATTRIBUTES

    docs = render("overlays/dev-server")
    assert all(d["metadata"].get("labels", {}).get("homelab-autoscaler.dev/development-only") == "true"
               for d in docs if d["kind"] in ("StatefulSet", "Deployment"))  # fmt: skip
    (sts,) = objects_of("StatefulSet", docs)
    assert sts["spec"]["replicas"] == 1, "SQLite has one writer"
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert container["command"] == ["temporal"] and args[:2] == ["server", "start-dev"]
    assert args[args.index("--ip") + 1] == "0.0.0.0"
    db = args[args.index("--db-filename") + 1]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert Path(db).parent.as_posix() in mounts and mounts[Path(db).parent.as_posix()] in {
        t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]
    }, "the database file must be on the PersistentVolume"
    given = {args[i + 1] for i, a in enumerate(args) if a == "--search-attribute"}
    assert given == {f"{n}={k}" for n, k in SEARCH_ATTRIBUTES.items()}


@needs_kubectl
def test_the_temporal_cluster_overlay_has_no_dev_server_and_mounts_client_certificates() -> None:
    docs = render("overlays/temporal-cluster")
    assert not objects_of("StatefulSet", docs)
    (dep,) = objects_of("Deployment", docs)
    pod = dep["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["HOMELAB_AUTOSCALER_TEMPORAL_ADDRESS"] != "temporal-frontend:7233"
    assert any(v.get("secret", {}).get("secretName") == "temporal-client-tls" for v in pod["volumes"])


@needs_kubectl
def test_the_external_postgresql_overlay_runs_no_database_and_creates_no_secret() -> None:
    """Your PostgreSQL: no StatefulSet or Service of the install's own, the server and its schema step reach the host
    the generated ConfigMap names (a new ConfigMap rolls them), the password is your Secret, and the setup step
    neither creates a Secret nor holds a grant to."""
    docs = render("overlays/external-postgresql")
    assert not objects_of("StatefulSet", docs)
    assert "temporal-postgresql" not in {d["metadata"]["name"] for d in objects_of("Service", docs)}
    assert "homelab-autoscaler-temporal-setup" not in {d["metadata"]["name"] for d in docs if "Role" in d["kind"]}
    (config,) = [d for d in objects_of("ConfigMap", docs) if d["metadata"]["name"].startswith("temporal-postgresql-")]
    assert set(config["data"]) == {"host", "port", "user", "tls", "tls-ca-file"}
    server = next(d for d in objects_of("Deployment", docs) if d["metadata"]["name"] == "temporal-server")
    pod = server["spec"]["template"]["spec"]
    for container, prefix in ((pod["initContainers"][0], "SQL_"), (pod["containers"][0], "POSTGRES_")):
        env = {e["name"]: e for e in container["env"]}
        for name in ("HOST", "PORT", "USER"):
            assert "value" not in env[prefix + name], (container["name"], env[prefix + name])
            assert env[prefix + name]["valueFrom"]["configMapKeyRef"]["name"] == config["metadata"]["name"]
        password = env[prefix + ("PWD" if prefix == "POSTGRES_" else "PASSWORD")]
        assert password["valueFrom"]["secretKeyRef"] == {"name": "temporal-postgresql", "key": "password"}
    assert {"name": "postgresql-ca", "secret": {"secretName": "temporal-postgresql-ca", "optional": True}} in pod[
        "volumes"
    ]
    operator = next(d for d in objects_of("Deployment", docs) if d["metadata"]["name"] == "homelab-autoscaler")
    (setup,) = operator["spec"]["template"]["spec"]["initContainers"]
    assert "--postgresql-secret" not in setup["args"] and "--retention" in setup["args"]


@needs_kubectl
def test_split_runs_each_role_once_and_the_service_selects_only_the_provider() -> None:
    docs = render("overlays/split")
    roles = {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["args"][0]
             for d in operators(docs)}  # fmt: skip
    assert sorted(roles.values()) == ["provider", "watch", "worker"]
    (svc,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "homelab-autoscaler-provider"]
    selected = [d for d in objects_of("Deployment", docs)
                if svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()]  # fmt: skip
    assert [roles[d["metadata"]["name"]] for d in selected] == ["provider"]


@needs_kubectl
def test_every_service_selects_some_pod() -> None:
    for path in KUSTOMIZATIONS:
        docs = render(path)
        pods = [d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
        for svc in objects_of("Service", docs):
            selector = svc["spec"].get("selector") or {}
            assert any(selector.items() <= labels.items() for labels in pods), f"{path}: {svc['metadata']['name']}"


@needs_kubectl
def test_mtls_on_both_ends() -> None:
    docs = render("overlays/homelab-mtls")
    (dep,) = operators(docs)
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HOMELAB_AUTOSCALER_INSECURE"] == "false"
    assert {"HOMELAB_AUTOSCALER_TLS_CERT", "HOMELAB_AUTOSCALER_TLS_KEY", "HOMELAB_AUTOSCALER_TLS_CA"} <= env.keys()
    certs = {c["metadata"]["name"]: c for c in objects_of("Certificate", docs)}
    server = certs["homelab-autoscaler-provider"]
    ca_docs = render("cluster-autoscaler/mtls")
    (cm,) = objects_of("ConfigMap", ca_docs)
    config = yaml.safe_load(cm["data"]["cloud-config.yaml"])
    assert {"address", "cert", "key", "cacert"} <= config.keys(), "cluster-autoscaler speaks mTLS or plaintext"
    host = config["address"].rsplit(":", 1)[0]
    assert host in server["spec"]["dnsNames"], "cluster-autoscaler checks the address' host against the certificate"
    (ca_dep,) = objects_of("Deployment", ca_docs)
    secrets = {v["secret"]["secretName"] for v in ca_dep["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    assert certs["cluster-autoscaler-client"]["spec"]["secretName"] in secrets
    plain = yaml.safe_load(
        objects_of("ConfigMap", render("cluster-autoscaler/plaintext"))[0]["data"]["cloud-config.yaml"]
    )
    assert "cert" not in plain and plain["address"] == config["address"]


@needs_kubectl
def test_cluster_autoscaler_uses_externalgrpc_and_its_cloud_config() -> None:
    docs = render("cluster-autoscaler/plaintext")
    (dep,) = objects_of("Deployment", docs)
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    args = dict(
        a.removeprefix("--").split("=", 1) if "=" in a else (a.removeprefix("--"), "") for a in container["args"]
    )
    assert args["cloud-provider"] == "externalgrpc"
    mount = next(m for m in container["volumeMounts"] if args["cloud-config"].startswith(m["mountPath"] + "/"))
    volume = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    (cm,) = objects_of("ConfigMap", docs)
    assert volume["configMap"]["name"] == cm["metadata"]["name"]
    assert Path(args["cloud-config"]).name in cm["data"]
    version = re.search(r":v(\d+)\.(\d+)\.", container["image"])
    assert version and (int(version[1]), int(version[2])) >= (1, 35), "the proto is cluster-autoscaler 1.35's"
    services = {(s["metadata"]["name"], s["metadata"]["namespace"], p["port"]) for s in
                objects_of("Service", render("overlays/homelab")) for p in s["spec"]["ports"]}  # fmt: skip
    address = yaml.safe_load(cm["data"]["cloud-config.yaml"])["address"]
    host, port = address.rsplit(":", 1)
    name, namespace = host.split(".")[:2]
    assert (name, namespace, int(port)) in services, f"{address} is not a Service of the install"


# --- images, security, probes -------------------------------------------------------------------------------
@needs_kubectl
@pytest.mark.parametrize("path", KUSTOMIZATIONS)
def test_images_are_pinned_and_containers_are_locked_down(path: str) -> None:
    docs = render(path)
    for doc in docs:
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, doc["metadata"]["name"]
        for c in pod["containers"]:
            image = c["image"]
            assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), f"unpinned image {image}"
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
            assert sc["readOnlyRootFilesystem"] is True
            assert "resources" in c and "requests" in c["resources"]


@needs_kubectl
def test_the_operator_probes_hit_the_health_port_it_listens_on() -> None:
    (dep,) = operators(render("overlays/homelab"))
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert ports[c["livenessProbe"]["httpGet"]["port"]] == int(env["HOMELAB_AUTOSCALER_HEALTH_PORT"])
    assert env["HOMELAB_AUTOSCALER_HEALTH_HOST"] == "0.0.0.0", "the kubelet probes the pod IP"
    assert ports["grpc"] == int(env["HOMELAB_AUTOSCALER_PROVIDER_ADDRESS"].rsplit(":", 1)[1])
    assert ports["metrics"] == int(env["HOMELAB_AUTOSCALER_METRICS_ADDRESS"].rsplit(":", 1)[1])


@needs_kubectl
@pytest.mark.parametrize("path", [p for p in KUSTOMIZATIONS if p != "rbac"])
def test_every_long_running_container_is_probed_on_a_port_it_names(path: str) -> None:
    """A wedged process is restarted and an unready one takes no traffic (issue 43: every role probed, and
    cluster-autoscaler's /health-check, which fails once its loop stops)."""
    for doc in render(path):
        if doc["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            where = f"deploy/{path}: {doc['metadata']['name']}/{c['name']}"
            named = {p.get("name") for p in c.get("ports", [])} | {p["containerPort"] for p in c.get("ports", [])}
            for probe in ("livenessProbe", "readinessProbe"):
                assert probe in c, f"{where} has no {probe}"
                if "exec" in c[probe]:
                    assert c[probe]["exec"]["command"], f"{where}: its {probe} runs nothing"
                    continue
                port = (c[probe].get("httpGet") or c[probe].get("tcpSocket") or c[probe].get("grpc") or {}).get("port")
                assert port in named, f"{where}: its {probe} asks port {port!r}, which it does not name"


# --- what the manifests ask of the operator exists ----------------------------------------------------------
def _role_variables(role: str) -> set[str]:
    """The HOMELAB_AUTOSCALER_* variables the command `role` reads: the settings of its sections."""
    from homelab_autoscaler import cli

    sections = dict(cli.commands())[role]
    return {cli.CONFIG_ENV} | {s.env for section in sections for s in cli.section_settings(section)}


def _operator_containers() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path in KUSTOMIZATIONS:
        if path.startswith("cluster-autoscaler"):
            continue
        for workload, c in containers(render(path)):
            if c["name"] == "homelab-autoscaler" and c.get("command") != ["temporal"]:
                yield path, workload, c


@needs_kubectl
def test_every_environment_variable_is_a_setting_of_the_role_it_configures() -> None:
    """A variable the container's command does not read would be ignored without a word: each must be a setting
    of that command's sections."""
    unknown = set()
    for path, workload, c in _operator_containers():
        role = (c.get("args") or ["run"])[0]
        known = _role_variables(role)
        for e in c.get("env", []):
            name = e["name"]
            assert name.startswith("HOMELAB_AUTOSCALER_"), f"{path} {workload}: {name}"
            if name not in known:
                unknown.add(f"{path} {workload} ({role}): {name}")
    assert not unknown, "not a setting of the container's command:\n" + "\n".join(sorted(unknown))


@functools.cache
def _help(role: str) -> str | None:
    """`homelab-autoscaler <role> --help`, or None while the role is a placeholder that is not built yet. Asked
    once per role: the overlays name the same roles again and again, and each asking was a process start."""
    from homelab_autoscaler import cli

    if role in getattr(cli, "MISSING", {}):
        return None
    result = subprocess.run(
        [sys.executable, "-m", "homelab_autoscaler.cli", role, "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"`homelab-autoscaler {role} --help` failed: {result.stderr}"
    return result.stdout


@needs_kubectl
@pytest.mark.long
def test_every_subcommand_and_flag_exists() -> None:
    not_built: set[str] = set()
    for path, workload, c in _operator_containers():
        args = c.get("args") or []
        assert args and not args[0].startswith("-"), f"{path} {workload}: the first argument is the role"
        role, flags = args[0], [a.split("=", 1)[0] for a in args[1:] if a.startswith("--")]
        text = _help(role)
        if text is None:
            not_built.add(role)
            continue
        for flag in flags:
            assert re.search(rf"(^|\s){re.escape(flag)}\b", text), f"{path} {workload}: {role} has no {flag}"
    if not_built:
        pytest.skip(f"roles not built yet (placeholders in homelab_autoscaler/cli.py): {', '.join(sorted(not_built))}")


# --- docs/install.md: the image and the Temporal volume -------------------------------------------------------
INSTALL = ROOT / "docs" / "install.md"


def _install_block(language: str, first_line: str) -> str:
    """The fenced `language` block of docs/install.md that contains `first_line`."""
    blocks: list[str] = re.findall(rf"```{language}\n(.*?)```", INSTALL.read_text(), flags=re.S)
    (block,) = [b for b in blocks if first_line in b]
    return block


def _render_overlay(tmp_path: Path, kustomization: str) -> list[dict[str, Any]]:
    (tmp_path / "kustomization.yaml").write_text(kustomization)
    done = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def test_the_image_the_install_docs_override_is_the_one_the_kustomizations_name() -> None:
    documented = yaml.safe_load(_install_block("yaml", "# kustomization.yaml of your overlay"))["images"][0]["name"]
    for path in ("base", "overlays/homelab", "overlays/split", "components/split"):
        kustomization = yaml.safe_load((DEPLOY / path / "kustomization.yaml").read_text())
        (entry,) = kustomization["images"]
        assert entry["name"] == "homelab-autoscaler", f"deploy/{path}: the manifests' placeholder"
        assert entry["newName"] == documented, f"deploy/{path} names {entry['newName']}, the docs {documented}"
    # One tag for both platforms (issue 42): buildx pushes the index; buildah builds it and pushes all of it.
    build = _install_block("sh", "docker buildx build")
    assert "docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/homelab-autoscaler:TAG --push ." in build
    assert "buildah bud --platform linux/amd64,linux/arm64 --manifest homelab-autoscaler:TAG ." in build
    assert "buildah manifest push --all homelab-autoscaler:TAG docker://REGISTRY/homelab-autoscaler:TAG" in build
    workloads = [
        doc
        for doc in yaml.safe_load_all((DEPLOY / "base/operator.yaml").read_text())
        if doc and doc["kind"] in ("Deployment", "StatefulSet")
    ]
    placeholders = {c["image"] for doc in workloads for c in doc["spec"]["template"]["spec"]["containers"]}
    assert placeholders == {"homelab-autoscaler"}
    # The dev server is Temporal's CLI from its own image, at the bundled server's version: ours has no dev server.
    (dev,) = [d for d in yaml.safe_load_all((DEPLOY / "overlays/dev-server/temporal.yaml").read_text())
              if d and d["kind"] == "StatefulSet"]  # fmt: skip
    (container,) = dev["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "temporalio/admin-tools:1.32.1" and container["command"] == ["temporal"]
    assert dev["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 1000


@needs_kubectl
def test_the_documented_overlay_runs_your_image(tmp_path: Path) -> None:
    kustomization = _install_block("yaml", "# kustomization.yaml of your overlay")
    kustomization = kustomization.replace(
        "../homelab-autoscaler/deploy/overlays/homelab",
        os.path.relpath(_deploy_dir() / "overlays" / "homelab", tmp_path),
    )
    kustomization = kustomization.replace("REGISTRY", "registry.lan:5000").replace("TAG", "v9")
    docs = _render_overlay(tmp_path, kustomization)
    images = {
        c["name"]: c["image"] for _, c in containers(docs) if c["name"] in ("homelab-autoscaler", "temporal-setup")
    }
    assert set(images) == {"homelab-autoscaler", "temporal-setup"}
    assert set(images.values()) == {"registry.lan:5000/homelab-autoscaler:v9"}


@needs_kubectl
def test_the_temporal_volume_takes_the_default_storage_class_or_the_documented_one(tmp_path: Path) -> None:
    (temporal,) = [d for d in render("overlays/homelab") if d["kind"] == "StatefulSet"]
    (claim,) = temporal["spec"]["volumeClaimTemplates"]
    assert "storageClassName" not in claim["spec"], "the default StorageClass, as docs/install.md says"
    assert "default StorageClass" in INSTALL.read_text()
    patch = _install_block("yaml", "storageClassName")
    docs = _render_overlay(
        tmp_path,
        f"resources:\n  - {os.path.relpath(_deploy_dir() / 'overlays' / 'homelab', tmp_path)}\n" + patch,
    )
    (temporal,) = [d for d in docs if d["kind"] == "StatefulSet"]
    assert temporal["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "local-path"


# --- power-method examples ----------------------------------------------------------------------------------
POWER = sorted((DEPLOY / "examples" / "power").glob("*.yaml"))


@pytest.mark.parametrize("path", POWER, ids=[p.stem for p in POWER])
def test_power_examples_validate(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    slots = [d for d in docs if d["kind"] == names.KIND_NODE]
    assert slots, f"{path.name} has no slot (Node) example"
    for doc in docs:
        validate(doc)
    from api.v2alpha1 import Node

    for doc in slots:
        Node.model_validate(doc)


def _pod_specs(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """(slot/field, pod spec) of every slot in an example file."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("kind") == names.KIND_NODE]
    return [
        (f"{d['metadata']['name']}/{field}", d["spec"][field])
        for d in docs
        for field in ("startupPodSpec", "shutdownPodSpec")
    ]


EXAMPLE_POD_SPECS = [
    (f"{path.relative_to(DEPLOY / 'examples')}:{where}", pod) for path in POWER for where, pod in _pod_specs(path)
]


def test_every_example_slot_names_an_image_the_project_builds() -> None:
    """One example set (issue 44): a slot of deploy/examples names a power image deploy/examples/power/images builds
    (`power-<name>` from `<name>.Containerfile`), never one nothing builds."""
    built = {
        f"power-{p.name.removesuffix('.Containerfile')}"
        for p in (DEPLOY / "examples" / "power" / "images").glob("*.Containerfile")
    }
    slots = sorted(p for p in (DEPLOY / "examples").rglob("*.yaml") if p.name != "homelab.yaml")  # the simulator's
    found = [(f"{path.relative_to(DEPLOY)}:{where}", pod["image"]) for path in slots for where, pod in _pod_specs(path)]
    assert found, "the examples have slots"
    for where, image in found:
        assert image.rsplit("/", 1)[-1].split(":")[0] in built, f"{where}: {image} is built by nothing in the project"


def _is_wake_on_lan(pod: dict[str, Any]) -> bool:
    text = " ".join([*(pod.get("command") or []), *(pod.get("args") or [])])
    return "SO_BROADCAST" in text or "wakeonlan" in text


@pytest.mark.parametrize(("where", "pod"), EXAMPLE_POD_SPECS, ids=[w for w, _ in EXAMPLE_POD_SPECS])
def test_example_scripts_fail_loudly(where: str, pod: dict[str, Any]) -> None:
    """A shell script stops at its first failing command; a wake-on-LAN Job broadcasts from its node's network."""
    line = [*(pod.get("command") or []), *(pod.get("args") or [])]
    if line[:2] in (["/bin/sh", "-c"], ["sh", "-c"], ["/bin/bash", "-c"], ["bash", "-c"]):
        script = line[2]
        assert script.lstrip().startswith("set -eu"), f"{where}: a shell script starts with `set -eu`"
        assert "|| true" not in script, f"{where}: a failure is checked, never ignored"
    if _is_wake_on_lan(pod):
        assert pod.get("hostNetwork") is True, f"{where}: Linux drops a directed broadcast routed from the pod network"


def _script(path: str, field: str) -> tuple[list[str], dict[str, Any]]:
    """The command line of an example's pod spec, as its container would run it, and the pod spec."""
    ((_, pod),) = [(w, p) for w, p in _pod_specs(DEPLOY / "examples" / "power" / path) if w.endswith(field)]
    return [*pod["command"], *pod["args"]], pod


def _run_wake_on_lan(*args: str) -> subprocess.CompletedProcess[str]:
    command, _ = _script("wake-on-lan.yaml", "startupPodSpec")
    assert command[:2] == ["python3", "-c"], "Debian's python3-minimal, in images/wake-on-lan.Containerfile"
    return subprocess.run(
        [sys.executable, "-c", command[2], *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_the_wake_on_lan_script_sends_the_magic_packet() -> None:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver:
        receiver.bind(("127.0.0.1", 0))
        receiver.settimeout(10)
        port = receiver.getsockname()[1]
        done = _run_wake_on_lan("aa:bb:cc:dd:ee:01", "127.0.0.1", str(port))
        assert done.returncode == 0, done.stderr
        packet = receiver.recv(1024)
    assert packet == b"\xff" * 6 + bytes.fromhex("aabbccddee01") * 16


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("aa:bb:cc:dd:ee", "127.0.0.1", "9"), "is not a MAC address"),
        (("zz:bb:cc:dd:ee:01", "127.0.0.1", "9"), "is not a MAC address"),
        (("aa:bb:cc:dd:ee:01", "256.1.1.1", "9"), "cannot send to 256.1.1.1:9"),
        (("aa:bb:cc:dd:ee:01", "no-such-host.invalid", "9"), "cannot send to no-such-host.invalid:9"),
    ],
)
def test_the_wake_on_lan_script_fails_when_it_cannot_send(args: tuple[str, ...], says: str) -> None:
    done = _run_wake_on_lan(*args)
    assert done.returncode != 0
    assert says in done.stderr, done.stderr


def _stub_tools(bin_dir: Path, calls: Path) -> None:
    """install, ssh, ping, sleep and curl as stubs: each logs its arguments; ssh and ping answer as told."""
    behaviour = {
        "ssh": 'case "$*" in *" true") exit "$SSH_LOGIN";; *poweroff*) exit "$SSH_POWEROFF";; esac',
        "ping": 'exit "$PING"',
    }
    bin_dir.mkdir()
    for tool in ("install", "ssh", "ping", "sleep", "curl"):
        stub = bin_dir / tool
        stub.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\n{behaviour.get(tool, "exit 0")}\n')
        stub.chmod(0o755)


SSH_SHUTDOWNS = ["ssh-shutdown.yaml", "wake-on-lan.yaml", "smart-plug.yaml"]


@pytest.mark.parametrize("path", SSH_SHUTDOWNS)
@pytest.mark.parametrize(
    ("login", "poweroff", "ping", "succeeds"),
    [
        (0, 255, 1, True),  # logged in; the machine dropped the connection going down
        (0, 0, 1, True),
        (0, 1, 1, False),  # sudo refused
        (255, 0, 0, False),  # answers ping, login refused (key, known_hosts)
        (255, 0, 1, True),  # no answer at all: already off
    ],
)
def test_the_ssh_shutdown_scripts_fail_when_the_machine_was_not_shut_down(
    tmp_path: Path, path: str, login: int, poweroff: int, ping: int, succeeds: bool
) -> None:
    calls = tmp_path / "calls"
    _stub_tools(tmp_path / "bin", calls)
    command, _ = _script(path, "shutdownPodSpec")
    assert command[:2] == ["/bin/sh", "-c"]
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SSH_LOGIN": str(login), "SSH_POWEROFF": str(poweroff)}
    env["PING"] = str(ping)
    done = subprocess.run(["/bin/sh", "-c", command[2]], env=env, capture_output=True, text=True, timeout=30)
    assert (done.returncode == 0) is succeeds, (done.returncode, done.stdout, done.stderr)
    if not succeeds and login != 0:
        assert "SSH login failed" in done.stderr
    plug_off = "curl" in calls.read_text() and "on=false" in calls.read_text()
    assert plug_off is (succeeds and path == "smart-plug.yaml"), calls.read_text()


def test_the_smart_plug_stays_on_under_an_os_that_still_answers(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    _stub_tools(tmp_path / "bin", calls)
    command, _ = _script("smart-plug.yaml", "shutdownPodSpec")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "SSH_LOGIN": "0", "SSH_POWEROFF": "255", "PING": "0"}
    done = subprocess.run(["/bin/sh", "-c", command[2]], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "the plug stays on" in done.stderr, done.stderr
    assert "on=false" not in calls.read_text()


def test_the_kind_homelab_and_workload_validate() -> None:
    for name in ("homelab.yaml", "workload.yaml"):
        for doc in yaml.safe_load_all((DEPLOY / "kind" / name).read_text()):
            if doc:
                validate(doc)


@needs_kubectl
def test_the_kind_install_runs_this_checkout_on_the_control_plane_with_short_scale_down_times() -> None:
    docs = render("kind")
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            pod = doc["spec"]["template"]["spec"]
            assert pod["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}, doc["metadata"]["name"]
    images = {c["name"]: c["image"] for _, c in containers(docs) if c["name"] in ("homelab-autoscaler", "temporal")}
    assert images == {"homelab-autoscaler": "homelab-autoscaler:e2e", "temporal": "temporalio/admin-tools:1.32.1"}, \
        "the image `make e2e` builds and loads into kind, and the dev server's own"  # fmt: skip
    (ca,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "cluster-autoscaler"]
    args = ca["spec"]["template"]["spec"]["containers"][0]["args"]
    flags = dict(a.removeprefix("--").split("=", 1) for a in args if "=" in a)
    assert len(flags) == len([a for a in args if "=" in a]), "a flag is given twice"
    assert flags["scale-down-unneeded-time"] == "1m" and flags["max-node-provision-time"] == "10m"
    assert flags["cloud-provider"] == "externalgrpc"


# --- the admission webhook (components/admission, in the mTLS install) ------------------------------------------------
def _env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _check_webhook_install(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The registration reaches the pods that serve it, over a certificate the API server accepts, and spares the
    ServiceAccount deploy/rbac binds. Returns the Deployment that serves it."""
    from admission.review import WEBHOOK_NAME, WEBHOOK_PATH

    (vwc,) = objects_of("ValidatingWebhookConfiguration", docs)
    (hook,) = vwc["webhooks"]
    assert hook["name"] == WEBHOOK_NAME and hook["failurePolicy"] == "Fail" and hook["sideEffects"] == "None"
    assert {op for rule in hook["rules"] for op in rule["operations"]} == {"CREATE", "UPDATE"}, "never a DELETE"
    assert hook["timeoutSeconds"] <= 10
    ref = hook["clientConfig"]["service"]
    assert ref["path"] == WEBHOOK_PATH
    (svc,) = [s for s in objects_of("Service", docs) if s["metadata"]["name"] == ref["name"]]
    assert svc["metadata"]["namespace"] == ref["namespace"]
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == ref["port"]]
    serving = [d for d in objects_of("Deployment", docs)
               if svc["spec"]["selector"].items() <= d["spec"]["template"]["metadata"]["labels"].items()]  # fmt: skip
    assert len(serving) == 1, "the webhook's Service selects the pods of one Deployment"
    (dep,) = serving
    (container,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "homelab-autoscaler"]
    env = _env_of(container)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[port["targetPort"]] == int(env["HOMELAB_AUTOSCALER_WEBHOOK_ADDRESS"].rsplit(":", 1)[1])
    # The certificate: the API server checks <service>.<namespace>.svc against it; cert-manager injects its CA.
    certs = {c["metadata"]["name"]: c for c in objects_of("Certificate", docs)}
    namespace, _, cert_name = vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].partition("/")
    cert = certs[cert_name]
    assert (
        namespace == cert["metadata"]["namespace"]
        and f"{ref['name']}.{ref['namespace']}.svc" in cert["spec"]["dnsNames"]
    )
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    for variable in ("HOMELAB_AUTOSCALER_WEBHOOK_TLS_CERT", "HOMELAB_AUTOSCALER_WEBHOOK_TLS_KEY"):
        volume = volumes[mounts[str(Path(env[variable]).parent)]]
        assert volume["secret"]["secretName"] == cert["spec"]["secretName"], variable
    # The operator's own writes are never sent: the user spared is the ServiceAccount deploy/rbac binds.
    (binding,) = [b for b in objects_of("ClusterRoleBinding", docs) if b["metadata"]["name"] == "homelab-autoscaler"]
    (subject,) = binding["subjects"]
    user = f"system:serviceaccount:{subject['namespace']}:{subject['name']}"
    (spared,) = [c["expression"] for c in hook["matchConditions"] if c["name"] == "not-the-operator"]
    assert spared == f"request.userInfo.username != '{user}'"
    return dep


@needs_kubectl
def test_the_mtls_install_registers_the_admission_webhook_and_serves_it_from_the_operator() -> None:
    dep = _check_webhook_install(render("overlays/homelab-mtls"))
    assert dep["metadata"]["name"] == "homelab-autoscaler"
    assert not objects_of("ValidatingWebhookConfiguration", render("overlays/homelab")), "no certificate, no webhook"


@needs_kubectl
def test_split_serves_the_admission_webhook_from_the_provider_deployment(tmp_path: Path) -> None:
    """components/admission patches the Deployment that serves the provider; with split listed first, that is the
    provider's own, and the worker and watchers serve nothing the API server calls."""
    deploy = _deploy_dir()
    components = [os.path.relpath(deploy / "components" / c, tmp_path) for c in ("split", "admission", "cert-manager")]
    kustomization = yaml.safe_dump({
        "namespace": "homelab-autoscaler-system",
        "resources": [os.path.relpath(deploy / "overlays" / "homelab", tmp_path)],
        "components": components,
    })  # fmt: skip
    docs = _render_overlay(tmp_path, kustomization)
    dep = _check_webhook_install(docs)
    assert dep["spec"]["template"]["spec"]["containers"][0]["args"] == ["provider"]
    others = [d for d in objects_of("Deployment", docs) if d is not dep and d["metadata"]["name"].startswith("homelab")]
    envs = [_env_of(d["spec"]["template"]["spec"]["containers"][0]) for d in others]
    assert envs and not any("HOMELAB_AUTOSCALER_WEBHOOK_ADDRESS" in env for env in envs)


@needs_kubectl
@pytest.mark.parametrize("path", ["base", "overlays/homelab", "overlays/split", "overlays/homelab-mtls",
                                  "overlays/temporal-cluster", "overlays/external-postgresql"])  # fmt: skip
def test_the_operator_and_its_temporal_never_stand_on_a_machine_it_powers_off(path: str) -> None:
    """Every Pod the install makes (its workloads, and its Jobs and CronJobs: the certs step's Job once landed on a
    machine) may only run on the control plane (tolerating its taint) or a node labelled
    homelab-autoscaler.dev/ground=true; the long-running ones tell cluster-autoscaler never to evict them: a machine
    the operator manages is never its ground (docs/decisions.md, "The operator's ground")."""
    docs = render(path)
    templates = [(d, d["spec"]["template"]) for d in docs if d["kind"] in ("Deployment", "StatefulSet", "Job")]
    templates += [(d, d["spec"]["jobTemplate"]["spec"]["template"]) for d in docs if d["kind"] == "CronJob"]
    assert templates
    for doc, pod in templates:
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        keys = [(e["key"], e["operator"]) for t in terms["nodeSelectorTerms"] for e in t["matchExpressions"]]
        assert keys == [("node-role.kubernetes.io/control-plane", "Exists"), ("homelab-autoscaler.dev/ground", "In")]
        assert {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"} in pod[
            "spec"]["tolerations"], doc["metadata"]["name"]  # fmt: skip
        if doc["kind"] in ("Deployment", "StatefulSet"):
            assert pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"


@needs_kubectl
@pytest.mark.parametrize(
    ("overlay", "components"),
    [("overlays/temporal-cluster", ["split"]), ("overlays/homelab", ["split", "cert-manager", "admission"])],
)
def test_components_added_to_an_overlay_run_the_released_image(
    tmp_path: Path, overlay: str, components: list[str]
) -> None:
    """docs/install.md adds components to an overlay of one's own: the Deployments a component brings come after
    that overlay named the image, and still run the released one, never the manifests' placeholder."""
    deploy = _deploy_dir()
    kustomization = yaml.safe_dump({
        "resources": [os.path.relpath(deploy / overlay, tmp_path)],
        "components": [os.path.relpath(deploy / "components" / c, tmp_path) for c in components],
    })  # fmt: skip
    (released,) = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())["images"]
    images = {
        c["image"]
        for _, c in containers(_render_overlay(tmp_path, kustomization))
        if not c["image"].startswith(("temporalio/", "postgres:"))
    }  # the bundled Temporal's, pinned apart
    assert images == {f"{released['newName']}:{released['newTag']}"}


# --- uninstalling with kustomize keeps the CRDs and the namespace (issue 44) --------------------------------------
UNINSTALL = "kubectl delete -k deploy/overlays/homelab -l 'homelab-autoscaler.dev/uninstall!=keep'"


@pytest.mark.parametrize("overlay", ["overlays/homelab", "overlays/homelab-mtls", "overlays/split",
                                     "overlays/temporal-cluster"])  # fmt: skip
def test_the_uninstall_selector_keeps_exactly_the_crds_and_the_namespace(overlay: str) -> None:
    """What `kubectl delete -k <overlay> -l 'homelab-autoscaler.dev/uninstall!=keep'` leaves (a `!=` selector
    matches an object without the label too): the CRDs, and so every Group, slot and claim, and the namespace they
    live in; everything else of the install goes."""
    docs = render(overlay)
    kept = {(d["kind"], d["metadata"]["name"]) for d in docs
            if (d["metadata"].get("labels") or {}).get(names.LABEL_UNINSTALL) == names.UNINSTALL_KEEP}  # fmt: skip
    crds = {("CustomResourceDefinition", f"{p}.{names.GROUP}") for p in ("groups", "nodes", "nodeclaims")}
    assert kept == crds | {("Namespace", "homelab-autoscaler-system")}, kept
    assert len(docs) > len(kept) + 5, "the rest of the install is deleted"


def test_the_install_guide_uninstalls_with_the_selector_and_warns() -> None:
    text = INSTALL.read_text()
    assert UNINSTALL in text
    section = text.split("## Uninstalling: keep your Groups, slots and claims", 1)[1].split("\n## ", 1)[0]
    assert "Do not uninstall with a bare `kubectl delete -k deploy/overlays/homelab`" in section
    removal = section.split("**Removing everything, on purpose.**", 1)[1]
    assert removal.index("delete nodeclaims --all") < removal.index("delete -k deploy/crds"), "claims end first"
    assert UNINSTALL in (ROOT / "README.md").read_text()
