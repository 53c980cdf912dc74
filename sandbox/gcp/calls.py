"""What a handler of the Google Cloud emulator receives and how a route is declared.

A route names its HTTP method, its aiohttp path pattern, the IAM permission the call needs
(checked before the handler runs) and the API it belongs to (for error wording). A handler is
a plain function of a `Call` to the JSON it answers; it raises `GoogleApiError` to refuse.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sandbox.auth import Principal
from sandbox.gcp.errors import Dialect

Json = dict[str, Any]

_VERSION_PREFIX = re.compile(r"^/(?:compute/)?v\d+/")


@dataclass(frozen=True)
class Call:
    """One authenticated API call.

    Attributes:
        principal: who calls.
        params: the path's named parts (`project`, `cluster` ...).
        query: the query string.
        body: the JSON body (`{}` when there is none).
        base_url: the emulator's own `https://127.0.0.1:<port>`, for self links.
        path: the request path.
    """

    principal: Principal
    params: Mapping[str, str]
    query: Mapping[str, str]
    body: Json
    base_url: str
    path: str

    @property
    def actor(self) -> str:
        """The caller as Google logs it (an operation's `user`)."""
        return self.principal.email or self.principal.username


Handler = Callable[[Call], Json]


@dataclass(frozen=True)
class Route:
    """One method and path of an API.

    Attributes:
        method: GET, POST, PUT, PATCH or DELETE.
        path: aiohttp pattern; `{project}` is checked against the emulated project.
        permission: what IAM checks, or a function of the call for paths that serve more
            than one kind of resource (operations).
        handler: answers the call.
        service: `container.googleapis.com` ..., for permission errors.
        dialect: how errors are worded (`errors.Dialect`).
    """

    method: str
    path: str
    permission: str | Callable[[Call], str]
    handler: Handler
    service: str
    dialect: Dialect = "google"

    def permission_for(self, call: Call) -> str:
        return self.permission if isinstance(self.permission, str) else self.permission(call)

    def resource_for(self, path: str) -> str:
        """The resource name IAM reports in a refusal."""
        name = _VERSION_PREFIX.sub("", path).split(":", 1)[0]
        return name if self.dialect == "compute" else f"//{self.service}/{name}"


def rfc3339(moment: dt.datetime | None = None) -> str:
    """A timestamp as the APIs write them: UTC, `Z`, microseconds."""
    moment = moment or dt.datetime.now(dt.UTC)
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
