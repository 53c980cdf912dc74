"""`authorization: Bearer <token>` on gRPC calls, one parser for every side: the gateway (worker
and operator tokens), the agent's WorkerService (the controlplane's token), and the callers that
present them.

The scheme is case-insensitive (RFC 7235 section 2.1: `Bearer`, `bearer` and `BEARER` are one
scheme); exactly one `authorization` entry is accepted, as a text value. Errors say what is wrong
with the header, never what the token was.
"""

from __future__ import annotations

from collections.abc import Iterable

AUTHORIZATION = "authorization"
SCHEME = "Bearer"

Metadata = Iterable[tuple[str, str | bytes]]


class BearerError(ValueError):
    """The call carries no usable bearer token; the message names the fix."""


def metadata(token: str) -> tuple[tuple[str, str]]:
    """The call metadata that presents `token`."""
    return ((AUTHORIZATION, f"{SCHEME} {token}"),)


def token(call_metadata: Metadata | None) -> str:
    """The one bearer token in the call metadata; BearerError when absent, ambiguous, of
    another scheme, binary or empty."""
    values = [value for key, value in call_metadata or () if key.lower() == AUTHORIZATION]
    if not values:
        raise BearerError("missing token: send `authorization: Bearer <token>`")
    if len(values) > 1:
        raise BearerError("more than one authorization header; send exactly one")
    [value] = values
    scheme, _, rest = value.partition(" ") if isinstance(value, str) else ("", "", "")
    if scheme.lower() != SCHEME.lower():
        raise BearerError("authorization is not a bearer token: send `Bearer <token>`")
    presented = rest.strip()
    if not presented:
        raise BearerError("empty bearer token")
    return presented
