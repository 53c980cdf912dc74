"""The endpoints' HTTP front: `<endpoints URL>/<name>/<path>` proxied to the endpoint's replicas.

Each controlplane replica serves it beside its gateway (`endpointsListen`, TLS with the
gateway's certificate when it has one). A request:

1. is authorized: `Authorization: Bearer <token>`, the operator's or one of the endpoint's
   workspace (another workspace's finds no such endpoint, 404), unless the endpoint is `public`
   (the header never reaches the replica); a WebSocket handshake is then refused 501 (not
   proxied), before any replica is woken;
2. finds a ready replica of the endpoint (its view, `EndpointWorkflow`'s query `view`, read
   again beside the request once older than `VIEW_TTL_S`: a warm request never waits on
   Temporal); with none, it **waits**: counted as waiting in this gateway's report
   to the autoscaler (signal `load`, sent at once when the first request starts waiting), so a
   replica starts (the cold start) and is never stopped while the request waits; it is answered
   once a replica is ready, or 503 after the endpoint's `cold_start_timeout_seconds`, or 503 at
   once when the endpoint's replicas keep failing before they are ready (the view's `failing`);
3. goes to the ready replica with the fewest requests in flight from here, as HTTP/1.1 written
   straight onto a kept `WorkerService/PortForward` stream to the replica's port
   (`levers9.gateway.replica_streams`: over TLS to the worker, through this replica's end of
   its tunnel, or relayed to the replica that holds it; the path `levers9 port-forward`
   takes), one request at a time per stream, the streams kept per replica;
4. is answered with the replica's response, streamed (server-sent events, token streams).

A replica that dies before it answers: 502 naming it and the endpoint. One that dies mid-body:
the client's connection is cut (its transfer is incomplete, never a clean end), never held.
Responses carry `x-levers9-replica: <task id>`.

Nothing waits forever (`FrontLimits`, from the controlplane's settings, and the endpoint's
spec):

- a request has the endpoint's `request_timeout_seconds` from its arrival to its response's
  end, a cold start included: then 504 naming the endpoint and the timeout, or, once the
  response has begun, its transfer cut;
- a request's line and headers arrive whole within `header_timeout_s` (of the connection, or of
  the request's first byte on a kept-alive one), else 408 and the connection closed: a client
  that dribbles them cannot hold the front's connections (Slowloris);
- a kept-alive connection without a request for `idle_timeout_s` is closed;
- a body over `max_body_bytes` is 413: by its Content-Length before any of it is read (or any
  replica is woken), or, chunked, once it goes past the limit (the replica's stream is closed
  with it).

Here the requests and their way to a replica; a client's connections and their limits are
`levers9.gateway.endpoint_connections`'s, the messages as they are rewritten each way (and the
front's own refusals) `levers9.gateway.endpoint_messages`'s, each endpoint's view, replica
choice, cold-start hold and load reports `levers9.gateway.endpoint_views`'s.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from ssl import SSLContext

from aiohttp import web
from pydantic import SecretStr

from levers9.gateway.endpoint_connections import FrontLimits, FrontServer
from levers9.gateway.endpoint_messages import (
    REPLICA_HEADER,
    Refused,
    cut,
    expect_continue,
    refuse_websocket,
    request_body,
    request_head,
    streamed,
    too_large,
    whole,
)
from levers9.gateway.endpoint_views import EndpointBook, EndpointState, EndpointViews
from levers9.gateway.errors import Unauthenticated
from levers9.gateway.replica_streams import (
    BodyRefused,
    Exchange,
    Replica,
    ReplicaFailed,
    StaleStream,
)
from levers9.gateway.roles import Authority
from levers9.gateway.task_service import TasksService
from levers9.logs import get_logger
from levers9.tokens import operator_token

log = get_logger(__name__)

MAX_REROUTES = 3
"""Replicas a request is sent on to when the one chosen cannot be reached, before a 502."""
RETRIED = frozenset({"GET", "HEAD", "OPTIONS"})
"""Sent again, once, on a new stream when a kept one was found closed (without a body)."""


class EndpointsError(Exception):
    """The endpoints' front cannot serve; the message says what to change."""


class _NotReached(Exception):
    """The request never reached the replica (see ReplicaFailed.reached)."""


@dataclass
class _Progress:
    """How far a request got: the replica it went to, and its response once begun."""

    task_id: str = ""
    response: web.StreamResponse | None = None

    def begun(self) -> bool:
        return self.response is not None and self.response.prepared


class EndpointProxy:
    def __init__(
        self,
        book: EndpointBook,
        tasks: TasksService,
        secret: SecretStr,
        gateway_id: str,
        *,
        operator_generation: int = 1,
        limits: FrontLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
        ui: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]] | None = None,
        box: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]] | None = None,
    ) -> None:
        """`ui`: what answers under `/ui/` (the dashboard, `levers9.dashboard`); `box`: under
        `/box/` (boxes' ports, `levers9.gateway.box_front`)."""
        self._ui = ui
        self._box = box
        self._views = EndpointViews(book, gateway_id, clock=clock)
        self._tasks = tasks
        self._authority: Authority | None = getattr(tasks, "authority", None)
        """Who a workspace token is (the gateway's; None: the operator's token only)."""
        self._operator_token = SecretStr(
            operator_token(secret.get_secret_value(), operator_generation)
        )
        self._limits = limits or FrontLimits.defaults()
        self._runner: web.BaseRunner | None = None
        self.requests = 0
        """Requests answered by a replica (counted for the benchmarks)."""

    # -- serving -----------------------------------------------------------------------------

    async def start(self, listen: str, ssl: SSLContext | None = None) -> int:
        """Serves on `listen` (host:port); returns the bound port."""
        host, _, port = listen.rpartition(":")
        server = FrontServer(
            self._handle,
            header_timeout_s=self._limits.header_timeout_s,
            keepalive_timeout=self._limits.idle_timeout_s,
            access_log=None,
        )
        runner = web.ServerRunner(server)
        await runner.setup()
        site = web.TCPSite(runner, host.strip("[]") or None, int(port), ssl_context=ssl)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise EndpointsError(
                f"the endpoints cannot listen on {listen}: {exc.strerror or exc}"
                " (set endpointsListen / LEVERS9_ENDPOINTS_LISTEN)"
            ) from None
        self._runner = runner
        bound = int(port)
        for address in runner.addresses:
            bound = int(address[1])
        log.info("endpoints listening", address=listen, port=bound, tls=ssl is not None)
        return int(bound)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self._views.stop()

    # -- a request ---------------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        arrived = asyncio.get_running_loop().time()
        name = request.raw_path.lstrip("/").partition("/")[0].partition("?")[0]
        progress = _Progress()
        if name == "ui" and self._ui is not None:
            return await self._ui(request)
        if name == "box" and self._box is not None:
            return await self._box(request)
        try:
            if not name:
                raise Refused(404, "no endpoint named: <endpoints URL>/<name>/<path>")
            endpoint = await self._views.endpoint(name)
            view = endpoint.view
            assert view is not None
            if not view.spec.public:
                await self._authorize(request, name, view.spec.workspace)
            refuse_websocket(name, request)
            self._check_length(name, request)
            await expect_continue(request)
            limit = view.spec.request_timeout_seconds
            deadline = asyncio.timeout_at(arrived + limit)
            try:
                async with deadline:
                    return await self._serve(endpoint, request, progress)
            except TimeoutError:
                if not deadline.expired():
                    raise
                return self._late(name, limit, request, progress)
        except Refused as refused:
            response = web.Response(
                status=refused.status,
                text=f"{refused}\n",
                headers={"WWW-Authenticate": "Bearer"} if refused.status == 401 else None,
            )
            if refused.status in (413, 417, 501):
                response.force_close()  # the rest of its body (or upgraded stream) is not read
            return response
        except BodyRefused as exc:
            if progress.begun():
                assert progress.response is not None
                cut(request)
                return progress.response
            log.info("request body refused", endpoint=name, error=str(exc))
            response = web.Response(status=413, text=f"endpoint {name}: {exc}\n")
            response.force_close()
            return response

    def _late(
        self, name: str, limit: float, request: web.BaseRequest, progress: _Progress
    ) -> web.StreamResponse:
        """The answer to a request that ran out of its endpoint's request timeout."""
        log.info(
            "request timed out",
            endpoint=name,
            task_id=progress.task_id or None,
            timeout_s=limit,
            response_begun=progress.begun(),
        )
        if progress.begun():
            assert progress.response is not None
            cut(request)
            return progress.response
        where = (
            f"replica {progress.task_id} had not answered"
            if progress.task_id
            else "no replica was ready for it (a cold start counts)"
        )
        return web.Response(
            status=504,
            text=f"endpoint {name}: no response within its request timeout of {limit:g} s:"
            f" {where}. To give it longer, create the endpoint again with --request-timeout"
            f" (`levers9 endpoint get {name}` shows it)\n",
            headers={REPLICA_HEADER: progress.task_id} if progress.task_id else None,
        )

    def _check_length(self, name: str, request: web.BaseRequest) -> None:
        length, limit = request.content_length, self._limits.max_body_bytes
        if length is not None and length > limit:
            what = f"endpoint {name}: the request's body ({length} bytes)"
            raise Refused(413, too_large(what, limit))

    async def _serve(
        self, endpoint: EndpointState, request: web.BaseRequest, progress: _Progress
    ) -> web.StreamResponse:
        name = endpoint.name
        body = await request_body(request, self._limits.max_body_bytes)
        tried: set[str] = set()
        while True:
            task_id = await self._views.replica(endpoint, tried)
            try:
                return await self._forward(endpoint, task_id, request, body, progress)
            except _NotReached as exc:
                # Gone since this gateway's view said ready (stopped idle, its node lost):
                # the request never reached it, so it goes to another, or waits for one.
                tried.add(task_id)
                progress.task_id = ""
                log.info(
                    "replica not reached, request sent on",
                    endpoint=name,
                    task_id=task_id,
                    error=str(exc),
                )
                if len(tried) > MAX_REROUTES:
                    raise Refused(
                        502,
                        f"endpoint {name}: replicas {', '.join(sorted(tried))} could not be"
                        f" reached: {exc}",
                    ) from None
                endpoint = await self._views.endpoint(name, fresh=True)

    async def _authorize(self, request: web.BaseRequest, name: str, workspace: str) -> None:
        """The operator's token, or one of the endpoint's own workspace; another workspace's
        token finds no such endpoint (404, as a missing one), so names cannot be probed."""
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Refused(
                401,
                "this endpoint needs `Authorization: Bearer <token>`: the operator's (the file"
                " LEVERS9_API_TOKEN_FILE names) or one of its workspace's, or create it --public",
            )
        if hmac.compare_digest(self._operator_token.get_secret_value(), token.strip()):
            return
        if self._authority is None:
            raise Refused(401, "the bearer token is not this controlplane's operator token")
        try:
            identity = await self._authority.identify([("authorization", header)])
        except Unauthenticated as refused:
            raise Refused(401, f"the bearer token is refused: {refused.message}") from None
        if not identity.sees(workspace):
            raise Refused(404, f"no endpoint {name}: `levers9 endpoint list` shows them")

    # -- to a replica ------------------------------------------------------------------------

    async def _replica_streams(self, endpoint: EndpointState, task_id: str) -> Replica:
        replica = endpoint.replicas.get(task_id)
        if replica is not None:
            return replica
        record = await self._views.record(endpoint, task_id)
        if record is None or record.state != "running" or record.worker_id is None:
            state = record.state if record is not None else "unknown"
            raise _NotReached(f"replica {task_id} is not running ({state})")
        assert endpoint.view is not None
        replica = endpoint.replicas.setdefault(
            task_id, Replica(self._tasks, record, endpoint.view.spec.port)
        )
        return replica

    async def _forward(
        self,
        endpoint: EndpointState,
        task_id: str,
        request: web.BaseRequest,
        body: bytes | AsyncIterator[bytes] | None,
        progress: _Progress,
    ) -> web.StreamResponse:
        """The exchange with replica `task_id`; raises _NotReached when it never got there
        and can go elsewhere (its body not streamed, or not begun)."""
        progress.task_id = task_id
        replica = await self._replica_streams(endpoint, task_id)
        head = request_head(endpoint.name, request, replica.port)
        endpoint.in_flight[task_id] = endpoint.in_flight.get(task_id, 0) + 1
        endpoint.peak = max(endpoint.peak, endpoint.total())
        self._views.report(endpoint)
        exchange: Exchange | None = None
        response: web.StreamResponse | None = None
        try:
            try:
                exchange = await self._exchange(replica, request, head, body)
                if exchange.done and request.method != "HEAD":  # whole: one write to the client
                    self.requests += 1
                    return whole(exchange, task_id)
                response = progress.response = streamed(exchange, task_id)
                await response.prepare(request)
                if exchange.first:
                    await response.write(exchange.first)
                async for data in exchange.rest():
                    await response.write(data)
                await response.write_eof()
                self.requests += 1
                return response
            finally:
                if exchange is not None:
                    await exchange.release()
        except ReplicaFailed as exc:
            endpoint.fetched = 0.0  # read the view again: the replica may be gone
            if not exc.reached and (body is None or isinstance(body, bytes)):
                if (gone := endpoint.replicas.pop(task_id, None)) is not None:
                    await gone.close()
                raise _NotReached(str(exc)) from None
            if response is None or not response.prepared:
                log.info("replica failed a request", endpoint=endpoint.name, task_id=task_id)
                return web.Response(
                    status=502,
                    text=f"replica {task_id} of endpoint {endpoint.name} failed before it"
                    f" answered: {exc}\n",
                    headers={REPLICA_HEADER: task_id},
                )
            log.info("replica broke mid-response", endpoint=endpoint.name, task_id=task_id)
            cut(request)
            return response
        finally:
            endpoint.in_flight[task_id] -= 1
            if not endpoint.in_flight[task_id]:
                del endpoint.in_flight[task_id]
            self._views.report(endpoint)

    async def _exchange(
        self,
        replica: Replica,
        request: web.BaseRequest,
        head: bytes,
        body: bytes | AsyncIterator[bytes] | None,
    ) -> Exchange:
        """The request sent and its response's head read. A kept stream the replica closed
        while it idled: a request without a streamed body goes again, once, on a new one."""
        stale: StaleStream | None = None
        for attempt in (1, 2):
            exchange: Exchange | None = None
            try:
                stream = await replica.stream()
                exchange = Exchange(replica, stream, head_request=request.method == "HEAD")
                await exchange.send(head, body)
                return exchange
            except StaleStream as exc:
                if attempt == 2 or body is not None or request.method not in RETRIED:
                    raise
                stale = exc
            except ReplicaFailed as exc:
                if stale is not None and not exc.reached:
                    # The kept stream may have carried the request after all (the replica
                    # died of it): not sent on to another replica.
                    raise ReplicaFailed(str(stale)) from None
                raise
            finally:
                if exchange is not None and exchange.head is None:
                    await exchange.release()
        raise AssertionError("unreachable")
