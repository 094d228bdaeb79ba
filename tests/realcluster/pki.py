"""The real cluster's PKI: one CA, the API server's serving certificate, client certificates for the control
plane's components, the ServiceAccount signing key, and kubeconfigs. Everything is made fresh per cluster, in
its directory, with short-lived certificates: nothing outlives the test that made it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=2)
# cert-manager's `usages` words, as x509 extended key usages and key usages (the ones deploy/ uses).
EXTENDED_USAGES = {"server auth": ExtendedKeyUsageOID.SERVER_AUTH, "client auth": ExtendedKeyUsageOID.CLIENT_AUTH}
KEY_USAGES = {"digital signature": "digital_signature", "key encipherment": "key_encipherment"}


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@dataclass(frozen=True)
class Pair:
    """A certificate and its key, as files."""

    cert: Path
    key: Path


class Authority:
    """A self-signed CA that issues serving and client certificates into one directory."""

    def __init__(self, directory: Path, name: str = "homelab-realcluster-ca") -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._key = _key()
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert = _write_cert(self._cert, self.dir / "ca.crt")
        self.key = _write_key(self._key, self.dir / "ca.key")

    def issue(
        self,
        stem: str,
        common_name: str,
        *,
        organizations: tuple[str, ...] = (),
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        server: bool = False,
        usages: tuple[str, ...] = (),
    ) -> Pair:
        """A leaf certificate: a client one (CN = user, O = groups, as the API server reads them) or a serving one.
        `usages` in cert-manager's words ("server auth", "digital signature", ...) decide its key usages instead, as
        cert-manager would issue a Certificate; an empty `common_name` is an empty subject (the names in the SAN)."""
        key = _key()
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        if common_name:
            attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = dt.datetime.now(dt.UTC)
        usage = [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
        if usages:
            unknown = [u for u in usages if u not in EXTENDED_USAGES and u not in KEY_USAGES]
            if unknown:
                raise ValueError(f"certificate {stem}: usages {unknown} are none of {[*EXTENDED_USAGES, *KEY_USAGES]}")
            usage = [EXTENDED_USAGES[u] for u in usages if u in EXTENDED_USAGES]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            # As Go's x509 (cert-manager, kubeadm) writes it: the issuer's key named, for path building.
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), critical=False)
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
        )
        if usages and any(u in KEY_USAGES for u in usages):
            flags = {name: name in {KEY_USAGES[u] for u in usages if u in KEY_USAGES} for name in KEY_USAGES.values()}
            builder = builder.add_extension(
                x509.KeyUsage(**flags, content_commitment=False, data_encipherment=False, key_agreement=False,
                              key_cert_sign=False, crl_sign=False, encipher_only=False, decipher_only=False),
                critical=True,
            )  # fmt: skip
        if dns or ips:
            names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            # RFC 5280: with an empty subject the names are the certificate's identity, and the SAN is critical.
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=not attrs)
        cert = builder.sign(self._key, hashes.SHA256())
        return Pair(_write_cert(cert, self.dir / f"{stem}.crt"), _write_key(key, self.dir / f"{stem}.key"))


def service_account_key(path: Path) -> Path:
    """The key the API server signs ServiceAccount tokens with (and the controller-manager's token controller)."""
    return _write_key(rsa.generate_private_key(public_exponent=65537, key_size=2048), path)


def kubeconfig(path: Path, *, server: str, ca: Path, user: str, pair: Pair | None = None, token: str = "") -> Path:
    """A kubeconfig of one cluster, one user (a client certificate or a bearer token) and one context."""
    credentials: dict[str, str] = {}
    if pair is not None:
        credentials = {"client-certificate": str(pair.cert), "client-key": str(pair.key)}
    if token:
        credentials["token"] = token
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "real", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": "real", "context": {"cluster": "real", "user": user}}],
        "current-context": "real",
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path
