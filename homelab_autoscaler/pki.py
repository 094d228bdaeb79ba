"""A private CA and the certificates it issues, as PEM bytes: what the `certs` setup step writes into Secrets.

Pure of the cluster: the step (homelab_autoscaler/certs.py) decides what to issue and where it goes; this file
only makes and reads X.509. ECDSA P-256 keys, as the cert-manager component asks for, so both issuers hand the
provider and cluster-autoscaler the same kind of certificate.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Ten years: the root of a private, two-party trust (as the cert-manager component's CA).
CA_LIFETIME = dt.timedelta(days=3650)
# Ninety days, renewed with a third left: cert-manager's defaults for the same certificates.
LEAF_LIFETIME = dt.timedelta(days=90)
# Issued a little in the past, so a peer whose clock lags by a minute or two still accepts it.
BACKDATE = dt.timedelta(minutes=5)


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, PEM."""

    cert: bytes
    key: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def new_ca(common_name: str, now: dt.datetime, lifetime: dt.timedelta = CA_LIFETIME) -> Issued:
    """A self-signed CA that may sign end-entity certificates only (path length 0)."""
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign, cRLSign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


class Usage(Enum):
    """What a leaf certificate is presented for: its extended key usages."""

    SERVER = (ExtendedKeyUsageOID.SERVER_AUTH,)
    CLIENT = (ExtendedKeyUsageOID.CLIENT_AUTH,)
    # A server whose own parts call it, as Temporal's system worker calls its frontend.
    SERVER_AND_CLIENT = (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)


def issue(
    ca: Issued,
    common_name: str,
    *,
    dns_names: Sequence[str] = (),
    usage: Usage = Usage.SERVER,
    now: dt.datetime,
    lifetime: dt.timedelta = LEAF_LIFETIME,
) -> Issued:
    """An end-entity certificate signed by `ca`, for what `usage` says (a serving one names `dns_names`).

    Never valid past the CA: a certificate that outlived its issuer would be refused anyway, and later.
    """
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA's key is not ECDSA: bring a CA whose tls.key is ECDSA, or let the step make one")
    key = _key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(min(now + lifetime, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True
        )  # digitalSignature, keyEncipherment
        .add_extension(x509.ExtendedKeyUsage(list(usage.value)), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if dns_names:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def load(pem: bytes) -> x509.Certificate:
    """The first certificate of a PEM; ValueError naming what is wrong when there is none."""
    return x509.load_pem_x509_certificate(pem)


def bundle(pems: Sequence[bytes], now: dt.datetime) -> bytes:
    """CA certificates joined into one trust bundle: each once, the expired left out, in the order given."""
    seen: list[bytes] = []
    for pem in pems:
        for cert in x509.load_pem_x509_certificates(pem):
            if cert.not_valid_after_utc <= now:
                continue
            one = cert.public_bytes(serialization.Encoding.PEM)
            if one not in seen:
                seen.append(one)
    return b"".join(seen)


def signed_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    """Whether the certificate's signature verifies with the CA's public key."""
    cert, ca = load(cert_pem), load(ca_pem)
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def dns_names(cert_pem: bytes) -> list[str]:
    try:
        san = load(cert_pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return list(san.value.get_values_for_type(x509.DNSName))


def remaining(cert_pem: bytes, now: dt.datetime) -> tuple[dt.timedelta, dt.timedelta]:
    """(time left, whole lifetime) of a certificate: the step renews one with a third or less left."""
    cert = load(cert_pem)
    return cert.not_valid_after_utc - now, cert.not_valid_after_utc - cert.not_valid_before_utc
