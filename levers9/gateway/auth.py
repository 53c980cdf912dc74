"""Worker tokens on gateway calls: `authorization: Bearer <token>`, checked against the worker id.

A token is the HMAC of one worker id (`levers9.tokens`), so checking it needs only the secret,
and a worker can speak only for itself. Errors name what is wrong, never the token.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import SecretStr

from levers9.gateway.errors import Unauthenticated
from levers9.rpc import bearer
from levers9.tokens import token_matches


def bearer_token(metadata: Iterable[tuple[str, str | bytes]]) -> str:
    """The one bearer token in the call metadata (`levers9.rpc.bearer`); `Unauthenticated`
    when absent or ambiguous."""
    try:
        return bearer.token(metadata)
    except bearer.BearerError as exc:
        raise Unauthenticated(str(exc)) from None


def authenticate(
    secret: SecretStr,
    worker_id: str,
    metadata: Iterable[tuple[str, str | bytes]],
    generation: int = 1,
) -> None:
    """Passes when the call carries the token of `worker_id` (of `generation`); a forged
    token, another worker's token or none at all raise `Unauthenticated`."""
    token = bearer_token(metadata)
    if not token_matches(secret.get_secret_value(), worker_id, token, generation):
        raise Unauthenticated(
            "worker token does not match worker_id: each worker sends the token of its own"
            " Secret (worker-<pool>-<id>-token)"
        )
