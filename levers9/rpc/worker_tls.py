"""TLS for the controlplane's calls to workers (pools without the tunnel).

Without the tunnel the controlplane dials each worker's WorkerService at the node's external IP,
across the internet: the worker token, the task's command and environment, and its logs would
cross it in plaintext. So each worker serves TLS with a certificate of its own, and the
controlplane checks it:

- The **worker CA** is derived from the worker token secret (HKDF), so every controlplane
  replica holds the same CA without another setting, and rotating the secret revokes every
  worker's certificate with its token. The CA's key never leaves the controlplane.
- `create_worker_job` issues each worker a certificate naming `<worker-id>.worker.levers9`
  (a fresh P-256 key) and puts both in the worker's token Secret beside its token; the Job
  hands them to the agent (`LEVERS9_WORKER_TLS_CERT`, `LEVERS9_WORKER_TLS_KEY`).
- The agent registers `tls: true`; calls to it then dial with the CA as the only root and the
  worker's own name as the name to verify, so a certificate issued to another worker, or by
  anyone else, fails the handshake.

A worker started by an older controlplane (no certificate in its Secret) registers without
`tls` and is dialed in plaintext as before; the flag comes from the worker over its
authenticated registration, never from the network path to it. Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from grpc import aio

from levers9 import certificates
from levers9.rpc.tls import TlsError, check_key_pair

CA_NAME = "levers9 worker CA"
SERVER_NAME_SUFFIX = ".worker.levers9"
# The CA's validity is fixed, so every replica derives the same CA; a worker's certificate is
# bound to its id and revoked with the secret, and lives as long as its Job might.
CA_NOT_BEFORE = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
CA_NOT_AFTER = dt.datetime(2075, 1, 1, tzinfo=dt.UTC)
WORKER_VALIDITY = dt.timedelta(days=3650)
_HKDF_INFO = b"levers9 worker CA v1"


@dataclass(frozen=True)
class WorkerCertificate:
    """What goes into a worker's Secret: its certificate and key (PEM)."""

    cert_pem: str
    key_pem: str


@dataclass(frozen=True)
class WorkerCa:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, worker_id: str, now: dt.datetime) -> WorkerCertificate:
        """A serving certificate for `worker_id` with a fresh key."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = certificates.serving_certificate(
            self.key,
            self.cert,
            key.public_key(),
            [x509.DNSName(server_name(worker_id))],
            now - dt.timedelta(hours=1),
            min(now + WORKER_VALIDITY, CA_NOT_AFTER),
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return WorkerCertificate(
            cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem.decode()
        )


def server_name(worker_id: str) -> str:
    """The name a worker's certificate carries and its callers verify."""
    return f"{worker_id}{SERVER_NAME_SUFFIX}"


@functools.lru_cache(maxsize=4)
def worker_ca(secret: str, generation: int = 1) -> WorkerCa:
    """The CA derived from the worker token secret: the same key on every replica.

    `generation` (the controlplane's `workerCaGeneration`) rotates it on its own: another
    derivation label, so a new CA without a new root secret (workers with certificates of the
    old one are replaced, as they can no longer be verified)."""
    info = _HKDF_INFO + (f" generation {generation}".encode() if generation > 1 else b"")
    seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret.encode())
    order = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # P-256's n
    key = ec.derive_private_key(int.from_bytes(seed, "big") % (order - 1) + 1, ec.SECP256R1())
    cert = certificates.ca_certificate(key, CA_NAME, 1, CA_NOT_BEFORE, CA_NOT_AFTER)
    return WorkerCa(key, cert)


def worker_channel(
    address: str, worker_id: str, tls: bool, secret: str, ca_generation: int = 1
) -> aio.Channel:
    """A channel to one worker: TLS checked against the worker CA and the worker's own name
    when it registered `tls`, else plaintext (tunnel ends, workers of an older controlplane)."""
    if not tls:
        return aio.insecure_channel(address)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=worker_ca(secret, ca_generation).cert_pem
    )
    options = (("grpc.ssl_target_name_override", server_name(worker_id)),)
    return aio.secure_channel(address, credentials, options=options)


def server_credentials(cert_pem: str, key_pem: str, prefix: str) -> grpc.ServerCredentials:
    """The agent's serving credentials, checked to belong together; a TlsError naming the
    variable (`<prefix>WORKER_TLS_CERT`, `<prefix>WORKER_TLS_KEY`) otherwise."""
    cert_var, key_var = f"{prefix}WORKER_TLS_CERT", f"{prefix}WORKER_TLS_KEY"
    if bool(cert_pem) != bool(key_pem):
        missing = key_var if cert_pem else cert_var
        raise TlsError(f"{missing} is not set: the worker's Secret carries both or neither")
    check_key_pair(cert_pem.encode(), key_pem.encode(), cert_var, key_var)
    return grpc.ssl_server_credentials([(key_pem.encode(), cert_pem.encode())])
