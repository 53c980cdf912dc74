"""The worker's side of the gateway: register, heartbeat, report tasks.

The worker dials out (the gateway never dials it for these). Registration is retried with
bounded, jittered back-off for as long as the gateway is unreachable. Heartbeats follow every
`heartbeat_seconds` the gateway asked for, with the running task count and since when the
worker has been idle (the controlplane decides on wind-down), and, with the pool's
`cache.enabled`, the image references the node's cache holds when they changed (placement
prefers a worker whose node holds a task's image). A gateway that restarted no longer
knows the worker and answers NOT_FOUND or UNAUTHENTICATED: the worker registers again. Each
task's end is reported, retried for as long as the controlplane would wait on the worker's
record; GetTask remains the fallback. A task's reports are delivered in the order they were
made (each waits for the one before it, delivered or given up): each carries the whole status,
so the record's latest is the task's latest (a start retried past the task's readiness would
otherwise undo it). Every call presents the worker's token.

The channel is TLS when the Job says so (`LEVERS9_GATEWAY_TLS`, `LEVERS9_GATEWAY_CA`), plaintext
otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
from grpc import aio

from levers9.agent.backoff import Backoff
from levers9.logs import get_logger
from levers9.proto import gateway_pb2, gateway_pb2_grpc, worker_pb2
from levers9.rpc import bearer

log = get_logger("levers9.agent.gateway")

CALL_TIMEOUT_S = 10.0
DEFAULT_HEARTBEAT_S = 10
REPORT_DEADLINE_S = 600.0  # about when the controlplane gives up on a silent worker's record
FORGOTTEN = frozenset({grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAUTHENTICATED})
REFUSED = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED})


@dataclass(frozen=True)
class Registration:
    """What the worker tells the gateway about itself, beyond its pool and id."""

    node_name: str
    pod_uid: str
    advertised_address: str
    visible_devices: tuple[int, ...]
    gpu_product: str
    agent_version: str
    tunnel: bool = False
    tls: bool = False
    """WorkerService serves TLS (the certificate from the worker's Secret)."""
    checkpoint: str = ""
    """What it can checkpoint tasks with (levers9.agent.checkpoints.Capability.summary)."""

    def request(self, pool_name: str, worker_id: str) -> gateway_pb2.RegisterRequest:
        return gateway_pb2.RegisterRequest(
            pool_name=pool_name,
            worker_id=worker_id,
            node_name=self.node_name,
            pod_uid=self.pod_uid,
            advertised_address=self.advertised_address,
            gpus=len(self.visible_devices),
            visible_devices=self.visible_devices,
            gpu_product=self.gpu_product,
            agent_version=self.agent_version,
            tunnel=self.tunnel,
            tls=self.tls,
            checkpoint=self.checkpoint,
        )


class Load(Protocol):
    """What heartbeats report (`tasks.TaskManager` has it)."""

    @property
    def running(self) -> int: ...

    @property
    def idle_since(self) -> float | None: ...


class GatewayClient:
    """See module doc. `run` registers and heartbeats until cancelled; `report` sends a task's
    end in the background (it may be called before `run`); `drain` waits for reports still
    under way."""

    def __init__(
        self,
        channel: aio.Channel,
        token: str,
        pool_name: str,
        worker_id: str,
        *,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        cache: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        self._stub = gateway_pb2_grpc.GatewayStub(channel)
        self._metadata = bearer.metadata(token)
        self._pool_name = pool_name
        self._worker_id = worker_id
        self._backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self._forgotten = asyncio.Event()
        self._reports: set[asyncio.Task[None]] = set()
        self._latest: dict[str, asyncio.Task[None]] = {}
        """Each task's latest report under way: the next one waits for it."""
        self._cache = cache
        """The references the node's image cache holds (`ImageCache.references`), with the
        pool's `cache.enabled`: heartbeats report them when they change."""
        self._reported: list[str] | None = None

    async def run(self, registration: Registration, load: Load) -> None:
        request = registration.request(self._pool_name, self._worker_id)
        while True:
            heartbeat_s = await self._register(request)
            await self._heartbeat(load, heartbeat_s)

    def reregister(self) -> None:
        """Registers again now (the tunnel was re-homed: the record must follow it)."""
        self._forgotten.set()

    def report(self, status: worker_pb2.TaskStatus) -> None:
        before = self._latest.get(status.task_id)
        task = asyncio.create_task(self._after(before, status), name=f"report {status.task_id}")
        self._reports.add(task)
        self._latest[status.task_id] = task
        task.add_done_callback(self._reports.discard)
        task.add_done_callback(lambda done: self._forget(status.task_id, done))

    async def drain(self, timeout_s: float) -> None:
        """Waits up to `timeout_s` for reports under way; abandons the rest (GetTask remains)."""
        pending: Sequence[asyncio.Task[None]] = list(self._reports)
        if not pending:
            return
        _, late = await asyncio.wait(pending, timeout=timeout_s)
        for task in late:
            log.warning("task report abandoned", task=task.get_name())
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    # -- registration and heartbeats ---------------------------------------------------------

    async def _register(self, request: gateway_pb2.RegisterRequest) -> int:
        attempt = 0
        while True:
            try:
                response = await self._stub.Register(
                    request, metadata=self._metadata, timeout=CALL_TIMEOUT_S
                )
            except aio.AioRpcError as error:
                delay = self._backoff.delay(attempt, self._rng)
                log.warning(
                    "gateway registration failed, retrying",
                    code=error.code().name,
                    error=error.details() or "",
                    retry_in_s=round(delay, 2),
                )
                attempt += 1
                await asyncio.sleep(delay)
                continue
            heartbeat_s = response.heartbeat_seconds or DEFAULT_HEARTBEAT_S
            self._forgotten.clear()
            log.info(
                "registered with the gateway",
                address=request.advertised_address,
                visible_devices=list(request.visible_devices),
                heartbeat_seconds=heartbeat_s,
            )
            return heartbeat_s

    async def _heartbeat(self, load: Load, heartbeat_s: int) -> None:
        """Heartbeats until the gateway forgets this worker."""
        self._reported = None  # the record may be new: the first beat says what the cache holds
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._forgotten.wait(), heartbeat_s)
            if not self._forgotten.is_set():
                try:
                    request = self._heartbeat_request(load)
                    cached = await self._cache_report()
                    if cached is not None:
                        request.cached_images.extend(cached)
                        request.cache_reported = True
                    await self._stub.Heartbeat(
                        request, metadata=self._metadata, timeout=CALL_TIMEOUT_S
                    )
                    if cached is not None:
                        self._reported = cached
                    continue
                except aio.AioRpcError as error:
                    if error.code() not in FORGOTTEN:
                        log.warning("heartbeat failed", code=error.code().name)
                        continue
                    self._forgotten.set()
            log.info("the gateway does not know this worker, registering again")
            return

    async def _cache_report(self) -> list[str] | None:
        """What the node's image cache holds (the pool's `cache.enabled`), when it changed since
        the last beat the gateway took; None: unchanged, or not reported."""
        if self._cache is None:
            return None
        try:
            held = list(await asyncio.to_thread(self._cache))
        except OSError as error:  # the cache's folder: the beat goes without it
            log.warning("image cache unreadable for the heartbeat", error=str(error))
            return None
        return None if held == self._reported else held

    def _heartbeat_request(self, load: Load) -> gateway_pb2.HeartbeatRequest:
        idle_since = load.idle_since
        return gateway_pb2.HeartbeatRequest(
            pool_name=self._pool_name,
            worker_id=self._worker_id,
            running_tasks=load.running,
            idle_since_unix_ms=0 if idle_since is None else int(idle_since * 1000),
        )

    # -- task reports ------------------------------------------------------------------------

    async def _after(
        self, before: asyncio.Task[None] | None, status: worker_pb2.TaskStatus
    ) -> None:
        if before is not None:
            await asyncio.wait({before})  # its outcome is its own; only its turn matters here
        await self._deliver(status)

    def _forget(self, task_id: str, done: asyncio.Task[None]) -> None:
        if self._latest.get(task_id) is done:
            del self._latest[task_id]

    async def _deliver(self, status: worker_pb2.TaskStatus) -> None:
        request = gateway_pb2.ReportTaskRequest(
            pool_name=self._pool_name,
            worker_id=self._worker_id,
            status=status,
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REPORT_DEADLINE_S
        attempt = 0
        while True:
            try:
                await self._stub.ReportTask(
                    request, metadata=self._metadata, timeout=CALL_TIMEOUT_S
                )
            except aio.AioRpcError as error:
                code = error.code()
                if code in REFUSED:
                    log.warning("task report refused", task_id=status.task_id, code=code.name)
                    return
                if code in FORGOTTEN:
                    self._forgotten.set()  # register again now, not at the next heartbeat
                delay = self._backoff.delay(attempt, self._rng)
                attempt += 1
                if loop.time() + delay > deadline:
                    log.warning("task report given up", task_id=status.task_id, code=code.name)
                    return
                await asyncio.sleep(delay)
                continue
            log.info(
                "task reported",
                task_id=status.task_id,
                state=worker_pb2.TaskState.Name(status.state),
            )
            return
