"""`levers9.v1.Clusters`: joined clusters' agents (`levers9 cluster join`) dial in here.

- `JoinCluster`: the agent's first contact. The join token it read from its Secret is checked
  against the join's record (`ClusterWorkflow`, Update `exchange`: the token's SHA-256, unspent,
  unexpired) and spent; the answer is the agent's own token (an HMAC of the cluster's name and
  that join under the controlplane's secret), which the agent keeps in its Secret. A used or
  expired token is PERMISSION_DENIED with the fix; an unknown cluster NOT_FOUND.
- `ClusterTunnel`: the agent's one outbound stream, with its agent token, held as a tunnel
  session (levers9.tunnel.mux). This process keeps one loopback listener per joined cluster,
  for its lifetime: each connection to it is a `kube` stream to the agent's proxy of its
  cluster's API, through the current session (none: the connection is reset, and the call fails
  as an unreachable cluster does). The pool's Kubernetes client is pointed at that listener
  (`KubeClients(joined=hub.url)`), so reconcile, the cache's watches and the worker Jobs work
  unchanged, and the controlplane never dials the cluster.
- A session held for a cluster this process did not serve yet calls `on_joined` (worker_main
  loads the pool: its client, cache and reconcile schedule).

Tokens never appear in a message or a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from pydantic import SecretStr
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from levers9.cluster_records import cluster_state
from levers9.clusters import ClusterState, cluster_workflow_id
from levers9.contract import DNS_LABEL, KUBE_TARGET
from levers9.gateway.auth import bearer_token
from levers9.gateway.errors import Unauthenticated
from levers9.gateway.tunnel import pump_session, read_hello
from levers9.logs import get_logger
from levers9.proto import gateway_pb2, gateway_pb2_grpc
from levers9.tokens import agent_token, agent_token_matches, join_digest
from levers9.tunnel.bridge import pipe
from levers9.tunnel.frames import Frame
from levers9.tunnel.mux import Session, TunnelError
from levers9.tunnel.wire import to_proto

OPEN_TIMEOUT_S = 10.0

log = get_logger(__name__)


class ClusterRecords(Protocol):
    async def state(self, name: str) -> ClusterState | None:
        """The join's record; None when no cluster of that name is joined."""

    async def exchange(self, name: str, digest: str) -> str | None:
        """Spends the join token with this SHA-256: "" done, else why not; None: no such
        cluster."""


class TemporalClusterRecords:
    def __init__(self, client: Client) -> None:
        self._client = client

    async def state(self, name: str) -> ClusterState | None:
        # The record's memo, not the query: an agent's tunnel is taken while no Temporal worker
        # polls (this replica starting, or every replica restarting at once).
        state = await cluster_state(self._client, name)
        return None if state is None or state.leaving else state

    async def exchange(self, name: str, digest: str) -> str | None:
        handle = self._client.get_workflow_handle(cluster_workflow_id(name))
        try:
            refusal: str = await handle.execute_update("exchange", digest, result_type=str)
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        except WorkflowUpdateFailedError as exc:
            return f"the join could not be checked: {exc.cause}"
        return refusal


@dataclass
class _Held:
    session_id: str
    session: Session
    outgoing: asyncio.Queue[gateway_pb2.TunnelFrame | None]


class _Connector:
    """A loopback listener for one joined cluster, bound for the process's lifetime; each
    connection is a `kube` stream through the cluster's current session."""

    def __init__(self, name: str, current: Callable[[], _Held | None]) -> None:
        self.name = name
        self._current = current
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(128)
        self._socket.setblocking(False)
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(self._handle, sock=self._socket)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held = self._current()
        if held is None:
            writer.transport.abort()
            return
        try:
            stream = await held.session.open(KUBE_TARGET, OPEN_TIMEOUT_S)
        except (TunnelError, TimeoutError) as exc:
            log.info("cluster agent stream refused", cluster=self.name, error=str(exc))
            writer.transport.abort()
            return
        with contextlib.suppress(asyncio.CancelledError):
            await pipe(stream, reader, writer)


class ClusterHub(gateway_pb2_grpc.ClustersServicer):
    def __init__(
        self,
        records: ClusterRecords,
        secret: SecretStr,
        on_joined: Callable[[ClusterState], Awaitable[None]] | None = None,
    ) -> None:
        self._records = records
        self._secret = secret
        self._on_joined = on_joined
        self._held: dict[str, _Held] = {}
        self._connectors: dict[str, _Connector] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._starting: set[asyncio.Future[None]] = set()

    async def prepare(self) -> None:
        """Starts serving the listeners made so far (the gateway's start calls it)."""
        self._loop = asyncio.get_running_loop()
        for connector in self._connectors.values():
            await connector.start()

    def url(self, name: str) -> str:
        """The loopback URL that reaches cluster `name`'s API through its agent (made once,
        from any thread: the pool's client asks for it where it is built)."""
        connector = self._connectors.get(name)
        if connector is None:
            connector = self._connectors[name] = _Connector(name, lambda: self._held.get(name))
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._start_soon, connector)
        return connector.url

    def _start_soon(self, connector: _Connector) -> None:
        task = asyncio.ensure_future(connector.start())
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    def connected(self, name: str) -> bool:
        return name in self._held

    async def disconnect(self, name: str, reason: str) -> bool:
        """Ends the cluster's session (its agent reconnects); False when none is held."""
        held = self._held.pop(name, None)
        if held is None:
            return False
        await held.session.close(reason)
        held.outgoing.put_nowait(None)
        return True

    async def close(self) -> None:
        for held in list(self._held.values()):
            await held.session.close("gateway stopping")
            held.outgoing.put_nowait(None)
        for connector in self._connectors.values():
            await connector.close()

    async def JoinCluster(
        self,
        request: gateway_pb2.JoinClusterRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> gateway_pb2.JoinClusterResponse:
        name = request.cluster_name
        if not DNS_LABEL.fullmatch(name):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "cluster_name: a lowercase DNS label"
            )
        if not request.join_token:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "join_token: missing")
        digest = join_digest(request.join_token)
        refusal = await self._records.exchange(name, digest)
        if refusal is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no cluster {name} is being joined: run `levers9 cluster join --name {name}`",
            )
        if refusal:
            log.warning("cluster join refused", cluster=name, reason=refusal)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, refusal)
        log.info("cluster joined", cluster=name)
        return gateway_pb2.JoinClusterResponse(
            agent_token=agent_token(self._secret.get_secret_value(), name, digest)
        )

    async def ClusterTunnel(
        self,
        request_iterator: AsyncIterator[gateway_pb2.TunnelFrame],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[gateway_pb2.TunnelFrame]:
        try:
            token = bearer_token(context.invocation_metadata() or ())
        except Unauthenticated as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        name = (await read_hello(request_iterator, context)).pool_name
        state = await self._records.state(name) if DNS_LABEL.fullmatch(name) else None
        if state is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no cluster {name} is joined: `levers9 cluster join --name {name}`",
            )
        secret = self._secret.get_secret_value()
        if not agent_token_matches(secret, name, state.join_digest, token):
            log.warning("cluster tunnel refused", cluster=name, reason="agent token")
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                f"this agent token is not cluster {name}'s (from an older join?): run"
                f" `levers9 cluster join --name {name}` again",
            )
        outgoing: asyncio.Queue[gateway_pb2.TunnelFrame | None] = asyncio.Queue()

        async def send(frame: Frame) -> None:
            outgoing.put_nowait(to_proto(frame))

        held = _Held(secrets.token_hex(8), Session(send, initiator=True), outgoing)
        previous = self._held.get(name)
        if previous is not None:
            await previous.session.close("replaced by a new tunnel from the cluster's agent")
            previous.outgoing.put_nowait(None)
        first_here = name not in self._connectors
        self.url(name)
        await self._connectors[name].start()
        self._held[name] = held
        log.info("cluster agent connected", cluster=name, session_id=held.session_id)
        if self._on_joined is not None and (first_here or previous is None):
            try:
                await self._on_joined(state)
            except Exception as exc:  # the session stands; the pool's passes will say why
                log.error("joined pool not loaded", cluster=name, error=repr(exc))
        try:
            async for frame in pump_session(
                request_iterator, held.session, outgoing, held.session_id
            ):
                yield frame
        finally:
            if self._held.get(name) is held:
                del self._held[name]
            await held.session.close("tunnel closed")
            log.info("cluster agent disconnected", cluster=name, session_id=held.session_id)
