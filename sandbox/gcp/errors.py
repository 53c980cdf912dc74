"""Errors as Google's REST front ends word them.

Two dialects, both `{"error": {...}}` with the HTTP code repeated in `code`:

- most APIs (container, IAM, resource manager, artifact registry) say what went wrong in
  `status`, the google.rpc code name (`PERMISSION_DENIED`, `ALREADY_EXISTS`, `ABORTED` ...),
  which google-api-core turns into `Forbidden`, `Conflict` and so on;
- compute says it in `errors[].reason` (`forbidden`, `alreadyExists`, `conditionNotMet`,
  `notFound`), which gcloud prints and the python compute client carries in `.errors`.

Both dialects also carry the other's field, so a client that looks at either finds something.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Dialect = Literal["google", "compute"]

_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    412: "FAILED_PRECONDITION",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
_REASON = {
    400: "invalid",
    401: "authError",
    403: "forbidden",
    404: "notFound",
    409: "alreadyExists",
    412: "conditionNotMet",
    429: "rateLimitExceeded",
    500: "backendError",
    503: "backendError",
    504: "backendError",
}
_MESSAGE = {
    429: "Quota exceeded; retry after a while.",
    500: "Internal error encountered.",
    503: "The service is currently unavailable.",
    504: "The request timed out.",
}


@dataclass
class GoogleApiError(Exception):
    """An error answer; `body()` renders it in the dialect of the API that raised it.

    Attributes:
        code: the HTTP status.
        message: the human text.
        status: the google.rpc code name; derived from `code` when empty.
        reason: compute's `errors[].reason`; derived from `code` when empty.
        details: google.rpc detail objects (`ErrorInfo` ...), each with its `@type`.
        headers: extra response headers (`Retry-After`).
    """

    code: int
    message: str
    status: str = ""
    reason: str = ""
    details: list[dict[str, Any]] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)
        self.status = self.status or _STATUS.get(self.code, "UNKNOWN")
        self.reason = self.reason or _REASON.get(self.code, "error")

    def body(self, dialect: Dialect = "google") -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        item = {"message": self.message, "domain": "global", "reason": self.reason}
        error["errors"] = [item]
        if dialect == "google":
            error["status"] = self.status
            if self.details:
                error["details"] = self.details
        return {"error": error}


def unauthenticated() -> GoogleApiError:
    return GoogleApiError(
        401,
        "Request had invalid authentication credentials. Expected OAuth 2 access token, login "
        "cookie or other valid authentication credential. See "
        "https://developers.google.com/identity/sign-in/web/devconsole-project.",
        reason="authError",
    )


def permission_denied(permission: str, resource: str, service: str) -> GoogleApiError:
    """IAM's refusal: the permission the call needed and the resource it was checked on."""
    return GoogleApiError(
        403,
        f"Permission '{permission}' denied on resource '{resource}' (or it may not exist).",
        details=[
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "IAM_PERMISSION_DENIED",
                "domain": service,
                "metadata": {"permission": permission, "resource": resource},
            }
        ],
    )


def compute_forbidden(permission: str, resource: str) -> GoogleApiError:
    return GoogleApiError(403, f"Required '{permission}' permission for '{resource}'")


def not_found(message: str) -> GoogleApiError:
    return GoogleApiError(404, message)


def already_exists(message: str) -> GoogleApiError:
    return GoogleApiError(409, message)


def aborted(message: str) -> GoogleApiError:
    return GoogleApiError(409, message, status="ABORTED", reason="aborted")


def condition_not_met(message: str) -> GoogleApiError:
    return GoogleApiError(412, message, status="FAILED_PRECONDITION", reason="conditionNotMet")


def invalid_argument(message: str) -> GoogleApiError:
    return GoogleApiError(400, message)


def injected(
    code: int, message: str | None = None, retry_after_seconds: int | None = None
) -> GoogleApiError:
    """A staged fault's answer: the usual words for `code`, or the rule's own."""
    headers = {"Retry-After": str(retry_after_seconds)} if retry_after_seconds is not None else {}
    text = message or _MESSAGE.get(code, f"Injected fault ({code}).")
    return GoogleApiError(code, text, headers=headers)
