"""A task's I/O: ask the pool for cards (signal `request` to PoolWorkflow; the Update of records
started before it), and the worker's WorkerService
(RunTask, GetTask) at its advertised address, with the worker's own token.

The token is computed here from the controlplane's secret, so it never passes through Temporal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple, Protocol, TypeVar

import grpc
from grpc import aio
from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError

from activities.checkpoint_images import StoreError, delete_stored
from activities.heartbeat import heartbeating
from levers9.box_state import BoxCheckpoint, CheckpointOutcome, NodeImage, StoredImage
from levers9.config import ControlplaneSettings
from levers9.core.disks import LOST, DiskFile, DiskState
from levers9.core.placement import Placement, Share, Slot
from levers9.core.quantity import binary_text
from levers9.core.task_reports import TaskReport
from levers9.core.volumes import endpoint_of, sealing_context
from levers9.gateway.convert import TunnelEndpoint, task_report
from levers9.models import (
    POOL_WORKFLOW,
    PlaceRequest,
    PoolInput,
    TaskRecord,
    WorkerRecord,
    WorkerTaskInput,
    pool_workflow_id,
    task_workflow_id,
    worker_workflow_id,
)
from levers9.proto import gateway_pb2, worker_pb2, worker_pb2_grpc
from levers9.records.disks import TemporalDiskRecords
from levers9.records.found import is_running, or_none
from levers9.records.listing import machine_records
from levers9.records.volumes import TemporalVolumeRecords
from levers9.records.workspaces import TemporalWorkspaceRecords
from levers9.rpc.worker_tls import worker_channel
from levers9.sealed import Unsealable, unseal
from levers9.task_wire import task_spec
from levers9.telemetry import span
from levers9.tokens import command_metadata

T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...]
PLACE_HEARTBEAT_S = 5.0
REQUEST_BATCH_S = 0.05
REQUEST_BATCH_MAX = 500
"""Requests per signal: 500 of about 150 bytes, far below Temporal's 2 MB payload."""
LARGEST_TTL_S = 10.0
RPC_TIMEOUT_S = 15.0
CANCEL_TIMEOUT_S = 45.0
"""The agent's SIGTERM grace (10 s) and the container's teardown, well inside."""
CHECKPOINT_TIMEOUT_S = 300.0
"""A checkpoint writes the sandbox's memory and writable layer (1 GiB: about 4 s here)."""
# A worker that cannot be reached is retried by Temporal; these mean the task cannot go on there.
PERMANENT = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT}
UNREACHABLE = f"Worker{grpc.StatusCode.UNAVAILABLE.name}"
TUNNEL_RECONNECTING = "WorkerTunnelReconnecting"
"""A tunnelled worker whose session this replica does not hold (yet): after a controlplane
restart it reconnects with backoff (up to 30 s between tries); its caller routes again."""


SHARE_TTL_S = 2.0
"""How long a workspace's quota read for a request serves the next ones (a burst reads it once)."""


class Largest(NamedTuple):
    """The most cards and allocatable memory one machine of a pool has (None: not known)."""

    gpus: int | None
    memory_bytes: int | None

    def holds(self, request: PlaceRequest) -> bool:
        return (self.gpus is None or request.gpus <= self.gpus) and (
            self.memory_bytes is None or request.memory_bytes <= self.memory_bytes
        )


class WorkerRoute(Protocol):
    """Where one worker is called: a task's (WorkerTaskInput), or a disk file's (DiskFile)."""

    @property
    def pool_name(self) -> str: ...
    @property
    def worker_id(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def task_queue(self) -> str | None: ...
    @property
    def tls(self) -> bool: ...


class _Route(NamedTuple):
    pool_name: str
    worker_id: str
    address: str
    task_queue: str | None
    tls: bool


class TunnelEndpoints(Protocol):
    """The tunnel sessions this process holds (`levers9.gateway.tunnel.TunnelHub`)."""

    def endpoint(self, pool_name: str, worker_id: str) -> TunnelEndpoint | None: ...


class RequestBatches:
    """The placement requests of this process's activities, one signal per pool per
    REQUEST_BATCH_S (at most REQUEST_BATCH_MAX each): a burst of 10,000 tasks signals the pool
    a few hundred times, not 10,000, which its history and its continue-as-new could not follow
    (Temporal refuses a continue-as-new while signals are arriving). Each request returns once
    its batch was taken; a failed signal fails every request of the batch, and the activities
    retry (a repeated request queues nothing twice)."""

    def __init__(self, send: Callable[[str, list[PlaceRequest]], Awaitable[None]]) -> None:
        self._send = send
        self._open: dict[str, list[tuple[PlaceRequest, asyncio.Future[None]]]] = {}
        self._flushing: set[asyncio.Task[None]] = set()

    async def add(self, request: PlaceRequest) -> None:
        waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        batch = self._open.get(request.pool_name)
        if batch is None:
            batch = self._open[request.pool_name] = []
            asyncio.get_running_loop().call_later(
                REQUEST_BATCH_S, self._flush_soon, request.pool_name
            )
        batch.append((request, waiting))
        if len(batch) >= REQUEST_BATCH_MAX:
            self._flush_soon(request.pool_name)
        await waiting

    def _flush_soon(self, pool_name: str) -> None:
        batch = self._open.pop(pool_name, None)
        if batch:
            task = asyncio.get_running_loop().create_task(self._flush(pool_name, batch))
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)

    async def _flush(
        self, pool_name: str, batch: list[tuple[PlaceRequest, asyncio.Future[None]]]
    ) -> None:
        try:
            await self._send(pool_name, [request for request, _ in batch])
        except BaseException as exc:
            for _, waiting in batch:
                if not waiting.done():
                    waiting.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for _, waiting in batch:
                if not waiting.done():
                    waiting.set_result(None)


class TaskActivities:
    """Temporal client and settings injected."""

    def __init__(
        self,
        client: Client,
        settings: ControlplaneSettings,
        tunnels: TunnelEndpoints | None = None,
    ) -> None:
        self._client = client
        self._settings = settings
        self._tunnels = tunnels
        self._largest: dict[str, tuple[float, Largest]] = {}
        """By pool: when its machine records were read, and the most one has."""
        self._batches = RequestBatches(self._signal_requests)
        self._workspaces = TemporalWorkspaceRecords(client, settings.task_queue)
        self._disks = TemporalDiskRecords(client, settings.task_queue)
        self._volumes = TemporalVolumeRecords(client, settings.task_queue)
        self._shares: dict[str, tuple[float, Share | None]] = {}
        """By workspace: when its record was read, and its quota and weight."""

    def _address(self, input: WorkerRoute) -> str:
        """Where the worker answers: a tunnelled worker's current session on this replica
        (re-homed after a gateway restart), else the address it advertised."""
        if input.task_queue and self._tunnels is not None:
            endpoint = self._tunnels.endpoint(input.pool_name, input.worker_id)
            if endpoint is None:
                raise ApplicationError(
                    f"worker {input.worker_id} has no tunnel session on this replica yet"
                    " (it reconnects with backoff)",
                    type=TUNNEL_RECONNECTING,
                )
            return endpoint.address
        return input.address

    @activity.defn
    async def place_task(self, request: PlaceRequest) -> Placement:
        """Waits (heartbeating) until the pool places the task on one worker's free cards."""
        pool_name = request.pool_name
        handle = await self._client.start_workflow(
            POOL_WORKFLOW,
            PoolInput(pool_name=pool_name),
            id=pool_workflow_id(pool_name),
            task_queue=self._settings.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        )
        async with heartbeating(PLACE_HEARTBEAT_S):
            placement: Placement = await handle.execute_update(
                "place", request, result_type=Placement
            )
        return placement

    @activity.defn
    async def request_placement(self, request: PlaceRequest) -> str:
        """Queues the task on its pool (signal-with-start `request`; a repeat queues nothing
        twice). Returns "" when queued, or why no machine of the pool can ever hold it (more
        cards, or a larger memory limit, than the largest machine record has; with no machine
        yet, it waits)."""
        largest = await self._largest_machine(request)
        if largest.gpus is not None and request.gpus > largest.gpus:
            return (
                f"no machine of pool {request.pool_name} can hold {request.gpus} cards:"
                f" the largest has {largest.gpus}"
            )
        if largest.memory_bytes is not None and request.memory_bytes > largest.memory_bytes:
            return (
                f"no machine of pool {request.pool_name} can hold a memory limit of"
                f" {binary_text(request.memory_bytes)}: the largest has"
                f" {binary_text(largest.memory_bytes)} allocatable"
            )
        pinned = await self._pinned(request) if request.disks else request
        if isinstance(pinned, str):
            return pinned
        share = await self._share(request.workspace)
        await self._batches.add(pinned.model_copy(update={"share": share}))
        return ""

    async def _pinned(self, request: PlaceRequest) -> PlaceRequest | str:
        """The request pinned to the node of the disks it mounts; or why it can never run: a
        disk that is not the workspace's (deleted since the submit), of another pool, lost with
        its node, or disks on two nodes."""
        disks: list[DiskState] = []
        for name in request.disks:
            disk = await self._disks.get(request.workspace, name)
            if disk is None:
                return (
                    f"disk {name}: no such disk in workspace {request.workspace}"
                    " (`levers9 disk list`)"
                )
            if disk.pool_name != request.pool_name:
                return (
                    f"disk {name} is on pool {disk.pool_name}, not the task's pool"
                    f" {request.pool_name}: run it with --pool {disk.pool_name}"
                )
            view = await self._disks.view(disk)
            if view.state == LOST:
                return view.reason
            disks.append(disk)
        nodes = sorted({d.node_name for d in disks})
        if len(nodes) > 1:
            return (
                f"disks {', '.join(d.name for d in disks)} are on different nodes"
                f" ({', '.join(nodes)}): a task mounts disks of one node"
            )
        return request.model_copy(
            update={
                "node": nodes[0],
                "pinned_by": "disk " + ", ".join(d.name for d in disks),
                "disk_ids": tuple(d.disk_id for d in disks),
            }
        )

    async def _share(self, workspace: str) -> Share | None:
        """The workspace's quota (and weight) from its record, read at most once per
        SHARE_TTL_S: the pool applies the newest a request brings, so `workspace set` reaches
        the queue with the workspace's next request. None for a workspace without a record
        (the operator's `default`: no quota)."""
        cached = self._shares.get(workspace)
        now = time.monotonic()
        if cached is not None and now - cached[0] < SHARE_TTL_S:
            return cached[1]
        state = await self._workspaces.get(workspace)
        share = None if state is None else Share(quota=state.gpu_quota, weight=state.weight)
        self._shares[workspace] = (now, share)
        return share

    async def _signal_requests(self, pool_name: str, requests: list[PlaceRequest]) -> None:
        await self._client.start_workflow(
            POOL_WORKFLOW,
            PoolInput(pool_name=pool_name),
            id=pool_workflow_id(pool_name),
            task_queue=self._settings.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            start_signal="requests",
            start_signal_args=[requests],
        )

    async def _largest_machine(self, request: PlaceRequest) -> Largest:
        """The most cards and memory a node of the pool has, from its running machine records:
        a burst of requests reads them once per LARGEST_TTL_S (10,000 tasks queued at once made
        10,000 visibility lists), but a task is refused only on a fresh read."""
        pool_name = request.pool_name
        cached = self._largest.get(pool_name)
        now = time.monotonic()
        if cached is not None and now - cached[0] < LARGEST_TTL_S and cached[1].holds(request):
            return cached[1]
        records = await machine_records(self._client, self._settings.task_queue, pool_name)
        memory = max((r.total_memory_bytes for r in records), default=0)
        largest = Largest(
            gpus=max((r.total_gpus for r in records), default=None),
            memory_bytes=memory or None,  # records made before they kept it: unknown
        )
        self._largest[pool_name] = (now, largest)
        return largest

    @activity.defn
    async def worker_ended(self, input: WorkerTaskInput) -> bool:
        """Whether the worker's record has ended (stopped, expired, wound down): a worker that
        is gone cannot be running the task, so the task may be placed elsewhere."""
        return await self._ended(input)

    async def _ended(self, input: WorkerTaskInput) -> bool:
        handle = self._client.get_workflow_handle(
            worker_workflow_id(input.pool_name, input.worker_id)
        )
        return not await is_running(handle)

    @activity.defn
    async def worker_route(self, input: WorkerTaskInput) -> WorkerTaskInput | None:
        """Where a tunnelled worker is reached now (the replica queue holding its session and
        that replica's end of it), from its record; None once the record has ended."""
        handle = self._client.get_workflow_handle(
            worker_workflow_id(input.pool_name, input.worker_id)
        )
        if not await is_running(handle):
            return None
        # None: it ended since
        record = await or_none(handle.query("record", result_type=WorkerRecord))
        if record is None or record.address is None:
            return input
        return input.model_copy(update={"address": record.address, "task_queue": record.task_queue})

    @activity.defn
    async def run_task(self, input: WorkerTaskInput) -> bool:
        """RunTask on the worker; True when it was already running (a retried call)."""
        spec = task_spec(input.task, input.gpu_indices, input.attempt)
        volumes = await self._volume_access(input)
        disks = await self._disk_access(input)
        task = input.task
        store = (
            await self._access(task.workspace, task.checkpoint_volume)
            if task.restore_from and task.checkpoint_volume
            else None
        )
        try:
            response = await self._call(
                input,
                "RunTask",
                lambda stub, md: stub.RunTask(
                    worker_pb2.RunTaskRequest(
                        task=spec, volumes=volumes, disks=disks, checkpoint_store=store
                    ),
                    metadata=md,
                    timeout=RPC_TIMEOUT_S,
                ),
            )
        except ApplicationError as error:
            # Nothing answers at its address and its record has ended (its Job failed, say):
            # no retry will reach an agent there, so say so now and the task is placed again,
            # rather than after every retry of a dead address.
            if error.type == UNREACHABLE and await self._ended(input):
                ended = f"{error.message} (its record has ended)"
                raise ApplicationError(ended, type="WorkerEnded", non_retryable=True) from None
            raise
        return bool(response.already_running)

    async def _volume_access(self, input: WorkerTaskInput) -> list[worker_pb2.VolumeAccess]:
        """Each volume of the task with its credentials, read from the volume's record and
        unsealed here, for the RunTask call alone: neither this activity's input nor its result
        holds them. A volume gone since the submit, or whose credentials do not open, fails the
        task (non-retryable) naming the volume."""
        mounts = [m for m in input.task.mounts if m.kind == "volume"]
        return [await self._access(input.task.workspace, mount.name) for mount in mounts]

    async def _access(self, workspace: str, name: str) -> worker_pb2.VolumeAccess:
        """The workspace's volume `name` with its credentials, unsealed here for one call."""
        secret = self._settings.token_secret()
        if secret is None:
            raise ApplicationError("no worker token secret", non_retryable=True)
        record = await self._volumes.get(workspace, name)
        if record is None:
            raise ApplicationError(
                f"volume {name}: no volume {name} in workspace {workspace}"
                " (deleted since the task was submitted?)",
                type="VolumeNotFound",
                non_retryable=True,
            )
        try:
            credentials = unseal(
                secret.get_secret_value(), record.sealed, sealing_context(workspace, name)
            )
        except Unsealable as exc:
            raise ApplicationError(
                f"volume {name}: {exc}", type="VolumeUnsealable", non_retryable=True
            ) from None
        spec = record.spec
        return worker_pb2.VolumeAccess(
            name=name,
            bucket=spec.bucket,
            endpoint=endpoint_of(spec),
            region=spec.region,
            access_key_id=credentials.access_key_id,
            secret_access_key=credentials.secret_access_key,
        )

    async def _disk_access(self, input: WorkerTaskInput) -> list[worker_pb2.DiskAccess]:
        """What the agent needs of each disk the task mounts: its file's name and size."""
        access = []
        for mount in input.task.mounts:
            if mount.kind != "disk":
                continue
            disk = await self._disks.get(input.task.workspace, mount.name)
            if disk is None:
                raise ApplicationError(
                    f"disk {mount.name}: no such disk in workspace {input.task.workspace}"
                    " (deleted since the task was queued)",
                    type="NoSuchDisk",
                    non_retryable=True,
                )
            access.append(
                worker_pb2.DiskAccess(
                    name=disk.name, disk_id=disk.disk_id, size_bytes=disk.size_bytes
                )
            )
        return access

    @activity.defn
    async def disk_worker(self, file: DiskFile) -> DiskFile | None:
        """The disk file with the route to a worker of its node that can be called now (the
        pool's placement knows them); None when the node has none."""
        handle = self._client.get_workflow_handle(pool_workflow_id(file.pool_name))
        slots: list[Slot] | None = await or_none(
            handle.query("node_workers", file.node_name, result_type=list[Slot])
        )
        if not slots:
            return None
        slot = slots[0]
        return file.model_copy(
            update={
                "worker_id": slot.worker_id,
                "address": slot.address,
                "task_queue": slot.task_queue,
                "tls": slot.tls,
            }
        )

    @activity.defn
    async def node_disk_use(self, file: DiskFile) -> int | None:
        """What the disk's filesystem holds, as the worker of its node reads it (ListNodeDisks);
        None when the node has no file of it yet."""
        response = await self._call(
            file,
            "ListNodeDisks",
            lambda stub, md: stub.ListNodeDisks(
                worker_pb2.ListNodeDisksRequest(), metadata=md, timeout=RPC_TIMEOUT_S
            ),
        )
        return next((d.used_bytes for d in response.disks if d.disk_id == file.disk_id), None)

    @activity.defn
    async def delete_node_disk(self, file: DiskFile) -> bool:
        """DeleteNodeDisk on the worker: the disk's file removed from its node (True), or there
        was none (False: no task had used the disk)."""
        response = await self._call(
            file,
            "DeleteNodeDisk",
            lambda stub, md: stub.DeleteNodeDisk(
                worker_pb2.DeleteNodeDiskRequest(disk_id=file.disk_id),
                metadata=md,
                timeout=RPC_TIMEOUT_S,
            ),
        )
        return bool(response.deleted)

    @activity.defn
    async def cancel_task(self, input: WorkerTaskInput) -> bool:
        """CancelTask on the worker: SIGTERM, its grace, SIGKILL; returns once the container is
        gone (True), or at once when the task had already ended (False)."""
        response = await self._call(
            input,
            "CancelTask",
            lambda stub, md: stub.CancelTask(
                worker_pb2.CancelTaskRequest(task_id=input.task.task_id),
                metadata=md,
                timeout=CANCEL_TIMEOUT_S,
            ),
        )
        return bool(response.cancelled)

    async def _running_on(self, task_id: str) -> tuple[TaskRecord | None, WorkerRecord | None]:
        """The task's record, and its worker's record when the task runs on one (None when
        the task is unknown, not running or on no worker, or the worker's record is gone)."""
        handle = self._client.get_workflow_handle(task_workflow_id(task_id))
        record = await or_none(handle.query("record", result_type=TaskRecord))
        if record is None or record.state != "running" or not record.worker_id:
            return record, None
        worker = await or_none(
            self._client.get_workflow_handle(
                worker_workflow_id(record.pool_name, record.worker_id)
            ).query("record", result_type=WorkerRecord)
        )
        return record, worker

    @activity.defn
    async def checkpoint_queue(self, task_id: str) -> str:
        """The task queue `checkpoint_task` of this task must run on: that of the replica
        holding its worker's tunnel session, from the worker's record; "" (the shared queue)
        for a worker dialled directly, or a task not running on one (checkpoint_task says so)."""
        _, worker = await self._running_on(task_id)
        return (worker.task_queue or "") if worker is not None else ""

    @activity.defn
    async def checkpoint_task(self, input: BoxCheckpoint) -> CheckpointOutcome:
        """CheckpointTask on the worker running the task (read from its record): returns once
        the image is sealed and the task ended, or with the worker's refusal (the task runs
        on). A task that is not running on a worker is refused here."""
        record, worker = await self._running_on(input.task_id)
        if record is None or record.state != "running" or not record.worker_id:
            state = "unknown" if record is None else record.state
            return CheckpointOutcome(
                refused=f"task {input.task_id} is {state}, not running", not_running=True
            )
        route = _Route(record.pool_name, record.worker_id, record.address or "", None, record.tls)
        if worker is not None and worker.address is not None:
            route = route._replace(address=worker.address, task_queue=worker.task_queue)
        store, unstored = None, ""
        if input.volume:
            try:
                store = await self._access(input.workspace, input.volume)
            except ApplicationError as error:  # checkpointed all the same, kept on its node
                unstored = error.message
        try:
            response = await self._call(
                route,
                "CheckpointTask",
                lambda stub, md: stub.CheckpointTask(
                    worker_pb2.CheckpointTaskRequest(
                        task_id=input.task_id, name=input.name, store=store
                    ),
                    metadata=md,
                    timeout=CHECKPOINT_TIMEOUT_S,
                ),
            )
        except ApplicationError as error:
            if error.type == f"Worker{grpc.StatusCode.FAILED_PRECONDITION.name}":
                return CheckpointOutcome(refused=error.message)
            raise
        return CheckpointOutcome(
            name=response.name,
            node=record.node_name or "",
            size_bytes=response.size_bytes,
            seconds=response.seconds,
            stored=response.stored,
            store_error=response.store_error or unstored,
            store_seconds=response.store_seconds,
            stored_sha256=response.stored_sha256,
        )

    @activity.defn
    async def task_node(self, task_id: str) -> str:
        """The node the task ran on, from its record ("": never placed, or no record)."""
        handle = self._client.get_workflow_handle(task_workflow_id(task_id))
        record = await or_none(handle.query("record", result_type=TaskRecord))
        return (record.node_name or "") if record is not None else ""

    @activity.defn
    async def delete_stored_checkpoint(self, image: StoredImage) -> int:
        """Removes checkpoint image `name` from the workspace's checkpoint volume (every object
        under `<prefix>/checkpoints/<name>/`); how many objects there were."""
        access = await self._access(image.workspace, image.volume)
        try:
            return await asyncio.to_thread(delete_stored, access, image.name)
        except StoreError as error:
            raise ApplicationError(str(error), type="CheckpointStore") from None

    @activity.defn
    async def delete_node_checkpoint(self, image: NodeImage) -> bool:
        """DeleteCheckpoint on a worker of the image's node: removed (True), or the node held
        none (False)."""
        response = await self._call(
            image.worker,
            "DeleteCheckpoint",
            lambda stub, md: stub.DeleteCheckpoint(
                worker_pb2.DeleteCheckpointRequest(workspace=image.workspace, name=image.name),
                metadata=md,
                timeout=RPC_TIMEOUT_S,
            ),
        )
        return bool(response.deleted)

    @activity.defn
    async def get_task(self, input: WorkerTaskInput) -> TaskReport:
        """GetTask on the worker: the fallback when a report signal was lost."""
        status = await self._call(
            input,
            "GetTask",
            lambda stub, md: stub.GetTask(
                worker_pb2.GetTaskRequest(task_id=input.task.task_id),
                metadata=md,
                timeout=RPC_TIMEOUT_S,
            ),
        )
        return task_report(
            gateway_pb2.ReportTaskRequest(
                pool_name=input.pool_name, worker_id=input.worker_id, status=status
            )
        )

    async def _call(
        self,
        input: WorkerRoute,
        rpc: str,
        call: Callable[[worker_pb2_grpc.WorkerServiceAsyncStub, Metadata], Awaitable[T]],
    ) -> T:
        secret = self._settings.token_secret()
        if secret is None:
            raise ApplicationError("no worker token secret", non_retryable=True)
        metadata = command_metadata(
            secret.get_secret_value(), input.worker_id, self._settings.worker_token_generation
        )
        address = self._address(input)
        tunnel = bool(input.task_queue)
        # `tls` is never set for a tunnelled worker (gateway.convert.registration): its end of
        # the tunnel is this replica's own, and the tunnel rides the gateway's channel.
        channel = worker_channel(
            address,
            input.worker_id,
            input.tls,
            secret.get_secret_value(),
            self._settings.worker_ca_generation,
        )
        with span(
            f"worker {rpc}",
            worker_id=input.worker_id,
            address=address,
            tunnel=tunnel,
            tls=input.tls,
        ):
            return await self._call_at(input, address, channel, metadata, call)

    async def _call_at(
        self,
        input: WorkerRoute,
        address: str,
        channel: aio.Channel,
        metadata: Metadata,
        call: Callable[[worker_pb2_grpc.WorkerServiceAsyncStub, Metadata], Awaitable[T]],
    ) -> T:
        async with channel:
            stub = worker_pb2_grpc.WorkerServiceStub(channel)
            try:
                return await call(stub, metadata)
            except aio.AioRpcError as error:
                code = error.code()
                text = f"worker {input.worker_id} at {address}: {code.name} {error.details()}"
                permanent = code in PERMANENT or code == grpc.StatusCode.NOT_FOUND
                raise ApplicationError(
                    text, type=f"Worker{code.name}", non_retryable=permanent
                ) from None
