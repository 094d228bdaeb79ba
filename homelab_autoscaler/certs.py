"""The `certs` setup step: the install's own CA, the provider's and the webhook's serving certificates and
cluster-autoscaler's client certificate, kept in Secrets of the operator's namespace (the client's in
cluster-autoscaler's, where that is another); mTLS with no cert-manager.

Idempotent: run it at install (a Job) and daily (a CronJob); a run that finds everything valid writes nothing. A
certificate is renewed with a third of its life left, and the CA likewise (the trust bundle keeps the old CA until it
expires, so a peer holding a certificate of the old CA is still trusted). A Secret this step did not write (no
`ISSUED_BY` annotation: cert-manager's, or one a user brought) is never written; a user's CA Secret with a key
(`homelab-autoscaler-ca`, tls.crt and tls.key) is used to issue the rest. Every write is guarded by the
resourceVersion it read, so two runs at once cannot interleave: the later one is refused and runs again.
"""

from __future__ import annotations

import base64
import datetime as dt
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from homelab_autoscaler import pki
from kube.adapter import Kube, Resource
from kube.errors import AlreadyExists, Conflict, KubeError, NotFound

log = logging.getLogger(__name__)

SECRETS = Resource("", "v1", "secrets", "Secret", True)
WEBHOOK_CONFIGS = Resource(
    "admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", "ValidatingWebhookConfiguration", False
)
ISSUED_BY = "homelab-autoscaler.dev/issued-by"
ISSUER = "homelab-autoscaler certs"
CA_SECRET = "homelab-autoscaler-ca"
PROVIDER_SECRET = "homelab-autoscaler-provider-tls"
CLIENT_SECRET = "cluster-autoscaler-client-tls"
WEBHOOK_SECRET = "homelab-autoscaler-webhook-tls"
# The bundled Temporal's (with --temporal): its frontend's serving certificate (which its own system worker also
# presents to it), and the client certificates of the operator's Pods and of the Web UI.
TEMPORAL_FRONTEND_SECRET = "temporal-frontend-tls"
TEMPORAL_CLIENT_SECRET = "homelab-autoscaler-temporal-tls"
TEMPORAL_WEB_SECRET = "temporal-web-tls"
TEMPORAL_FRONTEND = "temporal-frontend"
WEBHOOK_CONFIG = "homelab-autoscaler"
WEBHOOK_SERVICE = "homelab-autoscaler-webhook"
INJECTED = "cert-manager.io/inject-ca-from"
CERT_MANAGER = "cert-manager.io/certificate-name"


@dataclass(frozen=True)
class Leaf:
    """One certificate the install needs: the Secret it lives in and what it is for."""

    secret: str
    namespace: str
    common_name: str
    dns_names: tuple[str, ...] = ()
    usage: pki.Usage = pki.Usage.SERVER
    # Who reads it only when it starts, and so must be restarted once it is renewed ("" when every reader re-reads).
    read_at_start_by: str = ""


def _service_names(service: str, namespace: str) -> tuple[str, ...]:
    return (service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local")


def temporal_leaves(namespace: str) -> tuple[Leaf, ...]:
    """The bundled Temporal's frontend requires a client certificate of the install's CA: its own (its system worker
    calls it), the operator's Pods' and the Web UI's."""
    return (
        Leaf(
            TEMPORAL_FRONTEND_SECRET,
            namespace,
            TEMPORAL_FRONTEND,
            _service_names(TEMPORAL_FRONTEND, namespace),
            usage=pki.Usage.SERVER_AND_CLIENT,
        ),
        Leaf(TEMPORAL_CLIENT_SECRET, namespace, "homelab-autoscaler", usage=pki.Usage.CLIENT),
        Leaf(TEMPORAL_WEB_SECRET, namespace, "temporal-web", usage=pki.Usage.CLIENT),
    )


def leaves(namespace: str, client_namespace: str | None = None) -> tuple[Leaf, ...]:
    """The provider's names are its Service's (cluster-autoscaler checks the cloud-config's host against them), the
    webhook's the ones the API server dials; cluster-autoscaler's is a client certificate, in the namespace its Pod
    mounts it from (a Pod mounts Secrets of its own namespace only)."""
    provider = "homelab-autoscaler-provider"
    return (
        Leaf(PROVIDER_SECRET, namespace, provider, _service_names(provider, namespace)),
        Leaf(
            CLIENT_SECRET,
            client_namespace or namespace,
            "cluster-autoscaler",
            usage=pki.Usage.CLIENT,
            read_at_start_by="cluster-autoscaler",
        ),
        Leaf(
            WEBHOOK_SECRET,
            namespace,
            WEBHOOK_SERVICE,
            (f"{WEBHOOK_SERVICE}.{namespace}.svc", f"{WEBHOOK_SERVICE}.{namespace}.svc.cluster.local"),
        ),
    )


def due(cert: bytes, now: dt.datetime) -> bool:
    """Renewal is due with a third of the certificate's life left (cert-manager's default)."""
    left, lifetime = pki.remaining(cert, now)
    return left <= lifetime / 3


def _data(secret: Mapping[str, Any]) -> dict[str, bytes]:
    """A Secret's data decoded; a value that is not base64 reads as empty (and so is issued again, when ours)."""
    out: dict[str, bytes] = {}
    for key, value in (secret.get("data") or {}).items():
        try:
            out[key] = base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            out[key] = b""
    return out


def _ours(secret: Mapping[str, Any]) -> bool:
    """Written by this step, and not taken over by cert-manager since (it keeps the annotations it finds)."""
    annotations = (secret.get("metadata") or {}).get("annotations") or {}
    return annotations.get(ISSUED_BY) == ISSUER and CERT_MANAGER not in annotations


def _encoded(data: Mapping[str, bytes]) -> dict[str, str]:
    return {k: base64.b64encode(v).decode() for k, v in data.items()}


@dataclass
class Authority:
    """The CA in use: its pair (None when a user's CA Secret has no key) and the trust bundle to hand out."""

    pair: pki.Issued | None
    bundle: bytes


class CertSetup:
    """One run of the step against one namespace; `run()` returns a line per object saying what it found and did."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        *,
        client_namespace: str | None = None,
        temporal: bool = False,
        now: Callable[[], dt.datetime] | None = None,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.client_namespace = client_namespace or namespace
        self.temporal = temporal
        self.now = now or (lambda: dt.datetime.now(dt.UTC))
        self.said: list[str] = []

    # --- Secrets ------------------------------------------------------------------------------------------
    def _read(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self.kube.get_raw(SECRETS, namespace or self.namespace, name)
        except NotFound:
            return None

    def _write(
        self, name: str, data: Mapping[str, bytes], found: Mapping[str, Any] | None, namespace: str | None = None
    ) -> None:
        """Create the Secret, or replace its data guarded by the resourceVersion read (`Conflict` if it moved)."""
        namespace = namespace or self.namespace
        if found is None:
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "type": "kubernetes.io/tls",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "labels": {
                        "app.kubernetes.io/name": "homelab-autoscaler",
                        "app.kubernetes.io/part-of": "homelab-autoscaler",
                    },
                    "annotations": {ISSUED_BY: ISSUER},
                },
                "data": _encoded(data),
            }
            try:
                self.kube.create_raw(SECRETS, namespace, body)
            except AlreadyExists as err:  # another run was first: decide again from what it wrote
                raise Conflict(f"Secret {namespace}/{name} appeared meanwhile") from err
            return
        patch = {"metadata": {"resourceVersion": found["metadata"]["resourceVersion"]}, "data": _encoded(data)}
        self.kube.patch_raw(SECRETS, namespace, name, patch)

    # --- the CA ---------------------------------------------------------------------------------------------
    def authority(self) -> Authority:
        found = self._read(CA_SECRET)
        now = self.now()
        if found is not None and not _ours(found):
            data = _data(found)
            if not data.get("tls.crt"):
                raise ValueError(
                    f"Secret {self.namespace}/{CA_SECRET} (yours) has no tls.crt: give it the CA's "
                    "certificate and key, or delete it and let this step make a CA"
                )
            pair = pki.Issued(data["tls.crt"], data["tls.key"]) if data.get("tls.key") else None
            self.said.append(f"Secret {CA_SECRET}: yours, used as it is")
            return Authority(pair, pki.bundle([data.get("ca.crt") or data["tls.crt"]], now))
        data = _data(found) if found is not None else {}
        current = data.get("tls.crt", b"")
        try:
            keep = bool(current and data.get("tls.key")) and not due(current, now)
        except ValueError:
            keep = False
        if keep:
            self.said.append(f"Secret {CA_SECRET}: valid, kept")
            return Authority(self._signer(data, now), pki.bundle([data.get("ca.crt") or current], now))
        ca = pki.new_ca("homelab-autoscaler-ca", now)
        written = {"tls.crt": ca.cert, "tls.key": ca.key}
        previous = [data["ca.crt"]] if data.get("ca.crt") else []
        if current and data.get("tls.key"):
            # The old CA keeps signing while it outlives what it signs (see `_signer`), and stays trusted.
            written |= {"previous.crt": current, "previous.key": data["tls.key"]}
        written["ca.crt"] = pki.bundle([ca.cert, *previous], now)
        self._write(CA_SECRET, written, found)
        self.said.append(f"Secret {CA_SECRET}: {'renewed' if found else 'created'}")
        return Authority(self._signer(written, now), written["ca.crt"])

    @staticmethod
    def _signer(data: Mapping[str, bytes], now: dt.datetime) -> pki.Issued:
        """The CA that signs: the previous one while it outlives two leaves, else the newest.

        A renewed CA is trusted at once but signs only later, so a peer that read the trust bundle at its start (as
        cluster-autoscaler does) and was not restarted since keeps verifying every certificate it is served.
        """
        previous = data.get("previous.crt", b"")
        if previous and data.get("previous.key"):
            try:
                left, _ = pki.remaining(previous, now)
            except ValueError:
                left = dt.timedelta(0)
            if left > 2 * pki.LEAF_LIFETIME:
                return pki.Issued(previous, data["previous.key"])
        return pki.Issued(data["tls.crt"], data["tls.key"])

    # --- the leaves -----------------------------------------------------------------------------------------
    def leaf(self, leaf: Leaf, authority: Authority) -> None:
        found = self._read(leaf.secret, leaf.namespace)
        # A leaf outside the operator's namespace is named with its namespace in what the run says.
        shown = leaf.secret if leaf.namespace == self.namespace else f"{leaf.namespace}/{leaf.secret}"
        if found is not None and not _ours(found):
            self.said.append(f"Secret {shown}: yours (or cert-manager's), left alone")
            return
        now = self.now()
        data = _data(found) if found is not None else {}
        cert = data.get("tls.crt", b"")
        why = self._why_issue(leaf, cert, authority, now)
        if not why:
            if data.get("ca.crt") == authority.bundle:
                self.said.append(f"Secret {shown}: valid, kept")
                return
            self._write(leaf.secret, {**data, "ca.crt": authority.bundle}, found, leaf.namespace)
            self.said.append(f"Secret {shown}: trust bundle updated")
            return
        if authority.pair is None:
            raise ValueError(
                f"Secret {shown} needs issuing ({why}) but Secret {CA_SECRET} (yours) has no tls.key to sign with"
            )
        issued = pki.issue(
            authority.pair,
            leaf.common_name,
            dns_names=leaf.dns_names,
            usage=leaf.usage,
            now=now,
        )
        written = {"tls.crt": issued.cert, "tls.key": issued.key, "ca.crt": authority.bundle}
        self._write(leaf.secret, written, found, leaf.namespace)
        self.said.append(f"Secret {shown}: {'renewed' if found else 'created'} ({why})")
        if leaf.read_at_start_by and found is not None:
            log.warning(
                "%s reads Secret %s at start: restart it before the old one expires", leaf.read_at_start_by, shown
            )

    @staticmethod
    def _why_issue(leaf: Leaf, cert: bytes, authority: Authority, now: dt.datetime) -> str:
        """Why the leaf must be issued now ("" when the one there serves)."""
        if not cert:
            return "none yet"
        try:
            if due(cert, now):
                return "a third of its life left"
            if sorted(pki.dns_names(cert)) != sorted(leaf.dns_names):
                return "its names changed"
            if authority.pair is not None and not pki.signed_by(cert, authority.pair.cert):
                return "issued by another CA"
        except ValueError:
            return "unreadable"
        return ""

    # --- the webhook's registration -------------------------------------------------------------------------
    def ca_bundle(self) -> None:
        """The webhook's registration trusts the CA of the webhook's Secret (unless cert-manager injects it)."""
        try:
            config = self.kube.get_raw(WEBHOOK_CONFIGS, None, WEBHOOK_CONFIG)
        except NotFound:
            self.said.append(f"ValidatingWebhookConfiguration {WEBHOOK_CONFIG}: none (admission is off)")
            return
        except KubeError as err:
            if err.status != 403:
                raise
            self.said.append(f"ValidatingWebhookConfiguration {WEBHOOK_CONFIG}: not readable here (admission is off)")
            return
        if INJECTED in ((config.get("metadata") or {}).get("annotations") or {}):
            self.said.append(f"ValidatingWebhookConfiguration {WEBHOOK_CONFIG}: cert-manager injects its CA")
            return
        secret = self._read(WEBHOOK_SECRET)
        trust = _data(secret).get("ca.crt", b"") if secret else b""
        if not trust:
            raise ValueError(f"Secret {WEBHOOK_SECRET} has no ca.crt: the webhook's registration cannot trust it")
        encoded = base64.b64encode(trust).decode()
        webhooks = config.get("webhooks") or []
        changed = False
        for hook in webhooks:
            client = hook.get("clientConfig") or {}
            if (client.get("service") or {}).get("name") == WEBHOOK_SERVICE and client.get("caBundle") != encoded:
                client["caBundle"] = encoded
                hook["clientConfig"] = client
                changed = True
        if not changed:
            self.said.append(f"ValidatingWebhookConfiguration {WEBHOOK_CONFIG}: caBundle current")
            return
        patch = {"metadata": {"resourceVersion": config["metadata"]["resourceVersion"]}, "webhooks": webhooks}
        self.kube.patch_raw(WEBHOOK_CONFIGS, None, WEBHOOK_CONFIG, patch)
        self.said.append(f"ValidatingWebhookConfiguration {WEBHOOK_CONFIG}: caBundle set")

    # --- one run --------------------------------------------------------------------------------------------
    def run(self) -> list[str]:
        """Everything once; a write refused because another run moved first is decided again.

        Each refusal means another run settled one object that a new decision keeps, so a run is refused at most once
        per object it writes (the CA, each leaf, the webhook's registration), however many run at once: that many
        tries and one more. A fixed three failed one of three runs started together under load."""
        everyone = leaves(self.namespace, self.client_namespace)
        everyone += temporal_leaves(self.namespace) if self.temporal else ()
        attempts = len(everyone) + 3
        for attempt in range(1, attempts + 1):
            self.said = []
            try:
                authority = self.authority()
                for leaf in everyone:
                    self.leaf(leaf, authority)
                self.ca_bundle()
                return self.said
            except Conflict as err:
                if attempt == attempts:
                    raise
                log.info("another run wrote first (%s): deciding again", err)
        raise AssertionError("unreachable")
