"""Only the controlplane may call WorkerService: every call carries the worker's own token.

The controlplane presents `authorization: Bearer <token>`, the same token the worker uses
towards the gateway (it derives it from the worker id). The check is a constant-time compare.
The health service stays open: probes carry no token.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from grpc import aio

from levers9.rpc import bearer

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class TokenInterceptor(aio.ServerInterceptor):
    """Rejects calls to the services under `prefixes` that lack the token (UNAUTHENTICATED)."""

    def __init__(self, token: str, prefixes: Sequence[str]) -> None:
        self._token = token.encode()
        self._prefixes = tuple(prefixes)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Req, Resp] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Req, Resp] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(self._prefixes):
            return handler
        try:
            token = bearer.token(handler_call_details.invocation_metadata)
        except bearer.BearerError as exc:
            return _denied(handler, str(exc))
        if hmac.compare_digest(token.encode(), self._token):
            return handler
        return _denied(handler, "wrong token")


def _denied(
    handler: grpc.RpcMethodHandler[Req, Resp], why: str
) -> grpc.RpcMethodHandler[Req, Resp]:
    message = f"{why}: WorkerService takes the worker's own token as authorization: Bearer"

    async def deny(request: Any, context: aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(
        deny,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
