"""Fixtures for the Kubernetes API emulator: one emulator per session on a free loopback port.

The emulator runs on its own event loop in a background thread (`SandboxThread`), because the
official client and kubectl block: test code calls them directly, and reaches the in-process
registry through `sandbox_call`, which runs a function on the emulator's thread.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client

from sandbox.resources import NAMESPACES
from sandbox.server import Sandbox, SandboxOptions
from sandbox.threaded import SandboxThread
from tests.sandbox.factories import HISTORY, api_client

Call = Callable[..., Any]

KUBECTL = os.environ.get("KUBECTL", "kubectl")


@pytest.fixture(scope="session")
def sandbox_thread() -> Iterator[SandboxThread]:
    thread = SandboxThread(SandboxOptions(bookmark_interval=0.5, history_limit=HISTORY))
    thread.start()
    yield thread
    thread.stop()


@pytest.fixture(scope="session")
def sandbox(sandbox_thread: SandboxThread) -> Sandbox:
    return sandbox_thread.sandbox


@pytest.fixture(scope="session")
def sandbox_call(sandbox_thread: SandboxThread) -> Call:
    """Runs a function on the emulator's thread, where the registry may be used."""
    return sandbox_thread.call


@pytest.fixture(autouse=True)
def _fresh_access(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used the emulator: no faults, an open network, a zeroed counter."""
    if "sandbox" not in request.fixturenames:
        yield  # a test of pure code: no emulator to start just to reset it
        return
    sandbox: Sandbox = request.getfixturevalue("sandbox")
    sandbox_call: Call = request.getfixturevalue("sandbox_call")
    yield

    def reset() -> None:
        sandbox.parts.faults.clear()
        sandbox.parts.counter.reset()
        sandbox.policy.update(
            {
                "authorizedNetworks": None,
                "egressIp": SandboxOptions.egress_ip,
                "workstationIp": "127.0.9.9",
                "networkDenial": "forbidden",
            }
        )

    sandbox_call(reset)


@pytest.fixture(scope="session")
def ca_file(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ca") / "ca.crt"
    path.write_bytes(sandbox.ca.ca_pem)
    return path


@pytest.fixture(scope="session")
def admin_client(sandbox: Sandbox, ca_file: Path) -> client.ApiClient:
    return api_client(sandbox.url, ca_file, sandbox.admin_token)


@pytest.fixture(scope="session")
def core(admin_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(admin_client)


@pytest.fixture(scope="session")
def apps(admin_client: client.ApiClient) -> client.AppsV1Api:
    return client.AppsV1Api(admin_client)


@pytest.fixture(scope="session")
def batch(admin_client: client.ApiClient) -> client.BatchV1Api:
    return client.BatchV1Api(admin_client)


@pytest.fixture
def namespace(sandbox: Sandbox, sandbox_call: Call) -> str:
    """A namespace of this test's own."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    sandbox_call(sandbox.registry.create, NAMESPACES, {"metadata": {"name": name}})
    return name


@pytest.fixture(scope="session")
def kubectl(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., str]:
    """Runs the real kubectl against the emulator; returns stdout, raises with its stderr."""
    home = tmp_path_factory.mktemp("kubectl")
    kubeconfig = sandbox.write_kubeconfig(home / "kubeconfig")

    def run(*args: str, ok: bool = True, binary: str = KUBECTL, timeout: float = 60) -> str:
        command = [
            binary,
            "--kubeconfig",
            str(kubeconfig),
            "--cache-dir",
            str(home / "cache"),
            *args,
        ]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "HOME": str(home)},
        )
        if ok and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{done.stderr}")
        if not ok and done.returncode == 0:
            raise AssertionError(f"kubectl {' '.join(args)} succeeded:\n{done.stdout}")
        return done.stdout if ok else done.stderr

    return run


@pytest.fixture(scope="session")
def http(sandbox: Sandbox, ca_file: Path) -> Callable[..., urllib3.BaseHTTPResponse]:
    """Raw HTTPS to the emulator (admin token unless `token=` says otherwise; none at all when
    `anonymous`)."""
    pool = urllib3.PoolManager(ca_certs=str(ca_file), retries=False)

    def request(
        method: str,
        path: str,
        *,
        token: str | None = None,
        headers: dict[str, str] | None = None,
        body: Any = None,
        timeout: float = 10,
        anonymous: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        bearer = {} if anonymous else {"Authorization": f"Bearer {token or sandbox.admin_token}"}
        all_headers = {**bearer, **(headers or {})}
        if body is not None and not isinstance(body, bytes | str):
            body = json.dumps(body)
            all_headers.setdefault("Content-Type", "application/json")
        return pool.request(
            method, sandbox.url + path, headers=all_headers, body=body, timeout=timeout
        )

    return request
