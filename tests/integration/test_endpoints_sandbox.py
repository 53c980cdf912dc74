"""Endpoints end to end on the sandbox, as a user drives them: `levers9 endpoint create` (the real
CLI), then plain HTTP requests to the controlplane's endpoints front with the operator token,
proxied to the endpoint's replicas (tasks). Each test's endpoint has its own port (replicas
of different endpoints may share a worker, whose network their containers share).

- the first request at zero replicas is held through the cold start and answered;
- through a slow image pull (a registry behind a proxy that stalls each connection) the request
  waits, the one replica is never stopped and its pull never cancelled (the page's failure);
- concurrent requests scale the replicas up; idle ones stop, down to zero;
- a replica dying before it answers is a 502 naming it, mid-body a cut transfer, never a hang;
- without the token 401 (a `--public` endpoint needs none), an unknown endpoint 404, a
  WebSocket handshake 501; the page's vLLM row on this RTX PRO 6000 pool;
- `--ready-path`: no request before it answers 2xx, a replica whose path fails stays starting;
- a request that never reached a replica goes to another, a POST that reached one never twice;
  a failing endpoint's waiting request is 503 with the reason;
- nothing waits forever: a replica that never answers is 504 after the endpoint's request
  timeout (a cold start counts toward it), a client that sends its head slowly gets 408, a body
  over the limit 413 (by its length, nothing forwarded; chunked, cut), a kept-alive connection
  left idle is closed (the front's limits set small on a second front, per test).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
import structlog.testing
from pydantic import SecretStr
from temporalio.testing import WorkflowEnvironment

from levers9.core.endpoints import EndpointView
from levers9.gateway.endpoint_connections import FrontLimits
from levers9.gateway.endpoint_messages import REPLICA_HEADER as REPLICA
from levers9.gateway.endpoint_proxy import EndpointProxy
from levers9.gateway.endpoint_views import TemporalEndpointBook
from levers9.records.endpoints import delete_endpoint, endpoint_view, list_endpoints
from levers9.records.tasks import task_record
from levers9.temporal import connect
from levers9.tokens import operator_token
from sandbox import registries, task_images
from tests.controlplane import (
    POOL,
    TOKEN_SECRET,
    Controlplane,
    push_worker_image,
    reconciling,
    workers_available,
)
from tests.factories import HTTP_TASK as SERVE
from tests.factories import SERVE_H
from tests.waiting import eventually

pytestmark = pytest.mark.integration

WITHIN = 60
GAR_HOST = "us-central1-docker.pkg.dev"
IMAGE = f"{GAR_HOST}/demo/tasks/busybox:served"
SLEEPER = ("python", "-c", "import time; time.sleep(3600)")
"""A replica that never gets ready: its port never accepts."""


class StallingProxy:
    """A TCP proxy in front of the registry that holds each new connection `delay` seconds
    before it connects it: a slow link to a far registry, as a 20 GB image pull sees one. It
    runs on a loop of its own, in its own thread (the test's loop serves the controlplane)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.delay = 0.0
        self.connections = 0
        self.address = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self._loop
        ).result(10)
        self.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        await asyncio.sleep(self.delay)
        host, _, port = self.upstream.rpartition(":")
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            writer.close()
            return

        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError):
                dst.close()

        await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))


@pytest.fixture(scope="module")
async def proxy(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[StallingProxy]:
    directory = tmp_path_factory.mktemp("registry")
    with registries.LocalRegistry(directory / "gar") as gar:
        layout = directory / "layout"
        await asyncio.to_thread(task_images.build_busybox, layout, "served", "served")
        pushed = f"{gar.address}/demo/tasks/busybox:served"
        await asyncio.to_thread(registries.push_layout, layout, pushed, "served")
        # The replicas that name no image run in the worker's own, as on a real pool.
        await asyncio.to_thread(push_worker_image, directory, gar.address)
        stalling = StallingProxy(gar.address)
        stalling.start()
        try:
            yield stalling
        finally:
            stalling.close()


@pytest.fixture(scope="module")
async def cp(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory, proxy: StallingProxy
) -> AsyncIterator[Controlplane]:
    settings: dict[str, Any] = {
        "registryMirrors": f"{GAR_HOST}={proxy.address}",
        "insecureRegistries": proxy.address,
    }
    directory = tmp_path_factory.mktemp("endpoints")
    async with reconciling(dev_env.client, directory, None, False, **settings) as plane:
        await eventually(lambda: workers_available(plane), within=WITHIN)
        yield plane


@pytest.fixture(autouse=True)
async def _delete_after(cp: Controlplane) -> AsyncIterator[None]:
    """Each test's endpoints are deleted after it, but `cold` (the last test deletes it) and
    `limits` (its fixture does): their replicas stop here, not with the sandbox."""
    yield
    client = await connect(cp.settings)
    for name in await list_endpoints(client):
        if name not in ("cold", LIMITS):
            await delete_endpoint(client, name)


def _url(cp: Controlplane, name: str, path: str = "") -> str:
    return f"{cp.settings.endpoints_base_url()}/{name}/{path}"


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {operator_token(TOKEN_SECRET)}"}


async def _created(
    cp: Controlplane, name: str, port: int, *args: str, command: Sequence[str]
) -> str:
    """`levers9 endpoint create NAME` (on POOL, no card, `args`) serving `command`, which must
    succeed; its stdout."""
    done = await cp.cli(
        "endpoint", "create", name, "--pool", POOL, "--gpus", "0", "--port", str(port), *args,
        "--", *command,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def _create(cp: Controlplane, name: str, port: int, *args: str, serve: str = SERVE) -> None:
    stdout = await _created(cp, name, port, *args, command=("python", "-c", serve))
    assert f"endpoint {name} created: {_url(cp, name)}" in stdout
    assert "curl -m 1500" in stdout


async def _view(cp: Controlplane, name: str) -> EndpointView:
    view = await endpoint_view(await connect(cp.settings), name)
    assert view is not None
    return view


async def _why(cp: Controlplane, name: str) -> str:
    """The endpoint's events and its ended replicas' reasons and output (a failure's message)."""
    view = await _view(cp, name)
    client = await connect(cp.settings)
    lines = [f"{e.kind}: {e.message}" for e in view.events]
    for event in view.events:
        if event.kind == "replica ended":
            task_id = event.message.split()[1]
            record = await task_record(client, task_id)
            if record is not None:
                lines.append(f"{task_id}: {record.reason} {record.phases} {record.log_tail}")
    return "\n".join(lines)


async def _get(
    session: aiohttp.ClientSession, url: str, wait_s: float = 120
) -> tuple[int, str, str]:
    async with session.get(
        url, headers=_auth(), timeout=aiohttp.ClientTimeout(total=wait_s)
    ) as response:
        return response.status, await response.text(), response.headers.get("x-levers9-replica", "")


async def _get_once(url: str, wait_s: float = 120) -> tuple[int, str, str]:
    """`_get` in a session of its own."""
    async with aiohttp.ClientSession() as session:
        return await _get(session, url, wait_s)


async def test_the_first_request_at_zero_is_held_through_the_cold_start(cp: Controlplane) -> None:
    await _create(cp, "cold", 8101)
    view = await _view(cp, "cold")
    assert view.replicas == []
    assert view.spec.min_replicas == 0
    status, body, replica = await _get_once(_url(cp, "cold", "first?x=1"))
    assert status == 200, body
    assert body == f"hello from {replica} /first?x=1"
    view = await _view(cp, "cold")
    assert view.cold_starts == 1
    assert [r.task_id for r in view.replicas if r.state == "ready"] == [replica]
    kinds = [e.kind for e in view.events]
    assert kinds[:2] == ["cold start", "ready"], view.events
    assert view.events[0].message == "1 request(s) waiting and no replica: starting 1"
    shown = await cp.cli("endpoint", "get", "cold")
    assert "cold start" in shown.stdout
    assert replica in shown.stdout
    listed = await cp.cli("endpoint", "list")
    assert "cold" in listed.stdout
    record = await task_record(await connect(cp.settings), replica)
    assert record is not None
    assert record.endpoint == "cold"
    assert record.ready


@pytest.mark.skipif(os.geteuid() != 0, reason="runc needs root (CI and the worker Job are)")
async def test_a_request_is_held_through_a_slow_image_pull(
    cp: Controlplane, proxy: StallingProxy
) -> None:
    """Every registry connection stalls 2 s (skopeo makes several): the request waits the whole
    pull, the one replica is never stopped, its pull never cancelled or retried."""
    serve = (
        "busybox mkdir -p /dev/shm/www && echo pulled-and-served > /dev/shm/www/index.html"
        " && exec busybox httpd -f -p $LEVERS9_HOST:$PORT -h /dev/shm/www"
    )
    proxy.delay = 2.0
    try:
        await _created(cp, "pull", 8105, "--image", IMAGE, command=("sh", "-c", serve))
        before = proxy.connections
        status, body, replica = await _get_once(_url(cp, "pull"), wait_s=300)
    finally:
        proxy.delay = 0.0
    assert status == 200, body + await _why(cp, "pull")
    assert body.strip() == "pulled-and-served"
    assert proxy.connections > before, "the pull went through the stalling proxy"
    view = await _view(cp, "pull")
    assert view.cold_starts == 1
    assert [r.task_id for r in view.replicas] == [replica], "one replica, never replaced"
    assert "replica ended" not in [e.kind for e in view.events], view.events
    record = await task_record(await connect(cp.settings), replica)
    assert record is not None
    [pull] = [p for p in record.phases if p.name == "image.pull"]
    assert pull.detail.startswith("pulled "), pull
    # Held through the pull: the cold start (the request waiting) came before the pull's step,
    # and the replica was ready (then answered it) only after.
    cold = next(e for e in view.events if e.kind == "cold start")
    ready = next(e for e in view.events if e.kind == "ready")
    assert pull.at is not None
    assert cold.at <= pull.at <= ready.at, (cold, pull, ready)


async def test_concurrent_requests_scale_the_replicas_up(cp: Controlplane) -> None:
    await _create(cp, "burst", 8102, "--concurrency", "1", "--max-replicas", "3", "--idle", "600")
    async with aiohttp.ClientSession() as session:
        status, _, first = await _get(session, _url(cp, "burst"))
        assert status == 200
        seen: set[str] = set()

        async def wave() -> bool:
            answers = await asyncio.gather(
                *(_get(session, _url(cp, "burst", "slow?s=0.5")) for _ in range(6))
            )
            assert all(status == 200 for status, _, _ in answers), answers
            seen.update(replica for _, _, replica in answers)
            return len(seen) >= 2

        await eventually(wave, within=WITHIN)
    view = await _view(cp, "burst")
    ups = [e.message for e in view.events if e.kind == "scale up"]
    assert ups, view.events
    assert "waiting for 1 replica(s) (target 1 each): 1 -> " in ups[0], ups
    serving = {r.task_id for r in view.replicas if r.state != "stopping"}
    assert len(serving) >= 2, view.replicas
    assert first in serving, "the first replica serves on beside those scaled up"
    assert seen <= serving, "every answer came from one of the endpoint's replicas"


async def test_idle_replicas_stop_down_to_zero_and_start_again(cp: Controlplane) -> None:
    await _create(cp, "idle", 8103, "--idle", "2")
    async with aiohttp.ClientSession() as session:
        status, _, replica = await _get(session, _url(cp, "idle"))
        assert status == 200

        async def at_zero() -> bool:
            return (await _view(cp, "idle")).replicas == []

        await eventually(at_zero, within=WITHIN)
        view = await _view(cp, "idle")
        [down] = [e for e in view.events if e.kind == "scale down"]
        assert down.message == "0 in flight for 2 s: 1 -> 0"
        record = await task_record(await connect(cp.settings), replica)
        assert record is not None
        assert record.state == "cancelled"
        assert "endpoint idle" in record.reason
        status, _, again = await _get(session, _url(cp, "idle"))
        assert status == 200
        assert again != replica
    assert (await _view(cp, "idle")).cold_starts == 2


async def test_a_replica_dying_mid_request_is_a_clear_502_never_a_hang(cp: Controlplane) -> None:
    await _create(cp, "die", 8104, "--max-replicas", "1")
    async with aiohttp.ClientSession() as session:
        status, _, first = await _get(session, _url(cp, "die"))
        assert status == 200
        async with asyncio.timeout(30):
            status, body, replica = await _get(session, _url(cp, "die", "die"))
        assert status == 502
        assert replica == first
        assert f"replica {first} of endpoint die failed before it answered" in body

        async def served_again() -> bool:
            status, _, replica = await _get(session, _url(cp, "die"))
            return status == 200 and replica != first

        await eventually(served_again, within=WITHIN)
        async with (
            asyncio.timeout(30),
            session.get(_url(cp, "die", "half"), headers=_auth()) as response,
        ):
            assert response.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await response.read()
    view = await _view(cp, "die")
    ended = [e.message for e in view.events if e.kind == "replica ended"]
    assert any(first in message and "failed" in message for message in ended), ended


READ_BODY = (
    "        body = b''\n"
    "        if self.headers.get('Transfer-Encoding') == 'chunked':\n"
    "            while size := int(self.rfile.readline().split(b';')[0], 16):\n"
    "                body += self.rfile.read(size)\n"
    "                self.rfile.readline()\n"
    "            self.rfile.readline()\n"
    "        else:\n"
    "            body = self.rfile.read(int(self.headers['Content-Length']))\n"
)
"""In a handler's do_POST: `body`, the request's whole body, chunked or by length."""
VARIETY = (
    "import hashlib, http.server, json, os\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    protocol_version = 'HTTP/1.1'\n"
    "    def _send(self, status, body=b'', headers=()):\n"
    "        self.send_response(status)\n"
    "        for k, v in headers:\n"
    "            self.send_header(k, v)\n"
    "        if status != 204:\n"
    "            self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "    def do_GET(self):\n"
    "        if self.path == '/stream':\n"
    "            self.send_response(200)\n"
    "            self.send_header('Content-Type', 'text/event-stream')\n"
    "            self.send_header('Transfer-Encoding', 'chunked')\n"
    "            self.end_headers()\n"
    "            for i in range(3):\n"
    "                data = f'data: {i}\\n\\n'.encode()\n"
    "                self.wfile.write(b'%x\\r\\n%s\\r\\n' % (len(data), data))\n"
    "                self.wfile.flush()\n"
    "            self.wfile.write(b'0\\r\\n\\r\\n')\n"
    "        elif self.path == '/close':\n"
    "            self.close_connection = True\n"
    "            self._send(200, b'bye', [('Connection', 'close')])\n"
    "        elif self.path == '/nothing':\n"
    "            self._send(204)\n"
    "        else:\n"
    "            seen = {'path': self.path, 'headers': dict(self.headers.items())}\n"
    "            cookies = [('Set-Cookie', 'a=1'), ('Set-Cookie', 'b=2')]\n"
    "            self._send(200, json.dumps(seen).encode(), cookies)\n"
    "    def do_HEAD(self):\n"
    "        self.send_response(200)\n"
    "        self.send_header('Content-Length', '1234')\n"
    "        self.end_headers()\n"
    "    def do_POST(self):\n"
    + READ_BODY
    + "        framing = 'chunked' if self.headers.get('Transfer-Encoding') else 'length'\n"
    "        digest = hashlib.sha256(body).hexdigest()\n"
    "        self._send(200, f'{len(body)} {digest} {framing}'.encode())\n"
    "    def log_message(self, *args):\n"
    "        pass\n"
    "http.server.ThreadingHTTPServer(('0.0.0.0', int(os.environ['PORT'])), H).serve_forever()\n"
)


async def test_http_passes_through_as_sent_streamed_both_ways(cp: Controlplane) -> None:
    """What a platform engineer's server sees and sends: the path as sent (still encoded) under
    the endpoint's prefix, the headers but the operator token, bodies of every framing (small,
    large, chunked), a server-sent event stream, HEAD, 204, repeated headers, and a response
    that closes its connection followed by the next request."""
    import hashlib

    await _create(cp, "variety", 8106, serve=VARIETY)
    url = _url(cp, "variety")
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "echo/a%2Fb?x=1&y=%20", headers=_auth()) as response:
            assert response.status == 200, await response.text()
            seen = await response.json(content_type=None)  # the replica sent none
            assert response.headers.getall("Set-Cookie") == ["a=1", "b=2"]
        assert seen["path"] == "/echo/a%2Fb?x=1&y=%20"
        assert seen["headers"]["X-Forwarded-Prefix"] == "/variety"
        assert "Authorization" not in seen["headers"]
        assert seen["headers"]["Host"] == "127.0.0.1:8106"

        async with session.get(url + "stream", headers=_auth()) as response:
            assert response.headers["Content-Type"] == "text/event-stream"
            events = [line async for line in response.content if line.strip()]
        assert events == [b"data: 0\n", b"data: 1\n", b"data: 2\n"]

        async with session.head(url, headers=_auth()) as response:
            assert response.status == 200
            assert response.headers["Content-Length"] == "1234"
            assert await response.read() == b""
        async with session.get(url + "nothing", headers=_auth()) as response:
            assert response.status == 204
        for _ in range(2):  # the replica closes the first: the second goes on a new stream
            async with session.get(url + "close", headers=_auth()) as response:
                assert await response.text() == "bye"

        large = os.urandom(1 << 20)

        async def chunks() -> AsyncIterator[bytes]:
            for offset in range(0, len(large), 100_000):
                yield large[offset : offset + 100_000]

        for body, framing in ((b'{"prompt": "hi"}', "length"), (large, "length")):
            async with session.post(url, data=body, headers=_auth()) as response:
                answer = await response.text()
            assert answer == f"{len(body)} {hashlib.sha256(body).hexdigest()} {framing}"
        async with session.post(url, data=chunks(), headers=_auth()) as response:
            answer = await response.text()
        assert answer == f"{len(large)} {hashlib.sha256(large).hexdigest()} chunked"


async def test_requests_need_the_operator_token_and_a_known_endpoint(cp: Controlplane) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(_url(cp, "cold")) as response:
            assert response.status == 401
            assert "Authorization: Bearer <token>`: the operator's" in await response.text()
        async with session.get(_url(cp, "cold"), headers={"Authorization": "Bearer nope"}) as r:
            assert r.status == 401
        async with session.get(_url(cp, "nosuch"), headers=_auth()) as response:
            assert response.status == 404
            assert "no endpoint nosuch" in await response.text()


async def test_blackwell_replicas_get_the_triton_attention_backend(cp: Controlplane) -> None:
    """The pool's gpuType is RTX PRO 6000 (compute capability 12): the page's vLLM row."""
    status, body, _ = await _get_once(_url(cp, "cold", "env"))
    assert (status, body) == (200, "TRITON_ATTN")


async def test_delete_stops_the_replicas(cp: Controlplane) -> None:
    view = await _view(cp, "cold")
    replicas = [r.task_id for r in view.replicas]
    done = await cp.cli("endpoint", "delete", "cold")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "endpoint cold deleted" in done.stdout
    client = await connect(cp.settings)
    for task_id in replicas:
        record = await task_record(client, task_id)
        assert record is not None
        assert record.state == "cancelled"
    missing = await cp.cli("endpoint", "get", "cold")
    assert missing.returncode == 1
    assert "no endpoint cold" in missing.stderr


async def test_create_refuses_what_it_cannot_run_naming_the_option(cp: Controlplane) -> None:
    unknown = await cp.cli(
        "endpoint", "create", "x", "--pool", "nosuch", "--port", "80", "--", "true"
    )
    assert unknown.returncode == 1
    assert "no pool nosuch on this controlplane" in unknown.stderr
    bad = await cp.cli(
        "endpoint", "create", "Bad_Name", "--pool", POOL, "--port", "80", "--", "true"
    )
    assert bad.returncode == 2
    assert "NAME" in bad.stderr
    inverted = await cp.cli(
        "endpoint", "create", "y", "--pool", POOL, "--port", "80",
        "--min-replicas", "3", "--max-replicas", "1", "--", "true",
    )  # fmt: skip
    assert inverted.returncode == 2
    assert "--min-replicas 3 is above --max-replicas 1" in inverted.stderr


LIMITS = "limits"
REQUEST_TIMEOUT_S = 3
COUNTING = (
    "import http.server, os, time\n"
    "seen = {'heads': 0, 'bodies': 0}\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    protocol_version = 'HTTP/1.1'\n"
    "    def _send(self, body):\n"
    "        self.send_response(200)\n"
    "        self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "    def do_GET(self):\n"
    "        if self.path == '/hang':\n"
    "            time.sleep(3600)\n"
    "        if self.path == '/trickle':\n"
    "            self.send_response(200)\n"
    "            self.send_header('Content-Length', '1000')\n"
    "            self.end_headers()\n"
    "            self.wfile.write(b'x' * 10)\n"
    "            self.wfile.flush()\n"
    "            time.sleep(3600)\n"
    "        self._send(f\"{seen['heads']} {seen['bodies']}\".encode())\n"
    "    def do_POST(self):\n"
    "        seen['heads'] += 1\n" + READ_BODY + "        seen['bodies'] += 1\n"
    "        self._send(str(len(body)).encode())\n" + SERVE_H
)
"""A replica that counts the POSTs whose head it read and those whose whole body it read (GET
answers `<heads> <bodies>`), answers a POST with its body's length, `/hang` never, and
`/trickle` with 10 bytes of 1000, then nothing."""


@pytest.fixture(scope="module")
async def limits(cp: Controlplane) -> AsyncIterator[str]:
    """The endpoint `limits`: one replica kept ready (COUNTING), a request timeout of 3 s."""
    stdout = await _created(
        cp, LIMITS, 8107, "--min-replicas", "1", "--request-timeout", f"{REQUEST_TIMEOUT_S}s",
        command=("python", "-c", COUNTING),
    )  # fmt: skip
    assert f"curl -m {REQUEST_TIMEOUT_S} " in stdout

    async def ready() -> bool:
        return bool((await _view(cp, LIMITS)).replicas_ready())

    await eventually(ready, within=WITHIN)
    yield LIMITS
    await delete_endpoint(await connect(cp.settings), LIMITS)


@asynccontextmanager
async def _front(cp: Controlplane, **limits: float) -> AsyncIterator[tuple[str, int]]:
    """A second endpoints front on this controlplane (its Temporal, its gateway's streams to
    the workers) with its own limits: the defaults but `limits`. Yields its host and port."""
    assert cp.gateway is not None
    assert cp.gateway.tasks_service is not None
    proxy = EndpointProxy(
        TemporalEndpointBook(await connect(cp.settings)),
        cp.gateway.tasks_service,
        SecretStr(TOKEN_SECRET),
        "test-front",
        limits=FrontLimits(**{**FrontLimits.defaults().__dict__, **limits}),
    )
    port = await proxy.start("127.0.0.1:0")
    try:
        yield "127.0.0.1", port
    finally:
        await proxy.stop()


async def _counts(session: aiohttp.ClientSession, base: str) -> tuple[int, int]:
    """The replica's (POST heads, POST bodies) read whole."""
    status, body, _ = await _get(session, f"{base}/{LIMITS}/count")
    assert status == 200, body
    heads, bodies = body.split()
    return int(heads), int(bodies)


async def _response(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One response's head and its body (by its Content-Length) off a raw connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head, await reader.readexactly(length)


async def test_a_replica_that_never_answers_is_a_504_after_the_endpoints_timeout(
    cp: Controlplane, limits: str
) -> None:
    shown = await cp.cli("endpoint", "get", limits)
    assert f"request timeout {REQUEST_TIMEOUT_S} s (a cold start included)" in shown.stdout
    [replica] = (await _view(cp, limits)).replicas_ready()
    async with aiohttp.ClientSession() as session:
        status, body, answered = await _get(session, _url(cp, limits, "count"))
        assert (status, answered) == (200, replica), body  # it answers what it can
        status, body, answered = await _get(session, _url(cp, limits, "hang"), wait_s=60)
    assert status == 504, body
    assert answered == replica
    assert body == (
        f"endpoint {limits}: no response within its request timeout of {REQUEST_TIMEOUT_S} s:"
        f" replica {replica} had not answered. To give it longer, create the endpoint again"
        f" with --request-timeout (`levers9 endpoint get {limits}` shows it)\n"
    )


async def test_a_response_still_running_at_the_request_timeout_is_cut(
    cp: Controlplane, limits: str
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        asyncio.timeout(60),
        session.get(_url(cp, limits, "trickle"), headers=_auth()) as response,
    ):
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()


async def test_the_time_held_through_a_cold_start_counts_toward_the_request_timeout(
    cp: Controlplane,
) -> None:
    """A replica that never gets ready (its port never accepts): the request, held for it,
    is answered 504 at its request timeout, long before the cold start timeout."""
    await _created(cp, "unready", 8108, "--request-timeout", "1s", command=SLEEPER)
    status, body, replica = await _get_once(_url(cp, "unready"), wait_s=60)
    assert status == 504, body
    assert replica == ""
    assert body.startswith(
        "endpoint unready: no response within its request timeout of 1 s: no replica was"
        " ready for it (a cold start counts)."
    ), body
    view = await _view(cp, "unready")
    assert view.spec.cold_start_timeout_seconds == 1500
    assert [e.kind for e in view.events][:1] == ["cold start"], view.events


async def test_no_replica_ready_within_the_cold_start_timeout_is_a_503_saying_so(
    cp: Controlplane,
) -> None:
    """The troubleshooting row `503 endpoint E: no replica ready after N s`: a replica that
    never gets ready, a cold start timeout shorter than the request timeout."""
    await _created(cp, "never", 8109, "--cold-start-timeout", "2", command=SLEEPER)
    status, body, replica = await _get_once(_url(cp, "never"), wait_s=60)
    assert status == 503, body
    assert replica == ""
    assert body == (
        "endpoint never: no replica ready after 2 s (`levers9 endpoint get never` shows its"
        " replicas)\n"
    )
    view = await _view(cp, "never")
    assert view.spec.cold_start_timeout_seconds == 2
    assert [e.kind for e in view.events][:1] == ["cold start"], view.events
    assert [r.state for r in view.replicas if r.state == "ready"] == [], view.replicas


DRIBBLE_S = 0.3


async def test_a_client_that_sends_its_head_slowly_gets_408(cp: Controlplane, limits: str) -> None:
    async with _front(cp, header_timeout_s=1) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        prompt = f"GET /{limits}/count HTTP/1.1\r\nHost: front\r\n{_auth_line()}\r\n"
        writer.write(prompt.encode())
        head, _ = await _response(reader)
        assert head.startswith(b"HTTP/1.1 200 "), head  # a head sent at once is served
        writer.write(f"GET /{limits}/count HTTP/1.1\r\nHost: front\r\n".encode())
        answer, dribbled = b"", 0
        async with asyncio.timeout(30):
            while not answer:  # then dribbled, a header line each DRIBBLE_S, never finished
                with contextlib.suppress(ConnectionError):
                    writer.write(f"X-Dribble-{dribbled}: 1\r\n".encode())
                    await writer.drain()
                    dribbled += 1
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(DRIBBLE_S):  # or until the front answers
                        answer = await reader.read(65536)
            answer += await reader.read()  # to the end of the connection
        writer.close()
    assert dribbled >= 2, "the head was still coming when the front answered"
    head, _, text = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 Request Timeout\r\n"), answer
    assert b"Connection: close" in head
    assert text == (
        b"the request's line and headers did not arrive within 1 s"
        b" (endpointsHeaderTimeoutSeconds)\n"
    )


async def test_a_connection_that_sends_nothing_is_closed_at_the_header_timeout(
    cp: Controlplane, limits: str
) -> None:
    async with _front(cp, header_timeout_s=1) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        async with asyncio.timeout(30):
            said = await reader.read()  # to the end of the connection
        writer.close()
    assert said == b"", "nothing to answer: no 408"


async def test_an_idle_keep_alive_connection_is_closed_by_the_front(
    cp: Controlplane, limits: str
) -> None:
    async with _front(cp, idle_timeout_s=1) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        for _ in range(2):  # kept alive: the second request goes on the same connection
            request = f"GET /{limits}/count HTTP/1.1\r\nHost: front\r\n{_auth_line()}\r\n"
            writer.write(request.encode())
            head, _ = await _response(reader)
            assert head.startswith(b"HTTP/1.1 200 "), head
            assert b"connection: close" not in head.lower()
        async with asyncio.timeout(30):
            rest = await reader.read()  # then left idle: the front closes it
        writer.close()
    assert rest == b""


async def test_a_body_over_the_limit_is_413_and_never_reaches_the_replica(
    cp: Controlplane, limits: str
) -> None:
    async with _front(cp, max_body_bytes=100_000) as (host, port), aiohttp.ClientSession() as s:
        base = f"http://{host}:{port}"
        async with s.post(f"{base}/{limits}/", data=b"x" * 100_000, headers=_auth()) as response:
            assert (response.status, await response.text()) == (200, "100000")
        before = await _counts(s, base)
        async with s.post(f"{base}/{limits}/", data=b"x" * 100_001, headers=_auth()) as response:
            status, text = response.status, await response.text()
        assert await _counts(s, base) == before
    assert status == 413, text
    assert text == (
        f"endpoint {limits}: the request's body (100001 bytes) is over the endpoints' limit of"
        " 100000 bytes: the controlplane's endpointsMaxBodyBytes"
        " (LEVERS9_ENDPOINTS_MAX_BODY_BYTES) sets it\n"
    )


async def test_expect_100_continue_is_answered_only_to_a_body_within_the_limit(
    cp: Controlplane, limits: str
) -> None:
    """curl's way with a large upload: the head first, the body once the front says 100."""
    async with _front(cp, max_body_bytes=100_000) as (host, port):
        reader, writer = await asyncio.open_connection(host, port)
        head = (
            f"POST /{limits}/ HTTP/1.1\r\nHost: front\r\n{_auth_line()}"
            "Expect: 100-continue\r\nContent-Length: {length}\r\n\r\n"
        )
        writer.write(head.format(length=5).encode())
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hello")
        answer, body = await _response(reader)
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        assert body == b"5"
        writer.write(head.format(length=100_001).encode())  # and no body
        answer, body = await _response(reader)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 413 Request Entity Too Large\r\n"), answer
    assert b"Connection: close" in answer
    assert b"is over the endpoints' limit of 100000 bytes" in body


async def test_a_chunked_body_past_the_limit_is_cut_with_413(cp: Controlplane, limits: str) -> None:
    def chunked(total: int) -> AsyncIterator[bytes]:
        async def chunks() -> AsyncIterator[bytes]:
            for offset in range(0, total, 20_000):
                yield b"x" * min(20_000, total - offset)

        return chunks()

    async with _front(cp, max_body_bytes=100_000) as (host, port), aiohttp.ClientSession() as s:
        base = f"http://{host}:{port}"
        async with s.post(f"{base}/{limits}/", data=chunked(100_000), headers=_auth()) as r:
            assert (r.status, await r.text()) == (200, "100000")
        heads, bodies = await _counts(s, base)
        async with s.post(f"{base}/{limits}/", data=chunked(300_000), headers=_auth()) as r:
            status, text = r.status, await r.text()

        async def replica_saw_it_begin() -> bool:
            return (await _counts(s, base))[0] == heads + 1

        await eventually(replica_saw_it_begin, within=WITHIN)
        assert await _counts(s, base) == (heads + 1, bodies), "its body never ended"
    assert status == 413, text
    assert text.startswith(f"endpoint {limits}: the chunked body ("), text
    assert "bytes so far) is over the endpoints' limit of 100000 bytes: the controlplane's" in text
    assert "endpointsMaxBodyBytes" in text


async def test_create_refuses_a_request_timeout_that_is_not_a_duration_above_zero(
    cp: Controlplane,
) -> None:
    for bad in ("0", "-5s", "soon", "0m"):
        done = await cp.cli(
            "endpoint", "create", "t", "--pool", POOL, "--port", "80",
            "--request-timeout", bad, "--", "true",
        )  # fmt: skip
        assert done.returncode == 2, done.stdout + done.stderr
        said = " ".join(" ".join(line.strip("│ ").split()) for line in done.stderr.splitlines())
        assert (
            f"Invalid value for --request-timeout: '{bad}': a duration above zero, like 90s,"
            " 25m or 1h" in said
        ), done.stderr


def _auth_line() -> str:
    return "".join(f"{key}: {value}\r\n" for key, value in _auth().items())


async def _raw(cp: Controlplane, head: str) -> bytes:
    """One request written as `head` on a new connection to the front; its whole answer, to
    the end of the connection or of its body."""
    host, _, port = cp.settings.endpoints_base_url().removeprefix("http://").partition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head.encode())
        async with asyncio.timeout(60):
            answer, body = await _response(reader)
        return answer + body
    finally:
        writer.close()


async def test_a_websocket_handshake_is_refused_501_and_never_wakes_a_replica(
    cp: Controlplane,
) -> None:
    """docs/endpoints.md: WebSockets are not proxied. A client's handshake (RFC 6455, as
    `websockets` or a browser writes it) is refused at the door with a 501 saying so, at zero
    replicas (no cold start for it) and with a replica ready (it never reaches it); an Upgrade
    a server may ignore (h2c) is served as HTTP/1.1, Upgrade not passed on."""
    await _create(cp, "ws", 8110, serve=VARIETY)
    handshake = (
        "GET /ws/chat HTTP/1.1\r\nHost: front\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
        f"{_auth_line()}\r\n"
    )
    refused = (
        b"endpoint ws: WebSockets are not proxied (the request asked for Upgrade: websocket);"
        b" the endpoints carry HTTP requests and streamed responses (server-sent events)\n"
    )
    cold = await _raw(cp, handshake)
    assert cold.startswith(b"HTTP/1.1 501 Not Implemented\r\n"), cold
    assert cold.endswith(refused), cold
    assert b"x-levers9-replica" not in cold.lower()
    status, body, replica = await _get_once(_url(cp, "ws", "plain"))
    assert status == 200, body
    view = await _view(cp, "ws")
    assert view.cold_starts == 1, "the handshake started no replica; the plain GET did"
    assert view.events[0].message == "1 request(s) waiting and no replica: starting 1"
    warm = await _raw(cp, handshake)
    assert warm.startswith(b"HTTP/1.1 501 Not Implemented\r\n"), warm
    assert warm.endswith(refused), warm
    h2c = await _raw(
        cp,
        "GET /ws/h2c HTTP/1.1\r\nHost: front\r\nUpgrade: h2c\r\nConnection: Upgrade,"
        f" HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n{_auth_line()}\r\n",
    )
    assert h2c.startswith(b"HTTP/1.1 200 OK\r\n"), h2c
    assert f"x-levers9-replica: {replica}".encode() in h2c
    seen = json.loads(h2c.partition(b"\r\n\r\n")[2])
    assert seen["path"] == "/h2c"
    assert "Upgrade" not in seen["headers"], seen


async def test_a_public_endpoint_serves_without_the_token_and_never_passes_one_on(
    cp: Controlplane,
) -> None:
    """`--public`: requests need no operator token (create's curl line has none), and an
    Authorization header a caller sends still never reaches the replica; the same server
    created without it is refused 401."""
    for name, port, public in (("open", 8111, ("--public",)), ("closed", 8112, ())):
        stdout = await _created(cp, name, port, *public, command=("python", "-c", VARIETY))
        assert ("Authorization" in stdout) is not bool(public), stdout
    async with aiohttp.ClientSession() as session:
        async with session.get(_url(cp, "open", "anyone")) as response:
            assert response.status == 200, await response.text()
            seen = await response.json(content_type=None)
        assert seen["path"] == "/anyone"
        caller = {"Authorization": "Bearer the-callers-own-token"}
        async with session.get(_url(cp, "open", "theirs"), headers=caller) as response:
            assert response.status == 200, await response.text()
            seen = await response.json(content_type=None)
        assert "Authorization" not in seen["headers"], seen
        async with session.get(_url(cp, "closed", "anyone")) as response:
            assert response.status == 401
            assert "or create it --public" in await response.text()
    assert (await _view(cp, "closed")).cold_starts == 0


READY_PATH = (
    "import http.server, os\n"
    "health = []\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    protocol_version = 'HTTP/1.1'\n"
    "    def do_GET(self):\n"
    "        if self.path == '/health':\n"
    "            status = 200 if len(health) >= int(os.environ['FAIL_FIRST']) else 503\n"
    "            health.append(status)\n"
    "            print('health', status, flush=True)\n"
    "        else:\n"
    "            status = 200\n"
    "        body = ' '.join(map(str, health)).encode()\n"
    "        self.send_response(status)\n"
    "        self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers()\n"
    "        self.wfile.write(body)\n" + SERVE_H
)
"""A replica that listens at once and answers `/health` 503 to its first FAIL_FIRST probes,
then 200 (printing each); any other path answers the statuses `/health` gave so far."""


async def test_a_replica_gets_requests_only_once_its_ready_path_answers_2xx(
    cp: Controlplane,
) -> None:
    """`--ready-path /health`: the replica's port accepts at once, but the request held through
    the cold start reaches it only after /health answered 200, after the 503s before it."""
    await _create(
        cp, "readypath", 8113, "--ready-path", "/health", "-e", "FAIL_FIRST=3", serve=READY_PATH
    )
    async with aiohttp.ClientSession() as session:
        status, body, replica = await _get(session, _url(cp, "readypath", "work"))
    assert status == 200, body + await _why(cp, "readypath")
    assert body.split() == ["503", "503", "503", "200"], "its probes' answers before it came"
    record = await task_record(await connect(cp.settings), replica)
    assert record is not None
    [ready] = [p for p in record.phases if p.name == "container.ready"]
    assert ready.detail == "GET /health on port 8113: 200", ready


async def test_a_replica_whose_ready_path_fails_stays_not_ready(cp: Controlplane) -> None:
    """/health answers 503 to every probe: once the worker has probed it (and been refused)
    more than once, the replica is still starting, its record not ready, and a held request
    gets the cold start timeout's 503, never the replica."""
    await _create(
        cp, "neverready", 8114, "--ready-path", "/health", "--cold-start-timeout", "3",
        "-e", "FAIL_FIRST=1000000", serve=READY_PATH,
    )  # fmt: skip
    async with aiohttp.ClientSession() as session:
        status, body, replica = await _get(session, _url(cp, "neverready", "work"), wait_s=60)
    assert status == 503, body
    assert replica == ""
    assert body.startswith("endpoint neverready: no replica ready after 3 s"), body
    [starting] = (await _view(cp, "neverready")).replicas
    client = await connect(cp.settings)

    async def probed_and_refused_twice() -> bool:
        logs = await cp.cli("task", "logs", starting.task_id)
        return logs.stdout.splitlines().count("health 503") >= 2

    await eventually(probed_and_refused_twice, within=WITHIN)
    [still] = (await _view(cp, "neverready")).replicas
    assert (still.task_id, still.state) == (starting.task_id, "starting"), still
    record = await task_record(client, starting.task_id)
    assert record is not None
    assert (record.state, record.ready) == ("running", False), record


RESEND = (
    "import http.server, os, threading, time\n"
    "def say(line):\n"
    "    print(line, flush=True)\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    protocol_version = 'HTTP/1.1'\n"
    "    def _send(self, body):\n"
    "        self.send_response(200)\n"
    "        self.send_header('Content-Length', str(len(body)))\n"
    "        if self.close_connection:\n"
    "            self.send_header('Connection', 'close')\n"
    "        self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "    def do_GET(self):\n"
    "        say(f'GET {self.path}')\n"
    "        if self.path == '/unlisten':\n"
    "            self.close_connection = True\n"
    "            threading.Thread(target=server.shutdown).start()\n"
    "        self._send(os.environ['LEVERS9_TASK_ID'].encode())\n"
    "    def do_POST(self):\n"
    "        body = self.rfile.read(int(self.headers['Content-Length']))\n"
    "        say(f'POST {self.path}')\n"
    "        if self.path == '/die':\n"
    "            os._exit(3)\n"
    "        self._send(body)\n"
    "    def log_message(self, *args):\n"
    "        pass\n"
    "server = http.server.ThreadingHTTPServer((os.environ['LEVERS9_HOST'],"
    " int(os.environ['PORT'])), H)\n"
    "server.serve_forever()\n"
    "server.socket.close()\n"
    "say('stopped listening')\n"
    "time.sleep(3600)\n"
)
"""A replica that prints each request it receives (`GET /path`, `POST /path`) before it acts on
it: POST /die exits before answering; GET /unlisten answers, closes that connection and
the listening socket (the task runs on, its port refusing connections)."""


async def _received(cp: Controlplane, task_id: str) -> list[str]:
    """The lines the replica printed: the requests it received, each time it received one."""
    logs = await cp.cli("task", "logs", task_id)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    return logs.stdout.splitlines()


async def test_a_request_that_never_reached_a_replica_goes_to_another_but_a_post_never_twice(
    cp: Controlplane,
) -> None:
    """Two ready replicas. A POST that reached one, which died of it before answering, is 502
    naming it and was received once, by it alone (the other was ready all along). A GET whose
    replica's port refuses (its worker never connected) goes to the other, received there once."""
    await _create(cp, "resend", 8115, "--min-replicas", "2", "--max-replicas", "2", serve=RESEND)

    async def ready() -> list[str]:
        return (await _view(cp, "resend")).replicas_ready()

    async def two_ready() -> bool:
        return len(await ready()) == 2

    await eventually(two_ready, within=WITHIN)
    both = await ready()
    client = await connect(cp.settings)
    async with (
        aiohttp.ClientSession() as session,
        session.post(_url(cp, "resend", "die"), data=b"once", headers=_auth()) as r,
    ):
        status, text, died = r.status, await r.text(), r.headers.get(REPLICA, "")
    received = {task_id: await _received(cp, task_id) for task_id in both}
    posts = {task_id: lines.count("POST /die") for task_id, lines in received.items()}
    assert sorted(posts.values()) == [0, 1], f"a POST is never sent twice: {posts}"
    assert status == 502, text
    assert posts[died] == 1, (died, posts)
    assert text.startswith(f"replica {died} of endpoint resend failed before it answered"), text
    [other] = [t for t in both if t != died]
    record = await task_record(client, other)
    assert record is not None
    assert (record.state, record.ready) == ("running", True), "the other could have taken it"

    async def replaced() -> bool:
        now = await ready()
        return len(now) == 2 and died not in now

    await eventually(replaced, within=WITHIN, what="the replica that died replaced")
    async with _front(cp) as (host, port), aiohttp.ClientSession() as session:
        base = f"http://{host}:{port}/resend"
        status, deaf, _ = await _get(session, f"{base}/unlisten")
        assert status == 200, deaf

        async def stopped_listening() -> bool:
            return "stopped listening" in await _received(cp, deaf)

        await eventually(stopped_listening, within=WITHIN)
        [listening] = [t for t in await ready() if t != deaf]
        assert deaf == min(deaf, listening), "this front tries the lowest id first, at no load"
        with structlog.testing.capture_logs() as logs:
            status, body, answered = await _get(session, f"{base}/hello")
    assert (status, answered, body) == (200, listening, listening), body
    sent_on = [e for e in logs if e["event"] == "replica not reached, request sent on"]
    assert [e["task_id"] for e in sent_on] == [deaf], logs
    assert (await _received(cp, listening)).count("GET /hello") == 1
    assert (await _received(cp, deaf)).count("GET /hello") == 0


async def test_a_failing_endpoint_answers_its_waiting_request_503_with_the_reason(
    cp: Controlplane,
) -> None:
    """Replicas that exit before they are ready: after three in a row the endpoint is failing,
    and the request held for it is answered 503 with the reason (not at its timeouts)."""
    await _create(cp, "broken", 8116, serve="import sys; print('no model'); sys.exit(1)")
    async with aiohttp.ClientSession() as session:
        status, body, replica = await _get(session, _url(cp, "broken"), wait_s=60)
    assert status == 503, body
    assert replica == ""
    assert body == (
        "endpoint broken: 3 replicas in a row ended before they were ready; the last ended"
        " failed: exited with code 1\n"
    ), body + await _why(cp, "broken")
    view = await _view(cp, "broken")
    assert view.failing in body
    ended = [e.message for e in view.events if e.kind == "replica ended"]
    assert len(ended) == 3, view.events
