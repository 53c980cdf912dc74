"""Starting the Kubernetes API emulator: in-process (`start_sandbox`) or in the foreground.

    sandbox = await start_sandbox(SandboxOptions(authorized_networks=["203.0.113.0/24"]))
    sandbox.url, sandbox.ca.ca_pem, sandbox.admin_token      # for clients
    sandbox.registry                                         # in-process API (controllers)
    sandbox.compact(); sandbox.drop_watches(); sandbox.expire_tokens()   # see sandbox.admin
    key = sandbox.mint_service_account_key(project="demo", account="levers9-controlplane")
    token = sandbox.service_account_token("levers9", "agent")   # a Kubernetes SA's JWT (RBAC)
    sandbox.write_kubeconfig(path)                           # kubectl, as the admin user
    await sandbox.close()

    python -m sandbox.server --port 6443 --state-dir .levers9/sandbox
        serves until interrupted; writes <state-dir>/kubeconfig and <state-dir>/ca.crt.

It listens on 127.0.0.1 only, over HTTPS with a CA minted at start. It signs Kubernetes
service-account tokens (`serviceaccounts`: TokenRequest, the kubelet's mounted token, every
namespace's `kube-root-ca.crt`) with `service_account_key` (minted when None) and authorizes
their callers with RBAC (`rbac`; the default ClusterRoles it bootstraps are `rbac_defaults`'s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import signal
import socket
import ssl
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from sandbox import rbac_defaults
from sandbox.access import DEVELOPER, AccessPolicy, NetworkDenial
from sandbox.admin import AdminApi
from sandbox.apiserver import MAX_BODY, ApiServer, ApiServerParts
from sandbox.auth import Authenticator
from sandbox.discovery import ServerVersion
from sandbox.kubeconfig import write_kubeconfig
from sandbox.pki import CertificateAuthority, mint_certificate_authority
from sandbox.registry import Registry
from sandbox.serviceaccounts import DEFAULT_ISSUER, TokenSigner
from sandbox.store import (
    DEFAULT_CONTINUE_TTL_SECONDS,
    DEFAULT_HISTORY,
    DEFAULT_HISTORY_SECONDS,
    Store,
)

LOOPBACK = "127.0.0.1"
ADMIN_USER = "levers9-admin"


@dataclass
class SandboxOptions:
    """How to start the emulator. Every field has a working default.

    Attributes:
        port: TCP port on 127.0.0.1; 0 picks a free one.
        admin_token: the kubeconfig user's bearer token (cluster admin, exempt from
            authorized networks); random when None.
        static_tokens: more bearer tokens, token -> username, each a cluster admin subject to
            authorized networks (what a `flavor: generic` pool authenticates with).
        egress_ip: the address the controlplane's calls appear to come from.
        authorized_networks: CIDRs allowed to reach the API; None turns the check off.
        network_denial: "forbidden" (403) or "timeout" (held, then dropped) for others.
        role_bindings: service-account email -> IAM roles.
        server_version: what /version reports (kubectl's dispatcher picks its version by it).
        bookmark_interval: seconds between BOOKMARK events on an idle watch.
        history_limit: watch events kept per resource for resuming watches.
        history_seconds: how long a watch event is kept for them (the watch cache's 75 s);
            a watch from a version older than what is kept gets 410 Expired.
        continue_ttl_seconds: how long a paginated list's continue token stays valid
            (etcd's 5-minute compaction); an older one gets 410 Expired.
        ca: the CA and serving certificate; minted when None (a restart that keeps its
            clients' trust passes the one it had).
        service_account_key: the PEM RSA key that signs service-account tokens; minted when
            None (a restart that keeps the pods' tokens valid passes the one it had).
        service_account_issuer: the tokens' `iss` (and their default audience).
    """

    port: int = 0
    admin_token: str | None = None
    static_tokens: dict[str, str] = field(default_factory=dict)
    egress_ip: str = "203.0.113.10"
    authorized_networks: list[str] | None = None
    network_denial: NetworkDenial = "forbidden"
    role_bindings: dict[str, list[str]] = field(default_factory=dict)
    server_version: ServerVersion = field(default_factory=ServerVersion)
    bookmark_interval: float = 60.0
    history_limit: int = DEFAULT_HISTORY
    history_seconds: float = DEFAULT_HISTORY_SECONDS
    continue_ttl_seconds: float = DEFAULT_CONTINUE_TTL_SECONDS
    ca: CertificateAuthority | None = None
    service_account_key: bytes | None = None
    service_account_issuer: str = DEFAULT_ISSUER


@dataclass
class Sandbox:
    """A running emulator; `close()` stops it."""

    url: str
    port: int
    ca: CertificateAuthority
    admin_token: str
    parts: ApiServerParts
    _runner: web.AppRunner

    @property
    def registry(self) -> Registry:
        return self.parts.registry

    @property
    def store(self) -> Store:
        return self.parts.registry.store

    @property
    def token_uri(self) -> str:
        return self.parts.authenticator.token_uri

    @property
    def policy(self) -> AccessPolicy:
        return self.parts.policy

    def mint_service_account_key(
        self, *, project: str, account: str, roles: Sequence[str] = (DEVELOPER,)
    ) -> dict[str, str]:
        """A service-account key this server trusts, its account granted `roles`."""
        key = self.parts.authenticator.mint_key(project=project, account=account)
        for role in roles:
            self.parts.policy.grant(key["client_email"], role)
        return key

    def service_account_token(
        self,
        namespace: str,
        name: str,
        *,
        audiences: Sequence[str] | None = None,
        expiration_seconds: int = 3600,
    ) -> str:
        """A token for the Kubernetes service account `namespace/name`, as `kubectl create
        token` gets one (call it on the server's loop thread). Its caller is
        `system:serviceaccount:<namespace>:<name>`, authorized by RBAC."""
        return self.registry.service_accounts.issue(
            namespace, name, audiences=audiences, expiration_seconds=expiration_seconds
        ).token

    def compact(self) -> int:
        """Drops all watch history and list snapshots (`POST /_sandbox/compact`): a watch
        from an earlier resourceVersion and every continue token get 410. The current rv."""
        self.store.compact()
        return self.store.resource_version

    def drop_watches(self, *, graceful: bool = False) -> int:
        """Ends every open watch (`POST /_sandbox/watches/drop`): connections reset, or
        streams ended cleanly when `graceful`. How many were open."""
        return self.store.drop_watches(reset=not graceful)

    def expire_tokens(self) -> int:
        """Expires every issued access token now (`POST /_sandbox/tokens/expire`): the next
        call with one is 401. How many were valid."""
        return self.parts.authenticator.expire_tokens()

    def write_kubeconfig(self, path: Path, *, namespace: str | None = None) -> Path:
        return write_kubeconfig(
            path,
            server=self.url,
            ca_pem=self.ca.ca_pem,
            token=self.admin_token,
            user=ADMIN_USER,
            namespace=namespace,
        )

    async def crash(self) -> None:
        """As the apiserver's process killed, its store (etcd) kept: the listener closed, every
        open watch and connection cut where it stands, requests in flight never answered.
        Nothing answers on the port until `serve_again()`."""
        self.store.drop_watches(reset=True)
        for site in list(self._runner.sites):
            await site.stop()
        server = self._runner.server
        for handler in server.connections if server is not None else ():
            if handler.transport is not None:
                handler.transport.abort()

    async def serve_again(self) -> None:
        """After `crash()`: serves on the same port with the same certificate, as the
        apiserver started again."""
        site = web.SockSite(self._runner, _bind(self.port), ssl_context=_ssl_context(self.ca))
        await site.start()

    async def close(self) -> None:
        await self._runner.cleanup()

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def _ssl_context(ca: CertificateAuthority) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    # load_cert_chain reads files only; they live just long enough to be loaded.
    with tempfile.TemporaryDirectory(prefix="levers9-tls-") as tmp:
        cert, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        cert.write_bytes(ca.cert_pem + ca.ca_pem)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(ca.key_pem)
        context.load_cert_chain(cert, key)
    return context


def _bind(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, port))
    return sock


async def start_sandbox(
    options: SandboxOptions | None = None,
    *,
    registry: Registry | None = None,
    extra_routes: Callable[[web.Application, str], None] | None = None,
) -> Sandbox:
    """Starts the emulator on 127.0.0.1 and returns once it accepts connections.

    `extra_routes(app, admin_token)` adds routes beside the API (the cluster's scenario
    commands) before the app is frozen.
    """
    options = options or SandboxOptions()
    sock = _bind(options.port)
    port = sock.getsockname()[1]
    url = f"https://{LOOPBACK}:{port}"
    ca = options.ca or mint_certificate_authority()
    admin_token = options.admin_token or secrets.token_urlsafe(32)
    authenticator = Authenticator(f"{url}/token")
    authenticator.add_static_token(admin_token, ADMIN_USER, network_exempt=True)
    for token, username in options.static_tokens.items():
        authenticator.add_static_token(token, username)
    policy = AccessPolicy(egress_ip=options.egress_ip, network_denial=options.network_denial)
    policy.set_authorized_networks(options.authorized_networks)
    for email, roles in options.role_bindings.items():
        for role in roles:
            policy.grant(email, role)
    registry = registry or Registry(
        Store(
            history_limit=options.history_limit,
            history_seconds=options.history_seconds,
            continue_ttl_seconds=options.continue_ttl_seconds,
        )
    )
    signer = TokenSigner(options.service_account_key, issuer=options.service_account_issuer)
    registry.service_accounts.enable_tokens(signer, ca.ca_pem)
    authenticator.add_token_authenticator(registry.service_accounts.authenticate)
    rbac_defaults.install(registry)
    parts = ApiServerParts(
        registry=registry,
        authenticator=authenticator,
        policy=policy,
        version=options.server_version,
        bookmark_interval=options.bookmark_interval,
    )
    app = web.Application(client_max_size=MAX_BODY)
    AdminApi(parts, admin_token).add_routes(app)
    if extra_routes is not None:
        extra_routes(app, admin_token)
    ApiServer(parts, f"{LOOPBACK}:{port}").add_routes(app)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock, ssl_context=_ssl_context(ca)).start()
    return Sandbox(url, port, ca, admin_token, parts, runner)


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.server",
        description="Serve the levers9 Kubernetes API emulator on 127.0.0.1.",
    )
    parser.add_argument("--port", type=int, default=6443)
    parser.add_argument("--state-dir", type=Path, default=Path(".levers9/sandbox"))
    parser.add_argument("--admin-token", default=None)
    parser.add_argument("--egress-ip", default=SandboxOptions.egress_ip)
    parser.add_argument(
        "--authorized-network",
        action="append",
        dest="networks",
        help="CIDR allowed to reach the API (repeatable); none: check off",
    )
    return parser.parse_args(argv)


def _write_state(sandbox: Sandbox, state_dir: Path) -> Path:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "ca.crt").write_bytes(sandbox.ca.ca_pem)
    return sandbox.write_kubeconfig(state_dir / "kubeconfig")


async def serve(options: SandboxOptions, state_dir: Path) -> None:
    """Runs until SIGINT/SIGTERM, with kubeconfig and ca.crt written to `state_dir`."""
    sandbox = await start_sandbox(options)
    try:
        kubeconfig = _write_state(sandbox, state_dir)
        print(
            f"Kubernetes API emulator at {sandbox.url}; kubectl --kubeconfig {kubeconfig}",
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(signum, stop.set)
        await stop.wait()
    finally:
        await sandbox.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    options = SandboxOptions(
        port=args.port,
        admin_token=args.admin_token,
        egress_ip=args.egress_ip,
        authorized_networks=args.networks,
    )
    asyncio.run(serve(options, args.state_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
