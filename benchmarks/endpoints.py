"""Endpoints on the sandbox: the cold start from zero, and request latency through a warm
endpoint against the replica's own port (target: warm proxy overhead at most 2 ms p50).

Runs against the dev stack (`levers9 dev demo` first: attached, the pool's default image
built), as a user drives it: `levers9 endpoint create` (here through its library call), then
HTTPS requests to the endpoints front with the operator token, one at a time on one keep-alive
connection, and the same requests straight to the replica's port on its node (loopback here,
the worker's network on a real node). The replica is Python's http.server with TCP_NODELAY, as
uvicorn (vLLM's server), nginx and Go's net/http set it: without it its two writes per
response (headers, body) meet Nagle's algorithm and the peer's delayed ACK, 40 ms a request
on either path:

    levers9 dev demo && python benchmarks/endpoints.py [--requests 500] [--pool gke-rtx6000]

The machine's noise: the same requests straight to the replica take longer when the machine is
busy, and the proxied ones about three times as much longer (each is a chain of wake-ups of
processes sharing the cores: the client, the front, gRPC's threads, the agent, the replica).
`overhead_per_direct_p50` is the overhead over the direct p50 of the same run, for comparing
runs taken at different noise.

CPU: the controlplane's and the worker agents' CPU seconds over the warm requests (read from
/proc), less what they spend idle for as long after, per proxied request: what the proxy path
costs, steadier than wall time on a shared machine (the direct requests touch neither).

Cold start: from the first request to its answer (an endpoint at zero: placement, the
container's start in the pool's default image, the port's readiness, the proxy's first
connection). The endpoint is deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import ssl
import statistics
import time
import uuid

import aiohttp

from levers9.cli.runtime import honour_dev_env
from levers9.config import parse_settings
from levers9.core.endpoints import EndpointSpec
from levers9.records.endpoints import create_endpoint, delete_endpoint, endpoint_view
from levers9.temporal import connect
from sandbox.synthetic import cpu_model

SERVE = (
    "import http.server, os, socket\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def setup(self):\n"
    "        super().setup()\n"
    "        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)\n"
    "    protocol_version = 'HTTP/1.1'\n"
    "    def do_GET(self):\n"
    "        body = b'ok'\n"
    "        self.send_response(200)\n"
    "        self.send_header('Content-Length', '2')\n"
    "        self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "    def log_message(self, *args):\n"
    "        pass\n"
    "http.server.ThreadingHTTPServer(('0.0.0.0', int(os.environ['PORT'])), H).serve_forever()\n"
)


def _proxy_processes() -> list[int]:
    """The dev stack's controlplane and worker agents (this machine's), whose CPU the warm
    requests through the endpoint cost (the direct ones touch neither)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(a.endswith((b"levers9-worker", b"worker_main")) for a in argv[:4]):
            pids.append(int(entry))
    return pids


def _cpu_s(pids: list[int]) -> float:
    """User and system CPU seconds the processes have used (their threads included)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1]


async def _timed(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> float:
    began = time.perf_counter()
    async with session.get(url, headers=headers) as response:
        await response.read()
        if response.status != 200:
            raise SystemExit(f"{url}: {response.status} {await response.text()}")
    return time.perf_counter() - began


async def main_async(requests: int, pool: str, port: int) -> dict[str, object]:
    honour_dev_env()
    settings = parse_settings({})
    client = await connect(settings)
    name = f"bench-{uuid.uuid4().hex[:6]}"
    spec = EndpointSpec(
        name=name, pool_name=pool, command=("python", "-c", SERVE), port=port, gpus=1
    )
    await create_endpoint(client, settings.task_queue, spec)
    token = settings.operator_token()
    assert token is not None, "no operator token: source .levers9/dev/env"
    headers = {"Authorization": f"Bearer {token.get_secret_value()}"}
    context = ssl.create_default_context(
        cafile=str(settings.gateway_tls_ca_file) if settings.gateway_tls_ca_file else None
    )
    url = f"{settings.endpoints_base_url()}/{name}/"
    try:
        connector = aiohttp.TCPConnector(ssl=context, limit=1)
        async with aiohttp.ClientSession(connector=connector) as session:
            cold_s = await _timed(session, url, headers)
            view = await endpoint_view(client, name)
            assert view is not None
            assert view.replicas_ready(), view
            # The replica binds every address of its worker's network: the sandbox's nodes
            # share this machine's, so its port is right here.
            direct = f"http://127.0.0.1:{port}/"
            for _ in range(20):  # warm both paths: connections, the proxy's bridge
                await _timed(session, url, headers)
                await _timed(session, direct, {})
            proxied, straight = [], []
            pids = _proxy_processes()
            cpu_before, began = _cpu_s(pids), time.perf_counter()
            for _ in range(requests):  # interleaved, so noise hits both alike
                proxied.append(await _timed(session, url, headers))
                straight.append(await _timed(session, direct, {}))
            busy_cpu_s, took_s = _cpu_s(pids) - cpu_before, time.perf_counter() - began
            # The same processes idle as long (heartbeats, reconcile passes, Temporal polls):
            # what they spend without requests comes off.
            idle_before = _cpu_s(pids)
            await asyncio.sleep(took_s)
            proxy_cpu_s = busy_cpu_s - (_cpu_s(pids) - idle_before)
    finally:
        await delete_endpoint(client, name)
    p50 = statistics.median(proxied) - statistics.median(straight)
    return {
        "cold_start_s": round(cold_s, 3),
        "requests": requests,
        "proxied_p50_ms": round(statistics.median(proxied) * 1000, 3),
        "proxied_p95_ms": round(_pct(proxied, 95) * 1000, 3),
        "direct_p50_ms": round(statistics.median(straight) * 1000, 3),
        "direct_p95_ms": round(_pct(straight, 95) * 1000, 3),
        "overhead_p50_ms": round(p50 * 1000, 3),
        "overhead_p95_ms": round((_pct(proxied, 95) - _pct(straight, 95)) * 1000, 3),
        # The overhead in units of the direct request's own p50: the latency of both follows
        # how busy the machine is (each is wake-ups of processes sharing its cores), this less.
        "overhead_per_direct_p50": round(p50 / statistics.median(straight), 2),
        "target_p50_ms": 2.0,
        "proxy_cpu_ms_per_request": round(proxy_cpu_s * 1000 / requests, 3) if pids else None,
        "proxy_processes": len(pids),
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--pool", default="gke-rtx6000")
    parser.add_argument(
        "--port",
        type=int,
        default=None,
        help="the replica's port (default: one at random: the sandbox's nodes share this"
        " machine's network, and the last run's replica may still hold its port while it stops)",
    )
    args = parser.parse_args()
    port = args.port or random.randrange(20000, 30000)
    result = asyncio.run(main_async(args.requests, args.pool, port))
    print(json.dumps(result, indent=2))
    if float(result["overhead_p50_ms"]) > 2.0:  # type: ignore[arg-type]
        raise SystemExit("warm proxy overhead above the 2 ms p50 target")


if __name__ == "__main__":
    main()
