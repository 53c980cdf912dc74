"""The dashboard at `/ui/` of the endpoints' HTTP front (each controlplane replica, TLS as the
gateway): `Dashboard.handle` answers every request under `/ui/`.

Pages: sign-in and sign-out; tasks (filters, pages, live) and a task's page (spec, timeline, why
it waits, its logs streamed live, cancel, the CLI's commands); pools and their machines;
endpoints; boxes (each published port a link to its URL); workspaces (the operator's: quotas,
usage, tokens' labels and last use, create and revoke); with `temporalUiUrl`, each task,
endpoint, workspace and box links to its workflow in the Temporal UI. The live parts are pushed:
one server-sent event stream per open page (`/ui/events?src=<part>`) renders its part again
every `live_every_s` and sends it only when it changed; a task's logs are the gateway's
StreamTaskLogs, relayed as events.

Every call goes through the gateway's services with the signed-in token
(`levers9.dashboard.calls`); their refusals become pages (404 for a task the caller may not see,
as for a missing one; 403; 400 naming the field), never a stack trace.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import codecs
import hashlib
import json
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from urllib.parse import parse_qsl, urlsplit

import grpc
from aiohttp import web
from multidict import MultiMapping
from pydantic import SecretStr

from levers9.core.workspaces import workspace_workflow_id
from levers9.dashboard import html, views
from levers9.dashboard.calls import Calls, Refused, Services
from levers9.dashboard.samples import PoolReads, PoolSamples
from levers9.dashboard.sessions import (
    PRE_COOKIE,
    SESSION_COOKIE,
    Session,
    Sessions,
    random_cookie,
)
from levers9.gateway.server import Gateway
from levers9.logs import get_logger
from levers9.proto import gateway_pb2, worker_pb2

log = get_logger(__name__)

PREFIX = "/ui"
LIST_PAGE = 100
"""Task records read per page of the list (the gateway's page; filters apply within it)."""
LIVE_EVERY_S = 1.0
KEEPALIVE_S = 15.0
RENDERED_KEPT = 256
STATIC = {
    "htmx.min.js": "text/javascript",
    "dashboard.js": "text/javascript",
    "style.css": "text/css",
}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
HTTP_STATUS = {
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.FAILED_PRECONDITION: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.UNIMPLEMENTED: 501,
}


class BadForm(Exception):
    """A form field the page cannot use; the message names the field and the fix."""


@dataclass(frozen=True)
class Me:
    """The signed-in user, as the gateway's WhoAmI says."""

    session: Session
    who: gateway_pb2.WhoAmIResponse
    csrf: str
    calls: Calls

    @property
    def operator(self) -> bool:
        return self.who.operator

    @property
    def label(self) -> str:
        if self.who.operator:
            return "operator"
        return f"workspace {self.who.workspace} ({self.who.label or self.who.token_id})"


Query = MultiMapping[str]


class Dashboard:
    def __init__(
        self,
        services: Services,
        secret: SecretStr,
        *,
        endpoints_url: str = "",
        temporal: views.Temporal = views.NO_TEMPORAL,
        live_every_s: float = LIVE_EVERY_S,
        samples: PoolSamples | None = None,
    ) -> None:
        self._services = services
        self.samples = samples
        """Each pool's cards in use and tasks waiting, sampled in the background while the
        dashboard runs (`async with dashboard`); None: no chart."""
        self._temporal = temporal
        """Where the Temporal UI shows each task's, endpoint's, workspace's and box's
        workflow (no links without `temporalUiUrl`)."""
        self._sessions = Sessions(secret.get_secret_value())
        self._endpoints_url = endpoints_url.rstrip("/")
        self._every = live_every_s
        self.live_streams = 0
        self._rendered: dict[bytes, str] = {}
        """Task rows rendered, by a digest of the page of records and the filters they were
        rendered from: an open list's pushes re-read its records each second but render them
        again only when they changed."""
        """Server-sent event streams open now (the benchmarks read it)."""

    @classmethod
    def of(
        cls,
        gateway: Gateway,
        secret: SecretStr,
        endpoints_url: str = "",
        temporal: views.Temporal = views.NO_TEMPORAL,
        pools: PoolReads | None = None,
    ) -> Dashboard:
        """The dashboard over `gateway`'s services (worker_main serves it at `/ui/`), its
        chart sampled from `pools` (the records the Pools service reads)."""
        services = Services(
            gateway.tasks_service,
            gateway.pools_service,
            gateway.endpoints_service,
            gateway.workspaces_service,
            gateway.boxes_service,
        )
        samples = PoolSamples(pools) if pools is not None else None
        return cls(
            services, secret, endpoints_url=endpoints_url, temporal=temporal, samples=samples
        )

    async def __aenter__(self) -> Dashboard:
        """Starts sampling the pools for the chart (until the block ends)."""
        if self.samples is not None:
            await self.samples.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.samples is not None:
            await self.samples.__aexit__(*exc)

    # -- entry --------------------------------------------------------------------------------

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await self._route(request)
        except BadForm as exc:
            return self._page(request, "Not done", html.problem(str(exc)), status=400)
        except Refused as refused:
            return self._refused(request, refused)
        except Exception as exc:
            log.exception("dashboard request failed", path=request.path, error=type(exc).__name__)
            body = html.problem(
                f"The dashboard could not answer ({type(exc).__name__}); the controlplane's log"
                " says more. Reload to try again."
            )
            return self._page(request, "Error", body, status=500)

    async def _route(self, request: web.BaseRequest) -> web.StreamResponse:
        parts = [p for p in request.path[len(PREFIX) :].split("/") if p]
        method = request.method
        if not parts:
            return _redirect("/ui/tasks")
        if parts[0] == "static" and len(parts) == 2 and method in ("GET", "HEAD"):
            return self._static(parts[1])
        if parts == ["sign-in"]:
            if method == "POST":
                return await self._sign_in(request)
            return self._sign_in_page(request)
        session = self._sessions.open(request.cookies.get(SESSION_COOKIE))
        if session is None:
            if parts[0] == "events" or parts[-1] == "stream":
                return web.Response(status=401, text="signed out: sign in again at /ui/\n")
            return _redirect("/ui/sign-in")
        if method == "POST":
            form = await request.post()
            given = form.get("csrf")
            if not self._sessions.csrf_matches(
                session.cookie, given if isinstance(given, str) else None
            ):
                return self._forbidden_form(request)
        else:
            form = None
        me = await self._me(session)
        return await self._signed_in(request, me, parts, form)

    async def _me(self, session: Session) -> Me:
        calls = Calls(self._services, session.token)
        who = await calls.whoami()
        return Me(session, who, self._sessions.csrf(session.cookie), calls)

    async def _signed_in(
        self,
        request: web.BaseRequest,
        me: Me,
        parts: list[str],
        form: MultiMapping[str | bytes | bytearray | web.FileField] | None,
    ) -> web.StreamResponse:
        method, query = request.method, request.query
        if form is not None:  # a POST, its CSRF token checked
            fields = {k: v for k, v in form.items() if isinstance(v, str)}
            return await self._post(request, me, parts, fields)
        if method not in ("GET", "HEAD"):
            return web.Response(status=405, text="GET or POST\n")
        if parts == ["events"]:
            return await self._events(request, me)
        if parts[0] == "tasks" and len(parts) == 3 and parts[2] == "logs":
            return await self._logs_download(me, parts[1])
        if parts[0] == "tasks" and len(parts) == 4 and parts[2:] == ["logs", "stream"]:
            return await self._logs_stream(request, me, parts[1])
        if parts == ["tasks"]:
            src = html.path("tasks", "rows") + _query_string(query)
            body = views.task_filters(
                query.get("state", ""),
                query.get("pool", ""),
                query.get("q", ""),
                query.get("workspace", ""),
                me.operator,
            )
            body += html.live(src, await self._fragment(me, src), "task-list")
            return self._page(request, "Tasks", body, me, "tasks")
        if parts[0] == "tasks" and len(parts) == 2:
            return await self._task_page(request, me, parts[1])
        if parts == ["pools"]:
            src = html.path("pools", "live")
            body = html.live(src, await self._fragment(me, src), "pools")
            return self._page(request, "Pools and machines", body, me, "pools")
        if parts == ["endpoints"]:
            src = html.path("endpoints", "live")
            body = html.live(src, await self._fragment(me, src), "endpoints-live")
            return self._page(request, "Endpoints", body, me, "endpoints")
        if parts == ["boxes"]:
            src = html.path("boxes", "live")
            body = html.live(src, await self._fragment(me, src), "boxes-live")
            return self._page(request, "Boxes", body, me, "boxes")
        if parts == ["workspaces"]:
            return self._page(request, "Workspaces", await self._workspaces(me), me, "workspaces")
        return self._page(
            request, "Not found", html.problem(f"no page {request.path}"), me, status=404
        )

    # -- sign-in ------------------------------------------------------------------------------

    def _sign_in_page(
        self, request: web.BaseRequest, error: str = "", status: int = 200
    ) -> web.Response:
        pre = request.cookies.get(PRE_COOKIE) or random_cookie()
        response = _html(html.sign_in(self._sessions.csrf(pre), error), status)
        self._cookie(request, response, PRE_COOKIE, pre, max_age=3600, path="/ui/sign-in")
        return response

    async def _sign_in(self, request: web.BaseRequest) -> web.StreamResponse:
        form = await request.post()
        given, token = form.get("csrf"), form.get("token")
        if not self._sessions.csrf_matches(
            request.cookies.get(PRE_COOKIE), given if isinstance(given, str) else None
        ):
            return self._forbidden_form(request)
        token = token.strip() if isinstance(token, str) else ""
        if not token:
            return self._sign_in_page(request, "token: paste a workspace's or the operator's", 400)
        try:
            who = await Calls(self._services, token).whoami()
        except Refused as refused:
            status = 401 if refused.code == grpc.StatusCode.UNAUTHENTICATED else 503
            return self._sign_in_page(request, f"not signed in: {refused.details}", status)
        session = self._sessions.seal(token)
        log.info(
            "dashboard sign-in",
            workspace=who.workspace or None,
            operator=who.operator,
            token_id=who.token_id or None,
        )
        response = _redirect("/ui/tasks")
        self._cookie(
            request, response, SESSION_COOKIE, session.cookie, max_age=int(self._sessions.ttl_s)
        )
        return response

    def _sign_out(self, request: web.BaseRequest) -> web.StreamResponse:
        response = _redirect("/ui/sign-in")
        self._cookie(request, response, SESSION_COOKIE, "", max_age=0)
        return response

    @staticmethod
    def _cookie(
        request: web.BaseRequest,
        response: web.StreamResponse,
        name: str,
        value: str,
        *,
        max_age: int,
        path: str = "/ui/",
    ) -> None:
        response.set_cookie(
            name,
            value,
            max_age=max_age,
            path=path,
            httponly=True,
            secure=request.secure,
            samesite="Strict",
        )

    def _forbidden_form(self, request: web.BaseRequest) -> web.Response:
        log.info("dashboard form refused", path=request.path, reason="csrf")
        body = html.problem(
            "This form carries no valid CSRF token (it did not come from this dashboard's page,"
            " or the session changed): reload the page and send it again."
        )
        return _html(html.page("Refused", body), 403)

    # -- POSTs --------------------------------------------------------------------------------

    async def _post(
        self, request: web.BaseRequest, me: Me, parts: list[str], form: dict[str, str]
    ) -> web.StreamResponse:
        if parts == ["sign-out"]:
            return self._sign_out(request)
        if parts[0] == "tasks" and len(parts) == 3 and parts[2] == "cancel":
            await me.calls.cancel(parts[1], "cancelled from the dashboard")
            return _redirect(html.path("tasks", parts[1]))
        if parts == ["workspaces"]:
            name = form.get("name", "").strip()
            quota = _count(form, "gpu_quota", "GPU quota")
            queued = _count(form, "max_queued", "max queued")
            await me.calls.create_workspace(name, quota, queued)
            return _redirect("/ui/workspaces")
        if parts[0] == "workspaces" and len(parts) == 3 and parts[2] == "tokens":
            days = _count(form, "expires_days", "expires (days)") or 0
            made = await me.calls.create_token(parts[1], form.get("label", ""), days * 86400)
            body = (
                f"<p>The token of workspace <b>{html.esc(parts[1])}</b>, label"
                f" <b>{html.esc(made.record.label)}</b> (id {html.esc(made.record.token_id)}),"
                " shown this once: the controlplane keeps only its hash.</p>"
                f'<pre class="token" data-testid="new-token">{html.esc(made.token)}</pre>'
                '<p><a href="/ui/workspaces">Back to the workspaces</a></p>'
            )
            return self._page(request, "New token", body, me, "workspaces")
        if (
            parts[0] == "workspaces"
            and len(parts) == 5
            and parts[2:]
            == [
                "tokens",
                parts[3],
                "revoke",
            ]
        ):
            await me.calls.revoke_token(parts[1], parts[3])
            return _redirect("/ui/workspaces")
        return self._page(
            request, "Not found", html.problem(f"no form {request.path}"), me, status=404
        )

    # -- pages --------------------------------------------------------------------------------

    async def _task_page(self, request: web.BaseRequest, me: Me, task_id: str) -> web.Response:
        record = await me.calls.task(task_id)
        src = html.path("tasks", task_id, "status")
        logs = html.path("tasks", task_id, "logs")
        tail = (
            f"<details><summary>The record's tail</summary><pre>{html.esc(record.log_tail)}"
            "</pre></details>"
            if record.log_tail
            else ""
        )
        body = (
            '<div class="columns"><section><h2>Spec</h2>'
            f"{views.task_spec(record, self._temporal)}"
            f"<h2>Commands</h2>{views.cli_commands(record)}</section>"
            "<section><h2>Status</h2>"
            f"{html.live(src, views.task_status(record, me.csrf), 'status')}"
            "</section></div>"
            f'<h2>Logs <a class="small" href="{html.esc(logs)}" download>download</a>'
            ' <label class="small"><input type="checkbox" id="follow" checked> follow</label></h2>'
            f'<pre class="logs" data-logs="{html.esc(logs + "/stream")}" data-testid="logs">'
            f"</pre>{tail}"
        )
        return self._page(request, f"Task {task_id}", body, me, "tasks")

    async def _workspaces(self, me: Me) -> str:
        shown = ""
        for ws in await me.calls.workspaces():
            got = await me.calls.workspace(ws.name)
            held = sum(p.usage.gpus for p in got.pools)
            waiting = sum(p.usage.waiting for p in got.pools)
            quota = str(ws.gpu_quota) if ws.HasField("gpu_quota") else "none"
            workflow = self._temporal.link(workspace_workflow_id(ws.name))
            queued = str(ws.max_queued) if ws.HasField("max_queued") else "no bound"
            tokens = await me.calls.tokens(ws.name)
            new_token = (
                '<form method="post" class="inline"'
                f' action="{html.esc(html.path("workspaces", ws.name, "tokens"))}">'
                f'{html.csrf_field(me.csrf)}<input name="label" placeholder="label">'
                '<input name="expires_days" placeholder="expires in days (empty: never)">'
                '<button type="submit">Create token</button></form>'
            )
            shown += (
                f'<section class="workspace" data-testid="workspace-{html.esc(ws.name)}">'
                f"<h2>{html.esc(ws.name)}</h2><p>GPU quota {html.esc(quota)}, holds {held},"
                f" {waiting} waiting, {ws.running_tasks} task(s) not ended; max queued"
                f" {html.esc(queued)}; default pool {html.esc(ws.default_pool or '-')}"
                f"{'; workflow ' + workflow if workflow else ''}</p>"
                f"{views.token_rows(ws.name, tokens, me.csrf)}{new_token}</section>"
            )
        create = (
            '<h2>New workspace</h2><form method="post" action="/ui/workspaces" class="inline">'
            f'{html.csrf_field(me.csrf)}<input name="name" placeholder="name" required>'
            '<input name="gpu_quota" placeholder="GPU quota (empty: none)">'
            '<input name="max_queued" placeholder="max queued (empty: no bound)">'
            '<button type="submit">Create workspace</button></form>'
        )
        return (shown or html.problem("No workspace yet.")) + create

    # -- live parts ---------------------------------------------------------------------------

    async def _fragment(self, me: Me, src: str) -> str:
        """The HTML of the live part `src` (a path under /ui/ with its query)."""
        split = urlsplit(src)
        parts = [p for p in split.path[len(PREFIX) :].split("/") if p]
        query: dict[str, str] = dict(parse_qsl(split.query))
        if parts == ["tasks", "rows"]:
            return await self._task_rows(me, query)
        if len(parts) == 3 and parts[0] == "tasks" and parts[2] == "status":
            return views.task_status(await me.calls.task(parts[1]), me.csrf)
        if parts == ["pools", "live"]:
            return await self._pools(me)
        if parts == ["endpoints", "live"]:
            return views.endpoint_rows(
                await me.calls.endpoints(), self._endpoints_url, self._temporal
            )
        if parts == ["boxes", "live"]:
            return views.box_rows(
                await me.calls.boxes(), self._endpoints_url, me.operator, self._temporal
            )
        raise BadForm(f"src: no live part {src}")

    async def _task_rows(self, me: Me, query: dict[str, str]) -> str:
        state, pool, text = query.get("state", ""), query.get("pool", ""), query.get("q", "")
        workspace = query.get("workspace", "") if me.operator else ""
        try:
            page_token = base64.urlsafe_b64decode(query.get("page", "").encode())
        except (binascii.Error, ValueError):
            raise BadForm("page: not a page this list gave; list again from the first") from None
        answer = await me.calls.list_tasks(pool, LIST_PAGE, page_token)
        key = hashlib.blake2b(answer.SerializeToString(deterministic=True), digest_size=16)
        key.update(repr((state, pool, text, workspace, me.operator)).encode())
        rendered = self._rendered.get(key.digest())
        if rendered is not None:  # the same records, filtered alike: the same rows
            return rendered
        needle = text.lower()
        shown = [
            r
            for r in answer.records
            if (not state or r.state == state)
            and (not workspace or r.workspace == workspace)
            and (not needle or needle in _haystack(r))
        ]
        shown.sort(key=lambda r: (r.created_at.seconds, r.created_at.nanos), reverse=True)
        next_page = ""
        if answer.next_page_token:
            token = base64.urlsafe_b64encode(answer.next_page_token).decode()
            kept = {"state": state, "pool": pool, "q": text, "workspace": workspace}
            next_page = html.path("tasks", **kept, page=token)
        rendered = views.task_rows(shown, me.operator, next_page)
        if len(self._rendered) >= RENDERED_KEPT:
            self._rendered.clear()
        self._rendered[key.digest()] = rendered
        return rendered

    async def _pools(self, me: Me) -> str:
        shown = ""
        machines = await me.calls.machines()
        for pool in await me.calls.pools():
            try:
                got = await me.calls.pool(pool.name)
            except Refused:
                got = None
            shown += views.pool_card(pool, got)
            if self.samples is not None:
                ring = self.samples.of(pool.name)
                # Drawn up to its last sample, not to the clock: the part changes (and an open
                # page's stream sends it) once per sample, not every second.
                now = ring[-1][0] if ring else time.time()
                shown += views.chart(ring, now, self.samples.window_s, f"chart-{pool.name}")
            shown += views.machines(
                [m for m in machines if m.pool_name == pool.name], html.when(pool, "last_pass")
            )
        return shown or html.problem("No pool yet.")

    async def _events(self, request: web.BaseRequest, me: Me) -> web.StreamResponse:
        src = request.query.get("src", "")
        if not src.startswith(PREFIX + "/"):
            raise BadForm("src: a live part of a page, under /ui/")
        await self._fragment(me, src)  # a part that does not exist is refused before the stream
        response = await _event_stream(request)
        self.live_streams += 1
        last, quiet = "", 0.0
        try:
            while not _closing(request):
                try:
                    content = await self._fragment(me, src)
                except Refused as refused:
                    if refused.code == grpc.StatusCode.UNAUTHENTICATED:
                        await response.write(_event("signed-out", refused.details))
                        return response
                    content = html.problem(refused.details)
                if content != last:
                    await response.write(_event("message", content))
                    last, quiet = content, 0.0
                elif quiet >= KEEPALIVE_S:
                    await response.write(b": keep-alive\n\n")
                    quiet = 0.0
                await asyncio.sleep(self._every)
                quiet += self._every
        except ConnectionResetError:
            pass
        finally:
            self.live_streams -= 1
        return response

    async def _logs_stream(
        self, request: web.BaseRequest, me: Me, task_id: str
    ) -> web.StreamResponse:
        await me.calls.task(task_id)  # NOT_FOUND (another workspace's, or none) as a page
        try:
            offset = max(0, int(request.headers.get("Last-Event-ID", "0")))
        except ValueError:
            offset = 0
        response = await _event_stream(request)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        chunks = me.calls.logs(task_id, follow=True, offset=offset)
        pending: asyncio.Future[worker_pb2.LogChunk] | None = None
        try:
            while not _closing(request):
                if pending is None:
                    pending = asyncio.ensure_future(anext(chunks))
                done, _ = await asyncio.wait({pending}, timeout=self._every)
                if not done:
                    continue  # no output for a while: look again whether the front stops
                try:
                    chunk = pending.result()
                except StopAsyncIteration:
                    await response.write(_event("end", ""))
                    break
                pending = None
                text = decoder.decode(chunk.data)
                offset = chunk.offset + len(chunk.data)
                await response.write(_event("message", text, event_id=str(offset)))
        except Refused as refused:
            await response.write(_event("failed", refused.details))
        except ConnectionResetError:
            pass
        finally:
            if pending is not None:
                pending.cancel()
            await chunks.aclose()  # type: ignore[attr-defined]
        return response

    async def _logs_download(self, me: Me, task_id: str) -> web.Response:
        data = bytearray()
        async for chunk in me.calls.logs(task_id, follow=False):
            data += chunk.data
        return web.Response(
            body=bytes(data),
            content_type="text/plain",
            charset="utf-8",
            headers={**HEADERS, "Content-Disposition": f'attachment; filename="{task_id}.log"'},
        )

    # -- answers ------------------------------------------------------------------------------

    def _static(self, name: str) -> web.Response:
        kind = STATIC.get(name)
        if kind is None:
            return web.Response(status=404, text=f"no static file {name}\n")
        body = resources.files("levers9.dashboard").joinpath("static", name).read_bytes()
        return web.Response(body=body, content_type=kind, headers={"Cache-Control": "max-age=300"})

    def _page(
        self,
        request: web.BaseRequest,
        title: str,
        body: str,
        me: Me | None = None,
        current: str = "",
        status: int = 200,
    ) -> web.Response:
        if me is None:
            return _html(html.page(title, body), status)
        return _html(
            html.page(
                title, body, who=me.label, operator=me.operator, csrf=me.csrf, current=current
            ),
            status,
        )

    def _refused(self, request: web.BaseRequest, refused: Refused) -> web.StreamResponse:
        if refused.code == grpc.StatusCode.UNAUTHENTICATED:
            response = self._sign_in_page(request, f"signed out: {refused.details}", 401)
            self._cookie(request, response, SESSION_COOKIE, "", max_age=0)
            return response
        status = HTTP_STATUS.get(refused.code, 500)
        title = "Not found" if status == 404 else "Not done"
        return self._page(request, title, html.problem(refused.details), status=status)


def _count(form: dict[str, str], field: str, label: str) -> int | None:
    raw = form.get(field, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise BadForm(f"{label}: a whole number, 0 or more (or empty), not {raw!r}")
    return int(raw)


def _haystack(r: gateway_pb2.TaskRecord) -> str:
    return " ".join(
        (r.task_id, shlex.join(r.command), r.image, r.reason, r.workspace, r.node_name)
    ).lower()


def _query_string(query: Query) -> str:
    kept = {k: v for k, v in query.items() if k in ("state", "pool", "q", "workspace", "page")}
    return html.path("", **kept)[len("/ui/") :] if kept else ""


def _closing(request: web.BaseRequest) -> bool:
    """Whether the front stops (aiohttp's connection shutting down): a stream ends then, and
    the browser reconnects, to this replica once it is back or to another, instead of holding
    the front's shutdown for its timeout."""
    return bool(getattr(request.protocol, "_force_close", False))


def _redirect(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", headers=HEADERS)


async def _event_stream(request: web.BaseRequest) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    return response


def _event(kind: str, data: str, event_id: str = "") -> bytes:
    lines = [f"event: {kind}"] if kind != "message" else []
    if event_id:
        lines.append(f"id: {event_id}")
    lines.append(f"data: {json.dumps(data)}")
    return ("\n".join(lines) + "\n\n").encode()


Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]
