"""Tests of `levers9.tunnel`, and `Link`: two sessions joined by an in-memory ordered transport.

`Link` stands in for the gRPC stream the real owner carries frames over: each side's `send`
puts into a queue that a task drains into the other side's `feed`, in order. It records every
frame (without payload) so tests can assert what went over the wire, and lets a test inject
raw frames (a misbehaving peer) in order with the honest ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from types import TracebackType

from levers9.tunnel import Frame, FrameKind, Session
from levers9.tunnel.mux import AcceptStream

DEFAULT_TEST_WINDOW = 256 * 1024


async def eventually(condition: Callable[[], bool], within: float = 5.0) -> None:
    """Waits until `condition()` holds; AssertionError after `within` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition still false after the timeout")
        await asyncio.sleep(0.005)


class Link:
    """`client` (the initiator) and `server` (accepting with `accept`) over two queues."""

    def __init__(
        self,
        accept: AcceptStream | None = None,
        *,
        window: int = DEFAULT_TEST_WINDOW,
        server_window: int | None = None,
    ) -> None:
        self.to_server: asyncio.Queue[Frame] = asyncio.Queue()
        self.to_client: asyncio.Queue[Frame] = asyncio.Queue()
        self.client = Session(self.to_server.put, initiator=True, window=window)
        self.server = Session(
            self.to_client.put,
            initiator=False,
            accept=accept,
            window=server_window if server_window is not None else window,
        )
        self.sent_by_client: list[Frame] = []
        self.sent_by_server: list[Frame] = []
        self.feed_errors: list[Exception] = []
        self._pumps: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Link:
        self._pumps = [
            asyncio.create_task(self._pump(self.to_server, self.server, self.sent_by_client)),
            asyncio.create_task(self._pump(self.to_client, self.client, self.sent_by_server)),
        ]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.client.close()
        await self.server.close()
        for pump in self._pumps:
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        assert not self.feed_errors, self.feed_errors

    async def _pump(self, queue: asyncio.Queue[Frame], into: Session, record: list[Frame]) -> None:
        while True:
            frame = await queue.get()
            record.append(dataclasses.replace(frame, data=b"") if frame.data else frame)
            try:
                await into.feed(frame)
            except Exception as exc:  # a ProtocolError a test provoked; asserted at exit
                self.feed_errors.append(exc)

    def kinds(self, frames: list[Frame], stream_id: int) -> list[FrameKind]:
        """The kinds of the recorded `frames` on one stream, in order."""
        return [f.kind for f in frames if f.stream_id == stream_id]
