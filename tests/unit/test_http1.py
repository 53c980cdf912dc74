"""The endpoints' HTTP/1.1 client framing (levers9.rpc.http1, llhttp through httptools):
responses parsed as their bytes arrive, however the stream splits them, by the RFC 9112 rules
(a HEAD request's response, interim responses, a body to the connection's end, keep-alive);
malformed ones refused with what was wrong, in llhttp's words."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.rpc.http1 import (
    ConnectionClosed,
    HttpProtocolError,
    ResponseParser,
    chunk,
    request_head,
)


def _parse(data: bytes, *, split: int | None = None, head_request: bool = False) -> ResponseParser:
    """`data` fed in one piece or in pieces of `split` bytes; the body is kept on the parser."""
    parser = ResponseParser(head_request=head_request)
    body = b""
    pieces = [data] if split is None else [data[i : i + split] for i in range(0, len(data), split)]
    for piece in pieces:
        body += parser.feed(piece)
    parser.body = body  # type: ignore[attr-defined]
    return parser


SIMPLE = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello"
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nTrailer: x\r\n\r\n"
)


def test_a_response_with_a_length() -> None:
    parser = _parse(SIMPLE)
    assert parser.done
    assert parser.keep_alive
    assert parser.head is not None
    assert (parser.head.status, parser.head.reason, parser.head.version) == (200, "OK", "HTTP/1.1")
    assert parser.head.headers == (("Content-Length", "5"), ("X-A", "1"), ("X-A", "2"))
    assert parser.head.get("x-a") == "1"
    assert parser.body == b"hello"  # type: ignore[attr-defined]


@pytest.mark.parametrize("response", [SIMPLE, CHUNKED], ids=["length", "chunked"])
def test_any_split_of_the_bytes_parses_alike(response: bytes) -> None:
    whole = _parse(response)
    for split in range(1, len(response) + 1):
        parsed = _parse(response, split=split)
        assert parsed.done, split
        assert parsed.body == whole.body, split  # type: ignore[attr-defined]
        assert parsed.head == whole.head


@given(st.lists(st.binary(min_size=1, max_size=40), max_size=8), st.integers(1, 17))
def test_chunked_bodies_decode_to_what_was_chunked(chunks: list[bytes], split: int) -> None:
    response = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    response += b"".join(chunk(c) for c in chunks) + chunk(b"")
    parsed = _parse(response, split=split)
    assert parsed.done
    assert parsed.keep_alive
    assert parsed.body == b"".join(chunks)  # type: ignore[attr-defined]


def test_the_body_of_a_chunked_response_comes_as_it_arrives() -> None:
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n") == b""
    assert parser.head is not None
    assert not parser.done
    assert parser.feed(b"6\r\ndata: ") == b"data: "  # server-sent events, a token at a time
    assert parser.feed(b"\r\n3\r\nabc\r\n") == b"abc"
    assert not parser.done
    assert parser.feed(b"0\r\n\r\n") == b""
    assert parser.done


def test_without_length_the_body_runs_to_the_close() -> None:
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\n\r\nsome") == b"some"
    assert parser.feed(b" more") == b" more"
    assert not parser.done
    assert parser.feed(b"") == b""
    assert parser.done
    assert not parser.keep_alive


@pytest.mark.parametrize(
    ("response", "head_request"),
    [
        (b"HTTP/1.1 204 No Content\r\n\r\n", False),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", False),
    ],
    ids=["204", "304", "HEAD", "length 0"],
)
def test_responses_without_a_body_end_with_their_head(response: bytes, head_request: bool) -> None:
    parser = _parse(response, head_request=head_request)
    assert parser.done
    assert parser.keep_alive
    assert parser.body == b""  # type: ignore[attr-defined]


def test_a_head_requests_response_ends_with_its_head_however_it_is_split() -> None:
    response = (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 10\r\nX-A: 1\r\n\r\n"
    )
    for split in range(1, len(response) + 1):
        parsed = _parse(response, split=split, head_request=True)
        assert parsed.done, split
        assert parsed.keep_alive, split
        assert parsed.head is not None
        assert (parsed.head.status, parsed.head.headers[-1]) == (200, ("X-A", "1")), split
        assert parsed.body == b"", split  # type: ignore[attr-defined]
    # A server may not send ahead of the next request: the connection is not kept.
    parsed = _parse(response + b"HTTP/1.1 200 OK\r\n", head_request=True)
    assert parsed.done
    assert not parsed.keep_alive
    assert parsed.body == b""  # type: ignore[attr-defined]


def test_a_body_with_a_coding_other_than_chunked_runs_to_the_close() -> None:
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc") == b"abc"
    assert not parser.done
    assert parser.feed(b"") == b""
    assert parser.done
    assert not parser.keep_alive


def test_trailers_are_not_headers() -> None:
    parsed = _parse(CHUNKED)
    assert parsed.head is not None
    assert parsed.head.headers == (("Transfer-Encoding", "chunked"),)
    assert parsed.body == b"hello, world"  # type: ignore[attr-defined]


def test_interim_responses_are_skipped() -> None:
    parser = _parse(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n" + SIMPLE
    )
    assert parser.head is not None
    assert parser.head.status == 200
    assert parser.body == b"hello"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("response", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.1 200 OK\r\nConnection: Keep-Alive, Close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK", False),
    ],
    ids=["close", "close among others", "1.0", "1.0 keep-alive", "bytes sent ahead"],
)
def test_whether_the_connection_carries_the_next_request(response: bytes, keep_alive: bool) -> None:
    parser = _parse(response)
    assert parser.done
    assert parser.keep_alive is keep_alive


@pytest.mark.parametrize(
    ("response", "says"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "Expected HTTP/"),
        (b"HTTP/1.1 2000 OK\r\n\r\n", "Invalid response status"),
        (b"HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n", "not an HTTP/1.1 response"),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "Invalid header token"),
        (b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n", "Unexpected space"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            "Duplicate Content-Length",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Invalid character in Content-Length"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "Invalid character in chunk size",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
            "Expected LF after chunk data",
        ),
        (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", "switched protocols"),
    ],
)
def test_malformed_responses_are_refused_saying_how(response: bytes, says: str) -> None:
    with pytest.raises(HttpProtocolError, match=says):
        _parse(response)


def test_a_head_too_large_is_refused() -> None:
    parser = ResponseParser()
    with pytest.raises(HttpProtocolError, match="larger than 64 KiB"):
        parser.feed(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000)


def test_the_connection_closing_early_says_where() -> None:
    with pytest.raises(ConnectionClosed, match="before it answered") as idle:
        ResponseParser().feed(b"")
    assert isinstance(idle.value, ConnectionClosed)
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
    with pytest.raises(ConnectionClosed, match="before its response's end"):
        parser.feed(b"")
    assert parser.received > 0
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 10\r\n\r\nhalf")
    with pytest.raises(ConnectionClosed, match="before its response's end"):
        parser.feed(b"")  # its length says it was cut, whatever Connection says
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200")
    with pytest.raises(HttpProtocolError, match="inside its response head"):
        parser.feed(b"")


def test_bytes_after_the_end_are_refused() -> None:
    parser = _parse(SIMPLE)
    with pytest.raises(HttpProtocolError, match="after the end"):
        parser.feed(b"x")


def test_the_request_head() -> None:
    head = request_head("GET", "/v1/models?x=%20", [("Host", "127.0.0.1:8000"), ("Accept", "*/*")])
    assert head == b"GET /v1/models?x=%20 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nAccept: */*\r\n\r\n"
    with pytest.raises(HttpProtocolError, match="CR, LF"):
        request_head("GET", "/", [("X", "a\r\nInjected: 1")])
    assert chunk(b"abc") == b"3\r\nabc\r\n"
    assert chunk(b"") == b"0\r\n\r\n"
