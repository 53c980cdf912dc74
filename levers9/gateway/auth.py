"""Worker tokens on gateway calls: `authorization: Bearer <token>`, checked against the worker id.

A token is the HMAC of one worker id (`levers9.tokens`), so checking it needs only the secret,
and a worker can speak only for itself. Errors name what is wrong, never the token.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import SecretStr

from levers9.gateway.errors import Unauthenticated
from levers9.tokens import token_matches

AUTHORIZATION = "authorization"
_SCHEME = "bearer "


def bearer_token(metadata: Iterable[tuple[str, str | bytes]]) -> str:
    """The one bearer token in the call metadata; `Unauthenticated` when absent or ambiguous."""
    values = [value for key, value in metadata if key.lower() == AUTHORIZATION]
    if not values:
        raise Unauthenticated("missing worker token: send `authorization: Bearer <token>`")
    if len(values) > 1:
        raise Unauthenticated("more than one authorization header; send exactly one")
    [value] = values
    if not isinstance(value, str) or not value[: len(_SCHEME)].lower() == _SCHEME:
        raise Unauthenticated("authorization is not a bearer token: send `Bearer <token>`")
    token = value[len(_SCHEME) :].strip()
    if not token:
        raise Unauthenticated("empty bearer token")
    return token


def authenticate(
    secret: SecretStr, worker_id: str, metadata: Iterable[tuple[str, str | bytes]]
) -> None:
    """Passes when the call carries the token of `worker_id`; a forged token, another worker's
    token or none at all raise `Unauthenticated`."""
    token = bearer_token(metadata)
    if not token_matches(secret.get_secret_value(), worker_id, token):
        raise Unauthenticated(
            "worker token does not match worker_id: each worker sends the token of its own"
            " Secret (worker-<pool>-<id>-token)"
        )
