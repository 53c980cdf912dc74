"""The endpoints' HTTP front: `<endpoints URL>/<name>/<path>` proxied to the endpoint's replicas.

Each controlplane replica serves it beside its gateway (`endpointsListen`, TLS with the
gateway's certificate when it has one). A request:

1. is authorized: `Authorization: Bearer <operator token>` unless the endpoint is `public`
   (the header never reaches the replica);
2. finds a ready replica of the endpoint (its view, `EndpointWorkflow`'s query `view`, read at
   most every `VIEW_TTL_S`); with none, it **waits**: counted as waiting in this gateway's report
   to the autoscaler (signal `load`, sent at once when the first request starts waiting), so a
   replica starts (the cold start) and is never stopped while the request waits; it is answered
   once a replica is ready, or 503 after the endpoint's `cold_start_timeout_seconds`, or 503 at
   once when the endpoint's replicas keep failing before they are ready (the view's `failing`);
3. goes to the ready replica with the fewest requests in flight from here, through a keep-alive
   connection pool per replica. A pooled connection is a loopback socket bridged to one
   `WorkerService/PortForward` stream to the replica's worker (`TasksService.upstream`: over
   TLS directly, through this replica's end of the worker's tunnel, or relayed to the replica
   that holds it), so the path is the one `levers9 port-forward` takes;
4. is answered with the replica's response, streamed (server-sent events, token streams).

A replica that dies before it answers: 502 naming it and the endpoint. One that dies mid-body:
the client's connection is cut (its transfer is incomplete, never a clean end), never held.
Responses carry `x-levers9-replica: <task id>`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from ssl import SSLContext
from typing import Protocol

import aiohttp
from aiohttp import web
from pydantic import SecretStr
from temporalio.client import Client

from levers9.endpoint_records import query_endpoint, report_load
from levers9.endpoints import EndpointView, Load
from levers9.gateway.task_service import TasksService, Unroutable
from levers9.logs import get_logger
from levers9.models import TaskRecord
from levers9.proto import worker_pb2
from levers9.rpc.http_relay import forwarded_headers, request_body, response_for, stream_body
from levers9.task_records import task_record
from levers9.tokens import operator_token_matches

log = get_logger(__name__)

VIEW_TTL_S = 1.0
WAIT_POLL_S = 0.2
REPORT_SPACING_S = 1.0
REPORT_REPEAT_S = 10.0
"""While this gateway holds requests of an endpoint it repeats its report (the autoscaler drops
reports older than 30 s: a gateway that died holding requests)."""
CHUNK = 64 * 1024
REPLICA_HEADER = "x-levers9-replica"


class EndpointsError(Exception):
    """The endpoints' front cannot serve; the message says what to change."""


class EndpointBook(Protocol):
    """What the proxy reads and tells (Temporal in production)."""

    async def view(self, name: str) -> EndpointView | None: ...

    async def report(self, name: str, load: Load) -> bool: ...

    async def task(self, task_id: str) -> TaskRecord | None: ...


class _Bridge:
    """A loopback listener whose every connection is one PortForward stream to the replica."""

    def __init__(self, tasks: TasksService, record: TaskRecord, port: int) -> None:
        self._tasks = tasks
        self._record = record
        self._port = port
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self.address = ""

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = f"{host}:{port}"
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        abort = True
        try:
            abort = await self._pipe(reader, writer)
        except asyncio.CancelledError:
            pass
        except (Unroutable, OSError) as exc:
            log.info("endpoint bridge failed", task_id=self._record.task_id, error=str(exc))
        except Exception as exc:  # grpc's AioRpcError and the like: the socket is cut
            log.info("replica connection broke", task_id=self._record.task_id, error=repr(exc))
        finally:
            self._conns.discard(task)
            if abort:
                writer.transport.abort()
            else:
                writer.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        start = worker_pb2.PortForwardRequest(
            start=worker_pb2.PortForwardStart(task_id=self._record.task_id, port=self._port)
        )

        async def requests() -> AsyncIterator[worker_pb2.PortForwardRequest]:
            yield start
            while data := await reader.read(CHUNK):
                yield worker_pb2.PortForwardRequest(data=data)

        async with self._tasks.upstream(self._record) as up:
            async for response in up.port_forward(requests()):
                writer.write(response.data)
                await writer.drain()
        return False  # the replica closed its side: a clean close


@dataclass
class _Endpoint:
    name: str
    view: EndpointView | None = None
    fetched: float = 0.0
    in_flight: dict[str, int] = field(default_factory=dict)
    waiting: int = 0
    bridges: dict[str, _Bridge] = field(default_factory=dict)
    session: aiohttp.ClientSession | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    reporter: asyncio.Task[None] | None = None
    refreshing: asyncio.Lock = field(default_factory=asyncio.Lock)

    def total(self) -> int:
        return sum(self.in_flight.values())


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class EndpointProxy:
    def __init__(
        self,
        book: EndpointBook,
        tasks: TasksService,
        secret: SecretStr,
        gateway_id: str,
        *,
        operator_generation: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._book = book
        self._tasks = tasks
        self._secret = secret
        self._gateway_id = gateway_id
        self._operator_generation = operator_generation
        self._clock = clock
        self._endpoints: dict[str, _Endpoint] = {}
        self._runner: web.AppRunner | None = None
        self.requests = 0
        """Requests answered by a replica (counted for the benchmarks)."""

    # -- serving -----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(client_max_size=0)
        app.router.add_route("*", "/{name}", self._handle)
        app.router.add_route("*", "/{name}/{path:.*}", self._handle)
        return app

    async def start(self, listen: str, ssl: SSLContext | None = None) -> int:
        """Serves on `listen` (host:port); returns the bound port."""
        host, _, port = listen.rpartition(":")
        runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
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
            for bridge in endpoint.bridges.values():
                await bridge.close()
            if endpoint.session is not None:
                await endpoint.session.close()

    # -- a request ---------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        try:
            endpoint = await self._endpoint(name)
            assert endpoint.view is not None
            if not endpoint.view.spec.public:
                self._authorize(request)
            task_id = await self._replica(endpoint)
            return await self._forward(endpoint, task_id, request)
        except _Refused as refused:
            return web.Response(
                status=refused.status,
                text=f"{refused}\n",
                headers={"WWW-Authenticate": "Bearer"} if refused.status == 401 else None,
            )

    def _authorize(self, request: web.Request) -> None:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _Refused(
                401,
                "this endpoint needs `Authorization: Bearer <operator token>`"
                " (the file LEVERS9_API_TOKEN_FILE names), or create it --public",
            )
        if not operator_token_matches(
            self._secret.get_secret_value(), token.strip(), self._operator_generation
        ):
            raise _Refused(401, "the bearer token is not this controlplane's operator token")

    async def _endpoint(self, name: str, *, fresh: bool = False) -> _Endpoint:
        endpoint = self._endpoints.get(name)
        if endpoint is None:
            endpoint = self._endpoints[name] = _Endpoint(name)
        await self._refresh(endpoint, VIEW_TTL_S if not fresh else WAIT_POLL_S)
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
            for task_id in list(endpoint.bridges):
                if task_id not in ready:
                    await endpoint.bridges.pop(task_id).close()

    async def _replica(self, endpoint: _Endpoint) -> str:
        """A ready replica, with the fewest requests from here in flight; waits for one."""
        view = endpoint.view
        assert view is not None
        ready = view.replicas_ready()
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
                ready = view.replicas_ready()
                if ready:
                    return min(ready, key=lambda t: (endpoint.in_flight.get(t, 0), t))
        finally:
            endpoint.waiting -= 1
            self._report(endpoint)

    async def _bridge(self, endpoint: _Endpoint, task_id: str) -> _Bridge:
        bridge = endpoint.bridges.get(task_id)
        if bridge is not None:
            return bridge
        record = await self._book.task(task_id)
        if record is None or record.state != "running" or record.worker_id is None:
            raise _Refused(502, f"replica {task_id} of endpoint {endpoint.name} is not running")
        assert endpoint.view is not None
        bridge = _Bridge(self._tasks, record, endpoint.view.spec.port)
        await bridge.start()
        endpoint.bridges[task_id] = bridge
        return bridge

    async def _forward(
        self, endpoint: _Endpoint, task_id: str, request: web.Request
    ) -> web.StreamResponse:
        bridge = await self._bridge(endpoint, task_id)
        if endpoint.session is None:
            endpoint.session = aiohttp.ClientSession(
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=30),
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
            )
        path = request.match_info.get("path", "")
        url = f"http://{bridge.address}/{path}"
        if request.query_string:
            url += f"?{request.query_string}"
        headers = forwarded_headers(request)
        headers.pop("Authorization", None)
        headers["X-Forwarded-Host"] = request.host
        headers["X-Forwarded-Proto"] = request.scheme
        headers["X-Forwarded-Prefix"] = f"/{endpoint.name}"
        if request.remote:
            headers["X-Forwarded-For"] = request.remote
        body = request_body(request)
        endpoint.in_flight[task_id] = endpoint.in_flight.get(task_id, 0) + 1
        self._report(endpoint)
        response: web.StreamResponse | None = None
        # A pooled connection the replica closed while it idled (uvicorn after 5 s) fails
        # before a byte of the request arrived: a request without a body is sent again, once.
        retry = body is None and request.method in ("GET", "HEAD", "OPTIONS")
        try:
            try:
                upstream_call = await endpoint.session.request(
                    request.method, url, headers=headers, data=body, allow_redirects=False
                )
            except aiohttp.ServerDisconnectedError:
                if not retry:
                    raise
                upstream_call = await endpoint.session.request(
                    request.method, url, headers=headers, data=None, allow_redirects=False
                )
            async with upstream_call as upstream:
                response = response_for(upstream, {REPLICA_HEADER: task_id})
                await stream_body(upstream, response, request)
                self.requests += 1
                return response
        except (aiohttp.ClientError, ConnectionError) as exc:
            endpoint.fetched = 0.0  # read the view again: the replica may be gone
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            if response is None or not response.prepared:
                log.info("replica failed a request", endpoint=endpoint.name, task_id=task_id)
                return web.Response(
                    status=502,
                    text=f"replica {task_id} of endpoint {endpoint.name} failed before it"
                    f" answered: {why}\n",
                    headers={REPLICA_HEADER: task_id},
                )
            log.info("replica broke mid-response", endpoint=endpoint.name, task_id=task_id)
            if request.transport is not None:
                request.transport.abort()  # the client sees its transfer cut, never an end
            return response
        finally:
            endpoint.in_flight[task_id] -= 1
            if not endpoint.in_flight[task_id]:
                del endpoint.in_flight[task_id]
            self._report(endpoint)

    # -- reports to the autoscaler -----------------------------------------------------------

    def _report(self, endpoint: _Endpoint, *, urgent: bool = False) -> None:
        if endpoint.reporter is None or endpoint.reporter.done():
            endpoint.reporter = asyncio.create_task(self._reporting(endpoint))
        if urgent:
            endpoint.wake.set()

    async def _reporting(self, endpoint: _Endpoint) -> None:
        """Sends this gateway's numbers when they change (at most one a second, at once when a
        first request starts waiting), again every REPORT_REPEAT_S while not zero, and a last
        zero; then ends (the next request starts it again)."""
        sent: tuple[int, int] | None = None
        last = 0.0
        while True:
            now = (endpoint.total(), endpoint.waiting)
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
