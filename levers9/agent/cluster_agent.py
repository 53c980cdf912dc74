"""`levers9-cluster-agent`: a joined cluster's agent (`levers9 cluster join`), in the worker image.

It runs in the cluster as the Deployment the join installed, with in-cluster config: its
service account's token and CA (`/var/run/secrets/kubernetes.io/serviceaccount`, read afresh
for every call: the kubelet rotates the token) and `KUBERNETES_SERVICE_HOST`/`_PORT`. It:

1. reads its Secret (`levers9-agent`): its own token (`agent-token`) if it has one, else it
   spends the one-time join token (`join-token`) at the gateway (`Clusters/JoinCluster`) and
   keeps the answer in the Secret, the join token removed. A refused join (used, expired) is
   logged with the gateway's words and the agent exits 1 (the pod's log says what to do);
2. serves, on loopback only, a proxy of its cluster's API: plain HTTP in, TLS and its service
   account's bearer token out, every response streamed (watches). What it may do is its RBAC;
3. dials the gateway and keeps one outbound stream open (`Clusters/ClusterTunnel`, with its
   token), inside which the controlplane opens `kube` streams, each piped to that proxy; any
   other target is refused. A broken stream is reopened with backoff, as a worker's tunnel.

The controlplane never dials the cluster; nothing has to allow-list anything; no key exists.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import ssl
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import aiohttp
import grpc
from aiohttp import web
from grpc import aio

from levers9 import logs
from levers9.agent.paths import HostPaths, HostPathsError
from levers9.agent.tunnel import TunnelClient
from levers9.contract import AGENT_TOKEN_KEY, JOIN_TOKEN_KEY, KUBE_TARGET
from levers9.process import exit_now
from levers9.proto import gateway_pb2, gateway_pb2_grpc
from levers9.rpc import tls
from levers9.rpc.channel import gateway_channel
from levers9.rpc.http_relay import forwarded_headers, relay_response, request_body
from levers9.tunnel.bridge import dial
from levers9.tunnel.mux import Stream, StreamRefused

log = logs.get_logger("levers9.cluster_agent")
SERVICE_ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"


class AgentError(Exception):
    """The agent cannot run; the message says why and what to do."""


class InCluster:
    """The cluster's API as the pod's service account reaches it."""

    def __init__(self, env: Mapping[str, str], paths: HostPaths) -> None:
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise AgentError(
                "KUBERNETES_SERVICE_HOST/PORT are not set: the agent runs in the cluster, as"
                " the Deployment `levers9 cluster join` installs"
            )
        self.base = f"https://{host}:{port}"
        self._token = paths.map(f"{SERVICE_ACCOUNT}/token")
        ca = paths.map(f"{SERVICE_ACCOUNT}/ca.crt")
        if not self._token.is_file() or not ca.is_file():
            raise AgentError(
                f"no service account token in {SERVICE_ACCOUNT}: the pod needs its service"
                " account's token mounted (automountServiceAccountToken)"
            )
        self.ssl = ssl.create_default_context(cafile=str(ca))

    def authorization(self) -> str:
        return f"Bearer {self._token.read_text().strip()}"


class KubeProxy:
    """`kubectl proxy` for the tunnel: loopback HTTP in, the API server over TLS with the
    service account's token out, streamed both ways."""

    def __init__(self, cluster: InCluster) -> None:
        self._cluster = cluster
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> int:
        self._session = aiohttp.ClientSession(
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
            connector=aiohttp.TCPConnector(ssl=self._cluster.ssl, limit=0),
        )
        app = web.Application(client_max_size=0)
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        headers = forwarded_headers(request)
        headers["Authorization"] = self._cluster.authorization()
        try:
            async with self._session.request(
                request.method,
                self._cluster.base + request.path_qs,
                headers=headers,
                data=request_body(request),
                allow_redirects=False,
            ) as upstream:
                return await relay_response(upstream, request)
        except aiohttp.ClientError as exc:
            return web.Response(status=502, text=f"the cluster's API did not answer: {exc}\n")


class AgentSecret:
    """The agent's own Secret, through its service account."""

    def __init__(self, cluster: InCluster, namespace: str, name: str) -> None:
        self._cluster = cluster
        self._url = f"{cluster.base}/api/v1/namespaces/{namespace}/secrets/{name}"
        self.name = name

    async def read(self) -> dict[str, str]:
        async with self._http() as http, http.get(self._url) as response:
            if response.status != 200:
                raise AgentError(
                    f"cannot read Secret {self.name}: {response.status}"
                    f" {(await response.text())[:300]}"
                )
            data = (await response.json()).get("data") or {}
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    async def keep_agent_token(self, token: str) -> None:
        """Writes the agent token and removes the spent join token (a JSON merge patch)."""
        patch = {
            "data": {
                AGENT_TOKEN_KEY: base64.b64encode(token.encode()).decode(),
                JOIN_TOKEN_KEY: None,
            }
        }
        headers = {"Content-Type": "application/merge-patch+json"}
        async with self._http() as http, http.patch(self._url, json=patch, headers=headers) as r:
            if r.status != 200:
                raise AgentError(
                    f"cannot keep the agent token in Secret {self.name}: {r.status}"
                    f" {(await r.text())[:300]}"
                )

    def _http(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            headers={"Authorization": self._cluster.authorization()},
            connector=aiohttp.TCPConnector(ssl=self._cluster.ssl),
            timeout=aiohttp.ClientTimeout(total=30),
        )


class ClusterTunnelClient(TunnelClient):
    """The worker's tunnel client, on `Clusters/ClusterTunnel`, serving the `kube` target."""

    def __init__(
        self, channel: aio.Channel, token: str, cluster_name: str, proxy_port: int
    ) -> None:
        super().__init__(channel, token, cluster_name, "", Path("/nonexistent"))
        self._clusters = gateway_pb2_grpc.ClustersStub(channel)
        self._proxy_port = proxy_port

    def _open(
        self, frames: AsyncIterator[gateway_pb2.TunnelFrame]
    ) -> aio.StreamStreamCall[gateway_pb2.TunnelFrame, gateway_pb2.TunnelFrame]:
        return self._clusters.ClusterTunnel(frames, metadata=self._metadata)

    async def _accept(self, stream: Stream, target: str) -> None:
        if target != KUBE_TARGET:
            log.warning("tunnel target refused", target=target)
            raise StreamRefused(f"target {target} is not served here: only `{KUBE_TARGET}`")
        await dial(stream, "127.0.0.1", self._proxy_port)


async def agent_token(secret: AgentSecret, channel: aio.Channel, cluster_name: str) -> str:
    """The agent's token: got now for a join token in its Secret (then kept there), else the
    one kept."""
    data = await secret.read()
    join_token = data.get(JOIN_TOKEN_KEY)
    if not join_token and data.get(AGENT_TOKEN_KEY):
        return data[AGENT_TOKEN_KEY]
    # A join token present is a join not spent yet: the first, or a new one applied over the
    # Secret (`kubectl apply` keeps the old agent token, which the new join revoked).
    if not join_token:
        raise AgentError(
            f"Secret {secret.name} holds neither {AGENT_TOKEN_KEY} nor {JOIN_TOKEN_KEY}:"
            f" run `levers9 cluster join --name {cluster_name} ...` again"
        )
    request = gateway_pb2.JoinClusterRequest(cluster_name=cluster_name, join_token=join_token)
    try:
        reply = await gateway_pb2_grpc.ClustersStub(channel).JoinCluster(request, timeout=30)
    except aio.AioRpcError as exc:
        raise AgentError(f"the join was refused: {exc.code().name}: {exc.details()}") from None
    await secret.keep_agent_token(reply.agent_token)
    log.info("joined", cluster=cluster_name)
    return reply.agent_token


async def serve(env: Mapping[str, str], stop: asyncio.Event) -> None:
    try:
        paths = HostPaths.from_env(env)
    except HostPathsError as exc:
        raise AgentError(str(exc)) from None
    missing = [
        name
        for name in ("LEVERS9_GATEWAY_ADDRESS", "LEVERS9_CLUSTER_NAME", "LEVERS9_POD_NAMESPACE")
        if not env.get(name)
    ]
    if missing:
        raise AgentError(f"the agent's environment lacks {', '.join(missing)}")
    name = env["LEVERS9_CLUSTER_NAME"]
    cluster = InCluster(env, paths)
    credentials: grpc.ChannelCredentials | None = None
    if env.get("LEVERS9_GATEWAY_TLS") == "true" or env.get("LEVERS9_GATEWAY_CA"):
        ca = env.get("LEVERS9_GATEWAY_CA", "").encode() or None
        try:
            credentials = tls.channel_credentials(ca, "LEVERS9_GATEWAY_CA")
        except tls.TlsError as exc:
            raise AgentError(str(exc)) from None
    channel = gateway_channel(env["LEVERS9_GATEWAY_ADDRESS"], credentials)
    proxy = KubeProxy(cluster)
    try:
        secret = AgentSecret(
            cluster, env["LEVERS9_POD_NAMESPACE"], env.get("LEVERS9_AGENT_SECRET", "levers9-agent")
        )
        token = await agent_token(secret, channel, name)
        port = await proxy.start()
        tunnel = ClusterTunnelClient(channel, token, name, port)

        async def ready() -> None:
            log.info("cluster agent serving", cluster=name)

        running = asyncio.create_task(tunnel.run(ready))
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
        for task in (running, stopping):
            task.cancel()
        await asyncio.gather(running, stopping, return_exceptions=True)
    finally:
        await proxy.close()
        await channel.close()


def run(env: Mapping[str, str]) -> int:
    logs.setup((env.get("LEVERS9_LOG_LEVEL") or "INFO").upper())

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await serve(env, stop)
        except AgentError as exc:
            log.error("cluster agent cannot run", error=str(exc))
            return 1
        return 0

    return asyncio.run(main())


def main() -> None:
    exit_now(run(os.environ))
