"""Sockets through the tunnel: `LocalListener` -> `Session` -> `dial`, with real gRPC on top.

Every socket is on loopback; the in-memory `Link` stands in for the gateway's gRPC stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from levers9.tunnel import (
    MAX_DATA,
    FrameKind,
    LocalListener,
    Stream,
    StreamRefused,
    dial,
    dial_unix,
)
from tests.tunnel import Link, eventually

LOOPBACK = "127.0.0.1"


async def route(stream: Stream, target: str) -> None:
    """The accepting side's callback: "unix:<path>" or "127.0.0.1:<port>", nothing else."""
    if target.startswith("unix:"):
        await dial_unix(stream, target.removeprefix("unix:"))
        return
    host, _, port = target.rpartition(":")
    if host != LOOPBACK:
        raise StreamRefused(f"refusing {target}: loopback only")
    await dial(stream, host, int(port))


async def echo_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


async def answer_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Reads to EOF (so needs the client's half-close), then answers and closes."""
    data = await reader.read()
    writer.write(f"got {len(data)} bytes".encode())
    await writer.drain()
    writer.close()


@pytest.fixture
async def echo_port() -> AsyncIterator[int]:
    server = await asyncio.start_server(echo_connection, LOOPBACK, 0)
    async with server:
        yield server.sockets[0].getsockname()[1]


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
    return port


async def watch_health(
    stub: health_pb2_grpc.HealthStub, checker: health.aio.HealthServicer
) -> None:
    """A server-streaming call: the current status, then each change."""
    watch = stub.Watch(health_pb2.HealthCheckRequest(service="levers9.test"))
    first = await asyncio.wait_for(watch.read(), 5)
    assert isinstance(first, health_pb2.HealthCheckResponse)
    assert first.status == health_pb2.HealthCheckResponse.SERVING
    await checker.set("levers9.test", health_pb2.HealthCheckResponse.NOT_SERVING)
    second = await asyncio.wait_for(watch.read(), 5)
    assert isinstance(second, health_pb2.HealthCheckResponse)
    assert second.status == health_pb2.HealthCheckResponse.NOT_SERVING
    watch.cancel()
    # A call object still alive keeps gRPC's connection open after the channel closes;
    # returning drops the last reference.


async def test_grpc_health_through_the_tunnel() -> None:
    server = grpc.aio.server()
    checker = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    port = server.add_insecure_port(f"{LOOPBACK}:0")
    await server.start()
    try:
        await checker.set("levers9.test", health_pb2.HealthCheckResponse.SERVING)
        async with (
            Link(route) as link,
            LocalListener(link.client, f"{LOOPBACK}:{port}") as address,
        ):
            assert address.startswith(f"{LOOPBACK}:")
            options = [("grpc.enable_http_proxy", 0)]
            async with grpc.aio.insecure_channel(address, options=options) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                assert reply.status == health_pb2.HealthCheckResponse.SERVING

                await watch_health(stub, checker)

                # Several calls share the one HTTP/2 connection, hence one stream.
                replies = await asyncio.gather(
                    *(stub.Check(health_pb2.HealthCheckRequest(), timeout=5) for _ in range(20))
                )
                assert {r.status for r in replies} == {health_pb2.HealthCheckResponse.SERVING}
                assert link.client.open_streams == 1
            # The channel closed its connection: the stream ends on both sides.
            await eventually(
                lambda: link.client.open_streams == 0 and link.server.open_streams == 0
            )
    finally:
        await server.stop(None)


async def test_16_mib_through_pipe(echo_port: int) -> None:
    payload = random.Random(16).randbytes(16 * 1024 * 1024)
    async with (
        Link(route) as link,
        LocalListener(link.client, f"{LOOPBACK}:{echo_port}") as address,
    ):
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))

        async def send() -> None:
            view = memoryview(payload)
            for start in range(0, len(view), 1 << 20):
                writer.write(view[start : start + (1 << 20)])
                await writer.drain()
            writer.write_eof()

        async def receive() -> str:
            digest = hashlib.sha256()
            size = 0
            while chunk := await reader.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
            assert size == len(payload)
            return digest.hexdigest()

        _, received = await asyncio.wait_for(asyncio.gather(send(), receive()), 30)
        writer.close()
        assert received == hashlib.sha256(payload).hexdigest()
        carried = [f for f in link.sent_by_client if f.kind is FrameKind.DATA]
        assert len(carried) >= len(payload) // MAX_DATA
        await eventually(lambda: link.client.open_streams == 0 and link.server.open_streams == 0)


async def test_half_close_crosses_the_tunnel() -> None:
    server = await asyncio.start_server(answer_connection, LOOPBACK, 0)
    async with (
        server,
        Link(route) as link,
        LocalListener(link.client, f"{LOOPBACK}:{server.sockets[0].getsockname()[1]}") as address,
    ):
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"q" * 5000)
        writer.write_eof()  # the server answers only after our EOF arrives
        assert await asyncio.wait_for(reader.read(), 5) == b"got 5000 bytes"
        writer.close()
        await eventually(lambda: link.client.open_streams == 0 and link.server.open_streams == 0)


async def test_refused_open_closes_the_connection() -> None:
    dead = unused_port()
    async with Link(route) as link:
        with pytest.raises(StreamRefused, match=rf"^connect {LOOPBACK}:{dead}: "):
            await link.client.open(f"{LOOPBACK}:{dead}")
        with pytest.raises(StreamRefused, match="loopback only"):
            await link.client.open(f"10.0.0.1:{dead}")

        async with LocalListener(link.client, f"{LOOPBACK}:{dead}") as address:
            host, _, port = address.rpartition(":")
            reader, writer = await asyncio.open_connection(host, int(port))
            await connection_ends(reader)
            writer.close()
        assert link.client.open_streams == 0


async def test_socket_reset_resets_the_stream() -> None:
    async def rst(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(5)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    server = await asyncio.start_server(rst, LOOPBACK, 0)
    async with server, Link(route) as link:
        stream = await link.client.open(f"{LOOPBACK}:{server.sockets[0].getsockname()[1]}")
        await stream.write(b"hello")
        with pytest.raises(Exception, match="socket read") as info:
            await asyncio.wait_for(stream.read(), 5)
        assert type(info.value).__name__ == "StreamReset"
        await eventually(lambda: link.server.open_streams == 0)


async def connection_ends(reader: asyncio.StreamReader) -> None:
    """The peer closed (EOF) or aborted (RST) the connection, within 5 s."""
    with contextlib.suppress(ConnectionResetError):
        assert await asyncio.wait_for(reader.read(), 5) == b""


async def test_stream_reset_aborts_the_socket(echo_port: int) -> None:
    accepted: list[Stream] = []

    async def remember(stream: Stream, target: str) -> None:
        accepted.append(stream)
        await route(stream, target)

    async with (
        Link(remember) as link,
        LocalListener(link.client, f"{LOOPBACK}:{echo_port}") as address,
    ):
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
        # The accepting side resets the stream: the client's socket is cut.
        await accepted[0].reset("worker went away")
        await connection_ends(reader)
        writer.close()
        await eventually(lambda: link.client.open_streams == 0)
        assert link.server.open_streams == 0

        # The initiator's session closing (its transport gone) cuts connections too.
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
        await link.client.close("transport lost")
        await connection_ends(reader)
        writer.close()


async def test_listener_close_ends_its_connections(echo_port: int) -> None:
    async with Link(route) as link:
        listener = LocalListener(link.client, f"{LOOPBACK}:{echo_port}")
        host, _, port = (await listener.start()).rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
        assert listener.connections == 1
        await listener.close()
        await connection_ends(reader)
        writer.close()
        assert listener.connections == 0
        assert link.client.open_streams == 0
        await eventually(lambda: link.server.open_streams == 0)
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(host, int(port))


async def test_dial_unix(tmp_path: Path) -> None:
    path = tmp_path / "echo.sock"
    server = await asyncio.start_unix_server(echo_connection, str(path))
    async with server, Link(route) as link:
        stream = await link.client.open(f"unix:{path}")
        await stream.write(b"over a unix socket")
        await stream.write_eof()
        received = bytearray()
        while chunk := await stream.read():
            received += chunk
        assert bytes(received) == b"over a unix socket"
        with pytest.raises(StreamRefused, match=f"connect unix:{tmp_path}/missing.sock"):
            await link.client.open(f"unix:{tmp_path}/missing.sock")
        await eventually(lambda: link.client.open_streams == 0 and link.server.open_streams == 0)
