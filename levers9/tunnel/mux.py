"""`Session` and `Stream`: many independent byte streams over one ordered frame channel.

Why: the worker dials out to the controlplane once (it may sit behind NAT or a firewall that
admits no inbound connection); every connection the controlplane wants to make toward the worker
then rides that one transport. The design follows HTTP/2 and yamux:

- Stream ids: the initiator of the session opens odd ids, the other side even ids, each side in
  increasing order, so both could open without agreeing on ids first.
- Per-stream flow control: a side may send DATA only within the credit its peer granted (the
  window in OPEN/OPENED, then WINDOW frames). A receiver grants credit back as its application
  *consumes* bytes, never as they merely arrive, so a stream whose reader stalls stops its
  writer after one window while every other stream, and `feed`, keeps going. A receiver buffers
  at most the window it granted; a peer that sends more is answered with RESET.
- Half-close: FIN ends one direction; the stream is forgotten once both sides sent FIN and the
  application drained what it received, or at once on RESET.
- Nothing the session does on `feed` waits: frames to send (WINDOW, RESET, OPENED, DATA) go
  through one outbox drained by one task in order, so a transport that is slow to send can
  never stall the reading of the transport (the two would otherwise deadlock with a peer doing
  the same).

Cancelling a task blocked in `Stream.read`, `write`, `write_eof` or `Session.open` resets the
stream: a half-done read or write leaves the stream in no state worth keeping, and the reset
is what frees it on both sides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from enum import Enum, auto

from levers9.logs import get_logger
from levers9.tunnel.frames import MAX_DATA, Frame, FrameKind

MAX_STREAM_ID = 2**32 - 1
"""Ids fit an unsigned 32-bit field."""
MAX_WINDOW = 2**31 - 1
"""No side may hold more credit than this (HTTP/2's bound); fits a signed 32-bit field."""
DEFAULT_WINDOW = 1024 * 1024

log = get_logger(__name__)

SendFrame = Callable[[Frame], Awaitable[None]]
AcceptStream = Callable[["Stream", str], Awaitable[None]]


class TunnelError(Exception):
    """Base of the tunnel's errors; also raised for misuse (writing after `write_eof`)."""


class StreamRefused(TunnelError):
    """The peer answered OPEN with RESET; raise it from an accept callback to refuse."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StreamReset(TunnelError):
    """The stream was reset (by either side, or its session closed); `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ProtocolError(TunnelError):
    """A frame that names no stream (`Session.feed` raises it; the session stays usable).

    A violation within a stream (credit overrun, DATA after FIN, ...) resets only that stream,
    with a reason starting "protocol error:"; the local side sees it as `StreamReset`.
    """


class _State(Enum):
    OPENING = auto()
    """OPEN sent and no answer yet (opener), or OPEN received and not accepted (acceptor)."""
    OPEN = auto()
    RESET = auto()
    """Reset by either side, refused, or failed by the session's close."""


class Stream:
    """One bidirectional byte stream of a `Session`; made by `Session.open` or an OPEN."""

    def __init__(
        self,
        session: Session,
        stream_id: int,
        target: str,
        *,
        outbound: bool,
        window: int,
        send_credit: int,
    ) -> None:
        self._session = session
        self.stream_id = stream_id
        self.target = target
        self._outbound = outbound
        self._grant_at = max(1, window // 2)
        self._state = _State.OPENING
        self._reason = ""
        self._refused = False
        self._was_open = False  # OPENED seen or sent, even if reset since
        self._finished = False  # both FINs and drained: forgotten by the session in order
        self._buffer = bytearray()
        self._recv_credit = window  # what the peer may still send us
        self._unacked = 0  # consumed by the application, not yet granted back
        self._send_credit = send_credit
        self._local_fin = False
        self._remote_fin = False
        self._changed = asyncio.Event()  # OPENED/RESET while opening
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._write_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"Stream({self.stream_id}, {self.target!r}, {self._state.name})"

    @property
    def buffered(self) -> int:
        """Bytes received and not yet read (at most the window)."""
        return len(self._buffer)

    @property
    def reset_reason(self) -> str | None:
        """Why the stream was reset (or refused), None while it is not."""
        return self._reason if self._state is _State.RESET else None

    @property
    def at_eof(self) -> bool:
        """The peer sent FIN and every byte before it has been read."""
        return self._remote_fin and not self._buffer

    async def accept(self) -> None:
        """Accepts an incoming stream (sends OPENED); only then can it be read and written."""
        if self._state is _State.RESET:
            raise StreamReset(self._reason)
        if self._outbound or self._state is not _State.OPENING:
            raise TunnelError(f"stream {self.stream_id} is not waiting to be accepted")
        self._state = _State.OPEN
        self._was_open = True
        self._session._enqueue(Frame(self.stream_id, FrameKind.OPENED, credit=self._recv_credit))

    async def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (all that is buffered if `n` < 0), waiting for at least one.

        Unlike `asyncio.StreamReader.read(-1)` this does not wait for EOF. b"" once the peer's
        FIN has been reached; `StreamReset` after a reset, even with bytes still buffered.
        """
        if n == 0:
            return b""
        while True:
            if self._state is _State.RESET:
                raise StreamReset(self._reason)
            if self._buffer:
                break
            if self._remote_fin:
                return b""
            if self._state is _State.OPENING:
                raise TunnelError(f"stream {self.stream_id} is not open yet")
            self._readable.clear()
            try:
                await self._readable.wait()
            except asyncio.CancelledError:
                self._reset_local("read cancelled")
                raise
        if n < 0 or n >= len(self._buffer):
            data = bytes(self._buffer)
            self._buffer.clear()
        else:
            data = bytes(self._buffer[:n])
            del self._buffer[:n]
        self._consumed(len(data))
        return data

    async def readexactly(self, n: int) -> bytes:
        """Exactly `n` bytes; `asyncio.IncompleteReadError` if the peer's FIN comes first."""
        parts = bytearray()
        while len(parts) < n:
            chunk = await self.read(n - len(parts))
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(parts), n)
            parts += chunk
        return bytes(parts)

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Sends `data` in DATA frames of at most `MAX_DATA`, waiting for credit as needed.

        Returns once every byte is handed to the session's outbox: the peer's window, not the
        transport, is what makes a writer wait. Concurrent writes do not interleave.
        """
        view = memoryview(data).cast("B")
        try:
            async with self._write_lock:
                self._check_writable()
                while view:
                    if self._send_credit <= 0:
                        self._writable.clear()
                        await self._writable.wait()
                        self._check_writable()
                        continue
                    size = min(len(view), self._send_credit, MAX_DATA)
                    self._send_credit -= size
                    chunk = bytes(view[:size])
                    view = view[size:]
                    self._session._enqueue(Frame(self.stream_id, FrameKind.DATA, data=chunk))
        except asyncio.CancelledError:
            self._reset_local("write cancelled")
            raise

    async def write_eof(self) -> None:
        """Sends FIN after any write in progress: no more writes, reading goes on. Idempotent."""
        try:
            async with self._write_lock:
                if self._state is _State.RESET:
                    raise StreamReset(self._reason)
                if self._local_fin:
                    return
                if self._state is _State.OPENING:
                    raise TunnelError(f"stream {self.stream_id} is not open yet")
                self._local_fin = True
                self._session._enqueue(Frame(self.stream_id, FrameKind.FIN))
                self._maybe_finish()
        except asyncio.CancelledError:
            self._reset_local("write_eof cancelled")
            raise

    async def reset(self, reason: str = "reset") -> None:
        """Aborts the stream both ways (RESET to the peer); a no-op once reset or finished."""
        self._reset_local(reason)

    # -- internals, driven by the session --------------------------------------------------

    def _check_writable(self) -> None:
        if self._state is _State.RESET:
            raise StreamReset(self._reason)
        if self._state is _State.OPENING:
            raise TunnelError(f"stream {self.stream_id} is not open yet")
        if self._local_fin:
            raise TunnelError(f"stream {self.stream_id}: write after write_eof")

    def _consumed(self, size: int) -> None:
        self._unacked += size
        # After the peer's FIN it sends no more DATA: credit would be useless, and a WINDOW
        # arriving after the peer forgot the stream is only noise.
        if not self._remote_fin and self._unacked >= self._grant_at:
            self._recv_credit += self._unacked
            self._session._enqueue(Frame(self.stream_id, FrameKind.WINDOW, credit=self._unacked))
            self._unacked = 0
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if (
            self._local_fin
            and self._remote_fin
            and not self._buffer
            and self._state is _State.OPEN
            and not self._finished
        ):
            self._finished = True
            self._session._forget(self)

    def _reset_local(self, reason: str) -> None:
        """Reset decided here: tell the peer, fail local waiters."""
        if self._state is _State.RESET or self._finished:
            return
        self._session._enqueue(Frame(self.stream_id, FrameKind.RESET, reason=reason))
        self._fail(reason)

    def _protocol_error(self, message: str) -> None:
        log.warning("tunnel protocol error", stream=self.stream_id, error=message)
        self._reset_local(f"protocol error: {message}")

    def _fail(self, reason: str) -> None:
        """Reset without a frame (the peer's RESET, or the session closing)."""
        if self._state is _State.RESET:
            return
        self._state = _State.RESET
        self._reason = reason
        self._buffer.clear()
        self._changed.set()
        self._readable.set()
        self._writable.set()
        self._session._forget(self)

    def _on_frame(self, frame: Frame) -> None:
        kind = frame.kind
        if kind is FrameKind.RESET:
            if self._outbound and self._state is _State.OPENING:
                self._refused = True
            self._fail(frame.reason or "reset by peer")
            return
        if kind is FrameKind.OPENED:
            if not self._outbound or self._state is not _State.OPENING:
                self._protocol_error("unexpected OPENED")
            elif not 0 <= frame.credit <= MAX_WINDOW:
                self._protocol_error(f"OPENED with window {frame.credit}")
            else:
                self._state = _State.OPEN
                self._was_open = True
                self._send_credit = frame.credit
                self._changed.set()
            return
        if self._state is _State.OPENING:
            self._protocol_error(f"{kind.value} before the stream was accepted")
            return
        if kind is FrameKind.DATA:
            size = len(frame.data)
            if self._remote_fin:
                self._protocol_error("DATA after FIN")
            elif size > MAX_DATA:
                self._protocol_error(f"DATA of {size} bytes, more than {MAX_DATA}")
            elif size > self._recv_credit:
                self._protocol_error(
                    f"credit overrun: DATA of {size} bytes with {self._recv_credit} granted"
                )
            elif size:
                self._recv_credit -= size
                self._buffer += frame.data
                self._readable.set()
        elif kind is FrameKind.WINDOW:
            if frame.credit <= 0 or self._send_credit + frame.credit > MAX_WINDOW:
                self._protocol_error(f"WINDOW of {frame.credit} on {self._send_credit}")
            else:
                self._send_credit += frame.credit
                self._writable.set()
        elif kind is FrameKind.FIN:
            if self._remote_fin:
                self._protocol_error("second FIN")
            else:
                self._remote_fin = True
                self._readable.set()
                self._maybe_finish()
        else:  # OPEN is the session's
            self._protocol_error(f"unexpected {kind.value}")


class Session:
    """Multiplexes `Stream`s over one ordered frame channel; one per transport, per side.

    `send` carries a frame to the peer (called by one task, in order); the owner calls `feed`
    with each frame received, in order. The initiator (controlplane side) opens odd stream ids,
    the other side even ones. `accept(stream, target)` runs in its own task for each OPEN: it
    calls `await stream.accept()` and serves the stream, or raises `StreamRefused(reason)`
    first; without `accept` every OPEN is refused. `window` is the receive window granted to
    the peer per stream: the most this side buffers for one stream.
    """

    def __init__(
        self,
        send: SendFrame,
        *,
        initiator: bool,
        accept: AcceptStream | None = None,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        if not 1 <= window <= MAX_WINDOW:
            raise ValueError(f"window must be within 1..{MAX_WINDOW}, not {window}")
        self._send = send
        self._initiator = initiator
        self._accept = accept
        self._window = window
        self._streams: dict[int, Stream] = {}
        self._next_id = 1 if initiator else 2
        self._last_peer_id = 0
        self._outbox: asyncio.Queue[Frame] = asyncio.Queue()
        self._sender: asyncio.Task[None] | None = None
        self._accept_tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._close_reason = ""
        self._closed_event = asyncio.Event()

    def __repr__(self) -> str:
        side = "initiator" if self._initiator else "acceptor"
        return f"Session({side}, streams={len(self._streams)}, closed={self._closed})"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def close_reason(self) -> str | None:
        """Why the session closed (the argument to `close`, or the transport's failure)."""
        return self._close_reason if self._closed else None

    @property
    def open_streams(self) -> int:
        """Streams the session still tracks: opening, open, or half-closed."""
        return len(self._streams)

    @property
    def pending_frames(self) -> int:
        """Frames queued for `send` and not yet handed to it."""
        return self._outbox.qsize()

    async def wait_closed(self) -> None:
        await self._closed_event.wait()

    async def open(self, target: str, timeout: float = 10) -> Stream:  # noqa: ASYNC109
        """Opens a stream to `target` on the peer; waits for OPENED.

        `StreamRefused(reason)` if the peer answers RESET, `TimeoutError` (and the stream is
        reset) if it does not answer within `timeout`, `StreamReset` if the session closes.
        (`timeout` bounds only the wait for the answer; the stream it returns has none.)
        """
        if self._closed:
            raise StreamReset(self._close_reason)
        stream_id = self._next_id
        if stream_id > MAX_STREAM_ID:
            raise TunnelError("stream ids exhausted; open a new session")
        self._next_id += 2
        stream = Stream(self, stream_id, target, outbound=True, window=self._window, send_credit=0)
        self._streams[stream_id] = stream
        self._enqueue(Frame(stream_id, FrameKind.OPEN, target=target, credit=self._window))
        try:
            async with asyncio.timeout(timeout):
                await stream._changed.wait()
        except TimeoutError:
            stream._reset_local(f"open timed out after {timeout:g}s")
            raise TimeoutError(f"open {target!r}: no answer within {timeout:g}s") from None
        except asyncio.CancelledError:
            stream._reset_local("open cancelled")
            raise
        if stream._refused:
            raise StreamRefused(stream._reason)
        if not stream._was_open:  # the session closed first
            raise StreamReset(stream._reason)
        # Accepted, maybe reset since: the stream's own operations say so.
        return stream

    async def feed(self, frame: Frame) -> None:
        """Handles one frame from the peer; never waits on a stream's reader or on `send`.

        `ProtocolError` for a frame naming no valid stream id (the session is unaffected).
        Frames after `close` are dropped.
        """
        if self._closed:
            return
        stream_id = frame.stream_id
        if not 1 <= stream_id <= MAX_STREAM_ID:
            raise ProtocolError(f"{frame.kind.value} frame for stream id {stream_id}")
        if frame.kind is FrameKind.OPEN:
            self._on_open(frame)
            return
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream._on_frame(frame)
        elif frame.kind in (FrameKind.DATA, FrameKind.OPENED):
            # The peer thinks the stream is alive: tell it otherwise. WINDOW, FIN and RESET
            # for a forgotten stream are late but legitimate (e.g. credit granted just before
            # our FIN arrived) and never answered, so two sides cannot bounce RESETs.
            self._enqueue(Frame(stream_id, FrameKind.RESET, reason="unknown stream"))

    async def close(self, reason: str = "session closed") -> None:
        """Fails every stream with `StreamReset(reason)`, cancels the accept tasks, and sends
        nothing more (queued frames are dropped). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        for stream in list(self._streams.values()):
            stream._fail(reason)
        self._streams.clear()
        while not self._outbox.empty():
            self._outbox.get_nowait()
        current = asyncio.current_task()
        tasks = [
            t for t in (*self._accept_tasks, self._sender) if t is not None and t is not current
        ]
        for task in tasks:
            task.cancel()
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            self._closed_event.set()

    # -- internals -------------------------------------------------------------------------

    def _is_local_id(self, stream_id: int) -> bool:
        return (stream_id % 2 == 1) == self._initiator

    def _enqueue(self, frame: Frame) -> None:
        if self._closed:
            return
        self._outbox.put_nowait(frame)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_loop(), name="tunnel-sender")

    def _forget(self, stream: Stream) -> None:
        if self._streams.get(stream.stream_id) is stream:
            del self._streams[stream.stream_id]

    async def _send_loop(self) -> None:
        while True:
            frame = await self._outbox.get()
            try:
                await self._send(frame)
            except Exception as exc:
                log.warning("tunnel transport send failed", error=str(exc) or repr(exc))
                await self.close(f"transport send failed: {str(exc) or repr(exc)}")
                return

    def _on_open(self, frame: Frame) -> None:
        stream_id = frame.stream_id
        problem = None
        if self._is_local_id(stream_id):
            problem = f"OPEN with this side's stream id {stream_id}"
        elif stream_id <= self._last_peer_id:
            problem = f"OPEN with stream id {stream_id}, not above {self._last_peer_id}"
        elif not 0 <= frame.credit <= MAX_WINDOW:
            problem = f"OPEN with window {frame.credit}"
        if problem is not None:
            log.warning("tunnel protocol error", stream=stream_id, error=problem)
            existing = self._streams.get(stream_id)
            if existing is not None:
                existing._reset_local(f"protocol error: {problem}")
            else:
                self._enqueue(
                    Frame(stream_id, FrameKind.RESET, reason=f"protocol error: {problem}")
                )
            return
        self._last_peer_id = stream_id
        if self._accept is None:
            self._enqueue(Frame(stream_id, FrameKind.RESET, reason="not accepting streams"))
            return
        stream = Stream(
            self,
            stream_id,
            frame.target,
            outbound=False,
            window=self._window,
            send_credit=frame.credit,
        )
        self._streams[stream_id] = stream
        task = asyncio.create_task(
            self._run_accept(self._accept, stream), name=f"tunnel-accept-{stream_id}"
        )
        self._accept_tasks.add(task)
        task.add_done_callback(self._accept_tasks.discard)

    async def _run_accept(self, accept: AcceptStream, stream: Stream) -> None:
        try:
            await accept(stream, stream.target)
        except StreamRefused as exc:
            stream._reset_local(exc.reason)
        except StreamReset as exc:
            stream._reset_local(exc.reason)
        except asyncio.CancelledError:
            stream._reset_local("accept cancelled")
            raise
        except Exception as exc:
            log.exception("tunnel accept failed", stream=stream.stream_id, target=stream.target)
            stream._reset_local(f"accept failed: {type(exc).__name__}: {exc}")
        else:
            if stream._state is _State.OPENING:
                stream._reset_local("not accepted")


__all__ = [
    "DEFAULT_WINDOW",
    "MAX_STREAM_ID",
    "MAX_WINDOW",
    "ProtocolError",
    "Session",
    "Stream",
    "StreamRefused",
    "StreamReset",
    "TunnelError",
]
