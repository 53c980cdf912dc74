"""Temporal over TLS, mutual TLS and an API key, as Temporal Cloud or a self-hosted cluster
serves it: the dev server cannot serve TLS, so a front of the test's own terminates TLS (with a
CA and certificates minted here, a client certificate required where mTLS is) and relays every
call to it, keeping what metadata each call carried. `connect` (every levers9 process's client)
and the CLI reach Temporal through it with the right settings, and each wrong one is refused
with `cannot reach Temporal at <address> (<why>): <what to set>`, never showing the API key.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from grpc import aio
from temporalio.testing import WorkflowEnvironment

from levers9 import certificates
from levers9.config import ControlplaneSettings
from levers9.errors import Unreachable
from levers9.operations import start_pool_removal
from levers9.temporal import connect
from tests.factories import MARKER, free_port, values_doc, write_yaml
from tests.waiting import eventually

pytestmark = pytest.mark.integration

API_KEY = "tcld-key-7f3e9a51c2d84b06"
"""The key the front accepts; it must appear in nothing levers9 prints or logs."""
UNAUTHORIZED = "Request unauthorized."
"""What Temporal Cloud answers a call without a valid API key (UNAUTHENTICATED)."""
_DAY = dt.timedelta(days=1)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Authority:
    """A CA, the server certificate it issued for 127.0.0.1 and a client certificate."""

    ca: bytes
    server_cert: bytes
    server_key: bytes
    client_cert: bytes
    client_key: bytes

    @classmethod
    def mint(cls, common_name: str) -> Authority:
        now = dt.datetime.now(dt.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = certificates.ca_certificate(
            ca_key, common_name, x509.random_serial_number(), now - _DAY, now + _DAY
        )
        server_key = ec.generate_private_key(ec.SECP256R1())
        server = certificates.serving_certificate(
            ca_key,
            ca,
            server_key.public_key(),
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
            now - _DAY,
            now + _DAY,
        )
        client_key = ec.generate_private_key(ec.SECP256R1())
        client = (
            x509.CertificateBuilder()
            .subject_name(certificates.name("levers9-controlplane"))
            .issuer_name(ca.subject)
            .public_key(client_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _DAY)
            .not_valid_after(now + _DAY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return cls(
            ca=_pem(ca),
            server_cert=_pem(server),
            server_key=_pem_key(server_key),
            client_cert=_pem(client),
            client_key=_pem_key(client_key),
        )

    def write(self, directory: Path) -> dict[str, Path]:
        """The files the settings name: ca.pem, client.pem and client.key (0600)."""
        directory.mkdir(parents=True, exist_ok=True)
        files = {
            "ca": directory / "ca.pem",
            "cert": directory / "client.pem",
            "key": directory / "client.key",
        }
        files["ca"].write_bytes(self.ca)
        files["cert"].write_bytes(self.client_cert)
        files["key"].write_bytes(self.client_key)
        files["key"].chmod(0o600)
        return files


@dataclass
class Front(grpc.GenericRpcHandler):
    """Terminates TLS and relays each unary call to the dev server, keeping the `authorization`
    each call carried; with `api_key`, a call without `Bearer <api_key>` is UNAUTHENTICATED."""

    upstream: aio.Channel
    api_key: str | None = None
    authorizations: list[str | None] = field(default_factory=list)

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method = handler_call_details.method

        async def relay(request: bytes, context: aio.ServicerContext[bytes, bytes]) -> bytes:
            metadata = [(str(k), str(v)) for k, v in context.invocation_metadata() or ()]
            authorization = dict(metadata).get("authorization")
            self.authorizations.append(authorization)
            if self.api_key is not None and authorization != f"Bearer {self.api_key}":
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHORIZED)
            forwarded = [(k, v) for k, v in metadata if k != "authorization"]
            call: aio.UnaryUnaryMultiCallable[bytes, bytes] = self.upstream.unary_unary(method)
            try:
                response: bytes = await call(
                    request, metadata=forwarded, timeout=context.time_remaining()
                )
            except aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")
            return response

        return grpc.unary_unary_rpc_method_handler(relay)


@asynccontextmanager
async def serving(
    upstream: str, authority: Authority, *, client_auth: bool, api_key: str | None = None
) -> AsyncIterator[tuple[str, Front]]:
    """A TLS front of the dev server at `upstream`, on a port of its own: its address."""
    async with aio.insecure_channel(upstream) as channel:
        front = Front(channel, api_key=api_key)
        server = aio.server()
        server.add_generic_rpc_handlers([front])
        credentials = grpc.ssl_server_credentials(
            [(authority.server_key, authority.server_cert)],
            root_certificates=authority.ca if client_auth else None,
            require_client_auth=client_auth,
        )
        port = server.add_secure_port("127.0.0.1:0", credentials)
        await server.start()
        try:
            yield f"127.0.0.1:{port}", front
        finally:
            await server.stop(None)


@dataclass(frozen=True)
class Fronts:
    tls: str
    """TLS with the API key required, as Temporal Cloud serves it."""
    tls_front: Front
    mtls: str
    """Mutual TLS: a client certificate of the CA required."""
    files: dict[str, Path]
    """ca, cert, key: the authority's CA and client certificate."""
    other_ca: Path
    """A CA that signed neither front's certificate."""


@pytest.fixture(scope="module")
async def fronts(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fronts]:
    directory = tmp_path_factory.mktemp("temporal-tls")
    authority = Authority.mint("temporal-test-ca")
    files = authority.write(directory / "ours")
    other = Authority.mint("someone-else").write(directory / "other")["ca"]
    upstream = dev_env.client.service_client.config.target_host
    async with (
        serving(upstream, authority, client_auth=False, api_key=API_KEY) as (tls, tls_front),
        serving(upstream, authority, client_auth=True) as (mtls, _),
    ):
        yield Fronts(tls=tls, tls_front=tls_front, mtls=mtls, files=files, other_ca=other)


def _settings(address: str, **values: Any) -> ControlplaneSettings:
    return ControlplaneSettings.model_validate({"temporalAddress": address, **values})


async def _answers(settings: ControlplaneSettings) -> None:
    """A client of `connect` that got through: a listing answered, through the front."""
    client = await connect(settings)
    async for _ in client.list_workflows("WorkflowType='NoSuchWorkflow'"):
        pass


async def test_tls_with_the_ca_and_the_api_key_connects(fronts: Fronts) -> None:
    before = len(fronts.tls_front.authorizations)
    await _answers(
        _settings(fronts.tls, temporalTlsServerCaFile=fronts.files["ca"], temporalApiKey=API_KEY)
    )
    calls = fronts.tls_front.authorizations[before:]
    assert calls
    assert calls == [f"Bearer {API_KEY}"] * len(calls)


async def test_mtls_with_the_client_certificate_connects_the_cli(fronts: Fronts) -> None:
    done = await _cli(
        "pool",
        "list",
        TEMPORAL_ADDRESS=fronts.mtls,
        LEVERS9_TEMPORAL_TLS_SERVER_CA_FILE=str(fronts.files["ca"]),
        LEVERS9_TEMPORAL_TLS_CERT_FILE=str(fronts.files["cert"]),
        LEVERS9_TEMPORAL_TLS_KEY_FILE=str(fronts.files["key"]),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cannot reach" not in done.stdout + done.stderr


async def test_a_wrong_api_key_is_refused_and_never_shown(fronts: Fronts) -> None:
    wrong = API_KEY[::-1]
    done = await _cli(
        "--log-level",
        "DEBUG",
        "pool",
        "list",
        TEMPORAL_ADDRESS=fronts.tls,
        LEVERS9_TEMPORAL_TLS_SERVER_CA_FILE=str(fronts.files["ca"]),
        TEMPORAL_API_KEY=wrong,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert (
        f"error: cannot reach Temporal at {fronts.tls} (it refused the API key): set"
        " TEMPORAL_API_KEY (temporalApiKey) to a key valid for namespace default"
    ) in output
    assert wrong not in output
    # It was sent, as a bearer token: the front saw it and refused it.
    assert f"Bearer {wrong}" in fronts.tls_front.authorizations


REFUSALS: dict[str, tuple[Callable[[Fronts], ControlplaneSettings], str, str]] = {
    "a CA that did not sign the server": (
        lambda f: _settings(f.tls, temporalTlsServerCaFile=f.other_ca, temporalApiKey=API_KEY),
        "its TLS certificate is not signed by the CA in {other_ca}",
        "set temporalTlsServerCaFile (LEVERS9_TEMPORAL_TLS_SERVER_CA_FILE) to the CA that signed"
        " the server's certificate",
    ),
    "the system's roots for a private CA": (
        lambda f: _settings(f.tls, temporalApiKey=API_KEY),
        "its TLS certificate is not signed by a CA of the system's roots",
        "set temporalTlsServerCaFile (LEVERS9_TEMPORAL_TLS_SERVER_CA_FILE) to the CA that signed"
        " the server's certificate",
    ),
    "a name the server's certificate does not hold": (
        lambda f: _settings(
            f.tls.replace("127.0.0.1", "localhost"),
            temporalTlsServerCaFile=f.files["ca"],
            temporalApiKey=API_KEY,
        ),
        "its TLS certificate does not name that host",
        "set TEMPORAL_ADDRESS (temporalAddress) to a name its certificate holds",
    ),
    "no API key where one is needed": (
        lambda f: _settings(f.tls, temporalTlsServerCaFile=f.files["ca"]),
        "it wants an API key",
        "set TEMPORAL_API_KEY (temporalApiKey)",
    ),
    "mutual TLS without a client certificate": (
        lambda f: _settings(f.mtls, temporalTlsServerCaFile=f.files["ca"]),
        "it closed the TLS connection: it may want a client certificate, for mutual TLS",
        "set temporalTlsCertFile and temporalTlsKeyFile (LEVERS9_TEMPORAL_TLS_CERT_FILE,"
        " LEVERS9_TEMPORAL_TLS_KEY_FILE)",
    ),
    "mutual TLS with another CA's client certificate": (
        lambda f: _settings(
            f.mtls,
            temporalTlsServerCaFile=f.files["ca"],
            temporalTlsCertFile=f.other_ca.parent / "client.pem",
            temporalTlsKeyFile=f.other_ca.parent / "client.key",
        ),
        "it closed the TLS connection: it may have refused the client certificate",
        "set temporalTlsCertFile and temporalTlsKeyFile (LEVERS9_TEMPORAL_TLS_CERT_FILE,"
        " LEVERS9_TEMPORAL_TLS_KEY_FILE) to a certificate its client CA signed",
    ),
    "plaintext to a server of TLS only": (
        lambda f: _settings(f.mtls),
        "it closed the connection: it may serve TLS only",
        "set LEVERS9_TEMPORAL_TLS=true (temporalTls), with temporalTlsServerCaFile"
        " (LEVERS9_TEMPORAL_TLS_SERVER_CA_FILE) for a CA of your own",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
async def test_a_wrong_setting_is_refused_naming_the_fix(fronts: Fronts, case: str) -> None:
    make, reason, fix = REFUSALS[case]
    settings = make(fronts)
    with pytest.raises(Unreachable) as refused:
        await connect(settings)
    reason = reason.format(other_ca=fronts.other_ca)
    assert str(refused.value) == (
        f"cannot reach Temporal at {settings.temporal_address} ({reason}): {fix}"
    )


async def test_tls_to_a_plaintext_server_says_turn_it_off(dev_env: WorkflowEnvironment) -> None:
    address = dev_env.client.service_client.config.target_host
    with pytest.raises(Unreachable) as refused:
        await connect(_settings(address, temporalTls=True))
    assert str(refused.value) == (
        f"cannot reach Temporal at {address} (it does not speak TLS): unset LEVERS9_TEMPORAL_TLS"
        " and the LEVERS9_TEMPORAL_TLS_*_FILE settings (an API key turns TLS on too), or point"
        " TEMPORAL_ADDRESS at its TLS port"
    )


async def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The `levers9` CLI in its own process, with a user's Temporal settings in `env`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "LEVERS9_"))}
    return await asyncio.to_thread(
        subprocess.run,
        [str(Path(sys.executable).parent / "levers9"), *args],
        env={**clean, "LEVERS9_HOME": "/nonexistent/levers9-home", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_nothing_at_the_address_says_connection_refused_and_what_to_set() -> None:
    """The troubleshooting row `error: cannot reach Temporal at ... (connection refused)`: the
    CLI pointed where nothing listens."""
    address = f"127.0.0.1:{free_port()}"
    done = await _cli("pool", "list", TEMPORAL_ADDRESS=address)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr == (
        f"error: cannot reach Temporal at {address} (connection refused): set TEMPORAL_ADDRESS"
        " (temporalAddress), or start the dev stack with levers9 dev up\n"
    )
    assert done.stdout == ""


async def test_the_controlplane_serves_through_tls_and_the_api_key_never_logging_it(
    dev_env: WorkflowEnvironment, fronts: Fronts, tmp_path: Path, task_queue: str
) -> None:
    """worker_main over TLS with the API key, as on Temporal Cloud: its Temporal worker polls
    through the front and runs a workflow (a pool's removal); its log never holds the key."""
    values = write_yaml(tmp_path / "values.yaml", values_doc({}))
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "LEVERS9_"))},
        "TEMPORAL_ADDRESS": fronts.tls,
        "TEMPORAL_API_KEY": API_KEY,
        "LEVERS9_TEMPORAL_TLS_SERVER_CA_FILE": str(fronts.files["ca"]),
        "LEVERS9_TASK_QUEUE": task_queue,
        "LEVERS9_WORKER_TOKEN_SECRET": MARKER,
        "LEVERS9_GATEWAY_LISTEN": f"127.0.0.1:{free_port()}",
        "LEVERS9_ENDPOINTS_LISTEN": f"127.0.0.1:{free_port()}",
    }
    before = len(fronts.tls_front.authorizations)
    log = tmp_path / "worker_main.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "worker_main",
            "--values",
            str(values),
            "--log-level",
            "DEBUG",
            env=env,
            stderr=out,
        )
    try:
        await eventually(lambda: _logged(log, "temporal worker started"), within=60)
        settings = ControlplaneSettings.model_validate(
            {
                "temporalAddress": dev_env.client.service_client.config.target_host,
                "taskQueue": task_queue,
            }
        )
        handle = await start_pool_removal(dev_env.client, settings, "over-tls")
        result = await asyncio.wait_for(handle.result(), 60)
        assert result.schedule_deleted is False
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    calls = fronts.tls_front.authorizations[before:]
    assert len(calls) > 3, "it connected and polled through the front"
    assert set(calls) == {f"Bearer {API_KEY}"}
    output = log.read_text()
    assert "temporal worker started" in output
    assert API_KEY not in output


async def _logged(log: Path, line: str) -> bool:
    return line in await asyncio.to_thread(log.read_text)
