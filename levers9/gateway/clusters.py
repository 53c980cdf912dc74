"""`levers9.v1.Clusters`: joined clusters' agents (`levers9 cluster join`) dial in here.

- `JoinCluster`: the agent's first contact. The join token it read from its Secret is checked
  against the join's record (`ClusterWorkflow`, Update `exchange`: the token's SHA-256, unspent,
  unexpired) and spent; the answer is the agent's own token (an HMAC of the cluster's name and
  that join under the controlplane's secret), which the agent keeps in its Secret. A used or
  expired token is PERMISSION_DENIED with the fix; an unknown cluster NOT_FOUND.
- `ClusterTunnel`: the agent's one outbound stream, with its agent token, held as a tunnel
  session (levers9.tunnel.mux). This process keeps one loopback listener per joined cluster,
  for its lifetime: each connection to it is a `kube` stream to the agent's proxy of its
  cluster's API, through the current session. The pool's Kubernetes client is pointed at that
  listener (`KubeClients(joined=hub.url)`), so reconcile, the cache's watches and the worker
  Jobs work unchanged, and the controlplane never dials the cluster.
- One replica holds the session; it records its route, and on every other replica a connection
  to the listener is relayed to it (`RelayKube`, levers9.gateway.cluster_relay). With no
  session anywhere the connection is reset, and the call fails as an unreachable cluster does.
- A session held for a cluster this process did not serve yet calls `on_joined` (worker_main
  loads the pool: its client, cache and reconcile schedule); so does `load`, for a pool that an
  activity or a worker's registration names on a replica that has not loaded it yet.

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

from levers9.contract import DNS_LABEL, KUBE_TARGET
from levers9.core.workspaces import parse_token
from levers9.gateway.auth import bearer_token
from levers9.gateway.cluster_relay import (
    RELAY_OPENED,
    RELAYED,
    ClusterRoutes,
    RelayRefused,
    relay_connection,
    relay_metadata,
    serve_relay,
)
from levers9.gateway.errors import Unauthenticated
from levers9.gateway.task_upstream import Replicas
from levers9.gateway.tunnel import pump_session, read_hello
from levers9.logs import get_logger
from levers9.proto import gateway_pb2, gateway_pb2_grpc
from levers9.providers.joined import ClusterRoute, ClusterState, cluster_workflow_id
from levers9.records.clusters import cluster_state
from levers9.tokens import (
    agent_token,
    agent_token_matches,
    join_digest,
    operator_token,
    operator_token_matches,
)
from levers9.tunnel.bridge import pipe
from levers9.tunnel.frames import Frame
from levers9.tunnel.mux import Session, TunnelError
from levers9.tunnel.wire import to_proto

OPEN_TIMEOUT_S = 10.0
RECORD_TIMEOUT_S = 10.0
"""The longest a session waits for its route to be recorded (it stands without)."""

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

    def __init__(
        self,
        name: str,
        current: Callable[[], _Held | None],
        relay: Callable[[str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    ) -> None:
        self.name = name
        self._current = current
        self._relay = relay
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
            with contextlib.suppress(asyncio.CancelledError):
                await self._relay(self.name, reader, writer)
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
        *,
        routes: ClusterRoutes | None = None,
        replicas: Replicas | None = None,
        replica_address: str | None = None,
        operator_generation: int = 1,
    ) -> None:
        """`routes`, `replicas` and `replica_address` (this replica's gateway, as the others
        reach it): where sessions are recorded and how connections are relayed to the replica
        holding one; without them this process serves its own sessions only."""
        self._records = records
        self._secret = secret
        self._on_joined = on_joined
        self._routes = routes
        self._replicas = replicas
        self._replica_address = replica_address
        self._operator_generation = operator_generation
        self._held: dict[str, _Held] = {}
        self._connectors: dict[str, _Connector] = {}
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._loading: dict[str, asyncio.Lock] = {}
        self._loaded: set[str] = set()
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
            connector = self._connectors[name] = _Connector(
                name, lambda: self._held.get(name), self._relay
            )
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._start_soon, connector)
        return connector.url

    def _start_soon(self, connector: _Connector) -> None:
        task = asyncio.ensure_future(connector.start())
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    def connected(self, name: str) -> bool:
        return name in self._held

    async def load(self, name: str) -> bool:
        """Loads joined cluster `name`'s pool on this replica (`on_joined`), wherever its
        agent's session is: an activity or a worker's registration named a pool this replica
        has not loaded. False when no cluster of that name is joined."""
        if self._on_joined is None or not DNS_LABEL.fullmatch(name):
            return False
        async with self._loading.setdefault(name, asyncio.Lock()):
            if name in self._loaded:
                return True
            state = await self._records.state(name)
            if state is None:
                return False
            await self._on_joined(state)
            self._loaded.add(name)
        log.info("joined pool loaded for a call here", cluster=name)
        return True

    async def _relay(
        self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A connection to cluster `name` on a replica that holds no session of its agent:
        through the replica that does, the latest recorded first; reset when none can."""
        why = "no agent session is held here, and this replica relays to no other"
        if self._routes is not None and self._replicas is not None:
            here = self._replicas.task_queue
            try:
                routes = await self._routes.routes(name)
            except Exception as exc:  # Temporal unreachable: as an unreachable cluster
                routes, why = [], f"its route could not be read: {exc!r}"
            else:
                why = "no replica holds its agent's session"
            refusals = []
            for route in routes:
                if route.task_queue == here or not route.replica_address:
                    continue
                log.info(
                    "relaying to the replica holding the cluster's session",
                    cluster=name,
                    replica=route.replica_address,
                )
                try:
                    await relay_connection(
                        self._channel(route.replica_address),
                        relay_metadata(
                            operator_token(
                                self._secret.get_secret_value(), self._operator_generation
                            ),
                            here,
                        ),
                        name,
                        reader,
                        writer,
                    )
                    return
                except RelayRefused as exc:
                    refusals.append(f"{route.replica_address}: {exc}")
            if refusals:
                why = "; ".join(refusals)
        log.info("cluster agent stream refused", cluster=name, error=why)
        writer.transport.abort()

    def _channel(self, address: str) -> grpc.aio.Channel:
        assert self._replicas is not None
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = self._replicas.channel(address)
        return channel

    def _route(self, held: _Held) -> ClusterRoute | None:
        if self._routes is None or self._replicas is None:
            return None
        return ClusterRoute(
            task_queue=self._replicas.task_queue,
            replica_address=self._replica_address,
            session_id=held.session_id,
        )

    async def _record(self, name: str, route: ClusterRoute | None, *, held: bool) -> None:
        """Records that this replica holds (or no longer holds) the session; a failure is
        logged, never the session's end (the other replicas cannot reach it meanwhile)."""
        if self._routes is None or route is None:
            return
        try:
            async with asyncio.timeout(RECORD_TIMEOUT_S):
                if held:
                    await self._routes.held(name, route)
                else:
                    await self._routes.released(name, route)
        except Exception as exc:
            log.warning(
                "cluster session route not recorded",
                cluster=name,
                session_id=route.session_id,
                held=held,
                error=repr(exc),
            )

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
        for channel in self._channels.values():
            await channel.close()

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
        route = self._route(held)
        await self._record(name, route, held=True)
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
            await self._record(name, route, held=False)

    async def RelayKube(
        self,
        request_iterator: AsyncIterator[gateway_pb2.ClusterRelayData],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[gateway_pb2.ClusterRelayData]:
        """Another replica's connection to a cluster whose agent's session is held here."""
        try:
            token = bearer_token(context.invocation_metadata() or ())
        except Unauthenticated as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        secret = self._secret.get_secret_value()
        if parse_token(token) is not None:
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "RelayKube is the operator's (one replica to another): a workspace token may"
                " only run, read and stop its own workspace's tasks",
            )
        if not operator_token_matches(secret, token, self._operator_generation):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "operator token does not match this controlplane's secret: the replicas share"
                " one workerTokenSecret and operatorTokenGeneration",
            )
        first = await anext(request_iterator, None)
        if first is None or not DNS_LABEL.fullmatch(first.cluster_name):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "cluster_name: the first message names the cluster (a DNS label)",
            )
            return
        name = first.cluster_name
        here = self._replicas.task_queue if self._replicas is not None else "this replica"
        held = self._held.get(name)
        if held is None or held.session.closed:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"cluster {name}'s agent holds no session with {here}: read its route again",
            )
            return
        try:
            stream = await held.session.open(KUBE_TARGET, OPEN_TIMEOUT_S)
        except (TunnelError, TimeoutError) as exc:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"cluster {name}'s agent opened no stream: {exc}"
            )
            return
        relayed_by = next(
            (str(v) for k, v in context.invocation_metadata() or () if k == RELAYED), None
        )
        log.info(
            "serving a relayed connection to the cluster's API",
            cluster=name,
            relayed_by=relayed_by,
            session_id=held.session_id,
        )
        await context.send_initial_metadata(((RELAY_OPENED, "1"),))
        try:
            async for data in serve_relay(stream, first, request_iterator):
                yield data
        except TunnelError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cluster {name}'s stream: {exc}")
