"""The sandbox as one process: the Kubernetes API emulator and the cluster behind it, loaded
with a scenario, its trust kept under a state directory so a restart changes nothing a client
holds (`levers9 sandbox serve`, and what `levers9 dev up` runs).

State directory:

| file | what |
| - | - |
| `tls/ca.crt`, `tls/tls.crt`, `tls/tls.key` | the CA and serving certificate (reused on restart) |
| `admin-token` | the kubeconfig user's token, also the admin API's (0600) |
| `keys/<id>.json` | service-account keys this sandbox trusts, with their IAM roles (0600) |
| `kubeconfig`, `ca.crt` | for kubectl and clients |
| `sandbox.json` | url, port, project: what `dev up` reads once the API answers |
| `nodes/<node>/...` | each node's filesystem (hostPath volumes, the kubelet checkpoint) |
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers9.files import write_private
from levers9.logs import get_logger
from levers9.sandbox.access import DEVELOPER
from levers9.sandbox.cluster.cluster import Cluster
from levers9.sandbox.cluster_admin import ClusterAdmin
from levers9.sandbox.pki import CertificateAuthority, mint_certificate_authority
from levers9.sandbox.scenario import Scenario
from levers9.sandbox.server import LOOPBACK, Sandbox, SandboxOptions, start_sandbox

CONTROLPLANE_ACCOUNT = "levers9-controlplane"

log = get_logger("levers9.sandbox")


class SandboxState:
    """What a sandbox keeps across restarts."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory.absolute()

    def certificate_authority(self) -> CertificateAuthority:
        tls = self.dir / "tls"
        files = [tls / "ca.crt", tls / "tls.crt", tls / "tls.key"]
        if all(path.exists() for path in files):
            ca, cert, key = (path.read_bytes() for path in files)
            return CertificateAuthority(ca_pem=ca, cert_pem=cert, key_pem=key)
        authority = mint_certificate_authority()
        tls.mkdir(parents=True, exist_ok=True)
        files[0].write_bytes(authority.ca_pem)
        files[1].write_bytes(authority.cert_pem)
        write_private(files[2], authority.key_pem.decode())
        return authority

    def admin_token(self) -> str:
        path = self.dir / "admin-token"
        if path.exists():
            return path.read_text().strip()
        token = secrets.token_urlsafe(32)
        write_private(path, token)
        return token

    def saved_keys(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.dir / "keys").glob("*.json"))]

    def save_key(self, key: dict[str, str], roles: Sequence[str]) -> None:
        record = {"key": key, "roles": list(roles)}
        write_private(self.dir / "keys" / f"{key['private_key_id']}.json", json.dumps(record))


@dataclass
class RunningSandbox:
    sandbox: Sandbox
    cluster: Cluster
    state: SandboxState

    async def close(self) -> None:
        await self.cluster.stop()
        await self.sandbox.close()


def _trust_saved_keys(sandbox: Sandbox, state: SandboxState) -> None:
    for record in state.saved_keys():
        sandbox.parts.authenticator.register_key(record["key"])
        for role in record["roles"]:
            sandbox.policy.grant(record["key"]["client_email"], role)


def ensure_controlplane_key(running: RunningSandbox, path: Path) -> dict[str, str]:
    """The controlplane's service-account key at `path` (0600): minted once, trusted since.

    Like `gcloud iam service-accounts keys create`, then `roles/container.developer`.
    """
    if path.exists():
        key: dict[str, str] = json.loads(path.read_text())
        return key
    project = running.cluster.scenario.cluster.project
    key = running.sandbox.mint_service_account_key(
        project=project, account=CONTROLPLANE_ACCOUNT, roles=(DEVELOPER,)
    )
    running.state.save_key(key, (DEVELOPER,))
    write_private(path, json.dumps(key, indent=2) + "\n")
    return key


async def start(
    scenario: Scenario, state_dir: Path, port: int = 0, controlplane_key: Path | None = None
) -> RunningSandbox:
    """Starts the API and the cluster; returns once both run and the state files exist."""
    state = SandboxState(state_dir)
    network = scenario.network
    options = SandboxOptions(
        port=port,
        admin_token=state.admin_token(),
        egress_ip=network.egress_ips[0] if network.egress_ips else "127.0.0.1",
        authorized_networks=list(network.authorized_networks) or None,
        ca=state.certificate_authority(),
    )
    commands = ClusterAdmin()
    sandbox = await start_sandbox(options, extra_routes=commands.add_routes)
    _trust_saved_keys(sandbox, state)
    cluster = Cluster(sandbox.registry, scenario, state.dir, api_address=(LOOPBACK, sandbox.port))
    commands.attach(cluster)
    try:
        await cluster.start()
    except BaseException:
        await sandbox.close()
        raise
    running = RunningSandbox(sandbox, cluster, state)
    if controlplane_key is not None:
        ensure_controlplane_key(running, controlplane_key)
    (state.dir / "ca.crt").write_bytes(sandbox.ca.ca_pem)
    sandbox.write_kubeconfig(state.dir / "kubeconfig")
    info = {"url": sandbox.url, "port": sandbox.port, "project": scenario.cluster.project}
    (state.dir / "sandbox.json").write_text(json.dumps(info, indent=2) + "\n")
    return running


async def serve(
    scenario: Scenario, state_dir: Path, port: int, controlplane_key: Path | None = None
) -> None:
    """Runs until SIGINT/SIGTERM, then stops every pod process and the API."""
    running = await start(scenario, state_dir, port, controlplane_key)
    log.info(
        "sandbox serving",
        url=running.sandbox.url,
        kubeconfig=str(running.state.dir / "kubeconfig"),
        nodes=len(running.cluster.node_specs()),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("sandbox stopping")
        await running.close()
