"""The gateway on TLS, end to end on the sandbox: the controlplane serves it with a certificate
from a CA of its own (`gatewayTlsCertFile`/`KeyFile`/`CaFile`), every worker Job carries the CA
(never the key), the workers register over TLS and serve tasks through the tunnel inside it,
the CLI streams a task's output over TLS, and a client that speaks plaintext or trusts another
CA gets nothing.

The tests of this module share one controlplane and run in order.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from temporalio.testing import WorkflowEnvironment

from levers9.gateway.server import SERVICE_NAME
from levers9.rpc import tls
from sandbox import pki
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.waiting import eventually

pytestmark = pytest.mark.integration

WITHIN = 60


def _write(directory: Path, authority: pki.CertificateAuthority) -> dict[str, Path]:
    files = {
        "gatewayTlsCertFile": directory / "tls.crt",
        "gatewayTlsKeyFile": directory / "tls.key",
        "gatewayTlsCaFile": directory / "ca.crt",
    }
    files["gatewayTlsCertFile"].write_bytes(authority.cert_pem)
    files["gatewayTlsKeyFile"].write_bytes(authority.key_pem)
    files["gatewayTlsCaFile"].write_bytes(authority.ca_pem)
    return files


@pytest.fixture(scope="module")
async def cp(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Controlplane]:
    directory = tmp_path_factory.mktemp("gateway-tls")
    authority = pki.mint_certificate_authority("levers9-gateway-ca", hosts=("127.0.0.1",))
    files = _write(directory, authority)
    async with reconciling(
        dev_env.client,
        directory,
        tunnel=True,
        containers=True,
        gatewayTlsCertFile=files["gatewayTlsCertFile"],
        gatewayTlsKeyFile=files["gatewayTlsKeyFile"],
        gatewayTlsCaFile=files["gatewayTlsCaFile"],
    ) as plane:
        await eventually(lambda: workers_available(plane), within=WITHIN)
        yield plane


async def test_worker_jobs_carry_the_ca_never_the_key(cp: Controlplane) -> None:
    ca = cp.settings.gateway_tls_ca_file
    key = cp.settings.gateway_tls_key_file
    assert ca is not None
    assert key is not None
    jobs = await cp.worker_jobs()
    assert len(jobs) == 3
    for job in jobs:
        [container] = job["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["LEVERS9_GATEWAY_TLS"] == "true"
        assert env["LEVERS9_GATEWAY_CA"] == ca.read_text()
        assert "PRIVATE KEY" not in str(job)


async def test_the_cli_streams_a_task_over_tls(cp: Controlplane) -> None:
    done = await cp.cli("run", "--pool", POOL, "--", "sh", "-c", "echo over; echo tls")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "over\ntls\n" in done.stdout
    assert "no log stream" not in done.stderr


async def test_a_cli_without_the_ca_falls_back_to_the_record_and_says_why(
    cp: Controlplane, tmp_path: Path
) -> None:
    done = await cp.cli("run", "--pool", POOL, "--", "echo", "kept")
    assert done.returncode == 0, done.stdout + done.stderr
    task_id = done.stdout.split()[1]
    not_pem = tmp_path / "ca.crt"
    not_pem.write_text("not a certificate")
    cases = {
        "LEVERS9_GATEWAY_TLS_CA_FILE": "gatewayTlsCaFile: not a PEM certificate",
        "": "did not answer",  # plaintext to a TLS gateway
    }
    for variable, why in cases.items():
        env = {k: v for k, v in cp.cli_env().items() if k != "LEVERS9_GATEWAY_TLS_CA_FILE"}
        if variable:
            env[variable] = str(not_pem)
        logs = await asyncio.to_thread(
            subprocess.run,
            [str(Path(sys.executable).parent / "levers9"), "task", "logs", task_id],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert logs.returncode == 0, logs.stderr
        assert logs.stdout == "kept\n"
        assert "no log stream, showing the record's tail" in logs.stderr
        assert why in logs.stderr


async def _health(channel: aio.Channel) -> health_pb2.HealthCheckResponse.ServingStatus.ValueType:
    stub = health_pb2_grpc.HealthStub(channel)
    answer = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5)
    return answer.status


async def test_only_a_client_trusting_its_ca_gets_an_answer(cp: Controlplane) -> None:
    address = cp.settings.gateway_advertised_address
    trusted = tls.gateway_client_credentials(cp.settings)
    assert trusted is not None
    async with aio.secure_channel(address, trusted) as channel:
        assert await _health(channel) == health_pb2.HealthCheckResponse.SERVING
    async with aio.insecure_channel(address) as channel:
        with pytest.raises(aio.AioRpcError) as plaintext:
            await _health(channel)
    assert plaintext.value.code() == grpc.StatusCode.UNAVAILABLE
    other = pki.mint_certificate_authority("another-ca", hosts=("127.0.0.1",))
    untrusted = tls.channel_credentials(other.ca_pem, "test")
    async with aio.secure_channel(address, untrusted) as channel:
        with pytest.raises(aio.AioRpcError) as foreign:
            await _health(channel)
    assert foreign.value.code() == grpc.StatusCode.UNAVAILABLE
