"""What the apiserver's decoding refuses before any validation: `[]byte` fields that are not
base64 (a Secret's `data`, a ConfigMap's `binaryData`).

The apiserver decodes a JSON (or YAML) body into the typed object, and Go's `encoding/json`
reads a `[]byte` from a base64 string with `base64.StdEncoding`. A value that is not one fails
the decode, so a create or a replace is 400 BadRequest with the decoder's words:

    Secret in version "v1" cannot be handled as a Secret: illegal base64 data at input byte 4

A patch is applied first and its result decoded, so there it is 422 Invalid on `patch` (the
value shown is the patch as sent, never the stored object's other data).
"""

from __future__ import annotations

import json
from typing import Any

from sandbox import errors
from sandbox.errors import Cause
from sandbox.resources import CONFIG_MAPS, SECRETS, Resource

_BYTE_MAPS: dict[Resource, str] = {SECRETS: "data", CONFIG_MAPS: "binaryData"}
_ALPHABET = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
_NEWLINES = (ord("\n"), ord("\r"))
_PAD = ord("=")


def base64_error(text: str) -> int | None:
    """Where Go's `base64.StdEncoding` gives up on `text` (its `CorruptInputError`, a byte
    offset), or None when it decodes. Newlines are skipped, padding is required."""
    src = text.encode()
    end = len(src)
    si = 0
    while si < end:
        j = 0
        while j < 4:
            if si == end:
                return None if j == 0 else si - j  # a partial quantum, unpadded
            char = src[si]
            si += 1
            if char in _ALPHABET:
                j += 1
                continue
            if char in _NEWLINES:
                continue
            if char != _PAD or j < 2:
                return si - 1  # not base64, or padding too early
            if j == 2:  # "==" expected, the first one read
                while si < end and src[si] in _NEWLINES:
                    si += 1
                if si == end:
                    return end
                if src[si] != _PAD:
                    return si - 1
                si += 1
            while si < end and src[si] in _NEWLINES:
                si += 1
            return si if si < end else None  # anything after the padding is garbage
    return None


def byte_field_error(resource: Resource, obj: Any) -> str | None:
    """The decoder's error for the first `[]byte` value of `obj` that is not base64."""
    field = _BYTE_MAPS.get(resource)
    values = obj.get(field) if field is not None and isinstance(obj, dict) else None
    if not isinstance(values, dict):
        return None
    for value in values.values():
        if value is None:
            continue
        if not isinstance(value, str):
            return (
                f"json: cannot unmarshal {_json_kind(value)} into Go struct field "
                f"{resource.kind}.{field} of type []uint8"
            )
        offset = base64_error(value)
        if offset is not None:
            return f"illegal base64 data at input byte {offset}"
    return None


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return "array" if isinstance(value, list) else "object"


def check_body(resource: Resource, obj: Any) -> None:
    """400 for a create or replace body the apiserver could not decode."""
    problem = byte_field_error(resource, obj)
    if problem is not None:
        raise errors.bad_request(
            f'{resource.kind} in version "{resource.version}" cannot be handled as a '
            f"{resource.kind}: {problem}"
        )


def check_patched(resource: Resource, patched: Any, patch: Any) -> None:
    """422 on `patch` when the patched object could not be decoded."""
    problem = byte_field_error(resource, patched)
    if problem is not None:
        cause = Cause.invalid("patch", json.dumps(patch, separators=(",", ":")), problem)
        details = {"causes": [{"reason": cause.reason, "message": cause.message, "field": "patch"}]}
        # The apiserver names no kind here (an empty GroupKind): hence the leading space.
        raise errors.ApiError(422, "Invalid", f' "" is invalid: {cause.text}', details)
