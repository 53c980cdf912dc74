"""Tunnel vs direct dial, same run, same worker: StreamLogs throughput (MB/s) and RunTask /
GetTask round-trip latency (p50, p95), as ratios and added milliseconds. Target: tunnel
throughput at least half of direct, added p50 latency under 5 ms on loopback.

    python benchmarks/tunnel.py [--mib 64] [--runs 50]

What runs, as in production, in two processes on loopback: the worker (a child process: the
agent's real WorkerService, TaskManager and process runtime, on TCP for the direct path and on a
unix socket behind the agent's real TunnelClient for the tunnel path), and the controlplane
(this process: the real Gateway with its TunnelHub, and the gRPC client that calls the worker's
TCP address directly, or the gateway's loopback end of the session). The figures compare the
two paths on one machine, not absolute network speed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from grpc import aio
from pydantic import SecretStr

from levers9 import logs
from levers9.agent.driver import DriverSetup
from levers9.agent.process_runtime import ProcessRuntime
from levers9.agent.server import WorkerServer
from levers9.agent.service import WorkerService
from levers9.agent.supervisor import TaskManager
from levers9.agent.tunnel import TunnelClient
from levers9.gateway.server import Gateway
from levers9.gateway.tunnel import TunnelHub
from levers9.proto import worker_pb2, worker_pb2_grpc
from levers9.tokens import worker_token
from sandbox.synthetic import cpu_model

Metadata = tuple[tuple[str, str], ...]
SECRET = "benchmark-secret"
POOL, WORKER = "bench", "w0000001"


class _NoRecords:
    async def register(self, *args: object) -> None: ...
    async def heartbeat(self, *args: object) -> None: ...
    async def report(self, *args: object) -> None: ...


async def _timed(call: Callable[[], Awaitable[object]], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        began = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - began) * 1000)
    return samples


async def _stream_all(
    stub: worker_pb2_grpc.WorkerServiceAsyncStub, md: Metadata, task_id: str
) -> int:
    size = 0
    request = worker_pb2.StreamLogsRequest(task_id=task_id, follow=False)
    async for chunk in stub.StreamLogs(request, metadata=md):
        size += len(chunk.data)
    return size


async def measure(
    stub: worker_pb2_grpc.WorkerServiceAsyncStub, md: Metadata, log_task: str, runs: int, tag: str
) -> dict[str, float]:
    throughput = []
    for _ in range(3):
        began = time.perf_counter()
        size = await _stream_all(stub, md, log_task)
        throughput.append(size / (time.perf_counter() - began) / 2**20)
    counter = iter(range(10**6))

    async def run_task() -> None:
        spec = worker_pb2.TaskSpec(task_id=f"{tag}-{next(counter)}", command=["true"])
        await stub.RunTask(worker_pb2.RunTaskRequest(task=spec), metadata=md)

    async def get_task() -> None:
        await stub.GetTask(worker_pb2.GetTaskRequest(task_id=log_task), metadata=md)

    run = await _timed(run_task, runs)
    get = await _timed(get_task, runs)
    return {
        "mib_s": statistics.median(throughput),
        "run_p50": statistics.median(run),
        "run_p95": statistics.quantiles(run, n=20)[18],
        "get_p50": statistics.median(get),
        "get_p95": statistics.quantiles(get, n=20)[18],
    }


async def serve_worker(gateway: str) -> None:
    """The worker process: WorkerService on TCP (printed) and behind the tunnel, until stdin
    closes."""
    work = Path(tempfile.mkdtemp(prefix="l9b-"))
    driver = DriverSetup((), (work / "bin",), ())
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    tasks = TaskManager(ProcessRuntime(driver, env), (0, 1), work / "tasks", lambda status: None)
    token = worker_token(SECRET, WORKER)
    direct = await WorkerServer.start(WorkerService(tasks), token, "127.0.0.1")
    socket_path = work / "w.sock"
    unix = await WorkerServer.start_unix(WorkerService(tasks), token, str(socket_path))
    channel = aio.insecure_channel(gateway)
    client = TunnelClient(channel, token, POOL, WORKER, socket_path)

    async def ready() -> None: ...

    holding = asyncio.create_task(client.run(ready))
    print(direct.advertised_address, flush=True)
    await asyncio.to_thread(sys.stdin.read)
    holding.cancel()
    await asyncio.gather(holding, return_exceptions=True)
    await tasks.shutdown(grace_s=1)
    await direct.stop(0)
    await unix.stop(0)
    await channel.close()


async def main(mib: int, runs: int) -> int:
    token = worker_token(SECRET, WORKER)
    md = (("authorization", f"Bearer {token}"),)
    hub = TunnelHub(SecretStr(SECRET), "bench-replica")
    gateway = Gateway(_NoRecords(), SecretStr(SECRET), tunnels=hub)
    port = await gateway.start("127.0.0.1:0")
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--serve-worker",
        f"127.0.0.1:{port}",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert worker.stdout is not None
    assert worker.stdin is not None
    try:
        direct_address = (await asyncio.wait_for(worker.stdout.readline(), 30)).decode().strip()
        for _ in range(200):
            if (endpoint := hub.endpoint(POOL, WORKER)) is not None:
                break
            await asyncio.sleep(0.05)
        assert endpoint is not None, "the worker's tunnel did not come up"
        code = f"import sys; sys.stdout.buffer.write(b'x' * {mib * 2**20})"
        spec = worker_pb2.TaskSpec(task_id="logs", command=[sys.executable, "-c", code])
        async with aio.insecure_channel(direct_address) as dch:
            dstub = worker_pb2_grpc.WorkerServiceStub(dch)
            await dstub.RunTask(worker_pb2.RunTaskRequest(task=spec), metadata=md)
            for _ in range(1200):  # the writer ends within a minute
                status = await dstub.GetTask(worker_pb2.GetTaskRequest(task_id="logs"), metadata=md)
                if status.state != worker_pb2.TASK_STATE_RUNNING:
                    break
                await asyncio.sleep(0.05)
            direct_figures = await measure(dstub, md, "logs", runs, "direct")
        async with aio.insecure_channel(endpoint[0]) as tch:
            tstub = worker_pb2_grpc.WorkerServiceStub(tch)
            tunnel_figures = await measure(tstub, md, "logs", runs, "tunnel")
    finally:
        worker.stdin.close()
        await asyncio.wait_for(worker.wait(), 30)
        await gateway.stop(0)
    ratio = tunnel_figures["mib_s"] / direct_figures["mib_s"]
    added = tunnel_figures["run_p50"] - direct_figures["run_p50"]
    print(f"machine: {cpu_model()} ({platform.machine()}), python {platform.python_version()}")
    print(f"StreamLogs of {mib} MiB (median of 3), RunTask/GetTask over {runs} calls each")
    print(f"{'':14}{'MiB/s':>10}{'Run p50':>10}{'Run p95':>10}{'Get p50':>10}{'Get p95':>10}")
    for name, f in (("direct", direct_figures), ("tunnel", tunnel_figures)):
        print(
            f"{name:14}{f['mib_s']:>10.1f}{f['run_p50']:>9.2f}ms{f['run_p95']:>8.2f}ms"
            f"{f['get_p50']:>8.2f}ms{f['get_p95']:>8.2f}ms"
        )
    added_get = tunnel_figures["get_p50"] - direct_figures["get_p50"]
    print(f"throughput tunnel/direct: {ratio:.2f} (target >= 0.5)")
    print(f"added p50: RunTask {added:+.2f} ms, GetTask {added_get:+.2f} ms (target < 5 ms)")
    return 0 if ratio >= 0.5 and added < 5 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--serve-worker", metavar="GATEWAY", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_worker:
        logs.setup("ERROR")
        asyncio.run(serve_worker(args.serve_worker))
        raise SystemExit(0)
    logs.setup("ERROR")
    raise SystemExit(asyncio.run(main(args.mib, args.runs)))
