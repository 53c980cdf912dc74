"""The endpoints' front's client connections: what each is given (`FrontLimits`, from the
controlplane's settings) and aiohttp's low-level server whose connections hold each request's
head to a deadline (408, the connection closed: a client that dribbles its headers cannot hold
the front's connections) and close once idle between requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from levers9.config import ControlplaneSettings
from levers9.logs import get_logger

# The front's log: what a connection logs is the endpoints' front's doing.
log = get_logger("levers9.gateway.endpoint_proxy")


@dataclass(frozen=True)
class FrontLimits:
    """What the front gives a client connection (the settings `endpointsIdleTimeoutSeconds`,
    `endpointsHeaderTimeoutSeconds`, `endpointsMaxBodyBytes`)."""

    idle_timeout_s: float
    header_timeout_s: float
    max_body_bytes: int

    @classmethod
    def of(cls, settings: ControlplaneSettings) -> FrontLimits:
        return cls(
            idle_timeout_s=settings.endpoints_idle_timeout_seconds,
            header_timeout_s=settings.endpoints_header_timeout_seconds,
            max_body_bytes=settings.endpoints_max_body_bytes,
        )

    @classmethod
    def defaults(cls) -> FrontLimits:
        fields = ControlplaneSettings.model_fields
        return cls(
            idle_timeout_s=fields["endpoints_idle_timeout_seconds"].default,
            header_timeout_s=fields["endpoints_header_timeout_seconds"].default,
            max_body_bytes=fields["endpoints_max_body_bytes"].default,
        )


class FrontServer(web.Server):
    """aiohttp's low-level server, its connections `Connection`s."""

    def __init__(
        self,
        handler: Callable[[web.BaseRequest], Any],
        *,
        header_timeout_s: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, handler_cancellation=True, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._connection_kwargs = kwargs

    def __call__(self) -> RequestHandler:
        return Connection(
            self,
            header_timeout_s=self._header_timeout_s,
            loop=asyncio.get_running_loop(),
            **self._connection_kwargs,
        )


class Connection(RequestHandler):
    """One client connection, with a deadline on each request's head: from the connection, or
    on a kept-alive one from the first byte of its next request, to the head parsed whole.
    Past it: 408 when part of a head came (nothing, on a connection that sent none), and the
    connection closed. aiohttp's own keep-alive timeout closes a connection idle between
    requests. Reads aiohttp's state: `_waiter` (set while it waits for the next request) and
    `_request_count` (heads parsed); the front's tests drive both by sockets."""

    def __init__(self, manager: web.Server, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._head_deadline: asyncio.TimerHandle | None = None
        self._head_bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._expect_head()

    def data_received(self, data: bytes) -> None:
        if data and self._head_deadline is None and self._waiter is not None:
            self._expect_head()  # the next request on a kept-alive connection
        if self._head_deadline is not None:
            self._head_bytes += len(data)
        parsed = self._request_count
        super().data_received(data)
        if self._request_count != parsed:
            self._head_arrived()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def _expect_head(self) -> None:
        self._head_bytes = 0
        self._head_deadline = self._loop.call_later(self._header_timeout_s, self._head_late)

    def _head_arrived(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_late(self) -> None:
        self._head_deadline = None
        transport = self.transport
        if transport is None:
            return
        peer = transport.get_extra_info("peername")
        if self._head_bytes:
            log.info(
                "request head too slow, connection closed",
                peer=str(peer),
                received=self._head_bytes,
                timeout_s=self._header_timeout_s,
            )
            text = (
                f"the request's line and headers did not arrive within"
                f" {self._header_timeout_s:g} s (endpointsHeaderTimeoutSeconds)\n"
            ).encode()
            transport.write(
                b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(text), text)
            )
        self.force_close()
