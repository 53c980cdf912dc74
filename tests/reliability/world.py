"""A controlplane that can be killed: the Temporal dev server (its own sqlite file) and
worker_main as processes of their own, the sandbox cluster in this process.

`kill9()` is SIGKILL, nothing else: no shutdown hook runs, activities in flight are lost where
they stand, the gateway's sockets vanish. `start()` starts the same process again with the same
settings (same gateway port, same replica id), as Kubernetes restarts a crashed pod.

With `replicas=2`, two worker_main processes (replica ids `a`, `b`, a gateway port each) serve
one Temporal server and task queue, behind a `Balancer` that plays the gateway's Service:
workers dial it, and each new connection goes to the next replica that accepts it. With
`pools=False` the values define no pool (a cluster joined later is the only one).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest, GetSystemInfoRequest
from temporalio.client import Client
from temporalio.service import RPCError

from levers9.config import ControlplaneSettings
from levers9.core.capacity import NODE_LABEL
from levers9.devstack import values as devvalues
from levers9.records.listing import list_worker_records
from levers9.temporal import connect, list_reconcile_schedules
from levers9.tokens import operator_token
from sandbox.serve import RunningSandbox, start
from tests.controlplane import POOL, list_worker_jobs, quick_scenario
from tests.factories import free_port
from tests.waiting import eventually

BIN = Path(sys.executable).parent
TOKEN_SECRET = "reliability-token-secret-0123456789"
SETTLE_S = 90


@dataclass
class Process:
    """A child process (argv, env, log file) that can be SIGKILLed and started again."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} runs"
        with self.log.open("ab") as out:
            out.write(f"--- start {self.starts + 1} ---\n".encode())
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.starts += 1

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill9()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Balancer:
    """A TCP load balancer on loopback, as a Kubernetes Service is to the gateway's pods:
    each connection goes to the next backend in turn, skipping one that refuses it."""

    def __init__(self, backends: list[str]) -> None:
        self.backends = backends
        self._next = 0
        self._server: asyncio.Server | None = None
        port = free_port()
        self.address = f"127.0.0.1:{port}"

    async def start(self) -> None:
        """Serves on its address (connections to it are refused until then)."""
        host, port = self.address.rsplit(":", 1)
        self._server = await asyncio.start_server(self._serve, host, int(port))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = None
        for _ in self.backends:
            backend = self.backends[self._next % len(self.backends)]
            self._next += 1
            host, port = backend.rsplit(":", 1)
            with contextlib.suppress(OSError):
                upstream = await asyncio.open_connection(host, int(port))
                break
        if upstream is None:
            writer.close()
            return
        up_reader, up_writer = upstream

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, ConnectionError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError, RuntimeError):
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


@dataclass
class World:
    directory: Path
    sandbox: RunningSandbox
    temporal: Process
    controlplane: Process
    settings: ControlplaneSettings
    client: Client | None = None
    task_runs: Path = field(init=False)
    replicas: dict[str, Process] = field(default_factory=dict)
    """By replica id, with replicas=2 (`controlplane` is replica `a`)."""
    gateways: dict[str, str] = field(default_factory=dict)
    """Each replica's own gateway address, by replica id."""
    balancer: str | None = None
    """The Balancer's address (the gateway's Service), with replicas=2."""

    def __post_init__(self) -> None:
        self.task_runs = self.directory / "task-runs"
        self.task_runs.mkdir(exist_ok=True)

    async def temporal_ready(self) -> Client:
        async def up() -> bool:
            try:
                self.client = await connect(self.settings)
                await self.client.workflow_service.get_system_info(GetSystemInfoRequest())
            except (RPCError, RuntimeError):
                return False
            return True

        await eventually(up, within=30)
        assert self.client is not None
        return self.client

    def replica_queue(self, replica: str) -> str:
        return f"{self.settings.task_queue}-replica-{replica}"

    def cli_env(self, replica: str) -> dict[str, str]:
        """A user's shell whose CLI reaches this replica's gateway."""
        env = {
            **os.environ,
            "TEMPORAL_ADDRESS": self.settings.temporal_address,
            "LEVERS9_TASK_QUEUE": self.settings.task_queue,
            "LEVERS9_GATEWAY_ADDRESS": self.gateways[replica],
            "LEVERS9_API_TOKEN": operator_token(TOKEN_SECRET),
            "LEVERS9_HOME": str(self.directory / "no-dev-stack"),
        }
        env.pop("LEVERS9_GATEWAY_TLS_CA_FILE", None)
        return env

    async def controlplane_ready(self, process: Process | None = None) -> None:
        """Once the process we started polls the workflow queue (its pid in the identity)."""
        assert self.client is not None
        pid = (process or self.controlplane).pid

        async def polling() -> bool:
            assert self.client is not None
            try:
                described = await self.client.workflow_service.describe_task_queue(
                    DescribeTaskQueueRequest(
                        namespace="default",
                        task_queue=TaskQueue(name=self.settings.task_queue),
                        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
                    )
                )
            except RPCError:
                return False
            return any(p.identity.startswith(f"{pid}@") for p in described.pollers)

        await eventually(polling, within=60)

    async def worker_jobs(self) -> list[dict[str, Any]]:
        return await asyncio.to_thread(list_worker_jobs, self.sandbox)

    def task_command(self, task_id: str) -> tuple[str, ...]:
        """A task that leaves one line per run in `task_runs` (a run twice leaves two)."""
        runs = self.task_runs / task_id
        return ("sh", "-c", f"echo run >> {runs}; sleep 1; echo done")

    def runs(self, task_id: str) -> int:
        path = self.task_runs / task_id
        return len(path.read_text().splitlines()) if path.exists() else 0


@asynccontextmanager
async def world(
    directory: Path,
    *,
    tunnel: bool = False,
    replicas: int = 1,
    pools: bool = True,
    process_tasks: bool = False,
    **settings: str,
) -> AsyncIterator[World]:
    """The dev server and worker_main started (and stopped afterwards), on a sandbox; with
    `replicas=2`, two of them behind a Balancer; with `pools=False`, values without a pool; with
    `process_tasks`, the sandbox's knob (tests.controlplane.quick_scenario): tasks that name no
    image run as processes of the agent, so `task_command` can count runs in a host file."""
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    key_file = directory / "gke-sa.json"
    scenario = quick_scenario(process_tasks=process_tasks)
    running = await start(scenario, directory / "sandbox", controlplane_key=key_file)
    values = devvalues.write(
        directory,
        ca_base64=base64.b64encode(running.sandbox.ca.ca_pem).decode(),
        endpoint=running.sandbox.url,
        key_json=key_file.read_text(),
        tunnel=tunnel,
    )
    if not pools:
        values = [directory / "values.yaml"]
        values[0].write_text("config:\n  worker:\n    pools: {}\n")
    temporal_port, gateway_port = free_port(), free_port()
    env = {
        **os.environ,
        "LEVERS9_TEMPORAL_ADDRESS": f"127.0.0.1:{temporal_port}",
        "LEVERS9_TASK_QUEUE": f"reliability-{uuid.uuid4().hex[:8]}",
        "LEVERS9_RECONCILE_INTERVAL_SECONDS": "1",
        "LEVERS9_WORKER_TOKEN_SECRET": TOKEN_SECRET,
        "LEVERS9_GATEWAY_LISTEN": f"127.0.0.1:{gateway_port}",
        "LEVERS9_GATEWAY_ADVERTISED_ADDRESS": f"127.0.0.1:{gateway_port}",
        "LEVERS9_ENDPOINTS_LISTEN": f"127.0.0.1:{free_port()}",
        "LEVERS9_REPLICA_ID": "crashy",
        "REQUESTS_CA_BUNDLE": str(running.state.dir / "ca-bundle.pem"),
        "OTEL_SDK_DISABLED": "true",
        **settings,
    }
    for key in ("TEMPORAL_ADDRESS", "LEVERS9_HOME"):
        env.pop(key, None)
    temporal = Process(
        "temporal",
        [
            str(BIN / "temporal"),
            "server",
            "start-dev",
            "--headless",
            "--port",
            str(temporal_port),
            "--db-filename",
            str(directory / "temporal.db"),
            "--log-level",
            "error",
        ],
        env,
        directory / "temporal.log",
    )
    argv = [sys.executable, "-P", "-m", "worker_main"]
    for path in values:
        argv += ["--values", str(path)]
    balancer = None
    processes: dict[str, Process] = {}
    gateways: dict[str, str] = {}
    if replicas == 1:
        processes["crashy"] = Process("worker_main", argv, env, directory / "worker_main.log")
        gateways["crashy"] = env["LEVERS9_GATEWAY_LISTEN"]
    else:
        for n in range(replicas):
            replica = "abcdefgh"[n]
            gateways[replica] = f"127.0.0.1:{gateway_port if n == 0 else free_port()}"
        balancer = Balancer(list(gateways.values()))
        for replica, gateway in gateways.items():
            own = {
                **env,
                "LEVERS9_GATEWAY_LISTEN": gateway,
                "LEVERS9_ENDPOINTS_LISTEN": f"127.0.0.1:{free_port()}",
                "LEVERS9_GATEWAY_ADVERTISED_ADDRESS": balancer.address,
                "LEVERS9_REPLICA_ID": replica,
            }
            log = directory / f"worker_main-{replica}.log"
            processes[replica] = Process(f"worker_main-{replica}", argv, own, log)
    controlplane = next(iter(processes.values()))
    plane = World(
        directory,
        running,
        temporal,
        controlplane,
        ControlplaneSettings.model_validate(
            {
                "temporalAddress": env["LEVERS9_TEMPORAL_ADDRESS"],
                "taskQueue": env["LEVERS9_TASK_QUEUE"],
                "workerTokenSecret": TOKEN_SECRET,
            }
        ),
        replicas=processes,
        gateways=gateways,
        balancer=balancer.address if balancer is not None else None,
    )
    try:
        temporal.start()
        await plane.temporal_ready()
        for process in processes.values():
            process.start()
            await plane.controlplane_ready(process)
        if balancer is not None:
            # Only now: workers dialing meanwhile are refused and retry, so that their
            # sessions spread over every replica, not all on the first one up.
            await balancer.start()
        yield plane
    finally:
        for process in processes.values():
            process.stop()
        if balancer is not None:
            await balancer.close()
        with contextlib.suppress(Exception):
            await running.close()
        temporal.stop()


def agent_pid(worker_id: str) -> int:
    """The worker's agent process (the sandbox runs pods as processes)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"LEVERS9_WORKER_ID={worker_id}".encode() in environ:
            return int(proc.name)
    raise AssertionError(f"no agent process for worker {worker_id}")


def live(job: dict[str, Any]) -> bool:
    """A worker Job neither finished nor being deleted."""
    status = job.get("status") or {}
    ended = {c["type"] for c in status.get("conditions") or () if c.get("status") == "True"}
    return not ({"Complete", "Failed"} & ended) and not job["metadata"].get("deletionTimestamp")


async def settled(w: World) -> None:
    """Every Ready, schedulable GPU node has exactly one live worker Job, and the records
    agree with the Jobs (all available)."""
    seen: dict[str, object] = {}

    async def agree() -> bool:
        jobs = [j for j in await w.worker_jobs() if live(j)]
        records = await list_worker_records(w.settings, POOL, include_ended=False)
        gpu_nodes = {
            spec.name
            for spec in w.sandbox.cluster.node_specs()
            if spec.gpus.count and spec.ready and not spec.unschedulable
        }
        on_nodes = Counter(j["metadata"]["labels"][NODE_LABEL] for j in jobs)
        seen.update(
            nodes=sorted(gpu_nodes),
            jobs=dict(on_nodes),
            records={r.job_name: r.state for r in records},
            job_names=sorted(j["metadata"]["name"] for j in jobs),
        )
        return (
            set(on_nodes) == gpu_nodes
            and all(n == 1 for n in on_nodes.values())
            and {r.job_name for r in records} == {j["metadata"]["name"] for j in jobs}
            and all(r.state == "available" for r in records)
        )

    try:
        await eventually(agree, within=SETTLE_S)
    except TimeoutError:
        raise AssertionError(f"did not settle: {seen}") from None


async def _passes(w: World) -> int:
    rows = [row for row in await list_reconcile_schedules(w.settings) if row.pool == POOL]
    return rows[0].passes if rows else 0


async def passes_after(w: World, count: int = 2, within: float = 60) -> None:
    """Waits until `count` reconcile passes that started after this call have ended: the
    schedule (overlap SKIP) starts pass n+1 only once pass n is over, so `count` + 1 new
    actions prove it. What a test asserts did not happen afterwards had those passes to happen.
    """
    before = await _passes(w)

    async def enough() -> bool:
        return await _passes(w) >= before + count + 1

    await eventually(enough, within=within, what=f"{count} reconcile passes after {before}")
