"""`levers9 task checkpoint` and `task restore`: the gateway's Tasks.CheckpointTask and
Tasks.RestoreTask, and what a platform engineer reads of them (the checkpoint's name, size and
node, where it is kept, how the task ended; the restored task's id)."""

from __future__ import annotations

from levers9.cli.gateway_api import CALL_TIMEOUT_S
from levers9.cli.service_call import Metadata, call_service
from levers9.models import TaskCheckpoint, TaskRecord
from levers9.proto import gateway_pb2, gateway_pb2_grpc
from levers9.task_wire import from_message, record_from_message

CHECKPOINT_CALL_S = 420.0
"""The record's checkpoint activity may take 6 minutes (a large sandbox, an upload)."""
ENDED_WAIT_S = 30.0
"""How long the command waits for the checkpointed task's record to read its end."""


def checkpoint_task(task_id: str, volume: str) -> tuple[TaskCheckpoint, float, TaskRecord | None]:
    """The checkpoint taken, its upload's seconds, and the task's record once it ended (or as
    it is after ENDED_WAIT_S)."""

    async def call(
        stub: gateway_pb2_grpc.TasksAsyncStub, md: Metadata
    ) -> tuple[TaskCheckpoint, float, TaskRecord | None]:
        reply = await stub.CheckpointTask(
            gateway_pb2.CheckpointTaskRecordRequest(task_id=task_id, checkpoint_volume=volume),
            metadata=md,
            timeout=CHECKPOINT_CALL_S,
        )
        ended = await stub.GetTaskRecord(
            gateway_pb2.GetTaskRecordRequest(task_id=task_id, wait_seconds=ENDED_WAIT_S),
            metadata=md,
            timeout=ENDED_WAIT_S + CALL_TIMEOUT_S,
        )
        record = record_from_message(ended.record) if ended.HasField("record") else None
        taken = from_message(reply.checkpoint, TaskCheckpoint)
        return taken, reply.store_seconds, record

    return call_service(gateway_pb2_grpc.TasksStub, call)


def restore_task(checkpoint: str, pool: str) -> gateway_pb2.RestoreTaskResponse:
    request = gateway_pb2.RestoreTaskRequest(checkpoint=checkpoint, pool_name=pool)
    reply: gateway_pb2.RestoreTaskResponse = call_service(
        gateway_pb2_grpc.TasksStub,
        lambda stub, md: stub.RestoreTask(request, metadata=md, timeout=CALL_TIMEOUT_S),
    )
    return reply


def checkpoint_lines(
    task_id: str, taken: TaskCheckpoint, store_seconds: float, record: TaskRecord | None
) -> list[str]:
    """What `task checkpoint` prints: the image, where it is kept, how the task ended."""
    pool = record.pool_name if record is not None else "its pool"
    lines = [
        f"task {task_id} checkpointed to {taken.name} ({taken.size_bytes} bytes in"
        f" {taken.seconds:.1f} s) on node {taken.node or '?'}"
    ]
    if taken.stored:
        lines.append(
            f"kept in volume {taken.volume} ({taken.stored}, {store_seconds:.1f} s): levers9 task"
            f" restore {taken.name} restores it on any machine of pool {pool}"
        )
    elif taken.volume:
        lines.append(
            f"kept on node {taken.node} only: its upload to volume {taken.volume} failed"
            f" ({taken.store_error}); levers9 task restore {taken.name} restores it there"
        )
    else:
        lines.append(
            f"kept on node {taken.node} only (no --checkpoints VOLUME): levers9 task restore"
            f" {taken.name} restores it there"
        )
    if record is None:
        lines.append(f"levers9 task get {task_id} says how it ended")
    else:
        reason = f": {record.reason}" if record.reason else ""
        lines.append(f"task {task_id} is {record.state}{reason}")
    return lines
