"""The sandbox as one process: the Kubernetes API emulator and the cluster behind it, and the
Google Cloud APIs of its project on a port of their own (`gcp`), loaded with a scenario, its
trust kept under a state directory so a restart changes nothing a client holds
(`levers9 sandbox serve`, and what `levers9 dev up` runs).

State directory:

| file | what |
| - | - |
| `tls/ca.crt`, `tls/tls.crt`, `tls/tls.key` | the CA and serving certificate (reused on restart) |
| `admin-token` | the kubeconfig user's token, also the admin API's (0600) |
| `service-account.key` | signs Kubernetes service-account tokens (0600; kept across restarts) |
| `keys/<id>.json` | service-account keys this sandbox trusts, with their IAM roles (0600) |
| `kubeconfig`, `ca.crt` | for kubectl and clients |
| `ca-bundle.pem` | the public CAs (certifi's) and the sandbox CA, for `REQUESTS_CA_BUNDLE` |
| `sandbox.json` | url, port, project, gcpUrl: what `dev up` reads once the API answers |
| `operator-key.json` | the operator's key for the GCP APIs (`levers9-operator`, owner; 0600) |
| `gcp.json`, `gcp-port` | what the GCP APIs created, and their port, kept for a restart |
| `gcloud/` | gcloud's configuration directory when run with `gcp.env.cloud_env` |
| `nodes/<node>/...` | each node's filesystem (hostPath volumes, the kubelet checkpoint) |
| `cluster.json` | the cluster's objects and nodes (0600; `persist`), loaded on start |

A start with `cluster.json` is the saved cluster powered up again (`sandbox.persist`: every
object kept, the pods that ran ended by the node shutdown); without it, or with `fresh`, the
scenario's.
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

import certifi

from levers9.files import write_private
from levers9.logs import get_logger
from sandbox import persist, pki
from sandbox.access import DEVELOPER
from sandbox.cluster.cluster import Cluster
from sandbox.cluster_admin import ClusterAdmin
from sandbox.gcp.container import ClusterSite
from sandbox.gcp.env import OPERATOR_KEY
from sandbox.gcp.roles import OWNER
from sandbox.gcp.server import GcpEmulator, GcpSite, start_gcp
from sandbox.pki import CertificateAuthority, mint_certificate_authority
from sandbox.registry import Registry
from sandbox.scenario import Scenario
from sandbox.server import LOOPBACK, Sandbox, SandboxOptions, start_sandbox
from sandbox.serviceaccounts import TokenSigner
from sandbox.store import Store

CONTROLPLANE_ACCOUNT = "levers9-controlplane"
OPERATOR_ACCOUNT = "levers9-operator"

log = get_logger("sandbox")


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

    def service_account_key(self) -> bytes:
        """The PEM key that signs Kubernetes service-account tokens: minted once, kept."""
        path = self.dir / "service-account.key"
        if path.exists():
            return path.read_bytes()
        key = TokenSigner().key_pem
        write_private(path, key.decode())
        return key

    def saved_keys(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.dir / "keys").glob("*.json"))]

    def save_key(self, key: dict[str, str], roles: Sequence[str]) -> None:
        record = {"key": key, "roles": list(roles)}
        write_private(self.dir / "keys" / f"{key['private_key_id']}.json", json.dumps(record))

    def write_ca_bundle(self, ca_pem: bytes) -> None:
        """`ca-bundle.pem`, for tools that take one bundle for every host (requests'
        REQUESTS_CA_BUNDLE): the public CAs and the sandbox's."""
        (self.dir / "ca-bundle.pem").write_bytes(Path(certifi.where()).read_bytes() + ca_pem)

    def forget_key(self, key_id: str) -> None:
        """A deleted key is not trusted again on restart."""
        (self.dir / "keys" / f"{key_id}.json").unlink(missing_ok=True)

    def gcp_port(self) -> int:
        """The GCP APIs' port last time (0: none yet), so keys naming it keep working."""
        path = self.dir / "gcp-port"
        text = path.read_text().strip() if path.exists() else ""
        return int(text) if text.isdigit() else 0

    def save_gcp_port(self, port: int) -> None:
        (self.dir / "gcp-port").write_text(f"{port}\n")


@dataclass
class RunningSandbox:
    sandbox: Sandbox
    cluster: Cluster
    state: SandboxState
    gcp: GcpEmulator
    saver: persist.Saver
    restored: bool = False
    """Whether the cluster is a saved one (else the scenario's)."""

    async def close(self) -> None:
        """Stops everything; the cluster is saved once its processes have stopped."""
        await self.gcp.close()
        await self.cluster.stop()
        try:
            await self.saver.stop()
        finally:
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
    running.gcp.iam.adopt_key(key)
    write_private(path, json.dumps(key, indent=2) + "\n")
    return key


def ensure_operator_key(running: RunningSandbox) -> dict[str, str]:
    """The operator's key, `operator-key.json` in the state directory (0600): minted once for
    `levers9-operator`, a project owner, and trusted since; its `token_uri` is the GCP APIs'
    `/token` (rewritten if their port changed). It is what `gcp.env.cloud_env` points gcloud
    and `GOOGLE_APPLICATION_CREDENTIALS` at: the person at the laptop, as on Google Cloud."""
    path = running.state.dir / OPERATOR_KEY
    gcp = running.gcp
    if path.exists():
        key: dict[str, str] = json.loads(path.read_text())
        saved = {record["key"]["private_key_id"] for record in running.state.saved_keys()}
        if key["private_key_id"] not in saved:  # its record was deleted: trust it again
            running.sandbox.parts.authenticator.register_key(key)
            running.state.save_key(key, (OWNER,))
            gcp.iam.adopt_key(key)
        # Always an owner: a policy set without it would otherwise lock the laptop out of
        # its own project until the state directory is wiped.
        running.sandbox.policy.grant(key["client_email"], OWNER)
        if key.get("token_uri") != gcp.token_uri:
            key["token_uri"] = gcp.token_uri
            write_private(path, pki.service_account_key_json(key))
        return key
    project = running.cluster.scenario.cluster.project
    account = gcp.iam.ensure_account(project, OPERATOR_ACCOUNT, "levers9 operator")
    key = gcp.iam.mint_key(account["email"], roles=(OWNER,))
    running.sandbox.policy.grant(key["client_email"], OWNER)
    write_private(path, pki.service_account_key_json(key))
    return key


async def _start_gcp(sandbox: Sandbox, cluster: Cluster, state: SandboxState) -> GcpEmulator:
    """The GCP APIs on the port they had last time when it is free, else on a new one."""
    site = GcpSite(
        authenticator=sandbox.parts.authenticator,
        access=sandbox.policy,
        ca=sandbox.ca,
        admin_token=sandbox.admin_token,
        cluster=ClusterSite(
            info=cluster.scenario.cluster,
            endpoint=f"{LOOPBACK}:{sandbox.port}",
            ca_base64=sandbox.ca.ca_base64,
            node_specs=cluster.node_specs,
        ),
        state_file=state.dir / "gcp.json",
        vault=state,
    )
    try:
        gcp = await start_gcp(site, state.gcp_port())
    except OSError:
        gcp = await start_gcp(site, 0)
    state.save_gcp_port(gcp.port)
    for record in state.saved_keys():
        gcp.iam.adopt_key(record["key"])
    return gcp


async def start(
    scenario: Scenario,
    state_dir: Path,
    port: int = 0,
    controlplane_key: Path | None = None,
    *,
    fresh: bool = False,
) -> RunningSandbox:
    """Starts the API and the cluster; returns once both run and the state files exist.

    The cluster is the one saved in `state_dir` (`persist`) when there is one and not `fresh`;
    raises `persist.SnapshotError` when that cannot be loaded."""
    state = SandboxState(state_dir)
    if fresh and persist.forget(state.dir):
        log.info("saved cluster removed: starting from the scenario", state_dir=str(state.dir))
    snapshot = persist.load(state.dir)
    network = scenario.network
    options = SandboxOptions(
        port=port,
        admin_token=state.admin_token(),
        egress_ip=network.egress_ips[0] if network.egress_ips else "127.0.0.1",
        authorized_networks=list(network.authorized_networks) or None,
        history_seconds=scenario.timing.watch_cache_seconds,
        continue_ttl_seconds=scenario.timing.continue_token_seconds,
        ca=state.certificate_authority(),
        service_account_key=state.service_account_key(),
    )
    store = Store(
        history_limit=options.history_limit,
        history_seconds=options.history_seconds,
        continue_ttl_seconds=options.continue_ttl_seconds,
    )
    if snapshot is not None:
        ended = persist.restore(store, snapshot)
        log.info(
            "saved cluster loaded",
            path=str(persist.snapshot_path(state.dir)),
            nodes=len(snapshot.nodes),
            objects=len(snapshot.objects),
            pods_ended=ended,
        )
    commands = ClusterAdmin()
    sandbox = await start_sandbox(
        options, registry=Registry(store), extra_routes=commands.add_routes
    )
    _trust_saved_keys(sandbox, state)
    cluster = Cluster(
        sandbox.registry,
        scenario,
        state.dir,
        api_address=(LOOPBACK, sandbox.port),
        nodes=None if snapshot is None else snapshot.nodes,
    )
    commands.attach(cluster)
    try:
        await cluster.start()
    except BaseException:
        await sandbox.close()
        raise
    try:
        gcp = await _start_gcp(sandbox, cluster, state)
    except BaseException:
        await cluster.stop()
        await sandbox.close()
        raise
    saver = persist.Saver(state.dir, store, cluster.node_specs)
    saver.start()
    running = RunningSandbox(sandbox, cluster, state, gcp, saver, restored=snapshot is not None)
    if controlplane_key is not None:
        ensure_controlplane_key(running, controlplane_key)
    ensure_operator_key(running)
    (state.dir / "ca.crt").write_bytes(sandbox.ca.ca_pem)
    state.write_ca_bundle(sandbox.ca.ca_pem)
    sandbox.write_kubeconfig(state.dir / "kubeconfig")
    info = {
        "url": sandbox.url,
        "port": sandbox.port,
        "project": scenario.cluster.project,
        "gcpUrl": gcp.url,
        "restored": running.restored,
    }
    (state.dir / "sandbox.json").write_text(json.dumps(info, indent=2) + "\n")
    return running


async def serve(
    scenario: Scenario,
    state_dir: Path,
    port: int,
    controlplane_key: Path | None = None,
    *,
    fresh: bool = False,
) -> None:
    """Runs until SIGINT/SIGTERM, then stops every pod process, saves the cluster, and stops
    the API."""
    running = await start(scenario, state_dir, port, controlplane_key, fresh=fresh)
    log.info(
        "sandbox serving",
        url=running.sandbox.url,
        gcp=running.gcp.url,
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
