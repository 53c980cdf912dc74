"""The Google Cloud emulator's HTTPS server: the gate every call passes, and its admin routes.

Order of the gate: staged faults (`/_gcp/faults`), then authentication (401 UNAUTHENTICATED
without a token the sandbox issued or a JWT a known key signed), then the project (another
project's resources are 403, "or it may not exist"), then IAM (403 PERMISSION_DENIED, or
compute's `forbidden`, unless one of the caller's roles grants the route's permission; the
sandbox's static-token users, the admin among them, pass), then the handler. Errors are
Google's JSON error bodies in the dialect of the API called (`errors`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from sandbox.access import AccessPolicy
from sandbox.admin import Handler, admin_only, read_json
from sandbox.auth import Authenticator, Principal, TokenError
from sandbox.errors import ApiError
from sandbox.gcp import errors
from sandbox.gcp.artifacts import ArtifactRegistry
from sandbox.gcp.calls import Call, Json, Route, rfc3339
from sandbox.gcp.compute import Compute
from sandbox.gcp.container import ClusterSite, Container
from sandbox.gcp.faults import GcpFaults
from sandbox.gcp.iam import Iam, KeyVault
from sandbox.gcp.policy import ProjectPolicy
from sandbox.gcp.roles import any_grants
from sandbox.gcp.world import GcpWorld
from sandbox.handlers import error_response, json_response
from sandbox.pki import CertificateAuthority
from sandbox.server import LOOPBACK, _bind, _ssl_context

_log = logging.getLogger(__name__)
MAX_BODY = 1024 * 1024
_SHARED_OPERATIONS = "/v1/projects/{project}/locations/{location}/operations/{operation}"


@dataclass
class GcpSite:
    """The sandbox parts the emulator serves from and shares with the Kubernetes API.

    Attributes:
        authenticator: who a bearer token is; mints and trusts keys.
        access: authorized networks and role bindings.
        ca: the sandbox CA and serving certificate (the same trust as the Kubernetes API).
        admin_token: the bearer token of `/_gcp/...`.
        cluster: what the cluster's description is read from.
        state_file: where the project's resources are kept across restarts; None: nowhere.
        vault: keeps the keys IAM creates; None: they are trusted until the process ends.
    """

    authenticator: Authenticator
    access: AccessPolicy
    ca: CertificateAuthority
    admin_token: str
    cluster: ClusterSite
    state_file: Path | None = None
    vault: KeyVault | None = None


class GcpEmulator:
    """The emulated project's APIs on one HTTPS port; `close()` stops it."""

    def __init__(self, site: GcpSite, port: int, started: str) -> None:
        self.port = port
        self.url = f"https://{LOOPBACK}:{port}"
        self.site = site
        self.world = GcpWorld(site.cluster.info.project)
        self.world.load(site.state_file)
        self.faults = GcpFaults()
        self.requests: Counter[str] = Counter()
        self.iam = Iam(
            self.world, site.authenticator, site.access, self.token_uri, site.vault, self.save
        )
        self.policy = ProjectPolicy(self.world, site.access, self.save)
        self.container = Container(self.world, site.access, site.cluster, self.save, started)
        self.compute = Compute(self.world, self.save)
        self.artifacts = ArtifactRegistry(self.world, self.save)
        self.container.restore()
        self.policy.restore()
        self._runner: web.AppRunner | None = None

    @property
    def token_uri(self) -> str:
        return f"{self.url}/token"

    def save(self) -> None:
        self.world.save(self.site.state_file)

    def routes(self) -> list[Route]:
        shared = Route(
            "GET",
            _SHARED_OPERATIONS,
            self._operation_permission,
            self._shared_operation,
            "container.googleapis.com",
        )
        return [
            *self.container.routes(),
            shared,
            *self.artifacts.routes(),
            *self.iam.routes(),
            *self.policy.routes(),
            *self.compute.routes(),
        ]

    def application(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/token", self._token)
        for method, path, handler in (
            ("GET", "/_gcp/state", self._state),
            ("GET", "/_gcp/faults", self._list_faults),
            ("POST", "/_gcp/faults", self._add_fault),
            ("DELETE", "/_gcp/faults", self._clear_faults),
            ("DELETE", "/_gcp/faults/{id}", self._remove_fault),
        ):
            app.router.add_route(method, path, admin_only(self.site.admin_token, handler))
        for route in self.routes():
            app.router.add_route(route.method, route.path, self._gate(route))
        app.router.add_route("*", "/{tail:.*}", self._unknown)
        return app

    def describe(self) -> Json:
        world = self.world
        return {
            "url": self.url,
            "project": world.project,
            "projectNumber": world.project_number,
            "cluster": self.container.cluster(self.url),
            "iamPolicy": self.policy.policy(),
            "serviceAccounts": [
                {"email": a.email, "uniqueId": a.unique_id, "displayName": a.display_name}
                for a in world.service_accounts.values()
            ],
            "keys": [{"keyId": k.key_id, "email": k.email} for k in world.keys.values()],
            "firewalls": list(world.firewalls.values()),
            "repositories": list(world.repositories.values()),
            "operations": len(world.operations),
            "faults": [r.describe() for r in self.faults.rules()],
            "requests": dict(sorted(self.requests.items())),
        }

    async def serve_on(self, sock: socket.socket) -> None:
        """Serves HTTPS on a bound socket until `close()`."""
        runner = web.AppRunner(self.application(), handler_cancellation=True, access_log=None)
        await runner.setup()
        try:
            await web.SockSite(runner, sock, ssl_context=_ssl_context(self.site.ca)).start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner

    async def close(self) -> None:
        self.save()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- the gate ----------------------------------------------------------------------------

    def _gate(self, route: Route) -> Handler:
        async def serve(request: web.Request) -> web.StreamResponse:
            self.requests[f"{route.method} {route.path}"] += 1
            try:
                call = await self._admit(route, request)
                return _answer(route.handler(call))
            except errors.GoogleApiError as error:
                return _error(error, route)
            except (ValueError, KeyError, TypeError) as error:
                return _error(errors.invalid_argument(f"Invalid request: {error}"), route)
            except (asyncio.CancelledError, ConnectionResetError):
                raise
            except Exception:  # Google answers 500 rather than hanging up
                _log.exception("internal error serving %s %s", request.method, request.path)
                return _error(errors.GoogleApiError(500, "Internal error encountered."), route)

        return serve

    async def _admit(self, route: Route, request: web.Request) -> Call:
        rule = self.faults.match(request.method, request.path)
        if rule is not None:
            if rule.delay_seconds:
                await asyncio.sleep(rule.delay_seconds)
            raise errors.injected(rule.status, rule.message, rule.retry_after_seconds)
        principal = self._authenticate(request.headers.get("Authorization"))
        if principal is None:
            raise errors.unauthenticated()
        params = dict(request.match_info)
        ours = params.get("project", self.world.project) in self._project_names
        if ours and "project" in params:
            params["project"] = self.world.project
        raw = await request.read()
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise errors.invalid_argument("Invalid JSON payload received.") from None
        if not isinstance(body, dict):
            raise errors.invalid_argument("Invalid JSON payload received: not an object.")
        call = Call(principal, params, request.query, body, self.url, request.path)
        permission = route.permission_for(call)
        # Another project's resources: Google does not say whether they exist.
        if not ours or not self._allowed(principal, permission):
            resource = route.resource_for(request.path)
            if route.dialect == "compute":
                raise errors.compute_forbidden(permission, resource)
            raise errors.permission_denied(permission, resource, route.service)
        return call

    def _authenticate(self, authorization: str | None) -> Principal | None:
        principal = self.site.authenticator.authenticate(authorization)
        if principal is not None or not authorization:
            return principal
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.iam.verify_jwt(token.strip())

    @property
    def _project_names(self) -> tuple[str, ...]:
        return (self.world.project, self.world.project_number, "-")

    def _allowed(self, principal: Principal, permission: str) -> bool:
        if principal.superuser:
            return True
        return any_grants(self.site.access.role_bindings.get(principal.email or "", ()), permission)

    # -- the operations path Container and Artifact Registry share ---------------------------

    def _operation_name(self, call: Call) -> str:
        p = call.params
        return f"projects/{p['project']}/locations/{p['location']}/operations/{p['operation']}"

    def _operation_permission(self, call: Call) -> str:
        found = self.world.operation(self._operation_name(call))
        if found is not None and found[0] == "artifactregistry":
            return "artifactregistry.repositories.get"
        return "container.operations.get"

    def _shared_operation(self, call: Call) -> Json:
        found = self.world.operation(self._operation_name(call))
        if found is None:
            raise errors.not_found(f"Operation {call.params['operation']} not found.")
        return found[1]

    # -- other routes ------------------------------------------------------------------------

    async def _token(self, request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        try:
            body = self.site.authenticator.exchange(form)
        except TokenError as error:
            return web.json_response(error.body(), status=400)
        return web.json_response(body, headers={"Cache-Control": "no-store"})

    async def _unknown(self, request: web.Request) -> web.Response:
        error = errors.not_found(f"The requested URL {request.path} was not found on this server.")
        return web.json_response(error.body(), status=404)

    async def _state(self, request: web.Request) -> web.Response:
        return json_response(self.describe())

    async def _list_faults(self, request: web.Request) -> web.Response:
        return json_response({"rules": [r.describe() for r in self.faults.rules()]})

    async def _add_fault(self, request: web.Request) -> web.Response:
        rule = self.faults.add(await read_json(request))
        return json_response(rule.describe(), 201)

    async def _clear_faults(self, request: web.Request) -> web.Response:
        self.faults.clear()
        return json_response({"rules": []})

    async def _remove_fault(self, request: web.Request) -> web.Response:
        if not self.faults.remove(int(request.match_info["id"])):
            return error_response(ApiError(404, "NotFound", "no such fault rule"))
        return json_response({"rules": [r.describe() for r in self.faults.rules()]})


def _answer(body: Json) -> web.Response:
    return web.json_response(body)


def _error(error: errors.GoogleApiError, route: Route) -> web.Response:
    return web.json_response(error.body(route.dialect), status=error.code, headers=error.headers)


async def start_gcp(site: GcpSite, port: int = 0) -> GcpEmulator:
    """Starts the emulator on 127.0.0.1:`port` (0: a free one); OSError if it is taken."""
    sock = _bind(port)
    emulator = GcpEmulator(site, sock.getsockname()[1], rfc3339())
    await emulator.serve_on(sock)
    return emulator
