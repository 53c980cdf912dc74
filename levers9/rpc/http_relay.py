"""Relaying one HTTP exchange (aiohttp server in, aiohttp client out), streamed both ways: a
joined cluster's agent relays to its API server with it. The endpoints' front speaks HTTP/1.1
onto its replicas' streams itself (levers9.gateway.replica_streams) and shares HOP_BY_HOP."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import aiohttp
from aiohttp import web

CHUNK = 64 * 1024
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
"""Headers of one connection (RFC 9110 7.6.1), never passed on; and Host, which the client sets
for where it goes."""


def forwarded_headers(request: web.Request) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}


def request_body(request: web.Request) -> AsyncIterator[bytes] | None:
    """The request's body as it arrives (None without one)."""
    if not request.body_exists:
        return None

    async def chunks() -> AsyncIterator[bytes]:
        async for chunk in request.content.iter_chunked(CHUNK):
            yield chunk

    return chunks()


def response_for(
    upstream: aiohttp.ClientResponse, extra: Mapping[str, str] | None = None
) -> web.StreamResponse:
    """The answer to relay: `upstream`'s status and end-to-end headers, and `extra`."""
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
    for key, value in upstream.headers.items():
        if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
            response.headers.add(key, value)
    if upstream.content_length is not None:
        response.content_length = upstream.content_length
    for key, value in (extra or {}).items():
        response.headers[key] = value
    return response


async def stream_body(
    upstream: aiohttp.ClientResponse, response: web.StreamResponse, request: web.Request
) -> web.StreamResponse:
    """Sends `response` and `upstream`'s body as it comes (server-sent events, watches). An
    upstream that breaks mid-body raises here with `response.prepared`: the caller cuts the
    client's connection (its transfer is then incomplete, never a clean end)."""
    await response.prepare(request)
    async for chunk in upstream.content.iter_any():
        await response.write(chunk)
    await response.write_eof()
    return response


async def relay_response(
    upstream: aiohttp.ClientResponse,
    request: web.Request,
    extra: Mapping[str, str] | None = None,
) -> web.StreamResponse:
    """Answers `request` with `upstream`, streamed."""
    return await stream_body(upstream, response_for(upstream, extra), request)
