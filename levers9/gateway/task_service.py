"""`levers9.v1.Tasks`: the CLI's way in, with the operator token. It submits a task (the gateway
starts its record, TaskWorkflow), reads its record (waiting for its end when asked, so
`levers9 run` needs no polling), and streams its output. The CLI then needs neither Temporal's
credentials nor the Temporal SDK, and starts in a fraction of the time (benchmarks/cli.py).

StreamTaskLogs, the log relay. The spec's firewall rule exists for this: "the controlplane dials
each worker to stream logs".
The CLI never reaches a worker itself; it asks the gateway with the operator token, and the
gateway finds the task's worker in the task record (Temporal), dials the worker's advertised
address with that worker's own token (over TLS checked against the worker CA when the worker
registered it), and relays `WorkerService/StreamLogs` chunk by chunk.

- A tunnelled worker is reached through its tunnel session, which one replica holds (its
  worker record names that replica's queue and address, current after the worker reconnects
  elsewhere): on that replica, through its end of the session; on any other, the call is
  relayed to that replica's gateway (`replicaAddress`) with the operator token, once (a
  relayed call is never relayed again). So logs and exec work whichever replica the CLI
  reaches. ExecTask is routed the same way.
- A task not yet placed is waited for (with `follow`), polling its record.
- The worker unreachable, or gone mid-stream: UNAVAILABLE naming the worker and its address,
  and where the record's tail is (`levers9 task logs <id>`).
- A pool this controlplane does not reconcile (no `reconcile:<pool>` schedule): INVALID_ARGUMENT
  naming the pools there are, before anything is started (it would wait forever).
- ListTasks: one page of task records, bounded in count and bytes (a list of thousands is
  many pages, none near gRPC's 4 MB); its page token is its own (the visibility page's token
  and how many of that page were sent), and one it did not give is INVALID_ARGUMENT.
- No such task: NOT_FOUND. A wrong or missing operator token: UNAUTHENTICATED. A malformed
  submit (no command, a pool name that is no DNS label, a bad task id): INVALID_ARGUMENT
  naming the field.
Tokens never appear in a message or a log line.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import grpc
from grpc import aio
from pydantic import SecretStr

from levers9.contract import PORT_CONNECTED_HEADER
from levers9.core.boxes import box_of_task_id
from levers9.core.workspaces import DEFAULT_WORKSPACE, name_problem
from levers9.gateway.convert import check_pool_name, check_task_id, submitted_task
from levers9.gateway.errors import InvalidRequest, Unauthenticated
from levers9.gateway.roles import Authority, Identity
from levers9.gateway.task_records import TaskRecords
from levers9.gateway.task_upstream import (
    Replicas,
    ReplicaUpstream,
    Unroutable,
    Upstream,
    WorkerUpstream,
    feed,
)
from levers9.logs import get_logger
from levers9.models import (
    POOL_MAX_WAITING,
    TERMINAL,
    TaskCheckpoint,
    TaskInput,
    TaskRecord,
    WorkerRecord,
    checkpointed_task_id,
    new_task_id,
)
from levers9.proto import gateway_pb2, gateway_pb2_grpc, worker_pb2, worker_pb2_grpc
from levers9.records.boxes import TemporalBoxRecords
from levers9.records.disks import TemporalDiskRecords
from levers9.records.volumes import TemporalVolumeRecords
from levers9.rpc import bearer
from levers9.rpc.worker_tls import worker_channel
from levers9.task_wire import record_message, to_message
from levers9.tokens import command_metadata, operator_token

PLACEMENT_POLL_S = (0.02, 0.5)
"""How often a follower re-reads the record of a task not placed yet: from the first value,
doubling up to the second (a warm pool places in tens of milliseconds; a queued task may wait
hours)."""

Context = grpc.aio.ServicerContext[gateway_pb2.StreamTaskLogsRequest, worker_pb2.LogChunk]


log = get_logger(__name__)
R = TypeVar("R")
M = TypeVar("M")

RELAYED = "levers9-relayed-by"
"""Metadata on a call one replica relays to another: the replica that relayed it."""

MAX_WAIT_S = 60.0
"""The longest a GetTaskRecord waits for the task's end; the CLI asks again past it."""
MAX_REASON_CHARS = 1024
LIST_PAGE_SIZE = 100
"""ListTasks' page when the request names none."""
MAX_LIST_PAGE_SIZE = 1000
MAX_LIST_PAGE_BYTES = 3 * 1024 * 1024
"""A ListTasks answer stays under this (gRPC's default limit is 4 MiB): a record of the page
that would pass it goes to the next page. One record alone is below it (a memo is at most 2 MiB)."""
_CURSOR = b"\x01"
"""ListTasks' page token: this, how many records of the visibility page were sent (4 bytes), a
MAC (16 bytes, over those, the pool and the visibility page's own token, which follows), so that
a token not from here is refused before Temporal sees it (it answers one UNKNOWN, retried)."""


class TasksService(gateway_pb2_grpc.TasksServicer):
    def __init__(
        self,
        records: TaskRecords,
        secret: SecretStr,
        replicas: Replicas | None = None,
        *,
        operator_generation: int = 1,
        ca_generation: int = 1,
        token_generation: int = 1,
        authority: Authority | None = None,
        volumes: TemporalVolumeRecords | None = None,
        disks: TemporalDiskRecords | None = None,
        boxes: TemporalBoxRecords | None = None,
    ) -> None:
        self._records = records
        self._boxes = boxes
        self._volumes = volumes
        self._disks = disks
        self.authority = authority or Authority(secret, operator_generation)
        """Who a bearer token is (the endpoints' front asks it too)."""
        self._secret = secret
        self._replicas = replicas
        self._operator_generation = operator_generation
        self._ca_generation = ca_generation
        self._token_generation = token_generation

    async def _authorize(self, context: grpc.aio.ServicerContext[Any, Any]) -> Identity:
        """The caller (the operator, or a workspace by one of its tokens); UNAUTHENTICATED
        saying why not."""
        try:
            return await self.authority.identify(context.invocation_metadata() or ())
        except Unauthenticated as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, exc.message)
            raise  # abort raises; for the type checker

    @staticmethod
    async def _task_id(context: grpc.aio.ServicerContext[Any, Any], task_id: str) -> None:
        try:
            check_task_id(task_id)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)

    @asynccontextmanager
    async def _upstream(
        self, record: TaskRecord, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Upstream]:
        relayed_by = next(
            (str(value) for key, value in context.invocation_metadata() or () if key == RELAYED),
            None,
        )
        try:
            async with self.upstream(record, relayed_by) as up:
                yield up
        except Unroutable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))

    @asynccontextmanager
    async def upstream(
        self, record: TaskRecord, relayed_by: str | None = None
    ) -> AsyncIterator[Upstream]:
        """Where the task's worker is reached from here: its WorkerService (over its TLS when
        it serves it, with that worker's own token), through this replica's end of its
        tunnel, or through the gateway of the replica that holds the tunnel."""
        assert record.worker_id is not None
        assert record.address is not None
        secret = self._secret.get_secret_value()
        address, tls = record.address, record.tls
        worker = await self._records.worker(record.pool_name, record.worker_id)
        here = self._replicas.task_queue if self._replicas else None
        if worker is not None and worker.task_queue and worker.task_queue != here:
            replica, metadata = self._relay(worker, relayed_by)
            assert self._replicas is not None
            log.info(
                "relaying to the replica holding the worker's tunnel",
                task_id=record.task_id,
                worker_id=record.worker_id,
                replica=replica,
            )
            async with self._replicas.channel(replica) as channel:
                yield ReplicaUpstream(gateway_pb2_grpc.TasksStub(channel), metadata, via=replica)
            return
        if worker is not None and worker.address and worker.task_queue:
            address = worker.address  # this replica's end of the tunnel, current
        metadata = command_metadata(secret, record.worker_id, self._token_generation)
        async with worker_channel(
            address, record.worker_id, tls, secret, self._ca_generation
        ) as channel:
            yield WorkerUpstream(worker_pb2_grpc.WorkerServiceStub(channel), metadata)

    def _relay(
        self, worker: WorkerRecord, relayed_by: str | None
    ) -> tuple[str, tuple[tuple[str, str], ...]]:
        """The gateway of the replica holding the worker's tunnel, and the metadata to call it
        with; raises Unroutable, saying why, when the call cannot be relayed."""
        if self._replicas is None or relayed_by is not None or not worker.replica_address:
            why = (
                "it gives no replicaAddress to relay through"
                if not worker.replica_address
                else f"the call was relayed here by {relayed_by}: the worker moved meanwhile, retry"
                if relayed_by is not None
                else "this gateway relays to no other replica"
            )
            raise Unroutable(
                f"worker {worker.worker_id}'s tunnel is held by another replica"
                f" ({worker.task_queue}) and {why}"
            )
        assert self._replicas is not None
        assert worker.replica_address is not None
        token = operator_token(self._secret.get_secret_value(), self._operator_generation)
        metadata = (*bearer.metadata(token), (RELAYED, self._replicas.task_queue))
        return worker.replica_address, metadata

    async def SubmitTask(
        self,
        request: gateway_pb2.SubmitTaskRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> gateway_pb2.SubmitTaskResponse:
        identity = await self._authorize(context)
        try:
            task = submitted_task(request)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        task = await self.admit(task, identity, context)
        await self._records.start(task)
        return gateway_pb2.SubmitTaskResponse(task_id=task.task_id)

    async def admit(
        self, task: TaskInput, identity: Identity, context: grpc.aio.ServicerContext[Any, Any]
    ) -> TaskInput:
        """The task as it may run: in the caller's workspace, its volumes and disks that
        workspace's, a runtime its pool offers, within max-queued; else the call is aborted
        naming the field (a box's task is admitted so too, `levers9.gateway.box_service`)."""
        task = await self._in_workspace(task, identity, context)
        await self._volumes_exist(task, context)
        await self._disks_exist(task, context)
        refused = await self._records.refusal(task.pool_name, task.runtime)
        if refused is not None:
            field, problem = refused
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {problem}")
        await self._within_max_queued(task, context)
        await self._within_pool_queue(task, context)
        return task

    async def record_of(self, task_id: str) -> TaskRecord | None:
        """The task's record (a box's task: its state and node), None when there is none."""
        return await self._records.get(task_id)

    async def _disks_exist(
        self, task: TaskInput, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """Refuses the submit (INVALID_ARGUMENT, nothing started) naming a disk its workspace
        does not have (another workspace's is as unknown as a missing one), or one of another
        pool."""
        if self._disks is None:
            return
        for mount in task.mounts:
            if mount.kind != "disk":
                continue
            disk = await self._disks.get(task.workspace, mount.name)
            if disk is None:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"task.mounts: no disk {mount.name} in workspace {task.workspace}"
                    " (`levers9 disk list`; `levers9 disk create` makes one)",
                )
            elif disk.pool_name != task.pool_name:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"task.mounts: disk {mount.name} is on pool {disk.pool_name}, not"
                    f" {task.pool_name}: run the task with --pool {disk.pool_name}",
                )

    async def _volumes_exist(
        self, task: TaskInput, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """Refuses the submit (INVALID_ARGUMENT, nothing started) naming a volume its workspace
        does not have (another workspace's is as unknown as a missing one)."""
        if self._volumes is None:
            return
        for mount in task.mounts:
            if mount.kind != "volume":
                continue
            if await self._volumes.get(task.workspace, mount.name) is None:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"task.mounts: no volume {mount.name} in workspace {task.workspace}"
                    " (`levers9 volume list`; `levers9 volume create` makes one)",
                )
        volume = task.checkpoint_volume
        if volume and await self._volumes.get(task.workspace, volume) is None:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"task.checkpoint_volume: no volume {volume} in workspace {task.workspace}"
                " (`levers9 volume list`; `levers9 volume create` makes one)",
            )

    async def _box_of(self, record: TaskRecord) -> str:
        """The box whose running task `record` is ("": none): the box its id names
        (levers9.core.boxes.box_of_task_id) is asked."""
        name = box_of_task_id(record.task_id)
        if self._boxes is None or not name:
            return ""
        box = await self._boxes.get(record.workspace, name)
        return name if box is not None and box.task_id == record.task_id else ""

    async def _within_max_queued(
        self, task: TaskInput, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """Refuses the submit (RESOURCE_EXHAUSTED, nothing started) when its workspace keeps as
        many tasks waiting in the pool as its max-queued allows."""
        if task.workspace == DEFAULT_WORKSPACE:
            return
        state = await self.authority.workspace(task.workspace)
        if state is None or state.max_queued is None:
            return
        waiting = await self._records.waiting(task.pool_name, task.workspace)
        if waiting >= state.max_queued:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"workspace {task.workspace} has {waiting} tasks waiting in pool"
                f" {task.pool_name}, its max-queued ({state.max_queued}): submit again once some"
                f" start, or raise it (levers9 workspace set {task.workspace} --max-queued N)",
            )

    async def _within_pool_queue(
        self, task: TaskInput, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """Refuses the submit (RESOURCE_EXHAUSTED, nothing started) when the pool keeps
        POOL_MAX_WAITING tasks waiting, whatever their workspaces."""
        waiting = await self._records.pool_waiting(task.pool_name)
        if waiting >= POOL_MAX_WAITING:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"pool {task.pool_name} has {waiting} tasks waiting, the most one pool keeps"
                f" ({POOL_MAX_WAITING}): submit again once some start, or give each"
                " workspace a max-queued (levers9 workspace set NAME --max-queued N)",
            )

    async def _in_workspace(
        self, task: TaskInput, identity: Identity, context: grpc.aio.ServicerContext[Any, Any]
    ) -> TaskInput:
        """The task in the caller's workspace: a workspace token's own, whatever the request
        says; the operator's, the one it names (which must exist) or `default`."""
        if not identity.operator:
            return task.model_copy(update={"workspace": identity.own_workspace})
        if task.workspace == DEFAULT_WORKSPACE:
            return task
        problem = name_problem(task.workspace)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"task.workspace: {problem}")
        if not await self.authority.workspace_exists(task.workspace):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"task.workspace: no workspace {task.workspace} (`levers9 workspace list`)",
            )
        return task

    async def _own(
        self,
        identity: Identity,
        task_id: str,
        context: grpc.aio.ServicerContext[Any, Any],
        missing: str,
        where_queued: bool = False,
    ) -> TaskRecord:
        """The task's record when the caller may see it; NOT_FOUND with `missing` when there
        is no such task or it is another workspace's: the same answer, so ids cannot be
        probed."""
        record = await self._records.get(task_id, where_queued=where_queued)
        if record is None or not identity.sees(record.workspace):
            await context.abort(grpc.StatusCode.NOT_FOUND, missing)
        assert record is not None
        return record

    async def GetTaskRecord(
        self,
        request: gateway_pb2.GetTaskRecordRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> gateway_pb2.GetTaskRecordResponse:
        identity = await self._authorize(context)
        await self._task_id(context, request.task_id)
        wait = request.wait_seconds
        if not math.isfinite(wait) or wait < 0:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "wait_seconds: a number of seconds, 0 or more"
            )
        if not identity.operator:
            seen = await self._own(
                identity, request.task_id, context, f"no task {request.task_id}", wait == 0
            )
            if wait == 0:
                return gateway_pb2.GetTaskRecordResponse(record=record_message(seen))
        if wait > 0:
            record = await self._records.ended(request.task_id, min(wait, MAX_WAIT_S))
        else:
            record = await self._records.get(request.task_id, where_queued=True)
        if record is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no task {request.task_id}")
        return gateway_pb2.GetTaskRecordResponse(record=record_message(record))

    async def ListTasks(
        self,
        request: gateway_pb2.ListTasksRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> gateway_pb2.ListTasksResponse:
        identity = await self._authorize(context)
        # The page token is bound to the pool and to the caller's workspace (no '/' in either).
        scope = f"{request.pool_name}/{identity.workspace or ''}"
        try:
            if request.pool_name:
                check_pool_name(request.pool_name)
            if not 0 <= request.page_size <= MAX_LIST_PAGE_SIZE:
                raise InvalidRequest(
                    "page_size",
                    f"{request.page_size} is not 0 (meaning {LIST_PAGE_SIZE}) to"
                    f" {MAX_LIST_PAGE_SIZE} records",
                )
            sent, token = self._read_cursor(scope, request.page_token)
            records, next_token = await self._records.page(
                request.pool_name or None,
                request.page_size or LIST_PAGE_SIZE,
                token,
                identity.workspace,
            )
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        reply = gateway_pb2.ListTasksResponse()
        for i, record in enumerate(records[sent:]):
            message = record_message(record)
            if i and reply.ByteSize() + message.ByteSize() + 16 > MAX_LIST_PAGE_BYTES:
                reply.next_page_token = self._cursor(scope, sent + i, token)
                return reply
            reply.records.append(message)
        if next_token:
            reply.next_page_token = self._cursor(scope, 0, next_token)
        return reply

    def _mac(self, pool_name: str, sent: bytes, token: bytes) -> bytes:
        key = hashlib.sha256(b"levers9 ListTasks\0" + self._secret.get_secret_value().encode())
        message = b"\0".join((pool_name.encode(), sent, token))
        return hmac.new(key.digest(), message, hashlib.sha256).digest()[:16]

    def _cursor(self, pool_name: str, sent: int, token: bytes) -> bytes:
        counted = sent.to_bytes(4, "big")
        return _CURSOR + counted + self._mac(pool_name, counted, token) + token

    def _read_cursor(self, pool_name: str, page_token: bytes) -> tuple[int, bytes]:
        """How many records of the visibility page were sent, and that page's token."""
        if not page_token:
            return 0, b""
        counted, mac, token = page_token[1:5], page_token[5:21], page_token[21:]
        if not page_token.startswith(_CURSOR) or not hmac.compare_digest(
            mac, self._mac(pool_name, counted, token)
        ):
            raise InvalidRequest(
                "page_token",
                "not one ListTasks gave for this pool_name: list again from the first page",
            )
        return int.from_bytes(counted, "big"), token

    async def CancelTask(
        self,
        request: gateway_pb2.CancelTaskRecordRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> gateway_pb2.CancelTaskRecordResponse:
        identity = await self._authorize(context)
        await self._task_id(context, request.task_id)
        if len(request.reason) > MAX_REASON_CHARS:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"reason: at most {MAX_REASON_CHARS} characters"
            )
        missing = f"no running task {request.task_id} (it may have ended)"
        if not identity.operator:
            await self._own(identity, request.task_id, context, missing)
        if not await self._records.cancel(request.task_id, request.reason):
            await context.abort(grpc.StatusCode.NOT_FOUND, missing)
        return gateway_pb2.CancelTaskRecordResponse()

    async def CheckpointTask(
        self,
        request: gateway_pb2.CheckpointTaskRecordRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> gateway_pb2.CheckpointTaskRecordResponse:
        """`levers9 task checkpoint`: the task's record asks its worker (Update `checkpoint`);
        the task ends with the checkpoint kept in its record, or runs on (FAILED_PRECONDITION
        with the worker's reason)."""
        identity = await self._authorize(context)
        await self._task_id(context, request.task_id)
        task_id = request.task_id
        record = await self._own(identity, task_id, context, f"no task {task_id}")
        box = await self._box_of(record)
        if box:
            # Its box would see the task end and read it as the box's end, its checkpoint
            # unknown to `box start`.
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"task {task_id} is box {box}'s: `levers9 box stop {box}` checkpoints it and"
                f" `levers9 box start {box}` restores it",
            )
        volume = request.checkpoint_volume
        if volume:
            problem = name_problem(volume)
            if problem is not None:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"checkpoint_volume: {problem}"
                )
            if self._volumes is not None and not await self._volumes.get(record.workspace, volume):
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"checkpoint_volume: no volume {volume} in workspace {record.workspace}"
                    " (`levers9 volume list`; `levers9 volume create` makes one)",
                )
        outcome = await self._records.checkpoint(task_id, volume)
        if outcome is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"no running task {task_id} (it has ended)"
            )
        assert outcome is not None
        if outcome.refused:
            runs_on = "" if outcome.not_running else "; the task runs on"
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"task {task_id} not checkpointed: {outcome.refused}{runs_on}",
            )
        log.info(
            "task checkpointed",
            task_id=task_id,
            checkpoint=outcome.name,
            node=outcome.node,
            size_bytes=outcome.size_bytes,
            stored=bool(outcome.stored),
        )
        taken = TaskCheckpoint(
            name=outcome.name,
            node=outcome.node,
            size_bytes=outcome.size_bytes,
            seconds=outcome.seconds,
            volume=volume,
            stored=outcome.stored,
            store_error=outcome.store_error,
            sha256=outcome.stored_sha256,
        )
        return gateway_pb2.CheckpointTaskRecordResponse(
            checkpoint=to_message(taken, gateway_pb2.TaskCheckpoint),
            store_seconds=outcome.store_seconds,
        )

    async def RestoreTask(
        self,
        request: gateway_pb2.RestoreTaskRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> gateway_pb2.RestoreTaskResponse:
        """`levers9 task restore NAME`: a new task from the checkpoint, as its task was
        submitted (image, runtime, command, mounts), pinned to the checkpoint's node unless it
        is kept in a volume; admitted as any submit."""
        identity = await self._authorize(context)
        name = request.checkpoint
        if not name:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "checkpoint: missing: the name `levers9 task checkpoint` printed, or the id of"
                " the task it was taken of",
            )
        found = await self._checkpoint(identity, name)
        if found is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no checkpoint {name} (`levers9 task get TASK` lists a task's checkpoints)",
            )
        assert found is not None
        task_id, checkpoint = found
        template = await self._records.submitted_as(task_id)
        if template is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"task {task_id}'s record does not say what it was submitted as (recorded by"
                " an older controlplane): its checkpoint cannot be restored by task restore",
            )
        assert template is not None
        stored = bool(checkpoint.stored)
        pool_name = request.pool_name or template.pool_name
        try:
            check_pool_name(pool_name)
        except InvalidRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        if not stored and pool_name != template.pool_name:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"pool_name: checkpoint {checkpoint.name} is kept on node {checkpoint.node} of"
                f" pool {template.pool_name} only (in no volume): restore it there (no --pool),"
                " or take it with --checkpoints VOLUME to restore it anywhere",
            )
        task = template.model_copy(
            update={
                "task_id": new_task_id(),
                "pool_name": pool_name,
                "restore_from": checkpoint.name,
                "restore_sha256": checkpoint.sha256,
                "checkpoint_volume": checkpoint.volume if stored else "",
                "node": "" if stored else checkpoint.node,
                "endpoint": "",
                "resume": None,
            }
        )
        task = await self.admit(task, identity, context)
        await self._records.start(task)
        log.info(
            "task restore submitted",
            task_id=task.task_id,
            checkpoint=checkpoint.name,
            node=task.node or "any",
        )
        return gateway_pb2.RestoreTaskResponse(
            task_id=task.task_id, restored_from=checkpoint.name, node=task.node
        )

    async def _checkpoint(self, identity: Identity, name: str) -> tuple[str, TaskCheckpoint] | None:
        """The task a checkpoint was taken of and its record of it, when the caller may see
        that task: `name` is a checkpoint's (`<task>-ck<n>`), or a task's id (its last)."""
        candidates = dict.fromkeys(t for t in (checkpointed_task_id(name), name) if t)
        for task_id in candidates:
            try:
                check_task_id(task_id)
            except InvalidRequest:
                continue
            record = await self._records.get(task_id)
            if record is None or not identity.sees(record.workspace):
                continue
            named = [c for c in record.checkpoints if c.name == name]
            if not named and task_id == name:
                named = list(record.checkpoints[-1:])
            if named:
                return task_id, named[-1]
        return None

    async def _running(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        identity: Identity,
        task_id: str,
        needs: str,
    ) -> TaskRecord:
        """The record of a running task (placed on its worker) the caller may see; aborts
        saying why not."""
        await self._task_id(context, task_id)
        record = await self._own(identity, task_id, context, f"no task {task_id}")
        if record.state != "running" or record.worker_id is None or record.address is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"task {task_id} is {record.state}, not running: {needs}",
            )
        return record

    async def _relay_stream(
        self,
        record: TaskRecord,
        context: grpc.aio.ServicerContext[Any, Any],
        call: Callable[[Upstream], AsyncIterator[R]],
    ) -> AsyncIterator[R]:
        """The worker's stream for `call`, relayed; its refusal passed on (a worker that does
        not answer is UNAVAILABLE naming it)."""
        via: str | None = None
        try:
            async with self._upstream(record, context) as up:
                via = up.via
                async for response in call(up):
                    yield response
        except aio.AioRpcError as exc:
            code = exc.code()
            if via is not None:  # the other replica's answer names the worker already
                await context.abort(code, f"through replica {via}: {exc.details()}")
            passed_on = (
                grpc.StatusCode.FAILED_PRECONDITION,
                grpc.StatusCode.NOT_FOUND,
                grpc.StatusCode.INVALID_ARGUMENT,
            )
            await context.abort(
                code if code in passed_on else grpc.StatusCode.UNAVAILABLE,
                f"worker {record.worker_id}: {code.name}: {exc.details()}",
            )

    async def ExecTask(
        self,
        request_iterator: AsyncIterator[worker_pb2.ExecRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[worker_pb2.ExecResponse]:
        identity = await self._authorize(context)
        first = await anext(request_iterator, None)
        if first is None or not first.HasField("start"):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "ExecTask starts with an ExecStart message"
            )
            return
        start = first.start
        await self._task_id(context, start.task_id)
        if not start.command:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "command: missing")
        record = await self._running(context, identity, start.task_id, "exec needs its container")
        requests = _prepend(first, request_iterator)
        async for response in self._relay_stream(record, context, lambda up: up.exec(requests)):
            yield response

    async def PortForward(
        self,
        request_iterator: AsyncIterator[worker_pb2.PortForwardRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[worker_pb2.PortForwardResponse]:
        identity = await self._authorize(context)
        first = await anext(request_iterator, None)
        if first is None or not first.HasField("start"):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "PortForward starts with a PortForwardStart"
            )
            return
        start = first.start
        if not 0 < start.port < 65536:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"port: {start.port} is not a TCP port"
            )
        record = await self._running(context, identity, start.task_id, "its ports are closed")
        if start.port not in record.ports:
            published = ", ".join(map(str, record.ports)) or "none"
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"task {start.task_id} did not publish port {start.port} (published:"
                f" {published}): run it with --port {start.port}",
            )
        requests = _prepend(first, request_iterator)

        async def forwarded(up: Upstream) -> AsyncIterator[worker_pb2.PortForwardResponse]:
            call = up.port_forward()
            feeding = asyncio.create_task(feed(call, requests))
            try:
                # The worker's word that it reached the port, passed on (the endpoints' front
                # sends a request that never got there to another replica).
                metadata = await call.initial_metadata()
                if metadata is not None and metadata.get(PORT_CONNECTED_HEADER):
                    await context.send_initial_metadata(((PORT_CONNECTED_HEADER, "1"),))
                async for response in call:
                    yield response
            finally:
                feeding.cancel()

        async for response in self._relay_stream(record, context, forwarded):
            yield response

    async def StreamTaskLogs(
        self, request: gateway_pb2.StreamTaskLogsRequest, context: Context
    ) -> AsyncIterator[worker_pb2.LogChunk]:
        identity = await self._authorize(context)
        if not request.task_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "task_id is required")
        record = await self._placed(identity, request.task_id, request.follow, context)
        if record is None or record.worker_id is None or record.address is None:
            return  # ended without ever running: there is no output to relay
        upstream = worker_pb2.StreamLogsRequest(
            task_id=request.task_id, follow=request.follow, offset=request.offset
        )
        via: str | None = None
        try:
            async with self._upstream(record, context) as up:
                via = up.via
                async for chunk in up.logs(upstream):
                    yield chunk
        except aio.AioRpcError as exc:
            code = exc.code()
            if via is not None:  # the other replica's answer names the worker already
                await context.abort(code, f"through replica {via}: {exc.details()}")
            if code == grpc.StatusCode.NOT_FOUND:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"worker {record.worker_id} no longer has task {request.task_id}'s output;"
                    f" `levers9 task logs {request.task_id}` shows the record's tail",
                )
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"worker {record.worker_id} at {record.address} did not stream logs"
                f" ({code.name}: {exc.details()}); `levers9 task logs {request.task_id}`"
                " shows the record's tail",
            )

    async def _placed(
        self, identity: Identity, task_id: str, follow: bool, context: Context
    ) -> TaskRecord | None:
        """The record once the task runs on its worker (placed is not enough: the worker knows
        the task only once RunTask got through); None when it ended without running."""
        pause, longest = PLACEMENT_POLL_S
        while True:
            record = await self._own(identity, task_id, context, f"no task {task_id}")
            if record.address is not None and record.state not in ("queued", "placed"):
                return record
            if record.state in TERMINAL or not follow:
                return None
            await asyncio.sleep(pause)
            pause = min(pause * 2, longest)


async def _prepend(first: M, rest: AsyncIterator[M]) -> AsyncIterator[M]:
    yield first
    async for message in rest:
        yield message
