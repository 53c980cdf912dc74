"""TLS for the gateway: the controlplane serves it with a certificate and key, workers and the
CLI dial it trusting a CA (the gateway certificate's issuer, or the system's roots when none is
given). A pool with `tunnel: true` carries every worker call inside this channel; without the
tunnel the controlplane dials workers with TLS of their own (`levers9.rpc.worker_tls`).

Every file and PEM is checked before gRPC sees it, so a wrong path, a file that is not PEM, or a
key that does not belong to the certificate fails at start with the setting named, not as a
handshake error on the first worker.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    from cryptography import x509

    from levers9.config import ControlplaneSettings


class TlsError(ValueError):
    """A certificate, key or CA cannot be used; the message names the setting."""


def read_pem(path: Path, setting: str) -> bytes:
    try:
        return path.expanduser().read_bytes()
    except OSError as error:
        raise TlsError(f"{setting}: cannot read {path}: {error.strerror}") from None


def certificates(pem: bytes, setting: str) -> list[x509.Certificate]:
    """The PEM's certificates (at least one), or a TlsError naming `setting`."""
    from cryptography import x509  # only with TLS files: a plaintext CLI never loads it

    try:
        found = x509.load_pem_x509_certificates(pem)
    except ValueError:
        found = []
    if not found:
        raise TlsError(f"{setting}: not a PEM certificate (-----BEGIN CERTIFICATE-----)")
    return found


def server_credentials(cert_file: Path, key_file: Path) -> grpc.ServerCredentials:
    """The gateway's certificate chain and key, checked to belong together."""
    cert_pem = read_pem(cert_file, "gatewayTlsCertFile")
    key_pem = read_pem(key_file, "gatewayTlsKeyFile")
    check_key_pair(cert_pem, key_pem, "gatewayTlsCertFile", "gatewayTlsKeyFile")
    return grpc.ssl_server_credentials([(key_pem, cert_pem)])


def check_key_pair(cert_pem: bytes, key_pem: bytes, cert_setting: str, key_setting: str) -> None:
    """The PEM certificate (chain) and unencrypted key load and belong together; a TlsError
    naming the setting otherwise."""
    from cryptography.hazmat.primitives import serialization

    leaf = certificates(cert_pem, cert_setting)[0]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise TlsError(
            f"{key_setting}: not an unencrypted PEM private key (-----BEGIN PRIVATE KEY-----)"
        ) from None
    if _public_der(key.public_key()) != _public_der(leaf.public_key()):
        raise TlsError(f"{key_setting}: the key does not belong to {cert_setting}'s certificate")


def _public_der(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    der: bytes = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return der


def channel_credentials(ca_pem: bytes | None, setting: str) -> grpc.ChannelCredentials:
    """TLS to the gateway, trusting `ca_pem` (checked) or, without one, the system's roots."""
    if ca_pem:
        certificates(ca_pem, setting)
    return grpc.ssl_channel_credentials(root_certificates=ca_pem or None)


def gateway_ca_pem(settings: ControlplaneSettings) -> bytes | None:
    """The gateway's CA as workers and the CLI trust it; None for the system's roots."""
    if settings.gateway_tls_ca_file is None:
        return None
    pem = read_pem(settings.gateway_tls_ca_file, "gatewayTlsCaFile")
    certificates(pem, "gatewayTlsCaFile")
    return pem


def gateway_client_credentials(settings: ControlplaneSettings) -> grpc.ChannelCredentials | None:
    """How the CLI dials the gateway: TLS when the gateway serves it, plaintext otherwise."""
    if not settings.gateway_uses_tls():
        return None
    return channel_credentials(gateway_ca_pem(settings), "gatewayTlsCaFile")


def gateway_server_credentials(settings: ControlplaneSettings) -> grpc.ServerCredentials | None:
    cert, key = settings.gateway_tls_cert_file, settings.gateway_tls_key_file
    if cert is None or key is None:
        return None
    return server_credentials(cert, key)


def endpoints_ssl_context(settings: ControlplaneSettings) -> ssl.SSLContext | None:
    """The endpoints' HTTPS: the gateway's own certificate; None when the gateway has none."""
    cert, key = settings.gateway_tls_cert_file, settings.gateway_tls_key_file
    if cert is None or key is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def check_gateway_settings(settings: ControlplaneSettings) -> None:
    """Reads and checks every gateway TLS file the settings name (a TlsError otherwise), so a
    wrong one stops the controlplane's start, not the first worker's handshake."""
    gateway_server_credentials(settings)
    gateway_ca_pem(settings)
