"""The Kubernetes API over HTTP: the aiohttp application and the gate every request passes.

Order of the gate, as on GKE: the network (authorized networks; unauthenticated callers are
treated as coming from the controlplane's egress IP; Kubernetes service accounts call from
inside the cluster and pass), then the request counter, then staged faults, then
authentication (401), then authorization (403: IAM for GKE identities, RBAC with its
escalation checks for service accounts, see `rbac`; a caller's reviews of itself, `kubectl
auth whoami|can-i`, are answered before it, see `reviews`), then the handler. So from an
allowed source a wrong, expired or revoked bearer token is 401 Unauthorized on every path (a
bad token is not taken for an anonymous caller, who may read `/version` and the health
checks), while a source off the networks is refused (403) or dropped (`network_denial:
timeout`) whatever its token, as GKE filters by address before the apiserver sees the
request. Discovery
(`/version`, `/api`, `/apis`, `/openapi/v3`) is served here; resources by `handlers`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from aiohttp import web

from sandbox import errors
from sandbox.access import AccessPolicy
from sandbox.auth import Authenticator, Principal
from sandbox.discovery import Discovery, ServerVersion, wants_aggregated
from sandbox.faults import FaultInjector, RequestCounter
from sandbox.handlers import ResourceHandlers, error_response, json_response
from sandbox.rbac import RbacAuthorizer
from sandbox.registry import Registry
from sandbox.reviews import Reviews, is_review
from sandbox.routing import RequestInfo, resolve
from sandbox.watchstream import WatchStreamer

_log = logging.getLogger(__name__)
_PUBLIC_PATHS = frozenset({"/version", "/healthz", "/livez", "/readyz"})
MAX_BODY = 8 * 1024 * 1024
OPENAPI_V2_PROTOBUF = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"


@dataclass
class ApiServerParts:
    """Everything the API reads at request time; tests and admin endpoints change it live."""

    registry: Registry
    authenticator: Authenticator
    policy: AccessPolicy = field(default_factory=AccessPolicy)
    faults: FaultInjector = field(default_factory=FaultInjector)
    counter: RequestCounter = field(default_factory=RequestCounter)
    version: ServerVersion = field(default_factory=ServerVersion)
    bookmark_interval: float = 60.0


async def drop_connection(request: web.Request) -> web.StreamResponse:
    """Closes the TCP connection without an answer, as a dropped route or a crash would."""
    transport = request.transport
    if transport is not None:
        transport.abort()
    raise asyncio.CancelledError


class ApiServer:
    """Builds the aiohttp application serving the Kubernetes API from `ApiServerParts`."""

    def __init__(self, parts: ApiServerParts, server_address: str) -> None:
        self.parts = parts
        self._discovery = Discovery(parts.registry.catalog, server_address)
        self._rbac = RbacAuthorizer(parts.registry)
        self._reviews = Reviews(parts, self._rbac)
        self._resources = ResourceHandlers(
            parts.registry, WatchStreamer(parts.registry, bookmark_interval=parts.bookmark_interval)
        )

    def add_routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self._serve)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        parts = self.parts
        try:
            authorization = request.headers.get("Authorization")
            principal = parts.authenticator.authenticate(authorization)
            if not parts.policy.network_allows(principal):
                if parts.policy.network_denial == "timeout":
                    await asyncio.sleep(parts.policy.timeout_hold_seconds)
                    return await drop_connection(request)
                raise parts.policy.network_error(principal)
            info = resolve(parts.registry.catalog, request.method, request.path, request.query)
            parts.counter.count(info)
            rule = parts.faults.match(info)
            if rule is not None:
                if rule.delay_seconds:
                    await asyncio.sleep(rule.delay_seconds)
                if rule.drop:
                    return await drop_connection(request)
                if rule.status is not None:
                    raise errors.injected(rule.status, rule.message, rule.retry_after_seconds)
            if principal is None and (
                request.path not in _PUBLIC_PATHS
                or parts.authenticator.presents_token(authorization)
            ):
                raise errors.unauthorized()
            if principal is not None:
                principal = self._rbac.impersonate(principal, request.headers)
            if principal is not None and is_review(info):
                return await self._reviews.answer(request, info, principal)
            if principal is not None and principal.in_cluster:
                self._rbac.authorize(principal, info, request.query)
                await self._rbac.check_write(principal, info, request)
            elif principal is not None:
                parts.policy.authorize(principal, info)
            if info.is_resource_request:
                return await self._resources.handle(request, info)
            return self._non_resource(request, info, principal)
        except errors.ApiError as error:
            return error_response(error)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as error:  # the apiserver answers 500 rather than hanging up
            _log.exception("internal error serving %s %s", request.method, request.path)
            return error_response(
                errors.ApiError(
                    500,
                    "InternalError",
                    f"Internal error occurred: {error}",
                    {"causes": [{"message": str(error)}]},
                )
            )

    def _non_resource(
        self, request: web.Request, info: RequestInfo, principal: Principal | None
    ) -> web.StreamResponse:
        path = request.path.rstrip("/") or "/"
        accept = request.headers.get("Accept", "")
        if request.method not in ("GET", "HEAD"):
            raise errors.method_not_allowed()
        if path == "/version":
            return json_response(self.parts.version.document())
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok", content_type="text/plain")
        if path == "/openapi/v2":
            return self._openapi_v2(accept)
        if path in ("/api", "/apis"):
            aggregated = wants_aggregated(accept)
            if aggregated is not None:
                document = self._discovery.aggregated(path == "/api", aggregated)
                return json_response(document, content_type=aggregated)
            if path == "/api":
                return json_response(self._discovery.api_versions())
            return json_response(self._discovery.api_group_list())
        segments = path.strip("/").split("/")
        if segments[0] == "api" and len(segments) == 2:
            found = self._discovery.resource_list("", segments[1])
        elif segments[0] == "apis" and len(segments) == 2:
            found = self._discovery.api_group(segments[1])
        elif segments[0] == "apis" and len(segments) == 3:
            found = self._discovery.resource_list(segments[1], segments[2])
        elif path == "/openapi/v3":
            found = self._discovery.openapi_root()
        elif segments[:2] == ["openapi", "v3"]:
            found = self._openapi(segments[2:])
        else:
            found = None
        if found is None:
            raise errors.path_not_found()
        return json_response(found)

    def _openapi_v2(self, accept: str) -> web.Response:
        # An empty document: kubectl 1.27/1.28 fetch it (as protobuf) before `apply` and skip
        # client-side validation and OpenAPI-driven patching for types it does not describe.
        if "protobuf" in accept:
            return web.Response(body=b"", content_type=OPENAPI_V2_PROTOBUF)
        return json_response(
            {
                "swagger": "2.0",
                "info": {"title": "Kubernetes", "version": self.parts.version.git_version},
                "paths": {},
                "definitions": {},
            }
        )

    def _openapi(self, segments: list[str]) -> dict[str, object] | None:
        if segments[:1] == ["api"] and len(segments) == 2:
            group, version = "", segments[1]
        elif segments[:1] == ["apis"] and len(segments) == 3:
            group, version = segments[1], segments[2]
        else:
            return None
        if not self._discovery.has_group_version(group, version):
            return None
        return self._discovery.openapi_group_version(group, version)
