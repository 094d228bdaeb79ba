"""cluster-autoscaler and the provider's mTLS as deploy/ runs them, out of cluster.

The harness renders the kustomizations a user applies (`kubectl kustomize`, with the server's own kubectl) and runs
what they say: cluster-autoscaler with its Deployment's arguments and the cloud-config of its ConfigMap, the provider
with the TLS settings deploy/components/cert-manager gives it, and the certificates cert-manager would issue for the
Certificates there (a pki.Authority per CA Certificate). What must differ outside a Pod is changed, each change said
with its reason (`Launch.changes`), and nothing else:

- a path under one of the Pod's volume mounts is the harness's copy of that volume (`Volumes`);
- the cloud-config's address keeps its host, which resolves to 127.0.0.1 in cluster-autoscaler's own mount namespace
  (its /etc/hosts, `with_hosts`), so cluster-autoscaler checks the provider's certificate against the name it checks
  in a cluster; the port is the provider's free loopback port;
- cluster-autoscaler's kubeconfig (a bound token of its ServiceAccount, where a Pod has it mounted) and its metrics
  address (a free loopback port, where a Pod listens on :8085 of its own network);
- the short test timings (`SHORT_TIMINGS`), so the story ends in minutes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.procs import ROOT
from tests.realcluster import pki

# What a user applies: cluster-autoscaler in plaintext, then over mTLS with the operator's mTLS install.
AUTOSCALER_PLAINTEXT = "deploy/cluster-autoscaler/plaintext"
AUTOSCALER_MTLS = "deploy/cluster-autoscaler/mtls"
OPERATOR_MTLS = "deploy/overlays/homelab-mtls"
AUTOSCALER = "cluster-autoscaler"  # the Deployment and its container
PROVIDER_LABEL = "homelab-autoscaler.dev/provider"
# The provider's settings the cert-manager component sets (HOMELAB_AUTOSCALER_TLS_CERT, _KEY, _CA and _INSECURE).
PROVIDER_TLS_ENV = ("HOMELAB_AUTOSCALER_TLS_", "HOMELAB_AUTOSCALER_INSECURE")

Kubectl = Callable[..., Any]  # Cluster.kubectl: runs kubectl, returns the CompletedProcess


@dataclass(frozen=True)
class Override:
    """A flag the harness sets over the manifest's value (or adds), and why it must differ here."""

    flag: str
    value: str
    why: str


# cluster-autoscaler's timings that keep the story under five minutes; every other timing is the manifest's (a
# Group's own scaleDownUnneededTime and maxNodeProvisionTime reach cluster-autoscaler through NodeGroupGetOptions).
SHORT_TIMINGS = (
    Override("scan-interval", "5s", "a short test timing: a loop every 5 s, not the default 10 s"),
    Override("scale-down-delay-after-add", "20s",
             "a short test timing: the manifest's 10m would hold step 5's scale-down for 10 minutes after step 4's "
             "scale-up"),
)  # fmt: skip


def render(kubectl: Kubectl, path: str) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize <path>` renders, as a user's `kubectl apply -k` would send them."""
    done = kubectl("kustomize", str(ROOT / path))
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def parse_args(args: Sequence[str]) -> list[tuple[str, str | None]]:
    """A container's `--name=value` and `--name` arguments, in order; anything else is an error naming it."""
    parsed: list[tuple[str, str | None]] = []
    for arg in args:
        if not arg.startswith("--") or len(arg) == 2:
            raise ValueError(f"argument {arg!r}: the harness reads --name=value and --name arguments only")
        name, eq, value = arg[2:].partition("=")
        parsed.append((name, value if eq else None))
    return parsed


def apply_overrides(args: Sequence[str], overrides: Sequence[Override]) -> tuple[list[str], list[str]]:
    """The arguments with each override's value in place of the manifest's (or added when the manifest does not set
    the flag), and a line per override saying what it changed and why."""
    parsed = parse_args(args)
    names = [n for n, _ in parsed]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"the manifest sets {', '.join('--' + n for n in twice)} more than once")
    values: dict[str, str | None] = dict(parsed)
    lines = []
    for o in overrides:
        if o.flag in values:
            lines.append(f"--{o.flag}: {values[o.flag]} -> {o.value} ({o.why})")
        else:
            lines.append(f"--{o.flag}={o.value} added ({o.why})")
            names.append(o.flag)
        values[o.flag] = o.value
    return [f"--{n}" if values[n] is None else f"--{n}={values[n]}" for n in names], lines


def only(docs: Sequence[dict[str, Any]], kind: str, name: str | None = None,
         label: str | None = None) -> dict[str, Any]:  # fmt: skip
    """The one object of `kind` (with this name, or carrying this label); an error names what was not one."""
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
             and (label is None or label in (d["metadata"].get("labels") or {}))]  # fmt: skip
    if len(found) != 1:
        raise ValueError(f"{len(found)} {kind} objects named {name or 'anything'} labelled {label or 'anything'}")
    return found[0]


def container_of(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return dict(container)


@dataclass
class Volumes:
    """A rendered Pod's volume mounts as directories under `root`, made when a path under one is first asked for: a
    configMap volume holds its ConfigMap's keys (or the items it names), a secret volume the keys of the Secret given
    for it (what cert-manager writes)."""

    pod: dict[str, Any]
    container: dict[str, Any]
    root: Path
    configmaps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    secrets: Mapping[str, Mapping[str, bytes]] = field(default_factory=dict)
    made: dict[str, Path] = field(default_factory=dict)

    def path(self, in_pod: str) -> Path:
        """Where the file the Pod sees at `in_pod` is here."""
        mounts = sorted(self.container.get("volumeMounts") or [], key=lambda m: -len(m["mountPath"]))
        for mount in mounts:
            base = mount["mountPath"].rstrip("/")
            if in_pod == base or in_pod.startswith(base + "/"):
                if "subPath" in mount:
                    raise ValueError(f"volume mount {mount['name']}: subPath is not read by the harness")
                return self._make(mount["name"]) / in_pod[len(base) :].lstrip("/")
        raise ValueError(f"{in_pod} is under no volume mount of container {self.container['name']}")

    def _make(self, name: str) -> Path:
        if name in self.made:
            return self.made[name]
        (volume,) = [v for v in self.pod.get("volumes") or [] if v["name"] == name]
        files: Mapping[str, str | bytes]
        if "configMap" in volume:
            files = self.configmaps[volume["configMap"]["name"]]
            items = volume["configMap"].get("items")
        elif "secret" in volume:
            files = self.secrets[volume["secret"]["secretName"]]
            items = volume["secret"].get("items")
        else:
            raise ValueError(f"volume {name}: only configMap and secret volumes are read by the harness")
        paths = {i["key"]: i["path"] for i in items} if items else {k: k for k in files}
        target = self.root / name
        target.mkdir(parents=True, exist_ok=True)
        for key, rel in paths.items():
            data = files[key]
            out = target / rel
            out.write_bytes(data if isinstance(data, bytes) else data.encode())
            out.chmod(0o600)
        self.made[name] = target
        return target


def issue_as_cert_manager(docs: Sequence[dict[str, Any]], directory: Path) -> dict[str, dict[str, bytes]]:
    """The Secrets cert-manager would write for the Certificates in `docs` (tls.crt, tls.key, ca.crt), by Secret name.
    A CA Certificate of a selfSigned Issuer becomes a pki.Authority named by its commonName; a `ca` Issuer issues with
    the Authority of its Secret, the names, subject and usages the Certificate asks for. Keys are ECDSA P-256 (what
    deploy/ asks); another issuer kind or key is an error naming the Certificate."""
    issuers = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Issuer"}
    certificates = [d for d in docs if d["kind"] == "Certificate"]
    authorities: dict[str, pki.Authority] = {}
    secrets: dict[str, dict[str, bytes]] = {}

    def issuer_of(cert: dict[str, Any]) -> dict[str, Any]:
        ref, name = cert["spec"]["issuerRef"], cert["metadata"]["name"]
        key = cert["spec"].get("privateKey") or {}
        if (key.get("algorithm"), key.get("size")) != ("ECDSA", 256):
            raise ValueError(f"Certificate {name}: the harness issues ECDSA P-256 keys only, not {key}")
        if ref.get("kind", "Issuer") != "Issuer" or ref["name"] not in issuers:
            raise ValueError(f"Certificate {name}: issuer {ref} is not an Issuer of the install")
        return dict(issuers[ref["name"]])

    for cert in certificates:
        spec = cert["spec"]
        if spec.get("isCA"):
            if "selfSigned" not in issuer_of(cert):
                raise ValueError(f"Certificate {cert['metadata']['name']}: a CA the harness makes is self-signed")
            ca = pki.Authority(directory / spec["secretName"], name=spec["commonName"])
            authorities[spec["secretName"]] = ca
            pem = ca.cert.read_bytes()
            secrets[spec["secretName"]] = {"tls.crt": pem, "tls.key": ca.key.read_bytes(), "ca.crt": pem}
    for cert in certificates:
        spec = cert["spec"]
        if spec.get("isCA"):
            continue
        issuer = issuer_of(cert)
        if "ca" not in issuer or issuer["ca"]["secretName"] not in authorities:
            raise ValueError(f"Certificate {cert['metadata']['name']}: its Issuer is no CA Issuer of the install")
        ca = authorities[issuer["ca"]["secretName"]]
        pair = ca.issue(spec["secretName"], spec.get("commonName", ""), dns=tuple(spec.get("dnsNames") or ()),
                        usages=tuple(spec.get("usages") or ()))  # fmt: skip
        secrets[spec["secretName"]] = {"tls.crt": pair.cert.read_bytes(), "tls.key": pair.key.read_bytes(),
                                       "ca.crt": ca.cert.read_bytes()}  # fmt: skip
    return secrets


def with_hosts(hosts: Path, argv: Sequence[str]) -> list[str]:
    """`argv` run in a mount namespace of its own whose /etc/hosts is `hosts` (bind-mounted there; the machine's
    /etc/hosts is not touched). Root unshares directly, anyone else through a user namespace mapping them to root.
    The process is `argv`'s own (the shell execs it): stopping it by its PID stops it."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise AssertionError("cluster-autoscaler runs in a mount namespace of its own: it needs `unshare`")
    as_root = [] if os.geteuid() == 0 else ["--map-root-user"]
    script = 'mount --bind "$0" /etc/hosts && exec "$@"'
    return [unshare, "--mount", "--propagation", "private", *as_root, "--", "/bin/sh", "-c", script, str(hosts),
            *argv]  # fmt: skip


@dataclass(frozen=True)
class Launch:
    """cluster-autoscaler's command line as deploy/ has it here, and every change the harness made to it."""

    argv: list[str]
    changes: list[str]
    kustomization: str
    address: str  # the cloud-config's address as the manifest says it


def autoscaler_launch(kubectl: Kubectl, binary: Path, kustomization: str, directory: Path, *, kubeconfig: Path,
                      metrics_port: int, provider_port: int,
                      secrets: Mapping[str, Mapping[str, bytes]] | None = None) -> Launch:  # fmt: skip
    """cluster-autoscaler as `kustomization` deploys it, run here: its Deployment's arguments and cloud-config with
    the changes named in this module's docstring."""
    docs = render(kubectl, kustomization)
    deployment = only(docs, "Deployment", AUTOSCALER)
    container = container_of(deployment, AUTOSCALER)
    configmaps = {d["metadata"]["name"]: d.get("data") or {} for d in docs if d["kind"] == "ConfigMap"}
    volumes = Volumes(deployment["spec"]["template"]["spec"], container, directory / "pod", configmaps, secrets or {})
    flags = dict(parse_args(container.get("args") or []))
    cloud_config = flags.get("cloud-config")
    if not cloud_config:
        raise ValueError(f"{kustomization}: cluster-autoscaler is given no --cloud-config")
    cloud_path = volumes.path(cloud_config)
    config = yaml.safe_load(cloud_path.read_text())
    changes = []
    address = str(config["address"])
    host = address.rpartition(":")[0]
    config["address"] = f"{host}:{provider_port}"
    changes.append(f"cloud-config address {address} -> {config['address']} (the provider listens on a free loopback "
                   f"port; {host} is 127.0.0.1 in cluster-autoscaler's mount namespace)")  # fmt: skip
    for key in ("cert", "key", "cacert"):
        if key in config:
            config[key] = str(volumes.path(str(config[key])))
    if "cert" in config:
        changes.append("cloud-config cert, key and cacert: the same files in the harness's copy of the Secret volume")
    cloud_path.write_text(yaml.safe_dump(config, sort_keys=False))
    overrides = (
        Override("cloud-config", str(cloud_path), "the harness's copy of the ConfigMap volume"),
        Override("kubeconfig", str(kubeconfig), "a bound token of its ServiceAccount, where a Pod has it mounted"),
        Override("address", f"127.0.0.1:{metrics_port}", "metrics and /health-check on a free loopback port"),
        *SHORT_TIMINGS,
    )
    args, lines = apply_overrides(container.get("args") or [], overrides)
    hosts = directory / "hosts"
    machine = Path("/etc/hosts").read_text() if Path("/etc/hosts").is_file() else ""
    hosts.write_text(f"{machine.rstrip()}\n127.0.0.1 {host}\n")
    return Launch(with_hosts(hosts, [str(binary), *args]), [*lines, *changes], kustomization, address)


def provider_tls_env(docs: Sequence[dict[str, Any]], directory: Path,
                     secrets: Mapping[str, Mapping[str, bytes]]) -> dict[str, str]:  # fmt: skip
    """The provider's TLS settings in the rendered mTLS install (deploy/components/cert-manager's patch of the
    Deployment labelled homelab-autoscaler.dev/provider), their paths in the harness's copies of its volumes."""
    deployment = only(docs, "Deployment", label=PROVIDER_LABEL)
    container = container_of(deployment, "homelab-autoscaler")
    volumes = Volumes(deployment["spec"]["template"]["spec"], container, directory / "pod", {}, secrets)
    env = {}
    for e in container.get("env") or []:
        if e["name"].startswith(PROVIDER_TLS_ENV) and "value" in e:
            value = str(e["value"])
            env[e["name"]] = str(volumes.path(value)) if value.startswith("/") else value
    if not {"HOMELAB_AUTOSCALER_TLS_CERT", "HOMELAB_AUTOSCALER_TLS_KEY", "HOMELAB_AUTOSCALER_TLS_CA"} <= env.keys():
        raise ValueError(f"{OPERATOR_MTLS}: the provider's Deployment has no TLS certificate settings ({sorted(env)})")
    return env
