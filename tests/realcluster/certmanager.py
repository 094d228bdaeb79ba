"""The harness in cert-manager's place, for `deploy/overlays/homelab-mtls` on the real node: cert-manager's own CRDs
are installed (from its Go module's source, by build-node.sh), the overlay is applied as written, and this module
does what cert-manager's controller and CA injector would do with the objects the API server then holds, and no
more: it reads the Issuers and Certificates back from the cluster, issues each Certificate from its Issuer, writes
the Secret as cert-manager writes it (type kubernetes.io/tls; tls.crt, tls.key, ca.crt; its annotations), marks the
Certificate and the Issuer Ready, and puts the CA named by `cert-manager.io/inject-ca-from` into the
ValidatingWebhookConfigurations that ask for it.

What is issued follows cert-manager's rules (pkg/util/pki in its module): the subject is the commonName alone; the
SANs are the dnsNames; key usages are the listed ones (its default "digital signature, key encipherment" when none),
plus "cert sign" for a CA; basic constraints CA true or false; the validity is `duration` (90 days when unset). A
selfSigned Issuer signs with the Certificate's own key and the Secret's ca.crt is the certificate itself; a ca
Issuer signs with the key in its Secret and ca.crt is that Secret's certificate. A field this module does not
implement is refused by name rather than ignored (docs/decisions.md).
"""

from __future__ import annotations

import base64
import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

GROUP, VERSION = "cert-manager.io", "v1"
INJECT_ANNOTATION = "cert-manager.io/inject-ca-from"
DEFAULT_DURATION = dt.timedelta(days=90)
DEFAULT_USAGES = ("digital signature", "key encipherment")
KEY_USAGES = {
    "digital signature": "digital_signature", "content commitment": "content_commitment",
    "key encipherment": "key_encipherment", "data encipherment": "data_encipherment",
    "key agreement": "key_agreement", "cert sign": "key_cert_sign", "crl sign": "crl_sign",
}  # fmt: skip
EXT_USAGES = {"server auth": ExtendedKeyUsageOID.SERVER_AUTH, "client auth": ExtendedKeyUsageOID.CLIENT_AUTH}
# Certificate fields this stand-in issues from; any other in a spec is refused by name.
CERTIFICATE_FIELDS = {"secretName", "commonName", "dnsNames", "isCA", "duration", "renewBefore", "usages",
                      "privateKey", "issuerRef"}  # fmt: skip


class Unsupported(ValueError):
    """A field of a Certificate or an Issuer that this stand-in does not issue from: named, never ignored."""


def parse_duration(text: str) -> dt.timedelta:
    """A Go duration as cert-manager's fields take it (`2160h`, `87600h`, `90m`, `1h30m`)."""
    parts = re.fullmatch(r"((\d+)h)?((\d+)m)?((\d+)s)?", text)
    if not text or parts is None:
        raise Unsupported(f"duration {text!r} is not a Go duration of hours, minutes and seconds")
    h, m, s = (int(parts.group(i) or 0) for i in (2, 4, 6))
    return dt.timedelta(hours=h, minutes=m, seconds=s)


PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def new_key(spec: dict[str, Any]) -> PrivateKey:
    """The private key a Certificate's `privateKey` asks for (cert-manager's default: RSA 2048)."""
    algorithm = spec.get("algorithm", "RSA")
    size = int(spec.get("size", 0) or 0)
    if algorithm == "ECDSA":
        curves = {0: ec.SECP256R1(), 256: ec.SECP256R1(), 384: ec.SECP384R1(), 521: ec.SECP521R1()}
        if size not in curves:
            raise Unsupported(f"privateKey.size {size} for ECDSA (256, 384 or 521)")
        return ec.generate_private_key(curves[size])
    if algorithm == "RSA":
        return rsa.generate_private_key(public_exponent=65537, key_size=size or 2048)
    raise Unsupported(f"privateKey.algorithm {algorithm!r} (ECDSA or RSA here)")


@dataclass(frozen=True)
class Issued:
    """A Certificate's Secret, as cert-manager writes it."""

    cert: x509.Certificate
    key: PrivateKey
    ca: x509.Certificate

    def secret_data(self) -> dict[str, str]:
        pem = serialization.Encoding.PEM
        key = self.key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        return {
            "tls.crt": base64.b64encode(self.cert.public_bytes(pem)).decode(),
            "tls.key": base64.b64encode(key).decode(),
            "ca.crt": base64.b64encode(self.ca.public_bytes(pem)).decode(),
        }


def issue(spec: dict[str, Any], signer: tuple[x509.Certificate, PrivateKey] | None,
          now: dt.datetime | None = None) -> Issued:  # fmt: skip
    """One Certificate's spec issued by a selfSigned issuer (`signer` None) or a CA (its certificate and key)."""
    unknown = sorted(set(spec) - CERTIFICATE_FIELDS)
    if unknown:
        raise Unsupported(f"Certificate fields not issued by the harness: {', '.join(unknown)}")
    now = now or dt.datetime.now(dt.UTC)
    key = new_key(spec.get("privateKey") or {})
    is_ca = bool(spec.get("isCA", False))
    usages = list(spec.get("usages") or DEFAULT_USAGES)
    flags = dict.fromkeys(KEY_USAGES.values(), False)
    ext: list[x509.ObjectIdentifier] = []
    for usage in usages:
        if usage in KEY_USAGES:
            flags[KEY_USAGES[usage]] = True
        elif usage in EXT_USAGES:
            ext.append(EXT_USAGES[usage])
        else:
            raise Unsupported(f"usage {usage!r}")
    if is_ca:
        flags["key_cert_sign"] = True
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, spec["commonName"])] if spec.get("commonName")
                        else [])  # fmt: skip
    issuer_cert, issuer_key = signer if signer is not None else (None, key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_cert.subject if issuer_cert is not None else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + (parse_duration(spec["duration"]) if spec.get("duration") else DEFAULT_DURATION))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(encipher_only=False, decipher_only=False, **flags), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if ext:
        builder = builder.add_extension(x509.ExtendedKeyUsage(ext), critical=False)
    if spec.get("dnsNames"):
        # With no subject, the SANs are the certificate's names: RFC 5280 makes the extension critical then.
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in spec["dnsNames"]]),
                                        critical=not spec.get("commonName"))  # fmt: skip
    if issuer_cert is not None:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    cert = builder.sign(issuer_key, hashes.SHA256())
    return Issued(cert, key, issuer_cert if issuer_cert is not None else cert)


class CertManager:
    """Reconciles one namespace's Issuers and Certificates and the cluster's injections, as cert-manager would,
    each time `reconcile()` is called (the run calls it after each apply; nothing here renews)."""

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.custom: Any = k8s.CustomObjectsApi(api)
        self.core: Any = k8s.CoreV1Api(api)
        self.admission: Any = k8s.AdmissionregistrationV1Api(api)
        self.issued: list[str] = []

    def _list(self, plural: str) -> list[dict[str, Any]]:
        return list(self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, plural)["items"])

    def _secret(self, name: str) -> Any:
        try:
            return self.core.read_namespaced_secret(name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _ready(self, plural: str, name: str, message: str) -> None:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready" if plural == "issuers" else
                                  "Issued", "message": message, "lastTransitionTime": now}]}  # fmt: skip
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, self.namespace, plural, name,
                                                          {"status": status})  # fmt: skip

    def _signer(self, issuer: dict[str, Any]) -> tuple[x509.Certificate, PrivateKey] | str | None:
        """The issuer's signing pair (None: self-signed), or why it cannot sign yet."""
        spec = issuer.get("spec") or {}
        if "selfSigned" in spec:
            return None
        if "ca" in spec:
            secret = self._secret(spec["ca"]["secretName"])
            if secret is None:
                return f"Secret {spec['ca']['secretName']} of Issuer {issuer['metadata']['name']} does not exist yet"
            cert = x509.load_pem_x509_certificate(base64.b64decode(secret.data["tls.crt"]))
            key = serialization.load_pem_private_key(base64.b64decode(secret.data["tls.key"]), None)
            assert isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey), type(key)
            return cert, key
        raise Unsupported(f"Issuer {issuer['metadata']['name']}: only selfSigned and ca issuers here ({sorted(spec)})")

    def reconcile(self) -> list[str]:
        """Issues every Certificate whose Secret is missing (a CA before what it signs: passes until none is left
        waiting), marks Issuers and Certificates Ready, injects CAs. Returns what is still waiting, with why."""
        waiting: list[str] = []
        for _ in range(5):
            issuers = {i["metadata"]["name"]: i for i in self._list("issuers")}
            waiting = []
            for name, issuer in issuers.items():
                signer = self._signer(issuer)
                if not isinstance(signer, str):
                    self._ready("issuers", name, "Signing CA verified" if signer else "")
            for cert in self._list("certificates"):
                spec, name = cert["spec"], cert["metadata"]["name"]
                if self._secret(spec["secretName"]) is not None:
                    continue
                ref = spec["issuerRef"]
                if ref.get("kind", "Issuer") != "Issuer" or ref.get("group", GROUP) != GROUP:
                    raise Unsupported(f"Certificate {name}: issuerRef {ref} (namespaced Issuers only here)")
                if ref["name"] not in issuers:
                    waiting.append(f"Certificate {name}: Issuer {ref['name']} does not exist")
                    continue
                signer = self._signer(issuers[ref["name"]])
                if isinstance(signer, str):
                    waiting.append(f"Certificate {name}: {signer}")
                    continue
                self._write(cert, issue(spec, signer), ref["name"])
            if not waiting:
                break
        self._inject()
        return waiting

    def _write(self, cert: dict[str, Any], issued: Issued, issuer: str) -> None:
        spec, name = cert["spec"], cert["metadata"]["name"]
        annotations = {
            "cert-manager.io/certificate-name": name, "cert-manager.io/issuer-name": issuer,
            "cert-manager.io/issuer-kind": "Issuer", "cert-manager.io/issuer-group": GROUP,
            "cert-manager.io/common-name": spec.get("commonName", ""),
            "cert-manager.io/alt-names": ",".join(spec.get("dnsNames") or []),
            "cert-manager.io/ip-sans": "", "cert-manager.io/uri-sans": "",
        }  # fmt: skip
        body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": spec["secretName"], "namespace": self.namespace, "annotations": annotations,
                             "labels": {"controller.cert-manager.io/fao": "true"}},
                "data": issued.secret_data()}  # fmt: skip
        self.core.create_namespaced_secret(self.namespace, body)
        self._ready("certificates", name, "Certificate is up to date and has not expired")
        self.issued.append(name)

    def _inject(self) -> None:
        """cainjector: a registration annotated `inject-ca-from: <namespace>/<certificate>` gets that Certificate's
        Secret's ca.crt as every webhook's caBundle."""
        for vwc in self.admission.list_validating_webhook_configuration().items:
            source = (vwc.metadata.annotations or {}).get(INJECT_ANNOTATION, "")
            if not source:
                continue
            namespace, name = source.split("/", 1)
            if namespace != self.namespace:
                continue
            cert = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "certificates", name)
            secret = self._secret(cert["spec"]["secretName"])
            if secret is None:
                continue
            bundle = secret.data["ca.crt"]
            patch = [{"op": "replace" if hook.client_config.ca_bundle else "add",
                      "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
                     for i, hook in enumerate(vwc.webhooks or [])]  # fmt: skip
            if patch:
                self.admission.patch_validating_webhook_configuration(vwc.metadata.name, patch)
