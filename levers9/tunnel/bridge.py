"""Bridges between tunnel streams and sockets: what makes the tunnel carry real connections.

On the initiator (controlplane) side a `LocalListener` accepts TCP connections on loopback and
opens one stream per connection, so an unmodified client (a `grpc.aio` channel to
"127.0.0.1:<port>") talks through the tunnel. On the accepting (worker) side the accept callback
calls `dial` (or `dial_unix`) to connect the stream to the real destination. Both end in `pipe`,
which copies each direction independently and maps the TCP events onto stream events:

    TCP EOF                 -> write_eof (FIN)         stream FIN    -> shutdown(SHUT_WR)
    TCP error               -> stream reset            stream reset  -> socket aborted (RST)

Keeping half-close end to end matters for protocols that send a request, shut their side and
read the answer; aborting the socket on a reset lets the client see an error rather than a
clean end of data it might take for a complete answer.
"""

from __future__ import annotations

import asyncio
import contextlib

from levers9.logs import get_logger
from levers9.tunnel.frames import MAX_DATA
from levers9.tunnel.mux import Session, Stream, StreamRefused, TunnelError

CLOSE_WAIT_S = 5.0
"""How long closing a socket may wait for its transport to finish (it never blocks a pipe)."""

log = get_logger(__name__)


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


async def _close_writer(writer: asyncio.StreamWriter, *, abort: bool) -> None:
    if abort:
        writer.transport.abort()
    else:
        writer.close()
    with contextlib.suppress(Exception, asyncio.CancelledError):
        async with asyncio.timeout(CLOSE_WAIT_S):
            await writer.wait_closed()


async def pipe(stream: Stream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copies both directions between `stream` and a socket until both are done.

    Half-close propagates both ways (a transport that cannot `write_eof` is closed instead on
    the stream's FIN). A socket error resets the stream; a stream reset aborts the socket; either
    ends both directions. Returns normally in every one of those cases; the writer is always
    closed. Cancelling the pipe resets the stream.
    """

    async def socket_to_stream() -> None:
        while True:
            try:
                data = await reader.read(MAX_DATA)
            except OSError as exc:
                await stream.reset(f"socket read: {_describe(exc)}")
                raise
            if not data:
                await stream.write_eof()
                return
            await stream.write(data)

    async def stream_to_socket() -> None:
        while True:
            data = await stream.read()
            try:
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    else:
                        writer.close()
                    return
                writer.write(data)
                await writer.drain()
            except OSError as exc:
                await stream.reset(f"socket write: {_describe(exc)}")
                raise

    tasks = {
        asyncio.create_task(socket_to_stream(), name=f"tunnel-pipe-up-{stream.stream_id}"),
        asyncio.create_task(stream_to_socket(), name=f"tunnel-pipe-down-{stream.stream_id}"),
    }
    abort = False
    try:
        pending = tasks
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            failure = next(
                (t.exception() for t in done if not t.cancelled() and t.exception() is not None),
                None,
            )
            if failure is not None:
                # The stream was reset (by us on a socket error, by the peer, by the session
                # closing): nothing more can flow either way.
                abort = True
                if not isinstance(failure, TunnelError | OSError):
                    await stream.reset(f"pipe failed: {type(failure).__name__}: {failure}")
                    log.error("tunnel pipe failed", stream=stream.stream_id, error=repr(failure))
                break
    except asyncio.CancelledError:
        abort = True
        await stream.reset("pipe cancelled")
        raise
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await _close_writer(writer, abort=abort)


async def _accept_and_pipe(
    stream: Stream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    try:
        await stream.accept()
    except BaseException:
        await _close_writer(writer, abort=True)
        raise
    await pipe(stream, reader, writer)


async def dial(stream: Stream, host: str, port: int, *, connect_timeout: float = 10) -> None:
    """Connects an incoming stream to `host:port` over TCP, accepts it, and pipes.

    A failed connect raises `StreamRefused("connect host:port: ...")` before accepting, so
    from an accept callback the opener's `open` fails with that reason.
    """
    try:
        async with asyncio.timeout(connect_timeout):
            reader, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError) as exc:
        raise StreamRefused(f"connect {host}:{port}: {_describe(exc)}") from exc
    await _accept_and_pipe(stream, reader, writer)


async def dial_unix(stream: Stream, path: str, *, connect_timeout: float = 10) -> None:
    """`dial` to a unix socket: `StreamRefused("connect unix:<path>: ...")` if it fails."""
    try:
        async with asyncio.timeout(connect_timeout):
            reader, writer = await asyncio.open_unix_connection(path)
    except (OSError, TimeoutError) as exc:
        raise StreamRefused(f"connect unix:{path}: {_describe(exc)}") from exc
    await _accept_and_pipe(stream, reader, writer)


class LocalListener:
    """Listens on loopback and tunnels every accepted connection to `target` on the peer.

    `start()` returns "host:port" to give a client (the port is chosen by the system unless
    given). A connection whose `open` is refused, times out or meets a closed session is
    closed at once. `close()` stops listening and ends the connections it carries (their
    streams are reset). Usable as `async with LocalListener(...) as address:`.
    """

    def __init__(
        self,
        session: Session,
        target: str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        open_timeout: float = 10,
    ) -> None:
        self._session = session
        self._target = target
        self._host = host
        self._port = port
        self._open_timeout = open_timeout
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def address(self) -> str:
        """ "host:port" once started."""
        if self._server is None:
            raise RuntimeError("LocalListener is not started")
        return f"{self._host}:{self._port}"

    @property
    def connections(self) -> int:
        """Connections being opened or piped now."""
        return len(self._tasks)

    async def start(self) -> str:
        if self._server is not None:
            return self.address
        if self._closed:
            raise RuntimeError("LocalListener is closed")
        self._server = await asyncio.start_server(self._handle, self._host, self._port)
        self._port = self._server.sockets[0].getsockname()[1]
        log.debug("tunnel listener started", address=self.address, target=self._target)
        return self.address

    async def close(self) -> None:
        self._closed = True
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> str:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self._closed or task is None:
            await _close_writer(writer, abort=True)
            return
        self._tasks.add(task)
        try:
            try:
                stream = await self._session.open(self._target, self._open_timeout)
            except (TunnelError, TimeoutError) as exc:
                log.info("tunnel open failed", target=self._target, error=_describe(exc))
                await _close_writer(writer, abort=True)
                return
            except BaseException:
                await _close_writer(writer, abort=True)
                raise
            await pipe(stream, reader, writer)
        except asyncio.CancelledError:
            # Cancelled by `close()` (the stream is reset, the socket closed). asyncio's
            # server would log a cancelled connection task as an unhandled exception.
            return
        finally:
            self._tasks.discard(task)
