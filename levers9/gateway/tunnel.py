"""`Gateway.Tunnel`: the controlplane's end of each tunnelled worker's one outbound stream.

A worker of a pool with `kubernetes.tunnel: true` dials the gateway (nothing dials it) and opens
this bidirectional stream with its worker token; its first frame (`hello`) names it, and must
match the token. The gateway then holds a `Session` (levers9.tunnel.mux) over the stream and a
loopback listener in front of it: every TCP connection to that listener becomes a multiplexed
stream to the worker's WorkerService (target `worker`), so the controlplane's gRPC clients
(RunTask, GetTask, StreamLogs, Exec) work unchanged, only pointed at the listener.
`open(pool, worker, target)` opens a stream to one of the worker's own container ports
(endpoint traffic); the worker refuses any target that is not itself.

The session lives in this process only: `endpoint()` gives the listener's address, this
replica's task queue and its replica address, which the gateway's Register records for the
worker, so that calls to it are scheduled where its session is and another replica's gateway
relays a stream to it through this one (levers9.gateway.task_service). A worker whose session
drops (a gateway restart) reconnects with backoff and registers again; its record then points
at the new session.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from pydantic import SecretStr

from levers9.gateway.auth import authenticate
from levers9.gateway.convert import TunnelEndpoint, check_worker
from levers9.gateway.errors import InvalidRequest, Unauthenticated
from levers9.logs import get_logger
from levers9.proto import gateway_pb2
from levers9.tunnel.bridge import LocalListener
from levers9.tunnel.frames import Frame
from levers9.tunnel.mux import Session, Stream
from levers9.tunnel.wire import WORKER_TARGET, from_proto, to_proto

HELLO_TIMEOUT_S = 10.0

log = get_logger(__name__)

Context = grpc.aio.ServicerContext[gateway_pb2.TunnelFrame, gateway_pb2.TunnelFrame]


@dataclass
class Held:
    session_id: str
    session: Session
    listener: LocalListener
    address: str
    outgoing: asyncio.Queue[gateway_pb2.TunnelFrame | None]


class TunnelHub:
    """The tunnel sessions this replica holds, by (pool, worker id)."""

    def __init__(
        self,
        secret: SecretStr,
        task_queue: str,
        replica_address: str | None = None,
        *,
        token_generation: int = 1,
    ) -> None:
        self._secret = secret
        self._token_generation = token_generation
        self.task_queue = task_queue
        self.replica_address = replica_address
        self._held: dict[tuple[str, str], Held] = {}

    def endpoint(self, pool_name: str, worker_id: str) -> TunnelEndpoint | None:
        """This replica's end of the worker's session, while it is held."""
        held = self._held.get((pool_name, worker_id))
        if held is None or held.session.closed:
            return None
        return TunnelEndpoint(held.address, self.task_queue, self.replica_address)

    async def open(self, pool_name: str, worker_id: str, target: str) -> Stream:
        """A stream to `target` on the worker (`127.0.0.1:<port>` of its own containers)."""
        held = self._held.get((pool_name, worker_id))
        if held is None or held.session.closed:
            raise LookupError(f"no tunnel session for worker {worker_id} of pool {pool_name}")
        return await held.session.open(target)

    @property
    def sessions(self) -> int:
        return len(self._held)

    async def close(self) -> None:
        for held in list(self._held.values()):
            await self._drop(held, "gateway stopping")

    async def serve(
        self, requests: AsyncIterator[gateway_pb2.TunnelFrame], context: Context
    ) -> AsyncIterator[gateway_pb2.TunnelFrame]:
        """The servicer's body: authenticate the hello, hold the session, pump frames."""
        hello = await read_hello(requests, context)
        pool_name, worker_id = hello.pool_name, hello.worker_id
        try:
            check_worker(pool_name, worker_id)
            authenticate(
                self._secret,
                worker_id,
                context.invocation_metadata() or (),
                self._token_generation,
            )
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Unauthenticated as exc:
            log.warning("tunnel refused", worker_id=worker_id, reason=str(exc))
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        outgoing: asyncio.Queue[gateway_pb2.TunnelFrame | None] = asyncio.Queue()

        async def send(frame: Frame) -> None:
            outgoing.put_nowait(to_proto(frame))

        session = Session(send, initiator=True)
        listener = LocalListener(session, WORKER_TARGET)
        address = await listener.start()
        held = Held(secrets.token_hex(8), session, listener, address, outgoing)
        previous = self._held.get((pool_name, worker_id))
        if previous is not None:
            await self._drop(previous, "replaced by a new tunnel from the same worker")
        self._held[(pool_name, worker_id)] = held
        log.info(
            "tunnel session held",
            pool_name=pool_name,
            worker_id=worker_id,
            session_id=held.session_id,
            address=address,
        )

        try:
            async for frame in pump_session(requests, session, outgoing, held.session_id):
                yield frame
        finally:
            if self._held.get((pool_name, worker_id)) is held:
                del self._held[(pool_name, worker_id)]
            await self._drop(held, "tunnel closed")
            log.info("tunnel session ended", pool_name=pool_name, worker_id=worker_id)

    async def _drop(self, held: Held, reason: str) -> None:
        await held.session.close(reason)
        await held.listener.close()
        held.outgoing.put_nowait(None)  # ends the stream to the worker: it reconnects


async def pump_session(
    requests: AsyncIterator[gateway_pb2.TunnelFrame],
    session: Session,
    outgoing: asyncio.Queue[gateway_pb2.TunnelFrame | None],
    session_id: str,
) -> AsyncIterator[gateway_pb2.TunnelFrame]:
    """A held session's stream: `ready`, then every frame the session sends, while the peer's
    frames feed the session; ends when either side ends (the caller closes the session)."""

    async def pump() -> None:
        try:
            async for message in requests:
                await session.feed(from_proto(message))
        except Exception as exc:
            log.warning("tunnel read failed", session_id=session_id, error=repr(exc))
            raise
        finally:
            outgoing.put_nowait(None)

    pumping = asyncio.create_task(pump())
    try:
        yield gateway_pb2.TunnelFrame(ready=gateway_pb2.TunnelReady(session_id=session_id))
        while (frame := await outgoing.get()) is not None:
            yield frame
    finally:
        pumping.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pumping


async def read_hello(
    requests: AsyncIterator[gateway_pb2.TunnelFrame], context: grpc.aio.ServicerContext[Any, Any]
) -> gateway_pb2.TunnelHello:
    """A tunnel's first frame, which must be `hello` within HELLO_TIMEOUT_S (else the call is
    aborted INVALID_ARGUMENT)."""
    try:
        first = await asyncio.wait_for(anext(requests), HELLO_TIMEOUT_S)
    except (StopAsyncIteration, TimeoutError):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first frame is hello")
    if first.WhichOneof("kind") != "hello":
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the first frame is hello")
    return first.hello
