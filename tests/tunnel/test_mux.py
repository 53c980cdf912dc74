"""`Session`/`Stream` over an in-memory transport: opening, flow control, half-close, resets."""

from __future__ import annotations

import asyncio
import os

import pytest

from levers9.tunnel import (
    MAX_DATA,
    Frame,
    FrameKind,
    ProtocolError,
    Session,
    Stream,
    StreamRefused,
    StreamReset,
    TunnelError,
)
from tests.tunnel import Link, eventually

WINDOW = 64 * 1024


async def read_all(stream: Stream) -> bytes:
    data = bytearray()
    while chunk := await stream.read():
        data += chunk
    return bytes(data)


async def echo(stream: Stream) -> None:
    await stream.accept()
    while data := await stream.read():
        await stream.write(data)
    await stream.write_eof()


class Server:
    """An accept callback routing by target, recording what its handlers saw."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.streams: dict[str, Stream] = {}
        self.errors: dict[str, BaseException] = {}
        self.cancelled: list[str] = []
        self.received: dict[str, bytes] = {}

    async def __call__(self, stream: Stream, target: str) -> None:
        self.streams[target] = stream
        try:
            await self._serve(stream, target)
        except asyncio.CancelledError:
            self.cancelled.append(target)
            raise
        except TunnelError as exc:
            self.errors[target] = exc
            raise

    async def _serve(self, stream: Stream, target: str) -> None:
        if target.startswith("echo"):
            await echo(stream)
        elif target == "hold":  # accepts, reads nothing until released, then drains
            await stream.accept()
            await self.release.wait()
            self.received[target] = await read_all(stream)
        elif target == "answer":  # reads to EOF, then answers and closes its side
            await stream.accept()
            data = await read_all(stream)
            self.received[target] = data
            await stream.write(f"got {len(data)} bytes".encode())
            await stream.write_eof()
        elif target == "reader":  # waits for data that may never come
            await stream.accept()
            self.received[target] = await read_all(stream)
        elif target == "reset-me":
            await stream.accept()
            await stream.reset("server says no")
        elif target == "never":  # neither accepts nor refuses
            await asyncio.Event().wait()
        elif target == "forgets":
            return
        elif target == "crashes":
            raise RuntimeError("boom")
        else:
            raise StreamRefused(f"no route to {target}")


async def test_open_echo_and_forget() -> None:
    async with Link(Server()) as link:
        stream = await link.client.open("echo")
        assert stream.stream_id == 1
        await stream.write(b"hello, ")
        await stream.write(bytearray(b"tunnel"))
        await stream.write_eof()
        assert await read_all(stream) == b"hello, tunnel"
        assert await stream.read() == b""
        assert stream.at_eof
        # Both FINs and drained: forgotten on both sides.
        await eventually(lambda: link.client.open_streams == 0 and link.server.open_streams == 0)
        second = await link.client.open("echo")
        assert second.stream_id == 3
        await second.reset("done")


async def test_open_refused_with_reason() -> None:
    async with Link(Server()) as link:
        with pytest.raises(StreamRefused, match="no route to nowhere") as info:
            await link.client.open("nowhere")
        assert info.value.reason == "no route to nowhere"
        with pytest.raises(StreamRefused, match=r"^not accepted$"):
            await link.client.open("forgets")
        with pytest.raises(StreamRefused, match="accept failed: RuntimeError: boom"):
            await link.client.open("crashes")
        assert link.client.open_streams == 0
        await eventually(lambda: link.server.open_streams == 0)
    async with Link(None) as link:
        with pytest.raises(StreamRefused, match="not accepting streams"):
            await link.client.open("echo")


async def test_open_timeout_resets_the_stream() -> None:
    server = Server()
    async with Link(server) as link:
        with pytest.raises(TimeoutError, match=r"no answer within 0\.1s"):
            await link.client.open("never", timeout=0.1)
        assert link.client.open_streams == 0
        await eventually(lambda: link.server.open_streams == 0)
        stream = server.streams["never"]
        assert stream.reset_reason == "open timed out after 0.1s"
        with pytest.raises(StreamReset):
            await stream.accept()


async def test_200_concurrent_streams_echo_64kib() -> None:
    async with Link(Server()) as link:

        async def one(i: int) -> None:
            payload = os.urandom(64 * 1024)
            stream = await link.client.open(f"echo-{i}")

            async def send() -> None:
                # Uneven writes, some bigger than a frame.
                for start in range(0, len(payload), 40_000):
                    await stream.write(payload[start : start + 40_000])
                await stream.write_eof()

            _, received = await asyncio.gather(send(), read_all(stream))
            assert received == payload, f"stream {i} corrupted"

        await asyncio.gather(*(one(i) for i in range(200)))
        await eventually(lambda: link.client.open_streams == 0 and link.server.open_streams == 0)
        data_frames = [f for f in link.sent_by_client if f.kind is FrameKind.DATA]
        # Every write of 40 000 bytes is split into frames of at most MAX_DATA.
        writes = [min(40_000, 65536 - i) for i in range(0, 65536, 40_000)]
        per_stream = sum(-(-size // MAX_DATA) for size in writes)
        assert len(data_frames) >= 200 * per_stream


async def test_backpressure_stalls_only_the_slow_stream() -> None:
    server = Server()
    async with Link(server, window=WINDOW) as link:
        slow = await link.client.open("hold")
        written = 0

        async def flood() -> None:
            nonlocal written
            for _ in range(4 * WINDOW // 8192):
                await slow.write(b"x" * 8192)
                written += 8192

        flooding = asyncio.create_task(flood())
        await eventually(lambda: written == WINDOW)
        await asyncio.sleep(0.05)
        assert written == WINDOW, "the writer went past the window"
        assert not flooding.done()
        assert server.streams["hold"].buffered == WINDOW
        # Arrival alone grants nothing.
        assert FrameKind.WINDOW not in link.kinds(link.sent_by_server, slow.stream_id)

        # Meanwhile another stream moves 16 windows' worth both ways.
        fast = await link.client.open("echo")
        payload = os.urandom(16 * WINDOW)

        async def send() -> None:
            await fast.write(payload)
            await fast.write_eof()

        _, echoed = await asyncio.gather(send(), read_all(fast))
        assert echoed == payload
        assert written == WINDOW

        server.release.set()
        await flooding
        await slow.write_eof()
        await eventually(lambda: "hold" in server.received)
        assert server.received["hold"] == b"x" * (4 * WINDOW)


async def test_half_close() -> None:
    server = Server()
    async with Link(server) as link:
        stream = await link.client.open("answer")
        await stream.write(b"a" * 100_000)
        await stream.write_eof()
        await stream.write_eof()  # idempotent
        with pytest.raises(TunnelError, match="write after write_eof"):
            await stream.write(b"more")
        # Our side is closed; the server still writes back, then its EOF.
        assert await stream.readexactly(4) == b"got "
        with pytest.raises(asyncio.IncompleteReadError) as info:
            await stream.readexactly(100)
        assert info.value.partial == b"100000 bytes"
        assert await stream.read() == b""
        await eventually(lambda: link.client.open_streams == 0 and link.server.open_streams == 0)


async def test_reset_by_the_opener_surfaces_on_the_acceptor() -> None:
    server = Server()
    async with Link(server) as link:
        stream = await link.client.open("reader")
        await stream.write(b"partial")
        await stream.reset("client gave up")
        with pytest.raises(StreamReset, match="client gave up"):
            await stream.read()
        with pytest.raises(StreamReset, match="client gave up"):
            await stream.write(b"x")
        await eventually(lambda: "reader" in server.errors)
        error = server.errors["reader"]
        assert isinstance(error, StreamReset)
        assert error.reason == "client gave up"
        assert link.client.open_streams == 0
        await eventually(lambda: link.server.open_streams == 0)


async def test_reset_by_the_acceptor_surfaces_on_the_opener() -> None:
    async with Link(Server()) as link:
        stream = await link.client.open("reset-me")
        with pytest.raises(StreamReset, match="server says no") as info:
            await stream.read()
        assert info.value.reason == "server says no"
        with pytest.raises(StreamReset, match="server says no"):
            await stream.write(b"x")
        with pytest.raises(StreamReset):
            await stream.write_eof()
        assert stream.reset_reason == "server says no"
        assert link.client.open_streams == 0
        assert link.server.open_streams == 0


async def test_cancelled_read_resets_the_stream() -> None:
    server = Server()
    async with Link(server) as link:
        stream = await link.client.open("reader")
        reading = asyncio.create_task(stream.read())
        await asyncio.sleep(0.01)
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        assert stream.reset_reason == "read cancelled"
        assert link.client.open_streams == 0
        await eventually(lambda: link.server.open_streams == 0)
        await eventually(lambda: "reader" in server.errors)
        assert str(server.errors["reader"]) == "read cancelled"


async def test_cancelled_write_resets_the_stream() -> None:
    server = Server()
    async with Link(server, window=WINDOW) as link:
        stream = await link.client.open("hold")
        writing = asyncio.create_task(stream.write(b"y" * (3 * WINDOW)))
        await eventually(lambda: server.streams["hold"].buffered == WINDOW)
        assert not writing.done()
        writing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await writing
        assert link.client.open_streams == 0
        await eventually(lambda: link.server.open_streams == 0)
        assert server.streams["hold"].reset_reason == "write cancelled"


async def test_cancelled_open_resets_the_stream() -> None:
    server = Server()
    async with Link(server) as link:
        opening = asyncio.create_task(link.client.open("never"))
        await eventually(lambda: "never" in server.streams)
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        assert link.client.open_streams == 0
        await eventually(lambda: link.server.open_streams == 0)


async def test_session_close_fails_streams_and_opens_in_flight() -> None:
    server = Server()
    async with Link(server) as link:
        stream = await link.client.open("reader")
        reading = asyncio.create_task(stream.read())
        opening = asyncio.create_task(link.client.open("never"))
        await eventually(lambda: "never" in server.streams)
        sent = len(link.sent_by_client)

        await link.client.close("bye")
        await link.client.close("again")  # idempotent
        assert link.client.closed
        assert link.client.close_reason == "bye"
        with pytest.raises(StreamReset, match="bye"):
            await reading
        with pytest.raises(StreamReset, match="bye"):
            await opening
        with pytest.raises(StreamReset, match="bye"):
            await stream.write(b"x")
        with pytest.raises(StreamReset, match="bye"):
            await link.client.open("echo")
        assert link.client.open_streams == 0
        await asyncio.sleep(0.01)
        assert len(link.sent_by_client) == sent, "frames sent after close"

        # The accepting side closing cancels its accept tasks.
        await link.server.close()
        assert sorted(server.cancelled) == ["never", "reader"]
        assert link.server.open_streams == 0
        await link.server.wait_closed()


async def test_credit_overrun_resets_only_that_stream() -> None:
    server = Server()
    async with Link(server, window=1024) as link:
        victim = await link.client.open("reader")
        other = await link.client.open("echo")
        # A peer ignoring its credit: 2000 bytes against a window of 1024.
        await link.to_server.put(Frame(victim.stream_id, FrameKind.DATA, data=b"z" * 2000))
        with pytest.raises(StreamReset, match="protocol error: credit overrun") as info:
            await victim.read()
        assert "2000 bytes with 1024 granted" in info.value.reason
        await eventually(lambda: "reader" in server.errors)
        assert str(server.errors["reader"]).startswith("protocol error: credit overrun")

        payload = os.urandom(10 * 1024)  # ten windows: the other stream still flows

        async def send() -> None:
            await other.write(payload)
            await other.write_eof()

        _, echoed = await asyncio.gather(send(), read_all(other))
        assert echoed == payload
        assert not link.server.closed


async def test_other_stream_protocol_errors() -> None:
    server = Server()
    async with Link(server) as link:
        too_big = await link.client.open("reader")
        await link.to_server.put(
            Frame(too_big.stream_id, FrameKind.DATA, data=b"z" * (MAX_DATA + 1))
        )
        with pytest.raises(StreamReset, match=f"protocol error: DATA of {MAX_DATA + 1} bytes"):
            await too_big.read()

        after_fin = await link.client.open("hold")
        await after_fin.write_eof()
        # Injected frames bypass the client's outbox: let the FIN arrive first.
        await eventually(lambda: server.streams["hold"].at_eof)
        await link.to_server.put(Frame(after_fin.stream_id, FrameKind.DATA, data=b"late"))
        with pytest.raises(StreamReset, match="protocol error: DATA after FIN"):
            await after_fin.read()

        # OPEN with the server's own (even) parity, and one reusing an old id.
        await link.to_server.put(Frame(4, FrameKind.OPEN, target="echo", credit=1024))
        await link.to_server.put(Frame(1, FrameKind.OPEN, target="echo", credit=1024))
        await eventually(lambda: link.kinds(link.sent_by_server, 4) == [FrameKind.RESET])
        await eventually(lambda: link.kinds(link.sent_by_server, 1)[-1:] == [FrameKind.RESET])
        reasons = [f.reason for f in link.sent_by_server if f.kind is FrameKind.RESET]
        assert any("OPEN with this side's stream id 4" in r for r in reasons)
        assert any("OPEN with stream id 1, not above 3" in r for r in reasons)


async def test_unknown_stream_data_is_answered_with_reset() -> None:
    async with Link(Server()) as link:
        await link.to_server.put(Frame(999, FrameKind.DATA, data=b"who?"))
        await link.to_server.put(Frame(1001, FrameKind.WINDOW, credit=10))
        await link.to_server.put(Frame(1003, FrameKind.FIN))
        await eventually(lambda: link.kinds(link.sent_by_server, 999) == [FrameKind.RESET])
        reset = next(f for f in link.sent_by_server if f.stream_id == 999)
        assert reset.reason == "unknown stream"
        # Late WINDOW/FIN are dropped, not answered (no RESET ping-pong): frames are handled in
        # order, so once a DATA sent after them is answered, they were handled.
        await link.to_server.put(Frame(1005, FrameKind.DATA, data=b"after"))
        await eventually(lambda: link.kinds(link.sent_by_server, 1005) == [FrameKind.RESET])
        assert link.kinds(link.sent_by_server, 1001) == []
        assert link.kinds(link.sent_by_server, 1003) == []
        # A frame naming no stream is the owner's problem.
        with pytest.raises(ProtocolError):
            await link.server.feed(Frame(0, FrameKind.DATA, data=b"x"))
        # The session is unaffected.
        stream = await link.client.open("echo")
        await stream.write(b"still fine")
        await stream.write_eof()
        assert await read_all(stream) == b"still fine"


async def test_send_failure_closes_the_session() -> None:
    async def broken(frame: Frame) -> None:
        raise ConnectionError("transport gone")

    session = Session(broken, initiator=True)
    with pytest.raises(StreamReset, match="transport send failed: transport gone"):
        await session.open("echo")
    assert session.closed
    assert session.open_streams == 0


def test_frame_normalizes_kind_and_hides_payload() -> None:
    frame = Frame(3, "DATA", data=b"secret" * 100)  # type: ignore[arg-type]
    assert frame.kind is FrameKind.DATA
    assert "secret" not in repr(frame)
    assert "600B" in repr(frame)
    with pytest.raises(ValueError, match="BOGUS"):
        Frame(3, "BOGUS")  # type: ignore[arg-type]
