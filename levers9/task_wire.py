"""A task's fields on the wire, carried by name: the proto TaskSpec (levers9/proto/worker.proto),
which `levers9 run` submits (Tasks.SubmitTask) and a worker runs (WorkerService.RunTask), and
levers9.models.TaskInput, which Temporal carries, name the same fields, and the converters here
copy every field the message declares by its name and kind (scalar, repeated, map, optional,
timestamp, nested message), never a hand list. A task field is added in its two declarations:
TaskSpec (the wire's number and type) and TaskInput (its default and its meaning);
tests/unit/test_task_wire.py fails while one of them lacks it. Likewise the record:
levers9.models.TaskRecord and the proto TaskRecord that Tasks.GetTaskRecord answers
(levers9/proto/gateway.proto), to the same `task get -o json`.

Pure: no checks here; the gateway checks what a client sends before it becomes a TaskInput
(levers9.gateway.convert.submitted_task), the agent what reaches it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import BaseModel

from levers9.core.placement import QueueSpot
from levers9.core.storage import TaskMount
from levers9.core.task_reports import TaskPhase
from levers9.core.workspaces import DEFAULT_WORKSPACE
from levers9.models import CheckpointRefusal, TaskAttempt, TaskCheckpoint, TaskInput, TaskRecord
from levers9.proto import gateway_pb2, worker_pb2

M = TypeVar("M", bound=Message)
B = TypeVar("B", bound=BaseModel)

NESTED: Mapping[str, type[BaseModel]] = {
    gateway_pb2.TaskRecordPhase.DESCRIPTOR.full_name: TaskPhase,
    gateway_pb2.TaskQueueSpot.DESCRIPTOR.full_name: QueueSpot,
    gateway_pb2.TaskAttempt.DESCRIPTOR.full_name: TaskAttempt,
    gateway_pb2.TaskCheckpoint.DESCRIPTOR.full_name: TaskCheckpoint,
    gateway_pb2.TaskCheckpointRefusal.DESCRIPTOR.full_name: CheckpointRefusal,
    worker_pb2.TaskMount.DESCRIPTOR.full_name: TaskMount,
}
"""The model each nested message of a record becomes."""


def task_spec(
    task: TaskInput, gpu_indices: Sequence[int] = (), attempt: int = 0
) -> worker_pb2.TaskSpec:
    """The task as the wire carries it; `gpu_indices`: the cards its placement chose (none
    when it is submitted), `attempt`: which attempt of the task it is on its worker."""
    spec = to_message(task, worker_pb2.TaskSpec)
    spec.gpu_indices.extend(gpu_indices)
    spec.attempt = attempt
    return spec


def task_input(spec: worker_pb2.TaskSpec, *, pool_name: str, gpus: int) -> TaskInput:
    """The task a TaskSpec describes, to run on `gpus` cards of a worker of `pool_name` (no
    workspace on the wire: `default`'s)."""
    workspace = spec.workspace or DEFAULT_WORKSPACE
    return from_message(spec, TaskInput, pool_name=pool_name, gpus=gpus, workspace=workspace)


def submit_request(task: TaskInput) -> gateway_pb2.SubmitTaskRequest:
    """What a client sends to start `task`'s record through the gateway."""
    return gateway_pb2.SubmitTaskRequest(
        pool_name=task.pool_name, gpus=task.gpus, task=task_spec(task)
    )


def record_message(record: TaskRecord) -> gateway_pb2.TaskRecord:
    """The record as Tasks.GetTaskRecord answers it."""
    return to_message(record, gateway_pb2.TaskRecord)


def record_from_message(message: gateway_pb2.TaskRecord) -> TaskRecord:
    """The record a GetTaskRecord answer carries, as the controlplane holds it (no workspace
    on the wire, from a gateway older than workspaces: `default`)."""
    return from_message(message, TaskRecord, workspace=message.workspace or DEFAULT_WORKSPACE)


def to_message(model: BaseModel, cls: type[M]) -> M:
    """`cls` with every field it declares taken from `model`'s field of that name (a field the
    model lacks stays unset; None leaves an optional field unset)."""
    message = cls()
    for field in cls.DESCRIPTOR.fields:
        if field.name not in type(model).model_fields:
            continue
        value = getattr(model, field.name)
        if value is None:
            continue
        target = getattr(message, field.name)
        if _is_map(field):
            target.update(value)
        elif field.is_repeated:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                target.extend(_message_of(v, field) for v in value)
            else:
                target.extend(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            target.CopyFrom(_message_of(value, field))
        else:
            setattr(message, field.name, value)
    return message


def from_message(
    message: Message,
    cls: type[B],
    *,
    nested: Mapping[str, type[BaseModel]] = NESTED,
    **given: Any,
) -> B:
    """`cls` from every field `message` declares that `cls` has too, and `given` (which wins
    over the message's field of its name); an unset optional field or message is None;
    `nested`: the model each nested message becomes, by its full name."""
    fields: dict[str, Any] = dict(given)
    for field in message.DESCRIPTOR.fields:
        if field.name not in cls.model_fields or field.name in given:
            continue
        value = getattr(message, field.name)
        if _is_map(field):
            fields[field.name] = dict(value)
        elif field.is_repeated:
            if field.type == FieldDescriptor.TYPE_MESSAGE:
                fields[field.name] = tuple(_model_of(v, nested) for v in value)
            else:
                fields[field.name] = tuple(value)
        elif field.has_presence and not message.HasField(field.name):
            fields[field.name] = None
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            fields[field.name] = _model_of(value, nested)
        else:
            fields[field.name] = value
    return cls(**fields)


def _is_map(field: Any) -> bool:
    return bool(
        field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry
    )


def _message_of(value: Any, field: Any) -> Message:
    if isinstance(value, datetime):
        stamp = Timestamp()
        stamp.FromDatetime(value)
        return stamp
    cls: type[Message] = message_factory.GetMessageClass(field.message_type)
    return to_message(value, cls)


def _model_of(message: Message, nested: Mapping[str, type[BaseModel]]) -> Any:
    if isinstance(message, Timestamp):
        return message.ToDatetime(tzinfo=UTC)
    return from_message(message, nested[message.DESCRIPTOR.full_name], nested=nested)
