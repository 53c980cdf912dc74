"""The endpoints' HTTP front: `<endpoints URL>/<name>/<path>` proxied to the endpoint's replicas.

Each controlplane replica serves it beside its gateway (`endpointsListen`, TLS with the
gateway's certificate when it has one). A request:

1. is authorized: `Authorization: Bearer <operator token>` unless the endpoint is `public`
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
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from ssl import SSLContext
from typing import Any, Protocol

from aiohttp import HttpVersion11, web
from aiohttp.web_protocol import RequestHandler
from multidict import CIMultiDict
from pydantic import SecretStr
from temporalio.client import Client
from temporalio.exceptions import TemporalError

from levers9.config import ControlplaneSettings
from levers9.endpoint_records import query_endpoint, report_load
from levers9.endpoints import EndpointView, Load
from levers9.gateway.replica_streams import (
    SEND_WHOLE,
    BodyRefused,
    Exchange,
    Replica,
    ReplicaFailed,
    StaleStream,
)
from levers9.gateway.task_service import TasksService
from levers9.logs import get_logger
from levers9.models import TaskRecord
from levers9.rpc import http1
from levers9.rpc.http_relay import HOP_BY_HOP
from levers9.task_records import task_record
from levers9.tokens import operator_token

log = get_logger(__name__)

VIEW_TTL_S = 1.0
WAIT_POLL_S = 0.2
RECORD_READS = 5
"""Reads of a replica's record Temporal did not answer, WAIT_POLL_S apart and doubling (3 s
in all), before its request is refused 503."""
REPORT_SPACING_S = 1.0
REPORT_REPEAT_S = 10.0
"""While this gateway holds requests of an endpoint it repeats its report (the autoscaler drops
reports older than 30 s: a gateway that died holding requests)."""
CHUNK = 64 * 1024
REPLICA_HEADER = "x-levers9-replica"
MAX_REROUTES = 3
"""Replicas a request is sent on to when the one chosen cannot be reached, before a 502."""
RETRIED = frozenset({"GET", "HEAD", "OPTIONS"})
"""Sent again, once, on a new stream when a kept one was found closed (without a body)."""
NOT_PASSED_ON = HOP_BY_HOP | {"authorization", "expect", "content-length"}
"""The connection's own headers and Host (RFC 9110 7.6.1), the operator token, and what the
front sets itself: it has answered `Expect: 100-continue`, and it frames the body it sends."""
MIB = 1024 * 1024


@dataclass(frozen=True)
class FrontLimits:
    """What the front gives a client connection (the settings `endpointsIdleTimeoutSeconds`,
    `endpointsHeaderTimeoutSeconds`, `endpointsMaxBodyBytes`)."""

    idle_timeout_s: float
    header_timeout_s: float
    max_body_bytes: int

    @classmethod
    def of(cls, settings: ControlplaneSettings) -> FrontLimits:
        return cls(
            idle_timeout_s=settings.endpoints_idle_timeout_seconds,
            header_timeout_s=settings.endpoints_header_timeout_seconds,
            max_body_bytes=settings.endpoints_max_body_bytes,
        )

    @classmethod
    def defaults(cls) -> FrontLimits:
        fields = ControlplaneSettings.model_fields
        return cls(
            idle_timeout_s=fields["endpoints_idle_timeout_seconds"].default,
            header_timeout_s=fields["endpoints_header_timeout_seconds"].default,
            max_body_bytes=fields["endpoints_max_body_bytes"].default,
        )


class EndpointsError(Exception):
    """The endpoints' front cannot serve; the message says what to change."""


class EndpointBook(Protocol):
    """What the proxy reads and tells (Temporal in production)."""

    async def view(self, name: str) -> EndpointView | None: ...

    async def report(self, name: str, load: Load) -> bool: ...

    async def task(self, task_id: str) -> TaskRecord | None: ...


@dataclass
class _Endpoint:
    name: str
    view: EndpointView | None = None
    fetched: float = 0.0
    in_flight: dict[str, int] = field(default_factory=dict)
    waiting: int = 0
    replicas: dict[str, Replica] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    reporter: asyncio.Task[None] | None = None
    refreshing: asyncio.Lock = field(default_factory=asyncio.Lock)
    refresher: asyncio.Task[None] | None = None

    peak: int = 0
    """The most requests in flight at once since the last report."""

    def total(self) -> int:
        return sum(self.in_flight.values())


class _NotReached(Exception):
    """The request never reached the replica (see ReplicaFailed.reached)."""


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _BodyTooLarge(BodyRefused):
    """A chunked body went past the front's limit."""


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
    ) -> None:
        self._book = book
        self._tasks = tasks
        self._operator_token = SecretStr(
            operator_token(secret.get_secret_value(), operator_generation)
        )
        self._gateway_id = gateway_id
        self._limits = limits or FrontLimits.defaults()
        self._clock = clock
        self._endpoints: dict[str, _Endpoint] = {}
        self._runner: web.BaseRunner | None = None
        self.requests = 0
        """Requests answered by a replica (counted for the benchmarks)."""

    # -- serving -----------------------------------------------------------------------------

    async def start(self, listen: str, ssl: SSLContext | None = None) -> int:
        """Serves on `listen` (host:port); returns the bound port."""
        host, _, port = listen.rpartition(":")
        server = _FrontServer(
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
        for endpoint in self._endpoints.values():
            if endpoint.reporter is not None:
                endpoint.reporter.cancel()
            if endpoint.refresher is not None:
                endpoint.refresher.cancel()
            for replica in endpoint.replicas.values():
                await replica.close()

    # -- a request ---------------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        arrived = asyncio.get_running_loop().time()
        name = request.raw_path.lstrip("/").partition("/")[0].partition("?")[0]
        progress = _Progress()
        try:
            if not name:
                raise _Refused(404, "no endpoint named: <endpoints URL>/<name>/<path>")
            endpoint = await self._endpoint(name)
            view = endpoint.view
            assert view is not None
            if not view.spec.public:
                self._authorize(request)
            _refuse_websocket(name, request)
            self._check_length(name, request)
            await _continue(request)
            limit = view.spec.request_timeout_seconds
            deadline = asyncio.timeout_at(arrived + limit)
            try:
                async with deadline:
                    return await self._serve(endpoint, request, progress)
            except TimeoutError:
                if not deadline.expired():
                    raise
                return self._late(name, limit, request, progress)
        except _Refused as refused:
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
                _cut(request)
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
            _cut(request)
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
            raise _Refused(413, _too_large(what, limit))

    async def _serve(
        self, endpoint: _Endpoint, request: web.BaseRequest, progress: _Progress
    ) -> web.StreamResponse:
        name = endpoint.name
        body = await self._body(request, self._limits.max_body_bytes)
        tried: set[str] = set()
        while True:
            task_id = await self._replica(endpoint, tried)
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
                    raise _Refused(
                        502,
                        f"endpoint {name}: replicas {', '.join(sorted(tried))} could not be"
                        f" reached: {exc}",
                    ) from None
                endpoint = await self._endpoint(name, fresh=True)

    def _authorize(self, request: web.BaseRequest) -> None:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _Refused(
                401,
                "this endpoint needs `Authorization: Bearer <operator token>`"
                " (the file LEVERS9_API_TOKEN_FILE names), or create it --public",
            )
        if not hmac.compare_digest(self._operator_token.get_secret_value(), token.strip()):
            raise _Refused(401, "the bearer token is not this controlplane's operator token")

    async def _endpoint(self, name: str, *, fresh: bool = False) -> _Endpoint:
        """The endpoint, its view read now when this gateway has none (or `fresh`, while a
        request waits for a replica); an older one than VIEW_TTL_S serves this request while it
        is read again beside it (a warm request never waits on Temporal)."""
        endpoint = self._endpoints.get(name)
        if endpoint is None:
            endpoint = self._endpoints[name] = _Endpoint(name)
        if endpoint.view is None or fresh:
            await self._refresh(endpoint, VIEW_TTL_S if not fresh else WAIT_POLL_S)
        elif self._clock() - endpoint.fetched >= VIEW_TTL_S and (
            endpoint.refresher is None or endpoint.refresher.done()
        ):
            endpoint.refresher = asyncio.create_task(self._refresh(endpoint, VIEW_TTL_S))
        if endpoint.view is None:
            raise _Refused(404, f"no endpoint {name}: `levers9 endpoint list` shows them")
        return endpoint

    async def _refresh(self, endpoint: _Endpoint, ttl: float) -> None:
        async with endpoint.refreshing:
            if endpoint.view is not None and self._clock() - endpoint.fetched < ttl:
                return
            try:
                view = await self._book.view(endpoint.name)
            except Exception as exc:
                if endpoint.view is None:
                    raise _Refused(503, f"endpoint {endpoint.name}: Temporal: {exc}") from None
                return  # serve from the last view
            endpoint.view, endpoint.fetched = view, self._clock()
            ready = set(view.replicas_ready()) if view is not None else set()
            for task_id in list(endpoint.replicas):
                if task_id not in ready:
                    await endpoint.replicas.pop(task_id).close()

    async def _replica(self, endpoint: _Endpoint, tried: set[str]) -> str:
        """A ready replica (not one of `tried`), with the fewest requests from here in
        flight; waits for one."""
        view = endpoint.view
        assert view is not None
        ready = [t for t in view.replicas_ready() if t not in tried]
        if ready:
            return min(ready, key=lambda t: (endpoint.in_flight.get(t, 0), t))
        deadline = self._clock() + view.spec.cold_start_timeout_seconds
        endpoint.waiting += 1
        self._report(endpoint, urgent=endpoint.waiting == 1)
        try:
            while True:
                if view.failing:
                    raise _Refused(503, f"endpoint {endpoint.name}: {view.failing}")
                left = deadline - self._clock()
                if left <= 0:
                    raise _Refused(
                        503,
                        f"endpoint {endpoint.name}: no replica ready after"
                        f" {view.spec.cold_start_timeout_seconds:g} s (`levers9 endpoint get"
                        f" {endpoint.name}` shows its replicas)",
                    )
                await asyncio.sleep(min(WAIT_POLL_S, left))
                endpoint = await self._endpoint(endpoint.name, fresh=True)
                view = endpoint.view
                assert view is not None
                ready = [t for t in view.replicas_ready() if t not in tried]
                if ready:
                    return min(ready, key=lambda t: (endpoint.in_flight.get(t, 0), t))
        finally:
            endpoint.waiting -= 1
            self._report(endpoint)

    async def _replica_streams(self, endpoint: _Endpoint, task_id: str) -> Replica:
        replica = endpoint.replicas.get(task_id)
        if replica is not None:
            return replica
        record = await self._record(endpoint, task_id)
        if record is None or record.state != "running" or record.worker_id is None:
            state = record.state if record is not None else "unknown"
            raise _NotReached(f"replica {task_id} is not running ({state})")
        assert endpoint.view is not None
        replica = endpoint.replicas.setdefault(
            task_id, Replica(self._tasks, record, endpoint.view.spec.port)
        )
        return replica

    async def _record(self, endpoint: _Endpoint, task_id: str) -> TaskRecord | None:
        """The replica's record; Temporal not answering for it (a controlplane or server just
        restarted) is tried again for a moment, then refused 503 saying so."""
        for attempt in range(RECORD_READS):
            try:
                return await self._book.task(task_id)
            except TemporalError as exc:
                if attempt + 1 == RECORD_READS:
                    raise _Refused(
                        503,
                        f"endpoint {endpoint.name}: the record of replica {task_id} cannot be"
                        f" read now (Temporal: {exc}); try again",
                    ) from None
                await asyncio.sleep(WAIT_POLL_S * 2**attempt)
        raise AssertionError("unreachable")

    @staticmethod
    def _request_head(endpoint: _Endpoint, request: web.BaseRequest, port: int) -> bytes:
        """The request as the replica gets it: its path under the endpoint's (as sent, still
        percent-encoded), its end-to-end headers but the operator token, and X-Forwarded-*."""
        target = request.raw_path[len(endpoint.name) + 1 :]
        if not target.startswith("/"):
            target = "/" + target
        headers = [
            (key, value)
            for key, value in request.headers.items()
            if key.lower() not in NOT_PASSED_ON
        ]
        headers.append(("Host", f"127.0.0.1:{port}"))
        headers.append(("X-Forwarded-Host", request.host))
        headers.append(("X-Forwarded-Proto", request.scheme))
        headers.append(("X-Forwarded-Prefix", f"/{endpoint.name}"))
        if request.remote:
            headers.append(("X-Forwarded-For", request.remote))
        if not request.body_exists:
            if request.method in ("POST", "PUT", "PATCH"):
                headers.append(("Content-Length", "0"))
        elif request.content_length is None:  # the client chunked it: so does the front
            headers.append(("Transfer-Encoding", "chunked"))
        else:
            headers.append(("Content-Length", str(request.content_length)))
        return http1.request_head(request.method, target, headers)

    @staticmethod
    async def _body(request: web.BaseRequest, limit: int) -> bytes | AsyncIterator[bytes] | None:
        """None, the whole body when it is small and its length known, else its chunks as
        they come (chunk-encoded when the client sent no length; cut past `limit`: a length
        over it was refused before)."""
        if not request.body_exists:
            return None
        length = request.content_length
        if length is not None and length <= SEND_WHOLE:
            return await request.read()

        async def chunks() -> AsyncIterator[bytes]:
            seen = 0
            async for data in request.content.iter_chunked(CHUNK):
                seen += len(data)
                if seen > limit:
                    raise _BodyTooLarge(
                        _too_large(f"the chunked body ({seen} bytes so far)", limit)
                    )
                yield data if length is not None else http1.chunk(data)
            if length is None:
                yield http1.chunk(b"")

        return chunks()

    async def _forward(
        self,
        endpoint: _Endpoint,
        task_id: str,
        request: web.BaseRequest,
        body: bytes | AsyncIterator[bytes] | None,
        progress: _Progress,
    ) -> web.StreamResponse:
        """The exchange with replica `task_id`; raises _NotReached when it never got there
        and can go elsewhere (its body not streamed, or not begun)."""
        progress.task_id = task_id
        replica = await self._replica_streams(endpoint, task_id)
        head = self._request_head(endpoint, request, replica.port)
        endpoint.in_flight[task_id] = endpoint.in_flight.get(task_id, 0) + 1
        endpoint.peak = max(endpoint.peak, endpoint.total())
        self._report(endpoint)
        exchange: Exchange | None = None
        response: web.StreamResponse | None = None
        try:
            try:
                exchange = await self._exchange(replica, request, head, body)
                if exchange.done and request.method != "HEAD":  # whole: one write to the client
                    self.requests += 1
                    return _whole(exchange, task_id)
                response = progress.response = _streamed(exchange, task_id)
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
            _cut(request)
            return response
        finally:
            endpoint.in_flight[task_id] -= 1
            if not endpoint.in_flight[task_id]:
                del endpoint.in_flight[task_id]
            self._report(endpoint)

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

    # -- reports to the autoscaler -----------------------------------------------------------

    def _report(self, endpoint: _Endpoint, *, urgent: bool = False) -> None:
        if endpoint.reporter is None or endpoint.reporter.done():
            endpoint.reporter = asyncio.create_task(self._reporting(endpoint))
        if urgent:
            endpoint.wake.set()

    async def _reporting(self, endpoint: _Endpoint) -> None:
        """Sends this gateway's numbers when they change (at most one a second, at once when a
        first request starts waiting), again every REPORT_REPEAT_S while not zero, and a last
        zero; then ends (the next request starts it again). In flight is the most at once since
        the last report: requests one after another are 1 for the autoscaler, not a 0 or a 1
        depending on the instant (and a signal each time it flips)."""
        sent: tuple[int, int] | None = None
        last = 0.0
        while True:
            now = (max(endpoint.peak, endpoint.total()), endpoint.waiting)
            endpoint.peak = endpoint.total()
            if now != sent or (now != (0, 0) and self._clock() - last >= REPORT_REPEAT_S):
                load = Load(gateway=self._gateway_id, in_flight=now[0], waiting=now[1])
                try:
                    await self._book.report(endpoint.name, load)
                    sent, last = now, self._clock()
                except Exception as exc:
                    log.warning(
                        "endpoint load not reported", endpoint=endpoint.name, error=str(exc)
                    )
            if sent == (0, 0):
                return
            endpoint.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REPORT_SPACING_S):
                    await endpoint.wake.wait()
            if endpoint.wake.is_set():
                continue


def _cut(request: web.BaseRequest) -> None:
    """The client sees its transfer cut, never a clean end."""
    if request.transport is not None:
        request.transport.abort()


def _too_large(what: str, limit: int) -> str:
    size = f"{limit} bytes" + (f" ({limit / MIB:g} MiB)" if limit >= MIB else "")
    return (
        f"{what} is over the endpoints' limit of {size}: the controlplane's"
        " endpointsMaxBodyBytes (LEVERS9_ENDPOINTS_MAX_BODY_BYTES) sets it"
    )


def _refuse_websocket(name: str, request: web.BaseRequest) -> None:
    """A WebSocket handshake is refused at the door (501), before it wakes a replica: the front
    does not carry upgraded connections, and the replica would only see a plain GET. Another
    Upgrade (h2c), which a server may ignore, is served as HTTP/1.1 without it."""
    upgrade = request.headers.get("Upgrade", "")
    if "websocket" in upgrade.lower():
        raise _Refused(
            501,
            f"endpoint {name}: WebSockets are not proxied (the request asked for Upgrade:"
            f" {upgrade}); the endpoints carry HTTP requests and streamed responses"
            " (server-sent events)",
        )


async def _continue(request: web.BaseRequest) -> None:
    """Answers `Expect: 100-continue` once the request is authorized and its length within
    the limit (a refused one never sends its body); any other expectation is 417."""
    expect = request.headers.get("Expect")
    if expect is None or request.version != HttpVersion11:
        return
    if expect.strip().lower() != "100-continue":
        raise _Refused(417, f"Expect: {expect} is not understood (only 100-continue)")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the response's own bytes are counted from here


class _FrontServer(web.Server):
    """aiohttp's low-level server, its connections `_Connection`s."""

    def __init__(
        self,
        handler: Callable[[web.BaseRequest], Any],
        *,
        header_timeout_s: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(handler, handler_cancellation=True, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._connection_kwargs = kwargs

    def __call__(self) -> RequestHandler:
        return _Connection(
            self,
            header_timeout_s=self._header_timeout_s,
            loop=asyncio.get_running_loop(),
            **self._connection_kwargs,
        )


class _Connection(RequestHandler):
    """One client connection, with a deadline on each request's head: from the connection, or
    on a kept-alive one from the first byte of its next request, to the head parsed whole.
    Past it: 408 when part of a head came (nothing, on a connection that sent none), and the
    connection closed. aiohttp's own keep-alive timeout closes a connection idle between
    requests. Reads aiohttp's state: `_waiter` (set while it waits for the next request) and
    `_request_count` (heads parsed); the front's tests drive both by sockets."""

    def __init__(self, manager: web.Server, *, header_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._head_deadline: asyncio.TimerHandle | None = None
        self._head_bytes = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._expect_head()

    def data_received(self, data: bytes) -> None:
        if data and self._head_deadline is None and self._waiter is not None:
            self._expect_head()  # the next request on a kept-alive connection
        if self._head_deadline is not None:
            self._head_bytes += len(data)
        parsed = self._request_count
        super().data_received(data)
        if self._request_count != parsed:
            self._head_arrived()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._head_arrived()
        super().connection_lost(exc)

    def _expect_head(self) -> None:
        self._head_bytes = 0
        self._head_deadline = self._loop.call_later(self._header_timeout_s, self._head_late)

    def _head_arrived(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_late(self) -> None:
        self._head_deadline = None
        transport = self.transport
        if transport is None:
            return
        peer = transport.get_extra_info("peername")
        if self._head_bytes:
            log.info(
                "request head too slow, connection closed",
                peer=str(peer),
                received=self._head_bytes,
                timeout_s=self._header_timeout_s,
            )
            text = (
                f"the request's line and headers did not arrive within"
                f" {self._header_timeout_s:g} s (endpointsHeaderTimeoutSeconds)\n"
            ).encode()
            transport.write(
                b"HTTP/1.1 408 Request Timeout\r\nContent-Type: text/plain; charset=utf-8\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(text), text)
            )
        self.force_close()


def _headers(exchange: Exchange, task_id: str) -> CIMultiDict[str]:
    assert exchange.head is not None
    headers: CIMultiDict[str] = CIMultiDict()
    for key, value in exchange.head.headers:
        if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
            headers.add(key, value)
    headers[REPLICA_HEADER] = task_id
    return headers


def _whole(exchange: Exchange, task_id: str) -> web.Response:
    """A response that came whole with its head."""
    assert exchange.head is not None
    return web.Response(
        status=exchange.head.status,
        reason=exchange.head.reason or None,
        headers=_headers(exchange, task_id),
        body=exchange.first if exchange.head.status not in (204, 304) else None,
    )


def _streamed(exchange: Exchange, task_id: str) -> web.StreamResponse:
    """A response whose body comes after its head (server-sent events, token streams), with
    the replica's length, else chunked; or the answer to a HEAD request."""
    head = exchange.head
    assert head is not None
    response = web.StreamResponse(
        status=head.status, reason=head.reason or None, headers=_headers(exchange, task_id)
    )
    length = head.get("content-length")
    if not head.values("transfer-encoding") and length is not None and length.isdigit():
        response.content_length = int(length)
    return response


class TemporalEndpointBook:
    """Endpoints and task records as Temporal holds them."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def view(self, name: str) -> EndpointView | None:
        return await query_endpoint(self._client, name)

    async def report(self, name: str, load: Load) -> bool:
        return await report_load(self._client, name, load)

    async def task(self, task_id: str) -> TaskRecord | None:
        return await task_record(self._client, task_id)
