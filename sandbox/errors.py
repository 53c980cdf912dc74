"""API errors as the real API server words them: a `Status` body, its HTTP code and reason.

Clients branch on `reason` and `code` (the official client raises `ApiException(status=...)`,
kubectl prints `Error from server (NotFound): ...` from `message`), so these builders copy the
apiserver's texts (`k8s.io/apimachinery/pkg/api/errors`) word for word.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandbox.resources import Resource

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(
    code: int,
    reason: str,
    message: str,
    details: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A `meta.k8s.io/v1` Status of failure, key order as the apiserver serializes it;
    `metadata` is its ListMeta (a `continue` token, for an expired one)."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": dict(metadata or {}),
        "status": "Failure",
    }
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = dict(details)
    body["code"] = code
    return body


def success_status(code: int = 200, details: Mapping[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}}
    body["status"] = "Success"
    if details is not None:
        body["details"] = dict(details)
    if code != 200:
        body["code"] = code
    return body


@dataclass
class ApiError(Exception):
    """A failed API call; the REST layer renders it as its Status body."""

    code: int
    reason: str
    message: str
    details: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def status(self) -> dict[str, Any]:
        return status_body(self.code, self.reason, self.message, self.details, self.metadata)


@dataclass(frozen=True)
class Cause:
    """One field error of a 422 Invalid (`metav1.StatusCause`)."""

    reason: str
    message: str
    field: str

    @staticmethod
    def required(path: str, detail: str = "") -> Cause:
        msg = "Required value" + (f": {detail}" if detail else "")
        return Cause("FieldValueRequired", msg, path)

    @staticmethod
    def invalid(path: str, value: Any, detail: str) -> Cause:
        return Cause("FieldValueInvalid", f"Invalid value: {_go_quote(value)}: {detail}", path)

    @staticmethod
    def forbidden(path: str, detail: str) -> Cause:
        return Cause("FieldValueForbidden", f"Forbidden: {detail}", path)

    @staticmethod
    def unsupported(path: str, value: Any, valid: Sequence[str]) -> Cause:
        options = ", ".join(f'"{v}"' for v in valid)
        msg = f"Unsupported value: {_go_quote(value)}: supported values: {options}"
        return Cause("FieldValueNotSupported", msg, path)

    @staticmethod
    def duplicate(path: str, value: Any) -> Cause:
        return Cause("FieldValueDuplicate", f"Duplicate value: {_go_quote(value)}", path)

    @property
    def text(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


def _go_quote(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list | tuple | dict):
        # apimachinery renders a composite value as its JSON (`["foo"]`).
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def _details(resource: Resource, name: str | None, *, kind: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if name:
        out["name"] = name
    if resource.group:
        out["group"] = resource.group
    out["kind"] = kind or resource.plural
    return out


def not_found(resource: Resource, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{resource.qualified} "{name}" not found', _details(resource, name)
    )


def already_exists(resource: Resource, name: str) -> ApiError:
    msg = f'{resource.qualified} "{name}" already exists'
    return ApiError(409, "AlreadyExists", msg, _details(resource, name))


def conflict(resource: Resource, name: str, detail: str | None = None) -> ApiError:
    detail = detail or (
        "the object has been modified; please apply your changes to the latest version and "
        "try again"
    )
    msg = f'Operation cannot be fulfilled on {resource.qualified} "{name}": {detail}'
    return ApiError(409, "Conflict", msg, _details(resource, name))


def invalid(resource: Resource, name: str, causes: Sequence[Cause]) -> ApiError:
    texts = [c.text for c in causes]
    summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details = _details(resource, name, kind=resource.kind)
    details["causes"] = [
        {"reason": c.reason, "message": c.message, "field": c.field} for c in causes
    ]
    msg = f'{resource.kind} "{name}" is invalid: {summary}'
    return ApiError(422, "Invalid", msg, details)


def invalid_options(kind: str, causes: Sequence[Cause]) -> ApiError:
    """A 422 for request options (`CreateOptions`, `DeleteOptions`, ...), which the apiserver
    validates before it reads the object: `DeleteOptions.meta.k8s.io "" is invalid: ...`."""
    texts = [c.text for c in causes]
    summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    details = {
        "group": "meta.k8s.io",
        "kind": kind,
        "causes": [{"reason": c.reason, "message": c.message, "field": c.field} for c in causes],
    }
    return ApiError(422, "Invalid", f'{kind}.meta.k8s.io "" is invalid: {summary}', details)


def forbidden(resource: Resource, name: str, detail: str) -> ApiError:
    subject = f'{resource.qualified} "{name}"' if name else resource.qualified
    return ApiError(403, "Forbidden", f"{subject} is forbidden: {detail}", _details(resource, name))


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def unprocessable(message: str) -> ApiError:
    """A 422 that names no object, as the apiserver answers a patch it cannot apply."""
    return ApiError(422, "Invalid", message)


def method_not_allowed() -> ApiError:
    return ApiError(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        {},
    )


def path_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def unauthorized() -> ApiError:
    return ApiError(401, "Unauthorized", "Unauthorized")


def expired(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def gone_too_old(requested: int, oldest: int) -> ApiError:
    return expired(f"too old resource version: {requested} ({oldest})")


def unsupported_media_type(content_type: str, accepted: Sequence[str]) -> ApiError:
    msg = (
        f"the body of the request was in an unknown format - accepted media types include: "
        f"{', '.join(accepted)}"
    )
    del content_type  # the apiserver does not echo it
    return ApiError(415, "UnsupportedMediaType", msg)


def injected(code: int, message: str | None, retry_after: int | None) -> ApiError:
    """A failure the fault injector stages, shaped like the apiserver's own for that code."""
    reason = _REASONS.get(code, "")
    details: dict[str, Any] | None = None
    headers: dict[str, str] = {}
    if code == 429:
        message = message or "Too many requests, please try again later."
        retry_after = retry_after if retry_after is not None else 1
    elif code == 500:
        message = f"Internal error occurred: {message or 'injected fault'}"
        details = {"causes": [{"message": message}]}
    elif code == 503:
        message = message or "the server is currently unable to handle the request"
    elif code == 504:
        message = message or "the server was unable to return a response in the time allotted"
    if retry_after is not None:
        details = {**(details or {}), "retryAfterSeconds": retry_after}
        headers["Retry-After"] = str(retry_after)
    return ApiError(code, reason, message or f"injected fault {code}", details, headers)
