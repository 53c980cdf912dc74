"""The worker's end of the tunnel (`kubernetes.tunnel: true`): one outbound stream to the
gateway, inside which the controlplane opens every connection it initiates.

The agent opens `Gateway.Tunnel` on its gateway channel with its worker token and says `hello`;
once the gateway answers `ready` it holds the session, and the agent registers (on the same
channel, so the same gateway replica). Each stream the controlplane opens names a target:

- `worker`: this agent's WorkerService, which in tunnel mode listens on a unix socket only (so
  nothing reaches it but the tunnel);
- `127.0.0.1:<port>` or `localhost:<port>`: a port of this worker's own containers.

Anything else (another host, another worker's address) is refused with the reason. When the
stream breaks (a gateway restart, a network blip) the session's streams are reset, and the agent
reconnects with backoff and registers again, so its record points at the new session.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

from grpc import aio

from levers9.agent.backoff import Backoff
from levers9.logs import get_logger
from levers9.proto import gateway_pb2, gateway_pb2_grpc
from levers9.rpc import bearer
from levers9.tunnel.bridge import dial, dial_unix
from levers9.tunnel.frames import Frame
from levers9.tunnel.mux import Session, Stream, StreamRefused
from levers9.tunnel.wire import WORKER_TARGET, from_proto, to_proto

log = get_logger("levers9.agent")

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost"})
READY_TIMEOUT_S = 15.0


def parse_local_target(target: str) -> int | None:
    """The port of `127.0.0.1:<port>` / `localhost:<port>`; None for anything else."""
    host, colon, port = target.rpartition(":")
    if not colon or host not in LOCAL_HOSTS or not port.isdigit():
        return None
    number = int(port)
    return number if 0 < number < 65536 else None


class TunnelClient:
    """Holds the worker's tunnel open; `on_ready` runs after every (re)connection."""

    def __init__(
        self,
        channel: aio.Channel,
        token: str,
        pool_name: str,
        worker_id: str,
        socket_path: Path,
        *,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._stub = gateway_pb2_grpc.GatewayStub(channel)
        self._metadata = bearer.metadata(token)
        self._pool_name = pool_name
        self._worker_id = worker_id
        self._socket_path = socket_path
        self._backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self.ready = asyncio.Event()
        self.sessions = 0
        """How many sessions were held so far (reconnections + 1)."""

    async def run(self, on_ready: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Connects, serves, reconnects; until cancelled."""
        attempt = 0
        while True:
            try:
                await self._session(on_ready)
                attempt = 0  # it was up: the next drop starts the backoff afresh
            except aio.AioRpcError as error:
                log.warning("tunnel failed", code=error.code().name, error=error.details() or "")
            except TimeoutError:
                log.warning("tunnel not ready in time")
            except Exception as error:  # a bug must not end the tunnel for good: log, retry
                log.error("tunnel broke", error=repr(error))
            self.ready.clear()
            delay = self._backoff.delay(attempt, self._rng)
            attempt += 1
            log.info("tunnel reconnecting", retry_in_s=round(delay, 2))
            await asyncio.sleep(delay)

    async def _session(self, on_ready: Callable[[], Coroutine[Any, Any, None]]) -> None:
        outgoing: asyncio.Queue[gateway_pb2.TunnelFrame | None] = asyncio.Queue()
        hello = gateway_pb2.TunnelHello(pool_name=self._pool_name, worker_id=self._worker_id)
        outgoing.put_nowait(gateway_pb2.TunnelFrame(hello=hello))

        async def frames() -> AsyncIterator[gateway_pb2.TunnelFrame]:
            while (frame := await outgoing.get()) is not None:
                yield frame

        async def send(frame: Frame) -> None:
            outgoing.put_nowait(to_proto(frame))

        session = Session(send, initiator=False, accept=self._accept)
        call = self._open(frames())
        try:
            first = await asyncio.wait_for(call.read(), READY_TIMEOUT_S)
            if (
                not isinstance(first, gateway_pb2.TunnelFrame)
                or first.WhichOneof("kind") != "ready"
            ):
                raise TimeoutError("the gateway did not say ready")
            self.sessions += 1
            self.ready.set()
            log.info("tunnel ready", session_id=first.ready.session_id)
            registering = asyncio.create_task(on_ready())
            try:
                # read() throughout: grpc refuses a call read both ways.
                while isinstance(message := await call.read(), gateway_pb2.TunnelFrame):
                    await session.feed(from_proto(message))
            finally:
                registering.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await registering
            log.warning("tunnel closed by the gateway")
        finally:
            outgoing.put_nowait(None)
            await session.close("tunnel closed")
            call.cancel()

    def _open(
        self, frames: AsyncIterator[gateway_pb2.TunnelFrame]
    ) -> aio.StreamStreamCall[gateway_pb2.TunnelFrame, gateway_pb2.TunnelFrame]:
        """The stream to the gateway (a subclass opens another RPC of the same frames)."""
        return self._stub.Tunnel(frames, metadata=self._metadata)

    async def _accept(self, stream: Stream, target: str) -> None:
        if target == WORKER_TARGET:
            await dial_unix(stream, str(self._socket_path))
            return
        port = parse_local_target(target)
        if port is None:
            log.warning("tunnel target refused", target=target)
            raise StreamRefused(
                f"target {target} is not this worker: only `worker` and 127.0.0.1:<port>"
            )
        await dial(stream, "127.0.0.1", port)
