"""HTTP/1.1 on a byte stream, as a client speaks it: the request's head and chunked body
written here, the response parsed as its bytes arrive by llhttp (Node's parser, through
`httptools`). No I/O here: the endpoints' front writes these bytes onto a `PortForward` stream
to a replica and feeds back what the stream returns, so a warm request costs one message each
way and no socket of its own.

llhttp frames the response by RFC 9112 section 6.3 and refuses what is malformed; this module
adds what it leaves to its caller: a HEAD request's response ends with its head; interim 1xx
responses (100 Continue, 103 Early Hints) are skipped; 101 (an upgrade) is refused; a body
without a length runs to the end of the connection; a head over `MAX_HEAD` is refused; and
whether the connection can carry the next request. What is wrong comes as an
`HttpProtocolError` that says what.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import httptools

MAX_HEAD = 64 * 1024
"""A response head (status line and headers, the interim responses' included) larger than
this is refused."""


class HttpProtocolError(Exception):
    """The bytes are not an HTTP/1.1 response; the message says how."""


class ConnectionClosed(HttpProtocolError):
    """The connection ended before the response did (`ResponseParser.received` says whether the
    replica had sent anything)."""


@dataclass(frozen=True)
class ResponseHead:
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    version: str
    """`HTTP/1.1` or `HTTP/1.0`."""

    def get(self, name: str) -> str | None:
        """The first value of header `name` (any case), or None."""
        lowered = name.lower()
        return next((v for k, v in self.headers if k.lower() == lowered), None)

    def values(self, name: str) -> list[str]:
        """Every comma-separated value of header `name`, lowercased."""
        lowered = name.lower()
        return [
            item.strip().lower()
            for key, value in self.headers
            if key.lower() == lowered
            for item in value.split(",")
            if item.strip()
        ]


def request_head(method: str, target: str, headers: Iterable[tuple[str, str]]) -> bytes:
    """`METHOD target HTTP/1.1` and `headers`, ended by the empty line. Header names and
    values that could split the head (CR, LF) are refused."""
    lines = [f"{method} {target} HTTP/1.1"]
    for key, value in headers:
        if any(c in key for c in "\r\n: ") or "\r" in value or "\n" in value:
            raise HttpProtocolError(f"header {key!r} cannot be sent: it holds CR, LF or a colon")
        lines.append(f"{key}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body (`b""` gives the last chunk)."""
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b"0\r\n\r\n"


class _Ahead(Exception):
    """The replica began another response after this one's end."""


class ResponseParser:
    """One response: `feed` it what the connection delivers, in order; it answers the head once
    it is whole, then the body's bytes as they come, and `done` once the response has ended.
    `feed(b"")` is the end of the connection."""

    def __init__(self, *, head_request: bool = False) -> None:
        self.head_request = head_request
        self.head: ResponseHead | None = None
        self.done = False
        self.keep_alive = False
        """Whether the connection can carry the next request once `done`."""
        self.received = 0
        """Bytes fed so far (a connection that closed before any: the replica closed it idle)."""
        self._parser = httptools.HttpResponseParser(self)
        self._reason = b""
        self._headers: list[tuple[str, str]] = []
        self._interim = False
        self._body: list[bytes] = []
        self._tail = b""
        """A HEAD response: the last bytes fed of a head not yet ended (its end may span feeds)."""

    def feed(self, data: bytes) -> bytes:
        """Takes the next bytes; returns the body bytes they complete (possibly none)."""
        if self.done:
            if data:
                raise HttpProtocolError("the replica sent bytes after the end of its response")
            return b""
        self.received += len(data)
        if not data:
            return self._eof()
        try:
            if self.head_request:
                self._feed_heads(data)
            else:
                self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, HttpProtocolError):
                raise exc.__context__ from None
            if not self.done:
                raise HttpProtocolError(str(exc) or type(exc).__name__) from None
            # Bytes after the response's end (_Ahead, or after `Connection: close`).
            self.keep_alive = False
        if self.head is None and self.received > MAX_HEAD:
            raise HttpProtocolError(f"a response head larger than {MAX_HEAD // 1024} KiB")
        body, self._body = b"".join(self._body), []
        return body

    def _feed_heads(self, data: bytes) -> None:
        """A HEAD request's response ends with its head, which llhttp cannot be told: it is fed
        up to each head's end (an interim response's, then the final one's)."""
        while data and not self.done:
            seen = self._tail + data
            end = seen.find(b"\r\n\r\n")
            if end < 0:
                self._parser.feed_data(data)
                self._tail = seen[-3:]
                return
            cut = end + 4 - len(self._tail)
            self._parser.feed_data(data[:cut])
            data, self._tail = data[cut:], b""
        if data:
            self.keep_alive = False  # a server may not send ahead of a request

    def _eof(self) -> bytes:
        if self.head is None:
            if self.received:
                raise HttpProtocolError(
                    "the replica closed the connection inside its response head"
                )
            raise ConnectionClosed("the replica closed the connection before it answered")
        coding = self.head.values("transfer-encoding")
        if coding[-1] != "chunked" if coding else self.head.get("content-length") is None:
            self.done = True  # the body ran to the end of the connection: no length, not chunked
            return b""
        raise ConnectionClosed("the replica closed the connection before its response's end")

    # -- llhttp's callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.done:
            raise _Ahead

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        # (a chunked body's trailers come here too, after the head was made: not kept)
        self._headers.append((name.decode("latin-1"), value.decode("latin-1").strip(" \t")))

    def on_headers_complete(self) -> None:
        parser = self._parser
        status, version = parser.get_status_code(), parser.get_http_version()
        if version not in ("1.1", "1.0"):
            raise HttpProtocolError(f"not an HTTP/1.1 response: HTTP/{version}")
        if 100 <= status < 200:
            if status == 101:
                raise HttpProtocolError("the replica switched protocols (101): not proxied")
            self._reason, self._headers, self._interim = b"", [], True
            return  # an interim response: the final one follows
        head = ResponseHead(
            status, self._reason.decode("latin-1"), tuple(self._headers), f"HTTP/{version}"
        )
        self.head = head
        if self.head_request:
            connection = head.values("connection")
            self.done = True
            self.keep_alive = (
                "close" not in connection if version == "1.1" else "keep-alive" in connection
            )
            return
        self.keep_alive = parser.should_keep_alive()

    def on_body(self, data: bytes) -> None:
        self._body.append(data)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self.done = True
