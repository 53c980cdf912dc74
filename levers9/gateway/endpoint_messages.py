"""The endpoints' front's HTTP messages: what the client sent, as the replica gets it, and the
replica's answer, as the client gets it.

The request's head rewritten for the replica (its path under the endpoint's, its end-to-end
headers but the operator token, X-Forwarded-*), its body whole or streamed (cut past the
front's limit, 413), `Expect: 100-continue` answered, a WebSocket handshake refused 501; the
replica's response whole or streamed with `x-levers9-replica`; and the refusals (`Refused`,
a status and the message that says what to change) the front answers with.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import HttpVersion11, web
from multidict import CIMultiDict

from levers9.gateway.replica_streams import SEND_WHOLE, BodyRefused, Exchange
from levers9.rpc import http1
from levers9.rpc.http_relay import HOP_BY_HOP

CHUNK = 64 * 1024
REPLICA_HEADER = "x-levers9-replica"
NOT_PASSED_ON = HOP_BY_HOP | {"authorization", "expect", "content-length"}
"""The connection's own headers and Host (RFC 9110 7.6.1), the operator token, and what the
front sets itself: it has answered `Expect: 100-continue`, and it frames the body it sends."""
MIB = 1024 * 1024


class Refused(Exception):
    """A request the front answers itself: `status`, and the message saying what to change."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class BodyTooLarge(BodyRefused):
    """A chunked body went past the front's limit."""


def request_head(name: str, request: web.BaseRequest, port: int) -> bytes:
    """The request as the replica gets it: its path under the endpoint's (as sent, still
    percent-encoded), its end-to-end headers but the operator token, and X-Forwarded-*."""
    target = request.raw_path[len(name) + 1 :]
    if not target.startswith("/"):
        target = "/" + target
    headers = [
        (key, value) for key, value in request.headers.items() if key.lower() not in NOT_PASSED_ON
    ]
    headers.append(("Host", f"127.0.0.1:{port}"))
    headers.append(("X-Forwarded-Host", request.host))
    headers.append(("X-Forwarded-Proto", request.scheme))
    headers.append(("X-Forwarded-Prefix", f"/{name}"))
    if request.remote:
        headers.append(("X-Forwarded-For", request.remote))
    if not request.body_exists:
        if request.method in ("POST", "PUT", "PATCH"):
            headers.append(("Content-Length", "0"))
    elif request.content_length is None:  # the client chunked it: so does the front
        headers.append(("Transfer-Encoding", "chunked"))
    else:
        headers.append(("Content-Length", str(request.content_length)))
    return http1.request_head(request.method, target, headers)


async def request_body(request: web.BaseRequest, limit: int) -> bytes | AsyncIterator[bytes] | None:
    """None, the whole body when it is small and its length known, else its chunks as
    they come (chunk-encoded when the client sent no length; cut past `limit`: a length
    over it was refused before)."""
    if not request.body_exists:
        return None
    length = request.content_length
    if length is not None and length <= SEND_WHOLE:
        return await request.read()

    async def chunks() -> AsyncIterator[bytes]:
        seen = 0
        async for data in request.content.iter_chunked(CHUNK):
            seen += len(data)
            if seen > limit:
                raise BodyTooLarge(too_large(f"the chunked body ({seen} bytes so far)", limit))
            yield data if length is not None else http1.chunk(data)
        if length is None:
            yield http1.chunk(b"")

    return chunks()


def cut(request: web.BaseRequest) -> None:
    """The client sees its transfer cut, never a clean end."""
    if request.transport is not None:
        request.transport.abort()


def too_large(what: str, limit: int) -> str:
    size = f"{limit} bytes" + (f" ({limit / MIB:g} MiB)" if limit >= MIB else "")
    return (
        f"{what} is over the endpoints' limit of {size}: the controlplane's"
        " endpointsMaxBodyBytes (LEVERS9_ENDPOINTS_MAX_BODY_BYTES) sets it"
    )


def refuse_websocket(name: str, request: web.BaseRequest) -> None:
    """A WebSocket handshake is refused at the door (501), before it wakes a replica: the front
    does not carry upgraded connections, and the replica would only see a plain GET. Another
    Upgrade (h2c), which a server may ignore, is served as HTTP/1.1 without it."""
    upgrade = request.headers.get("Upgrade", "")
    if "websocket" in upgrade.lower():
        raise Refused(
            501,
            f"endpoint {name}: WebSockets are not proxied (the request asked for Upgrade:"
            f" {upgrade}); the endpoints carry HTTP requests and streamed responses"
            " (server-sent events)",
        )


async def expect_continue(request: web.BaseRequest) -> None:
    """Answers `Expect: 100-continue` once the request is authorized and its length within
    the limit (a refused one never sends its body); any other expectation is 417."""
    expect = request.headers.get("Expect")
    if expect is None or request.version != HttpVersion11:
        return
    if expect.strip().lower() != "100-continue":
        raise Refused(417, f"Expect: {expect} is not understood (only 100-continue)")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the response's own bytes are counted from here


def response_headers(exchange: Exchange, task_id: str) -> CIMultiDict[str]:
    assert exchange.head is not None
    headers: CIMultiDict[str] = CIMultiDict()
    for key, value in exchange.head.headers:
        if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
            headers.add(key, value)
    headers[REPLICA_HEADER] = task_id
    return headers


def whole(exchange: Exchange, task_id: str) -> web.Response:
    """A response that came whole with its head."""
    assert exchange.head is not None
    return web.Response(
        status=exchange.head.status,
        reason=exchange.head.reason or None,
        headers=response_headers(exchange, task_id),
        body=exchange.first if exchange.head.status not in (204, 304) else None,
    )


def streamed(exchange: Exchange, task_id: str) -> web.StreamResponse:
    """A response whose body comes after its head (server-sent events, token streams), with
    the replica's length, else chunked; or the answer to a HEAD request."""
    head = exchange.head
    assert head is not None
    response = web.StreamResponse(
        status=head.status, reason=head.reason or None, headers=response_headers(exchange, task_id)
    )
    length = head.get("content-length")
    if not head.values("transfer-encoding") and length is not None and length.isdigit():
        response.content_length = int(length)
    return response
