"""HTTP/1.1 on a byte stream, as a client speaks it (RFC 9112): the request's head and chunked
body, and the response parsed as its bytes arrive. No I/O here: the endpoints' front writes
these bytes onto a `PortForward` stream to a replica and feeds back what the stream returns,
so a warm request costs one message each way and no socket of its own.

The response's framing is the RFC's (section 6.3), in its order: no body after a HEAD request
or for a 1xx, 204 or 304 status; `Transfer-Encoding: chunked` (decoded); `Content-Length`;
else the body runs to the end of the connection. Interim 1xx responses (100 Continue, 103
Early Hints) are skipped; 101 (an upgrade) is refused, as anything malformed is, with an
`HttpProtocolError` that says what was wrong.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_HEAD = 64 * 1024
"""A response head (status line and headers) larger than this is refused."""
MAX_CHUNK_LINE = 4 * 1024


class HttpProtocolError(Exception):
    """The bytes are not an HTTP/1.1 response; the message says how."""


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


@dataclass
class ResponseParser:
    """One response: `feed` it what the connection delivers, in order; it answers the head once
    it is whole, then the body's bytes as they come, and `done` once the response has ended.
    `feed(b"")` is the end of the connection."""

    head_request: bool = False
    head: ResponseHead | None = None
    done: bool = False
    keep_alive: bool = False
    """Whether the connection can carry the next request once `done`."""
    received: int = 0
    """Bytes fed so far (a connection that closed before any: the replica closed it idle)."""
    _buffer: bytearray = field(default_factory=bytearray)
    _mode: str = "head"
    """head, length, chunk-size, chunk-data, chunk-end, trailers, close, end."""
    _left: int = 0

    def feed(self, data: bytes) -> bytes:
        """Takes the next bytes; returns the body bytes they complete (possibly none)."""
        if self.done:
            if data:
                raise HttpProtocolError("the replica sent bytes after the end of its response")
            return b""
        self.received += len(data)
        if not data:
            return self._eof()
        self._buffer += data
        out = bytearray()
        while not self.done:
            before = (self._mode, len(self._buffer))
            out += self._step()
            if (self._mode, len(self._buffer)) == before:
                break  # needs more bytes
        return bytes(out)

    # -- states ------------------------------------------------------------------------------

    def _step(self) -> bytes:
        mode = self._mode
        if mode == "head":
            self._parse_head()
            return b""
        if mode == "length":
            return self._take(final="end")
        if mode == "close":
            data = bytes(self._buffer)
            self._buffer.clear()
            return data
        if mode == "chunk-size":
            line = self._line("chunk size")
            if line is None:
                return b""
            size = line.split(b";", 1)[0].strip()
            try:
                if not size or size.startswith((b"-", b"+", b"0x", b"0X")):
                    raise ValueError
                self._left = int(size, 16)
            except ValueError:
                raise HttpProtocolError(f"bad chunk size {line[:40]!r}") from None
            self._mode = "chunk-data" if self._left else "trailers"
            return b""
        if mode == "chunk-data":
            return self._take(final="chunk-end")
        if mode == "chunk-end":
            if len(self._buffer) < 2:
                return b""
            if self._buffer[:2] != b"\r\n":
                raise HttpProtocolError("a chunk did not end with CRLF")
            del self._buffer[:2]
            self._mode = "chunk-size"
            return b""
        if mode == "trailers":
            line = self._line("trailer")
            if line is None:
                return b""
            if not line:
                self._finish()
            return b""
        raise AssertionError(mode)

    def _take(self, final: str) -> bytes:
        data = bytes(self._buffer[: self._left])
        del self._buffer[: len(data)]
        self._left -= len(data)
        if not self._left:
            if final == "end":
                self._finish()
            else:
                self._mode = final
        return data

    def _line(self, what: str) -> bytes | None:
        end = self._buffer.find(b"\r\n")
        if end < 0:
            if len(self._buffer) > MAX_CHUNK_LINE:
                raise HttpProtocolError(f"a {what} line longer than {MAX_CHUNK_LINE} bytes")
            return None
        line = bytes(self._buffer[:end])
        del self._buffer[: end + 2]
        return line

    def _finish(self) -> None:
        self._mode = "end"
        self.done = True
        if self._buffer:
            # A server may not send ahead of a request: the connection is not reusable.
            self.keep_alive = False
            self._buffer.clear()

    def _eof(self) -> bytes:
        if self._mode == "close":
            self._finish()
            return b""
        if self._mode == "head":
            if not self.received:
                raise ConnectionClosed("the replica closed the connection before it answered")
            raise HttpProtocolError("the replica closed the connection inside its response head")
        raise ConnectionClosed("the replica closed the connection before its response's end")

    def _parse_head(self) -> None:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD:
                raise HttpProtocolError(f"a response head larger than {MAX_HEAD // 1024} KiB")
            return
        raw = bytes(self._buffer[:end])
        del self._buffer[: end + 4]
        head = _head(raw)
        if 100 <= head.status < 200:
            if head.status == 101:
                raise HttpProtocolError("the replica switched protocols (101): not proxied")
            return  # an interim response: the final one follows
        self.head = head
        connection = head.values("connection")
        if head.version == "HTTP/1.1":
            self.keep_alive = "close" not in connection
        else:
            self.keep_alive = "keep-alive" in connection
        if self.head_request or head.status in (204, 304):
            self._finish()
            return
        coding = head.values("transfer-encoding")
        if coding:
            if coding[-1] != "chunked":
                self.keep_alive = False
                self._mode = "close"
                return
            self._mode = "chunk-size"
            return
        length = _content_length(head)
        if length is None:
            self.keep_alive = False
            self._mode = "close"
        elif length == 0:
            self._finish()
        else:
            self._mode, self._left = "length", length


class ConnectionClosed(HttpProtocolError):
    """The connection ended before the response did (`ResponseParser.received` says whether the
    replica had sent anything)."""


def _head(raw: bytes) -> ResponseHead:
    try:
        text = raw.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover: latin-1 decodes every byte
        raise HttpProtocolError("an undecodable response head") from None
    status_line, *lines = text.split("\r\n")
    version, _, rest = status_line.partition(" ")
    code, _, reason = rest.partition(" ")
    if version not in ("HTTP/1.1", "HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise HttpProtocolError(f"not an HTTP/1.1 status line: {status_line[:80]!r}")
    headers = []
    for line in lines:
        key, colon, value = line.partition(":")
        if not colon or not key or key != key.strip() or line[0] in " \t":
            raise HttpProtocolError(f"a malformed response header line: {line[:80]!r}")
        headers.append((key, value.strip(" \t")))
    return ResponseHead(int(code), reason, tuple(headers), version)


def _content_length(head: ResponseHead) -> int | None:
    values = {v.strip() for k, v in head.headers if k.lower() == "content-length"}
    if not values:
        return None
    items = {item.strip() for value in values for item in value.split(",")}
    if len(items) != 1 or not next(iter(items)).isdigit():
        raise HttpProtocolError(f"a bad Content-Length: {', '.join(sorted(values))[:80]}")
    return int(next(iter(items)))
