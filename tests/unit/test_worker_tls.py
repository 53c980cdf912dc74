"""The worker CA and worker certificates (levers9.rpc.worker_tls), over real TLS handshakes: a
health server on loopback serving a worker's certificate, dialed as the controlplane dials."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from levers9.rpc.tls import TlsError
from levers9.rpc.worker_tls import (
    WorkerCertificate,
    server_credentials,
    server_name,
    worker_ca,
    worker_channel,
)

SECRET = "s3cret-for-the-worker-ca"
NOW = dt.datetime.now(dt.UTC)


@asynccontextmanager
async def serving(certificate: WorkerCertificate | None) -> AsyncIterator[str]:
    server = aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
    if certificate is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        creds = server_credentials(certificate.cert_pem, certificate.key_pem, "LEVERS9_")
        port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)


async def check(channel: aio.Channel) -> health_pb2.HealthCheckResponse:
    async with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)


def test_the_ca_is_derived_from_the_secret_alone() -> None:
    worker_ca.cache_clear()
    first = worker_ca(SECRET)
    worker_ca.cache_clear()
    again = worker_ca(SECRET)
    other = worker_ca("another secret")
    numbers = first.key.private_numbers().private_value
    assert numbers == again.key.private_numbers().private_value
    assert numbers != other.key.private_numbers().private_value
    assert first.cert.subject == again.cert.subject
    assert first.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_a_worker_certificate_names_its_worker_and_is_signed_by_the_ca() -> None:
    ca = worker_ca(SECRET)
    issued = ca.issue("3a47c8b8", NOW)
    cert = x509.load_pem_x509_certificate(issued.cert_pem.encode())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [server_name("3a47c8b8")]
    assert cert.issuer == ca.cert.subject
    cert.verify_directly_issued_by(ca.cert)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.not_valid_before_utc <= NOW <= cert.not_valid_after_utc
    # Each issue is a fresh key: the Secret is the only copy.
    assert ca.issue("3a47c8b8", NOW).key_pem != issued.key_pem


async def test_the_controlplane_reaches_the_worker_it_named() -> None:
    issued = worker_ca(SECRET).issue("w1", NOW)
    async with serving(issued) as address:
        reply = await check(worker_channel(address, "w1", True, SECRET))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_another_workers_certificate_fails_the_handshake() -> None:
    """A worker (or anyone holding its certificate) cannot answer for another worker."""
    issued = worker_ca(SECRET).issue("w2", NOW)
    async with serving(issued) as address:
        with pytest.raises(aio.AioRpcError) as raised:
            await check(worker_channel(address, "w1", True, SECRET))
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_certificate_from_another_secret_fails_the_handshake() -> None:
    """A server with a certificate from a CA other than ours (another controlplane, an
    impostor on the path) is refused."""
    issued = worker_ca("not our secret").issue("w1", NOW)
    async with serving(issued) as address:
        with pytest.raises(aio.AioRpcError) as raised:
            await check(worker_channel(address, "w1", True, SECRET))
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_the_ca_rotates_on_its_own_generation() -> None:
    """`workerCaGeneration: 2`: another CA from the same root; a certificate of the first
    generation no longer passes, one of the second does (generation 1 is the CA of before)."""

    def key(generation: int) -> int:
        return worker_ca(SECRET, generation).key.private_numbers().private_value

    assert key(1) == worker_ca(SECRET).key.private_numbers().private_value
    assert key(2) != key(1)
    old = worker_ca(SECRET).issue("w1", NOW)
    async with serving(old) as address:
        with pytest.raises(aio.AioRpcError) as raised:
            await check(worker_channel(address, "w1", True, SECRET, ca_generation=2))
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    new = worker_ca(SECRET, 2).issue("w1", NOW)
    async with serving(new) as address:
        reply = await check(worker_channel(address, "w1", True, SECRET, ca_generation=2))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_plaintext_worker_is_dialed_in_plaintext_and_a_tls_one_refuses_plaintext() -> None:
    async with serving(None) as address:
        reply = await check(worker_channel(address, "w1", False, SECRET))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    async with serving(worker_ca(SECRET).issue("w1", NOW)) as address:
        with pytest.raises(aio.AioRpcError) as raised:
            await check(worker_channel(address, "w1", False, SECRET))
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize(
    ("cert", "key", "message"),
    [
        ("CERT", "", "LEVERS9_WORKER_TLS_KEY is not set"),
        ("", "KEY", "LEVERS9_WORKER_TLS_CERT is not set"),
        ("garbage", "KEY", "LEVERS9_WORKER_TLS_CERT: not a PEM certificate"),
        ("CERT", "garbage", "LEVERS9_WORKER_TLS_KEY: not an unencrypted PEM private key"),
        ("CERT", "OTHER_KEY", "LEVERS9_WORKER_TLS_KEY: the key does not belong to"),
    ],
)
def test_broken_serving_credentials_name_the_variable(cert: str, key: str, message: str) -> None:
    mine = worker_ca(SECRET).issue("w1", NOW)
    other = worker_ca(SECRET).issue("w1", NOW)
    values = {"CERT": mine.cert_pem, "KEY": mine.key_pem, "OTHER_KEY": other.key_pem}
    with pytest.raises(TlsError, match=message) as raised:
        server_credentials(values.get(cert, cert), values.get(key, key), "LEVERS9_")
    assert "PRIVATE KEY-----\n" not in str(raised.value)
