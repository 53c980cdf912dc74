"""Starting the emulator: `start_sandbox` in the caller's event loop (HTTPS on 127.0.0.1 with
its own CA, closed cleanly), and `python -m sandbox.server` in the foreground, which
writes a kubeconfig and ca.crt that kubectl uses as they are, and stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp

from sandbox.server import start_sandbox


async def test_start_sandbox_in_the_running_loop() -> None:
    sandbox = await start_sandbox()
    try:
        assert sandbox.url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cadata=sandbox.ca.ca_pem.decode())
        headers = {"Authorization": f"Bearer {sandbox.admin_token}"}
        url = f"{sandbox.url}/api/v1/namespaces"
        async with (
            aiohttp.ClientSession() as session,
            session.get(url, ssl=context, headers=headers) as response,
        ):
            assert response.status == 200
            names = [n["metadata"]["name"] for n in (await response.json())["items"]]
        assert "default" in names
    finally:
        await sandbox.close()


def test_foreground_server_writes_kubeconfig_and_stops_on_sigterm(tmp_path: Path) -> None:
    state = tmp_path / "state"
    server = subprocess.Popen(
        [sys.executable, "-m", "sandbox.server", "--port", "0", "--state-dir", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        banner = server.stdout.readline()  # printed once the state files are written
        assert banner.startswith("Kubernetes API emulator at https://127.0.0.1:"), banner
        assert (state / "ca.crt").read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")
        assert oct((state / "kubeconfig").stat().st_mode & 0o777) == "0o600"
        out = subprocess.run(
            [
                "kubectl",
                "--kubeconfig",
                str(state / "kubeconfig"),
                "--cache-dir",
                str(tmp_path / "cache"),
                "get",
                "namespaces",
                "-o",
                "name",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "HOME": str(tmp_path)},
        )
        assert "namespace/default" in out.stdout.split(), out.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=30)
    assert server.returncode == 0


async def test_close_frees_the_port() -> None:
    sandbox = await start_sandbox()
    await sandbox.close()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", sandbox.port))
