"""X.509 the project mints: a CA that signs serving certificates, and those certificates (pure).

Two users: the worker CA (`levers9.rpc.worker_tls`, P-256, derived from the token secret) and the
sandbox's cluster CA (`sandbox.pki`, RSA, as GKE's). Both are real X.509 that gRPC,
kubectl and the Kubernetes client verify.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def ca_certificate(
    key: Any, common_name: str, serial: int, not_before: dt.datetime, not_after: dt.datetime
) -> x509.Certificate:
    """A self-signed CA for `key` that signs serving certificates directly (no intermediates)."""
    return (
        x509.CertificateBuilder()
        .subject_name(name(common_name))
        .issuer_name(name(common_name))
        .public_key(key.public_key())
        .serial_number(serial)
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def serving_certificate(
    ca_key: Any,
    ca: x509.Certificate,
    public_key: Any,
    names: list[x509.GeneralName],
    not_before: dt.datetime,
    not_after: dt.datetime,
) -> x509.Certificate:
    """A server certificate for `names` (the first is its common name), signed by `ca`."""
    first = names[0].value
    return (
        x509.CertificateBuilder()
        .subject_name(name(str(first)))
        .issuer_name(ca.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
