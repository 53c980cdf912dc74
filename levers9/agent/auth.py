"""Only the controlplane may call WorkerService: every call carries its command token.

The controlplane presents `levers9-command-token: <token>`, a credential of its own for this
worker (`levers9.tokens.command_token`), which the worker checks against the SHA-256 its Secret
carries: the worker's own token (what it presents to the gateway) does not command it, and
nothing on the node holds the command token. A worker whose Job came from an older controlplane
(no digest) checks `authorization: Bearer` against its own token, as before; the controlplane
sends both until such workers are gone. The checks are constant-time compares. The health
service stays open: probes carry no token.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc
from grpc import aio

from levers9.contract import COMMAND_TOKEN_HEADER
from levers9.rpc import bearer

Req = TypeVar("Req")
Resp = TypeVar("Resp")


class TokenInterceptor(aio.ServerInterceptor):
    """Rejects calls to the services under `prefixes` that lack the token (UNAUTHENTICATED)."""

    def __init__(self, token: str, prefixes: Sequence[str], command_digest: str = "") -> None:
        self._token = token.encode()
        self._prefixes = tuple(prefixes)
        self._command_digest = command_digest

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
        if self._command_digest:
            presented = [
                value
                for key, value in handler_call_details.invocation_metadata or ()
                if key.lower() == COMMAND_TOKEN_HEADER
            ]
            if len(presented) != 1 or not isinstance(presented[0], str):
                return _denied(handler, f"no {COMMAND_TOKEN_HEADER}")
            digest = hashlib.sha256(presented[0].encode()).hexdigest()
            if hmac.compare_digest(digest.encode(), self._command_digest.encode()):
                return handler
            return _denied(handler, "wrong command token")
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
    message = f"{why}: WorkerService takes only the controlplane's command token"

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
