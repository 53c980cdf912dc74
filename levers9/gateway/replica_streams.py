"""HTTP/1.1 exchanges with an endpoint's replicas, each on a kept `PortForward` stream.

A stream is one TCP connection to the replica's port, opened by its worker (the path
`levers9 port-forward` takes: the worker's WorkerService over TLS, this replica's end of the
worker's tunnel, or relayed to the controlplane replica that holds it). The front writes the
request's bytes onto it and parses the response from what comes back (`levers9.rpc.http1`):
one gRPC message each way for a small request, no socket or HTTP client in between. A stream
whose response ended cleanly with keep-alive goes back to its replica's idle list for the next
request; any other is closed.

A kept stream the replica closed while it idled (uvicorn after 5 s) fails before a byte of its
response: `Exchange.send` says so (`StaleStream`), and the front sends a request without a body
again, once, on a new stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import grpc

from levers9.contract import PORT_CONNECTED_HEADER
from levers9.gateway.task_service import TasksService
from levers9.gateway.task_upstream import PortForwardCall, Unroutable
from levers9.logs import get_logger
from levers9.models import TaskRecord
from levers9.proto import worker_pb2
from levers9.rpc.http1 import ConnectionClosed, HttpProtocolError, ResponseHead, ResponseParser

log = get_logger(__name__)

MAX_IDLE = 32
"""Idle streams kept per replica; more are closed when their response ends."""
SEND_WHOLE = 64 * 1024
"""A request body up to this size goes in the message with its head."""


class ReplicaFailed(Exception):
    """The exchange failed; the message says how (the replica's worker or connection).
    `reached`: whether any of the request may have reached the replica's port (False: its
    worker never connected to it, so the request can go to another replica)."""

    def __init__(self, message: str, *, reached: bool = True) -> None:
        super().__init__(message)
        self.reached = reached


class StaleStream(ReplicaFailed):
    """A kept stream was closed before the replica sent a byte of its response."""


class BodyRefused(Exception):
    """The front stopped the request's body on its way (raised by the body it gave `send`,
    e.g. past its size limit): not the replica's failure. The exchange raises it as it is,
    and its stream is closed on release."""


class Stream:
    """One PortForward call to a replica's port, one request at a time."""

    def __init__(self, call: PortForwardCall, stack: AsyncExitStack) -> None:
        self._call = call
        self._stack = stack
        self.used = 0

    @classmethod
    async def open(cls, tasks: TasksService, record: TaskRecord, port: int) -> Stream:
        stack = AsyncExitStack()
        try:
            upstream = await stack.enter_async_context(tasks.upstream(record))
            call = upstream.port_forward()
            start = worker_pb2.PortForwardStart(task_id=record.task_id, port=port)
            await call.write(worker_pb2.PortForwardRequest(start=start))
        except BaseException:
            await stack.aclose()
            raise
        return cls(call, stack)

    def alive(self) -> bool:
        return not self._call.done()

    async def reached(self) -> bool:
        """Whether the worker connected to the port (its initial metadata says so); asked of
        a call that has ended (a live one did, or it could not be carrying a response)."""
        if self.used or not self._call.done():
            return True
        metadata = await self._call.initial_metadata()
        return bool(metadata is not None and metadata.get(PORT_CONNECTED_HEADER))

    async def write(self, data: bytes) -> None:
        try:
            await self._call.write(worker_pb2.PortForwardRequest(data=data))
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            # The call ended before this write (grpc says INTERNAL, or that it has finished):
            # its own status says how.
            code = await self._call.code()
            if code == grpc.StatusCode.OK:
                raise ConnectionClosed("the replica closed the connection") from None
            raise ReplicaFailed(_status(code, await self._call.details())) from None

    async def read(self) -> bytes:
        """The next bytes; `b""` once the connection has closed."""
        response = await self._next()
        while response is not grpc.aio.EOF:
            assert isinstance(response, worker_pb2.PortForwardResponse)
            if response.data:
                return response.data
            response = await self._next()
        return b""

    async def _next(self) -> object:
        try:
            return await self._call.read()
        except grpc.aio.AioRpcError as exc:
            raise ReplicaFailed(_rpc_failure(exc)) from None

    async def close(self) -> None:
        self._call.cancel()
        with contextlib.suppress(Exception):
            await self._stack.aclose()


def _rpc_failure(exc: grpc.aio.AioRpcError) -> str:
    return _status(exc.code(), exc.details())


def _status(code: grpc.StatusCode, details: str | None) -> str:
    return f"{code.name}: {details}" if details else code.name


class Replica:
    """One replica's idle streams."""

    def __init__(self, tasks: TasksService, record: TaskRecord, port: int) -> None:
        self._tasks = tasks
        self.record = record
        self.port = port
        self._idle: list[Stream] = []
        self._closed = False

    async def stream(self) -> Stream:
        """An idle stream that is still open, or a new one."""
        while self._idle:
            stream = self._idle.pop()
            if stream.alive():
                return stream
            await stream.close()
        try:
            return await Stream.open(self._tasks, self.record, self.port)
        except grpc.aio.AioRpcError as exc:
            raise ReplicaFailed(_rpc_failure(exc), reached=False) from None
        except Unroutable as exc:
            raise ReplicaFailed(str(exc), reached=False) from None

    async def release(self, stream: Stream, reusable: bool) -> None:
        if reusable and not self._closed and len(self._idle) < MAX_IDLE and stream.alive():
            stream.used += 1
            self._idle.append(stream)
        else:
            await stream.close()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for stream in idle:
            await stream.close()


class Exchange:
    """One request and its response on one stream."""

    def __init__(self, replica: Replica, stream: Stream, *, head_request: bool) -> None:
        self._replica = replica
        self._stream = stream
        self._parser = ResponseParser(head_request=head_request)
        self._sender: asyncio.Task[None] | None = None
        self._released = False
        self.head: ResponseHead | None = None
        self.first = b""
        """The body bytes that came with the head."""

    @property
    def done(self) -> bool:
        return self._parser.done

    async def send(self, head: bytes, body: bytes | AsyncIterator[bytes] | None) -> ResponseHead:
        """Writes the request (a streamed body as the response is read: a replica that answers
        before it reads the whole body is not blocked) and reads until the response's head."""
        parser = self._parser
        try:
            if body is None or isinstance(body, bytes):
                await self._stream.write(head + (body or b""))
            else:
                await self._stream.write(head)
                self._sender = asyncio.create_task(self._send(body))
            pending = bytearray()
            while parser.head is None:
                pending += parser.feed(await self._read())
        except ConnectionClosed as exc:
            if not parser.received and self._stream.used:
                raise StaleStream(str(exc)) from None
            raise ReplicaFailed(str(exc), reached=await self._reached()) from None
        except HttpProtocolError as exc:
            raise ReplicaFailed(f"a malformed response: {exc}") from None
        except ReplicaFailed as exc:
            raise ReplicaFailed(str(exc), reached=await self._reached()) from None
        self.head, self.first = parser.head, bytes(pending)
        return parser.head

    async def _reached(self) -> bool:
        return bool(self._parser.received) or await self._stream.reached()

    async def _send(self, body: AsyncIterator[bytes]) -> None:
        async for data in body:
            if data:
                await self._stream.write(data)

    def _send_failure(self) -> Exception | None:
        sender = self._sender
        if sender is None or not sender.done() or sender.cancelled():
            return None
        error = sender.exception()
        if error is None or isinstance(error, BodyRefused):
            return error
        return ReplicaFailed(f"the request's body failed: {error}")

    async def _read(self) -> bytes:
        """The stream's next bytes, read while the body is still being sent."""
        if failure := self._send_failure():
            raise failure
        sender = self._sender
        if sender is None or sender.done():
            return await self._stream.read()
        reading = asyncio.ensure_future(self._stream.read())
        try:
            await asyncio.wait((reading, sender), return_when=asyncio.FIRST_COMPLETED)
            if not reading.done() and (failure := self._send_failure()):
                raise failure
            return await reading
        finally:
            if not reading.done():
                reading.cancel()

    async def rest(self) -> AsyncIterator[bytes]:
        """The body's bytes after `first`, as they come; raises ReplicaFailed when the
        connection breaks before the response's end."""
        parser = self._parser
        while not parser.done:
            try:
                data = parser.feed(await self._read())
            except HttpProtocolError as exc:
                raise ReplicaFailed(str(exc)) from None
            if data:
                yield data

    async def release(self) -> None:
        """Gives the stream back (kept when the response ended cleanly with keep-alive and the
        whole request was sent), or closes it."""
        if self._released:
            return
        self._released = True
        sender = self._sender
        if sender is not None and not sender.done():  # the body was not all sent
            sender.cancel()
            with contextlib.suppress(BaseException):
                await sender
        sent = sender is None or (not sender.cancelled() and sender.exception() is None)
        reusable = self._parser.done and self._parser.keep_alive and sent
        await self._replica.release(self._stream, reusable)
