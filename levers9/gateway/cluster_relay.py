"""A joined cluster reached from every replica: the replica that holds the agent's session serves
the others' connections to the cluster's API (`Clusters/RelayKube`).

A joined cluster's agent holds one session, with whichever replica its connection reached.
The replica that takes it records its route (`ClusterSessionWorkflow`, `cluster-session:<name>`:
its task queue, its gateway's `replicaAddress`, the session's id) and drops it when the session
ends. Every replica's pool client for that cluster talks to a loopback listener of its own; a
connection to it on a replica that holds no session is relayed: the routes are read (the
workflow's memo, which the server answers), the latest first, and the connection's bytes go in
one `RelayKube` call, with the operator token, to that replica's gateway, which opens a `kube`
stream in its session and pipes the two. A replica that holds none refuses the call
(FAILED_PRECONDITION: a route left by a replica killed with its session), and the next route is
tried; a relayed call is never relayed again. So reconcile, the watch-fed caches and worker Jobs
work on every replica, and when the holder dies the agent redials (another replica) and the
next connections follow its new route.

Tokens never appear in a message or a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Protocol

from grpc import aio
from temporalio.client import Client

from levers9.logs import get_logger
from levers9.proto import gateway_pb2, gateway_pb2_grpc
from levers9.providers.joined import (
    CLUSTER_SESSION_WORKFLOW,
    ClusterRoute,
    ClusterSessionInput,
    cluster_session_workflow_id,
)
from levers9.records.found import delivered, or_none
from levers9.rpc import bearer
from levers9.tunnel.frames import MAX_DATA
from levers9.tunnel.mux import Stream

RELAY_OPENED = "levers9-kube-opened"
"""Initial metadata of a RelayKube call whose stream to the agent's proxy is open."""
RELAYED = "levers9-relayed-by"
"""Metadata on a call one replica relays to another: the replica that relayed it."""

log = get_logger(__name__)


class ClusterRoutes(Protocol):
    async def held(self, name: str, route: ClusterRoute) -> None:
        """Records that this route holds cluster `name`'s session (the latest)."""

    async def released(self, name: str, route: ClusterRoute) -> None:
        """That route's session ended."""

    async def routes(self, name: str) -> list[ClusterRoute]:
        """The routes recorded, the latest first."""


class TemporalClusterRoutes:
    """The routes as ClusterSessionWorkflow keeps them (its memo is read, never queried)."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self._client = client
        self._task_queue = task_queue

    async def held(self, name: str, route: ClusterRoute) -> None:
        await self._client.start_workflow(
            CLUSTER_SESSION_WORKFLOW,
            ClusterSessionInput(name=name, routes=[route]),
            id=cluster_session_workflow_id(name),
            task_queue=self._task_queue,
            start_signal="held",
            start_signal_args=[route],
            memo={"routes": [route.model_dump(mode="json")]},
            static_summary=f"where joined cluster {name}'s agent session is held",
        )

    async def released(self, name: str, route: ClusterRoute) -> None:
        handle = self._client.get_workflow_handle(cluster_session_workflow_id(name))
        await delivered(handle.signal("released", route))  # not delivered: the session ended

    async def routes(self, name: str) -> list[ClusterRoute]:
        handle = self._client.get_workflow_handle(cluster_session_workflow_id(name))
        described = await or_none(handle.describe())
        if described is None:
            return []
        recorded = (await described.memo()).get("routes") or []
        return [ClusterRoute.model_validate(r) for r in reversed(recorded)]


class RelayRefused(Exception):
    """The replica could not relay the connection; the message says why."""


def relay_metadata(token: str, relayed_by: str) -> tuple[tuple[str, str], ...]:
    """A RelayKube call's metadata: the operator token, and the replica relaying."""
    return (*bearer.metadata(token), (RELAYED, relayed_by))


async def relay_connection(
    channel: aio.Channel,
    metadata: tuple[tuple[str, str], ...],
    name: str,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    """Carries one local connection to cluster `name`'s API through another replica's gateway.
    Raises RelayRefused before a byte moved when that replica cannot (the caller tries the next
    route); afterwards a broken call aborts the socket (the client sees an error, never a
    short answer it might take for a whole one)."""
    call = gateway_pb2_grpc.ClustersStub(channel).RelayKube(metadata=metadata)
    try:
        await call.write(gateway_pb2.ClusterRelayData(cluster_name=name))
        opened = await call.initial_metadata()
    except (aio.AioRpcError, asyncio.InvalidStateError):
        opened = None
    if opened is None or not opened.get(RELAY_OPENED):
        call.cancel()
        raise RelayRefused(f"{(await call.code()).name}: {await call.details()}")

    async def up() -> None:
        with contextlib.suppress(aio.AioRpcError, asyncio.InvalidStateError):  # the call ended
            while data := await reader.read(MAX_DATA):
                await call.write(gateway_pb2.ClusterRelayData(data=data))
            await call.done_writing()

    async def down() -> None:
        async for message in call:
            writer.write(message.data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    def abort() -> None:
        call.cancel()
        writer.transport.abort()

    await _both(up(), down(), abort)
    writer.close()


async def serve_relay(
    stream: Stream,
    first: gateway_pb2.ClusterRelayData,
    requests: AsyncIterator[gateway_pb2.ClusterRelayData],
) -> AsyncIterator[gateway_pb2.ClusterRelayData]:
    """The holder's side of a RelayKube call: the caller's bytes onto the `kube` stream (its
    end of input a FIN), the stream's bytes back, until the agent's side ends (the call then
    ends: no HTTP client writes past its server's close). A reset stream raises TunnelError;
    a cancelled call resets the stream."""

    async def up() -> None:
        if first.data:
            await stream.write(first.data)
        async for message in requests:
            if message.data:
                await stream.write(message.data)
        await stream.write_eof()

    feeding = asyncio.create_task(up())
    try:
        while data := await stream.read():
            yield gateway_pb2.ClusterRelayData(data=data)
    finally:
        feeding.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await feeding
        await stream.reset("relay ended")


async def _both(
    up: Coroutine[Any, Any, None], down: Coroutine[Any, Any, None], abort: Callable[[], None]
) -> None:
    """Runs both directions until both end; the first to fail aborts both."""
    tasks = {asyncio.create_task(up), asyncio.create_task(down)}
    try:
        pending = tasks
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(not t.cancelled() and t.exception() is not None for t in done):
                abort()
                break
    except asyncio.CancelledError:
        abort()
        raise
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
