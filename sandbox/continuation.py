"""List continuation and resource versions as the apiserver reads them from a request: the
continue token (`{"v", "rv", "start"}`, base64, plus the id of the list's snapshot in the
store), 400 for a token or a resourceVersion that is not one, and the 410 message of a token
whose snapshot is gone."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from sandbox import errors

CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted between "
    "the time the first chunk was returned and now may show up in the list."
)


@dataclass(frozen=True, slots=True)
class Continue:
    """A decoded continue token: `start` is the last key served plus NUL (the next key)."""

    rv: int
    start: str
    snapshot: str | None


def parse_resource_version(text: str) -> int:
    """A resourceVersion from a request, as an int; 400 when it is not one."""
    try:
        value = int(text)
    except ValueError:
        raise errors.bad_request(f"invalid resource version: {text}") from None
    if value < 0:
        raise errors.bad_request(f"invalid resource version: {text}")
    return value


def encode_continue(rv: int, start: str, snapshot: str | None = None) -> str:
    """The apiserver's token (`{"v", "rv", "start"}`) plus the id of the list's snapshot."""
    token: dict[str, Any] = {"v": "meta.k8s.io/v1", "rv": rv, "start": start + "\x00"}
    if snapshot is not None:
        token["snapshot"] = snapshot
    return base64.urlsafe_b64encode(json.dumps(token).encode()).decode().rstrip("=")


def decode_continue(token: str) -> Continue:
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded))
        rv, start = int(data["rv"]), str(data["start"])
        snapshot = data.get("snapshot")
        if data.get("v") != "meta.k8s.io/v1" or not start.endswith("\x00"):
            raise ValueError
        if rv < -1 or rv == 0 or not isinstance(snapshot, str | None):
            raise ValueError
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise errors.bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion "
            "(version meta.k8s.io/v1)"
        ) from None
    return Continue(rv, start, snapshot)
