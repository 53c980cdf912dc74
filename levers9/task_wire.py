"""A task's fields on the wire: the one copy between levers9.models.TaskInput and the proto
TaskSpec (levers9/proto/worker.proto), which `levers9 run` submits (Tasks.SubmitTask) and a
worker runs (WorkerService.RunTask). A task field is added in three places: TaskSpec, TaskInput
and the two functions here (tests/unit/test_task_wire.py fails while one is missing). Likewise
the record: levers9.models.TaskRecord and the proto TaskRecord that Tasks.GetTaskRecord answers
(levers9/proto/gateway.proto), converted both ways here, to the same `task get -o json`.

Pure: no checks here; the gateway checks what a client sends before it becomes a TaskInput
(levers9.gateway.convert.submitted_task), the agent what reaches it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from google.protobuf.timestamp_pb2 import Timestamp

from levers9.core.placement import QueueSpot
from levers9.core.task_reports import TaskPhase
from levers9.models import TaskInput, TaskRecord
from levers9.proto import gateway_pb2, worker_pb2


def task_spec(task: TaskInput, gpu_indices: Sequence[int] = ()) -> worker_pb2.TaskSpec:
    """The task as the wire carries it; `gpu_indices`: the cards its placement chose (none
    when it is submitted)."""
    return worker_pb2.TaskSpec(
        task_id=task.task_id,
        image=task.image,
        command=list(task.command),
        env=dict(task.env),
        gpu_indices=list(gpu_indices),
        memory_bytes=task.memory_bytes,
        cpu_millis=task.cpu_millis,
        ports=list(task.ports),
        ready_path=task.ready_path,
        stop_grace_seconds=task.stop_grace_seconds,
        runtime=task.runtime,
    )


def task_input(spec: worker_pb2.TaskSpec, *, pool_name: str, gpus: int) -> TaskInput:
    """The task a TaskSpec describes, to run on `gpus` cards of a worker of `pool_name`."""
    return TaskInput(
        task_id=spec.task_id,
        pool_name=pool_name,
        command=tuple(spec.command),
        gpus=gpus,
        image=spec.image,
        env=dict(spec.env),
        memory_bytes=spec.memory_bytes,
        cpu_millis=spec.cpu_millis,
        ports=tuple(spec.ports),
        ready_path=spec.ready_path,
        stop_grace_seconds=spec.stop_grace_seconds,
        runtime=spec.runtime,
    )


def submit_request(task: TaskInput) -> gateway_pb2.SubmitTaskRequest:
    """What a client sends to start `task`'s record through the gateway."""
    return gateway_pb2.SubmitTaskRequest(
        pool_name=task.pool_name, gpus=task.gpus, task=task_spec(task)
    )


def record_message(record: TaskRecord) -> gateway_pb2.TaskRecord:
    """The record as Tasks.GetTaskRecord answers it."""
    message = gateway_pb2.TaskRecord(
        task_id=record.task_id,
        pool_name=record.pool_name,
        command=list(record.command),
        gpus=record.gpus,
        image=record.image,
        state=record.state,
        created_at=_timestamp(record.created_at),
        worker_id=record.worker_id,
        node_name=record.node_name,
        address=record.address,
        tls=record.tls,
        gpu_indices=list(record.gpu_indices),
        phases=[
            gateway_pb2.TaskRecordPhase(
                name=p.name,
                at=None if p.at is None else _timestamp(p.at),
                error=p.error,
                detail=p.detail,
            )
            for p in record.phases
        ],
        exit_code=record.exit_code,
        result_json=record.result_json,
        reason=record.reason,
        log_tail=record.log_tail,
        host=record.host,
        image_digest=record.image_digest,
        ports=list(record.ports),
        ready=record.ready,
        endpoint=record.endpoint,
        finished_at=None if record.finished_at is None else _timestamp(record.finished_at),
    )
    if record.queue is not None:
        spot = record.queue
        message.queue.CopyFrom(
            gateway_pb2.TaskQueueSpot(
                position=spot.position,
                waiting=spot.waiting,
                gpus=spot.gpus,
                most_free=spot.most_free,
                workers=spot.workers,
            )
        )
    return message


def record_from_message(message: gateway_pb2.TaskRecord) -> TaskRecord:
    """The record a GetTaskRecord answer carries, as the controlplane holds it."""
    return TaskRecord(
        task_id=message.task_id,
        pool_name=message.pool_name,
        command=tuple(message.command),
        gpus=message.gpus,
        image=message.image,
        state=message.state,
        created_at=_datetime(message.created_at),
        worker_id=message.worker_id if message.HasField("worker_id") else None,
        node_name=message.node_name if message.HasField("node_name") else None,
        address=message.address if message.HasField("address") else None,
        tls=message.tls,
        gpu_indices=tuple(message.gpu_indices),
        phases=tuple(
            TaskPhase(
                name=p.name,
                at=_datetime(p.at) if p.HasField("at") else None,
                error=p.error,
                detail=p.detail,
            )
            for p in message.phases
        ),
        exit_code=message.exit_code if message.HasField("exit_code") else None,
        result_json=message.result_json,
        reason=message.reason,
        log_tail=message.log_tail,
        host=message.host,
        image_digest=message.image_digest,
        ports=tuple(message.ports),
        ready=message.ready,
        endpoint=message.endpoint,
        finished_at=_datetime(message.finished_at) if message.HasField("finished_at") else None,
        queue=_queue_spot(message.queue) if message.HasField("queue") else None,
    )


def _queue_spot(message: gateway_pb2.TaskQueueSpot) -> QueueSpot:
    return QueueSpot(
        position=message.position,
        waiting=message.waiting,
        gpus=message.gpus,
        most_free=message.most_free,
        workers=message.workers,
    )


def _timestamp(at: datetime) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(at)
    return stamp


def _datetime(stamp: Timestamp) -> datetime:
    return stamp.ToDatetime(tzinfo=UTC)
