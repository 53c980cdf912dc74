"""`MalformedRequests`: a request that is not the method's message is answered
INVALID_ARGUMENT, naming the message it should have been.

Without it grpc's own handling answers a body that does not parse with UNKNOWN ("Unexpected
<class 'DecodeError'>"), which reads like a server bug. The interceptor swaps each method's
request deserializer for one that cannot raise: an undecodable body becomes a `_Malformed`
value, and the wrapped handler aborts with INVALID_ARGUMENT when it meets one (for streaming
requests, at the message that does not parse; a handler that reads through `context.read()`
uses `read_checked`).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc import aio

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Context = aio.ServicerContext[Any, Any]


class _Malformed:
    def __init__(self, reason: str) -> None:
        self.reason = reason


async def read_checked(context: Context) -> Any:
    """The next request of a streaming call read through `context.read()` (which the wrapper
    cannot check), `aio.EOF` at its end; a malformed one aborts the call, as the wrapper does."""
    request = await context.read()
    if isinstance(request, _Malformed):
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
    return request


def _safe(deserializer: Callable[[bytes], Any], method: str) -> Callable[[bytes], Any]:
    def deserialize(body: bytes) -> Any:
        try:
            return deserializer(body)
        except (DecodeError, ValueError, TypeError) as error:
            return _Malformed(f"{method}: the request is not a valid message ({error})")

    return deserialize


async def _checked(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, _Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        yield request


def _unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def handle(request: Any, context: Context) -> Any:
        if isinstance(request, _Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        return await behavior(request, context)

    return handle


def _unary_stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
    # A streaming handler either yields its responses or writes them (`context.write`, as the
    # health service's Watch does); the wrapper keeps the behaviour's own form.
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
            if isinstance(request, _Malformed):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
            async for response in behavior(request, context):
                yield response

        return stream
    return _unary(behavior)


def _stream_unary(behavior: Callable[..., Any]) -> Callable[..., Any]:
    async def handle(requests: AsyncIterator[Any], context: Context) -> Any:
        return await behavior(_checked(requests, context), context)

    return handle


def _stream_stream(behavior: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behavior):

        async def stream(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
            async for response in behavior(_checked(requests, context), context):
                yield response

        return stream
    return _stream_unary(behavior)


class MalformedRequests(aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Req, Resp] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Req, Resp] | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        safe = _safe(handler.request_deserializer, method)
        serializer = handler.response_serializer
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                _unary(handler.unary_unary), safe, serializer
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _unary_stream(handler.unary_stream), safe, serializer
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                _stream_unary(handler.stream_unary), safe, serializer
            )
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                _stream_stream(handler.stream_stream), safe, serializer
            )
        return handler
