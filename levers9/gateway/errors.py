"""Why the gateway turns a worker call away, as the gRPC status the agent acts on."""

from __future__ import annotations

import grpc

_SHOWN_CHARS = 80


class Rejection(Exception):
    """A call the gateway refuses: `code` tells the agent what to do, `message` tells a person."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class InvalidRequest(Rejection):
    """A request field the agent got wrong; the message starts with the field's name."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {problem}")
        self.field = field


class Unauthenticated(Rejection):
    """No token, or not this worker's token. The message never holds the token itself."""

    def __init__(self, problem: str) -> None:
        super().__init__(grpc.StatusCode.UNAUTHENTICATED, problem)


def clipped(value: str) -> str:
    """A caller-supplied value cut to a length a log line can carry (a caller may send MiBs)."""
    if len(value) <= _SHOWN_CHARS:
        return value
    return f"{value[:_SHOWN_CHARS]}... ({len(value)} chars)"


def shown(value: str) -> str:
    """A caller-supplied value as an error message quotes it: clipped, repr-escaped."""
    if len(value) <= _SHOWN_CHARS:
        return repr(value)
    return f"{value[:_SHOWN_CHARS]!r}... ({len(value)} chars)"
