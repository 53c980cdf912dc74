"""Key material the sandbox mints: a cluster CA, a serving certificate, service-account keys.

Everything here is real X.509/RSA, so the official Kubernetes client, kubectl and google-auth
verify it exactly as they would GKE's.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import json
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from levers9 import certificates

_VALIDITY = dt.timedelta(days=365)


@dataclass(frozen=True)
class CertificateAuthority:
    """A self-signed CA and the serving certificate it issued for loopback."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @property
    def ca_base64(self) -> str:
        """The CA as GKE reports it (`masterAuth.clusterCaCertificate`): base64 of the PEM."""
        return base64.b64encode(self.ca_pem).decode()


def _private_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def mint_certificate_authority(
    common_name: str = "levers9-sandbox-ca", hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
) -> CertificateAuthority:
    """Mints a CA and a serving certificate for `hosts` (IPs or DNS names) signed by it."""
    now = dt.datetime.now(dt.UTC)
    ca_key = _private_key()
    ca_cert = certificates.ca_certificate(
        ca_key,
        common_name,
        x509.random_serial_number(),
        now - dt.timedelta(minutes=5),
        now + _VALIDITY,
    )
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = _private_key()
    cert = certificates.serving_certificate(
        ca_key, ca_cert, key.public_key(), names, now - dt.timedelta(minutes=5), now + _VALIDITY
    )
    return CertificateAuthority(
        ca_pem=ca_cert.public_bytes(serialization.Encoding.PEM),
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=_pem(key),
    )


def mint_service_account_key(
    *, project: str, account: str, token_uri: str, key_id: str | None = None
) -> dict[str, str]:
    """A service-account key in the JSON layout `gcloud iam service-accounts keys create` writes.

    Args:
        project: the GCP project id.
        account: the account's short name (`levers9-controlplane`).
        token_uri: where google-auth exchanges the key's signed JWT for an access token.
        key_id: the key's id; random when omitted.
    """
    key = _private_key()
    email = f"{account}@{project}.iam.gserviceaccount.com"
    kid = key_id or x509.random_serial_number().to_bytes(20, "big").hex()
    return {
        "type": "service_account",
        "project_id": project,
        "private_key_id": kid,
        "private_key": _pem(key).decode(),
        "client_email": email,
        "client_id": str(int(kid[:16], 16)),
        "auth_uri": "https://accounts.google.com/o/oauth2/auth",
        "token_uri": token_uri,
        "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
        "client_x509_cert_url": f"https://www.googleapis.com/robot/v1/metadata/x509/{email}",
        "universe_domain": "googleapis.com",
    }


def service_account_key_json(key: dict[str, str]) -> str:
    """The key file's text, as gcloud writes it."""
    return json.dumps(key, indent=2) + "\n"
