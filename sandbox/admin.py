"""Endpoints beside the Kubernetes API: Google's OAuth2 token endpoint and the sandbox's admin API.

`POST /token` is where google-auth exchanges a service-account JWT for an access token.

`/_sandbox/...` (admin token required) changes the simulated world at runtime:

| method and path | does |
| - | - |
| `GET /_sandbox/faults` | list fault rules with their `fired` counts |
| `POST /_sandbox/faults` | add a rule (`faults.FaultInjector.add`), returns it with its `id` |
| `DELETE /_sandbox/faults[/<id>]` | remove all rules, or one |
| `GET /_sandbox/requests` | API calls so far by verb and resource (`{"total", "counts"}`) |
| `DELETE /_sandbox/requests` | reset the counter |
| `GET /_sandbox/access` | egress IP, authorized networks, denial mode, IAM role bindings |
| `PATCH /_sandbox/access` | change any of those (same field names) |
| `POST /_sandbox/service-account-keys` | mint a key (`project`, `account`, `roles`?) |
| `POST /_sandbox/logs/<ns>/<pod>/<container>` | append to a container's log (`?finish=true`) |
| `POST /_sandbox/compact` | drop watch history and list snapshots: older rvs, tokens 410 |
| `POST /_sandbox/watches/drop` | end every open watch (reset; `{"graceful": true}`: clean) |
| `POST /_sandbox/tokens/expire` | every access token from `/token` expires now: 401 |

`compact` is an etcd compaction at the current revision: a watch from any earlier
resourceVersion and every outstanding continue token get 410 Expired (answers
`{"resourceVersion"}`). `watches/drop` is an apiserver restart as its watchers see it: each
open watch connection is reset mid-stream, or with `{"graceful": true}` its stream ends
cleanly; in-process controllers re-watch too (answers `{"dropped": n}`). `tokens/expire` makes
every issued access token invalid, so a client's next call is 401 until it exchanges its key
again (answers `{"expired": n}`, the tokens that were still valid).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from sandbox import errors
from sandbox.apiserver import ApiServerParts
from sandbox.auth import TokenError
from sandbox.handlers import error_response, json_response


class AdminApi:
    """The `/_sandbox` routes and `/token`, over the same parts the API serves from."""

    def __init__(self, parts: ApiServerParts, admin_token: str) -> None:
        self._parts = parts
        self._token = admin_token

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/token", self._token_endpoint)
        for method, path, handler in (
            ("GET", "/_sandbox/faults", self._list_faults),
            ("POST", "/_sandbox/faults", self._add_fault),
            ("DELETE", "/_sandbox/faults", self._clear_faults),
            ("DELETE", "/_sandbox/faults/{id}", self._remove_fault),
            ("GET", "/_sandbox/requests", self._requests),
            ("DELETE", "/_sandbox/requests", self._reset_requests),
            ("GET", "/_sandbox/access", self._access),
            ("PATCH", "/_sandbox/access", self._update_access),
            ("PUT", "/_sandbox/access", self._update_access),
            ("POST", "/_sandbox/service-account-keys", self._mint_key),
            ("POST", "/_sandbox/logs/{namespace}/{pod}/{container}", self._write_log),
            ("POST", "/_sandbox/compact", self._compact),
            ("POST", "/_sandbox/watches/drop", self._drop_watches),
            ("POST", "/_sandbox/tokens/expire", self._expire_tokens),
        ):
            app.router.add_route(method, path, admin_only(self._token, handler))

    async def _token_endpoint(self, request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        try:
            body = self._parts.authenticator.exchange(form)
        except TokenError as error:
            return web.json_response(error.body(), status=400)
        return web.json_response(body, headers={"Cache-Control": "no-store"})

    async def _list_faults(self, request: web.Request) -> web.Response:
        return json_response({"rules": [r.describe() for r in self._parts.faults.rules()]})

    async def _add_fault(self, request: web.Request) -> web.Response:
        rule = self._parts.faults.add(await _json(request))
        return json_response(rule.describe(), 201)

    async def _clear_faults(self, request: web.Request) -> web.Response:
        self._parts.faults.clear()
        return json_response({"rules": []})

    async def _remove_fault(self, request: web.Request) -> web.Response:
        if not self._parts.faults.remove(int(request.match_info["id"])):
            return error_response(errors.ApiError(404, "NotFound", "no such fault rule"))
        return json_response({"rules": [r.describe() for r in self._parts.faults.rules()]})

    async def _requests(self, request: web.Request) -> web.Response:
        return json_response(self._parts.counter.describe())

    async def _reset_requests(self, request: web.Request) -> web.Response:
        self._parts.counter.reset()
        return json_response(self._parts.counter.describe())

    async def _access(self, request: web.Request) -> web.Response:
        return json_response(self._parts.policy.describe())

    async def _update_access(self, request: web.Request) -> web.Response:
        self._parts.policy.update(await _json(request))
        return json_response(self._parts.policy.describe())

    async def _mint_key(self, request: web.Request) -> web.Response:
        spec = await _json(request)
        key = self._parts.authenticator.mint_key(
            project=str(spec["project"]), account=str(spec["account"])
        )
        for role in spec.get("roles") or []:
            self._parts.policy.grant(key["client_email"], str(role))
        return json_response(key, 201)

    async def _compact(self, request: web.Request) -> web.Response:
        store = self._parts.registry.store
        store.compact()
        return json_response({"resourceVersion": str(store.resource_version)})

    async def _drop_watches(self, request: web.Request) -> web.Response:
        graceful = (await _json(request)).get("graceful", False)
        if not isinstance(graceful, bool):
            raise ValueError('expected {"graceful": true|false}')
        dropped = self._parts.registry.store.drop_watches(reset=not graceful)
        return json_response({"dropped": dropped})

    async def _expire_tokens(self, request: web.Request) -> web.Response:
        return json_response({"expired": self._parts.authenticator.expire_tokens()})

    async def _write_log(self, request: web.Request) -> web.Response:
        info = request.match_info
        logs = self._parts.registry.logs
        logs.write(info["namespace"], info["pod"], info["container"], await request.text())
        if request.query.get("finish", "").lower() == "true":
            logs.finish(info["namespace"], info["pod"], info["container"])
        return json_response({})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def admin_only(token: str, handler: Handler) -> Handler:
    """Wraps an admin handler: the admin bearer token or 401; bad input is a 400 Status."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        supplied = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(supplied.encode(), token.encode()):
            return error_response(errors.unauthorized())
        try:
            return await handler(request)
        except errors.ApiError as error:
            return error_response(error)
        except (ValueError, KeyError, TypeError) as error:
            return error_response(errors.bad_request(str(error)))

    return guarded


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object (empty body: `{}`)."""
    return await _json(request)


async def _json(request: web.Request) -> dict[str, Any]:
    body = json.loads(await request.read() or b"{}")
    if not isinstance(body, dict):
        raise ValueError("expected a JSON object")
    return body
