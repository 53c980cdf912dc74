"""A task's fields are defined once: the proto TaskSpec and levers9.models.TaskInput name the
same fields, and levers9.task_wire carries every one of them both ways; so do the proto
TaskRecord and levers9.models.TaskRecord, to the same `task get -o json`. A field added to one
side and not the other, or left out of a converter, fails here."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf.descriptor import Descriptor
from pydantic import BaseModel

from levers9.core.placement import QueueSpot
from levers9.core.storage import TaskMount
from levers9.core.task_reports import TaskPhase
from levers9.models import CheckpointRefusal, TaskAttempt, TaskCheckpoint, TaskInput, TaskRecord
from levers9.proto import gateway_pb2, worker_pb2
from levers9.task_wire import (
    record_from_message,
    record_message,
    submit_request,
    task_input,
    task_spec,
)

PLACEMENT_ONLY = {"gpu_indices", "attempt"}
"""TaskSpec fields a task gets from its placement, not from its user."""
RECORD_ONLY = {
    "endpoint",
    "resume",
    "max_history_events",
    "ask_again_seconds",
    "node",
    "avoid_node",
}
"""TaskInput fields its record sets for itself; no client sends them."""

EVERY_FIELD = TaskInput(
    task_id="t-every-field",
    pool_name="gke-rtx6000",
    command=("python", "-m", "server"),
    gpus=2,
    image="127.0.0.1:5000/tasks/busybox:bb",
    env={"MODEL": "small", "WORKERS": "4"},
    memory_bytes=8 * 2**30,
    cpu_millis=4000,
    ports=(8080, 9090),
    ready_path="/health",
    stop_grace_seconds=30,
    runtime="runsc",
    borrow=True,
    retries=3,
    on_preempt="checkpoint",
    mounts=(
        TaskMount(kind="volume", name="data", path="/data", read_only=True),
        TaskMount(kind="disk", name="scratch", path="/scratch"),
    ),
    restore_from="box-1",
    checkpoint_volume="checkpoints",
    restore_sha256="0" * 64,
)


def _names(descriptor: Descriptor) -> set[str]:
    return set(descriptor.fields_by_name)


def test_task_spec_and_task_input_name_the_same_fields() -> None:
    spec = _names(worker_pb2.TaskSpec.DESCRIPTOR)
    submit = _names(gateway_pb2.SubmitTaskRequest.DESCRIPTOR) - {"task"}
    model = set(TaskInput.model_fields)
    assert spec - PLACEMENT_ONLY <= model
    assert model - RECORD_ONLY == (spec - PLACEMENT_ONLY) | submit


def test_every_field_set_is_set_on_the_wire() -> None:
    spec = task_spec(EVERY_FIELD, gpu_indices=(1, 3), attempt=2)
    assert {field.name for field, _ in spec.ListFields()} == _names(worker_pb2.TaskSpec.DESCRIPTOR)
    assert list(spec.gpu_indices) == [1, 3]
    assert spec.attempt == 2


def test_a_task_comes_back_from_the_wire_as_it_went() -> None:
    spec = task_spec(EVERY_FIELD, gpu_indices=(1, 3))
    assert task_input(spec, pool_name="gke-rtx6000", gpus=2) == EVERY_FIELD


def test_a_submit_carries_the_task_and_no_cards_of_its_own_choosing() -> None:
    request = submit_request(EVERY_FIELD)
    assert (request.pool_name, request.gpus) == ("gke-rtx6000", 2)
    assert request.task == task_spec(EVERY_FIELD)
    assert not request.task.gpu_indices
    assert task_input(request.task, pool_name=request.pool_name, gpus=request.gpus) == EVERY_FIELD


CREATED = datetime(2026, 12, 4, 21, 47, 15, 123456, tzinfo=UTC)
EVERY_RECORD_FIELD = TaskRecord(
    task_id="t-every-field",
    pool_name="gke-rtx6000",
    command=("python", "-m", "server"),
    gpus=2,
    image="127.0.0.1:5000/tasks/busybox:bb",
    state="failed",
    created_at=CREATED,
    worker_id="w-1",
    node_name="gke-node-1",
    address="192.0.2.7:50051",
    tls=True,
    gpu_indices=(1, 3),
    phases=(
        TaskPhase(name="placement", at=CREATED + timedelta(microseconds=7)),
        TaskPhase(name="image.pull", at=None, error="denied", detail="pulled 1085368 bytes"),
    ),
    exit_code=0,
    result_json='{"ok": true}',
    reason="OOM",
    log_tail="last line\n",
    host="runc",
    image_digest="sha256:" + "a" * 64,
    ports=(8080,),
    ready=True,
    endpoint="chat",
    borrowed=True,
    retries=2,
    on_preempt="requeue",
    attempts=(
        TaskAttempt(
            state="preempted",
            reason="preempted: reclaimed by workspace large",
            exit_code=137,
            worker_id="w-0",
            node_name="gke-node-0",
            gpu_indices=(0,),
            placed_at=CREATED + timedelta(seconds=1),
            finished_at=CREATED + timedelta(seconds=2),
        ),
    ),
    checkpoints=(
        TaskCheckpoint(
            name="t-every-field-ck1",
            node="gke-node-1",
            size_bytes=524288,
            seconds=0.25,
            volume="ckpts",
            stored="s3://bucket/p/checkpoints/t-every-field-ck1/",
            store_error="",
            sha256="b" * 64,
            at=CREATED + timedelta(seconds=3),
            store_seconds=0.5,
        ),
    ),
    checkpoint_asks=2,
    checkpoint_refusals=(
        CheckpointRefusal(
            ask=1,
            name="t-every-field-ck1",
            reason="runs under runc",
            not_running=True,
            at=CREATED + timedelta(seconds=2),
        ),
    ),
    finished_at=CREATED + timedelta(seconds=3),
    queue=QueueSpot(position=1, waiting=2, gpus=4, most_free=3, workers=5),
)


@pytest.mark.parametrize(
    ("message", "model"),
    [
        (gateway_pb2.TaskRecord, TaskRecord),
        (gateway_pb2.TaskRecordPhase, TaskPhase),
        (gateway_pb2.TaskQueueSpot, QueueSpot),
        (gateway_pb2.TaskAttempt, TaskAttempt),
        (gateway_pb2.TaskCheckpoint, TaskCheckpoint),
        (gateway_pb2.TaskCheckpointRefusal, CheckpointRefusal),
    ],
)
def test_the_record_on_the_wire_names_the_records_fields(
    message: type[
        gateway_pb2.TaskRecord
        | gateway_pb2.TaskRecordPhase
        | gateway_pb2.TaskQueueSpot
        | gateway_pb2.TaskAttempt
        | gateway_pb2.TaskCheckpoint
        | gateway_pb2.TaskCheckpointRefusal
    ],
    model: type[BaseModel],
) -> None:
    assert _names(message.DESCRIPTOR) == set(model.model_fields)


def test_every_record_field_set_is_set_on_the_wire() -> None:
    message = record_message(EVERY_RECORD_FIELD)
    assert {field.name for field, _ in message.ListFields()} == _names(
        gateway_pb2.TaskRecord.DESCRIPTOR
    )


@pytest.mark.parametrize(
    "record",
    [
        EVERY_RECORD_FIELD,
        TaskRecord.queued(EVERY_FIELD, CREATED),
        EVERY_RECORD_FIELD.model_copy(update={"exit_code": None, "phases": (), "queue": None}),
        TaskRecord.model_validate_json(EVERY_RECORD_FIELD.model_dump_json()),
    ],
    ids=["every-field", "queued", "no-exit-code", "read-from-a-memo"],
)
def test_task_get_prints_the_same_record_after_the_wire(record: TaskRecord) -> None:
    """`0` and `null`, microseconds, and the record's own JSON survive the trip."""
    wire = gateway_pb2.TaskRecord.FromString(record_message(record).SerializeToString())
    back = record_from_message(wire)
    assert back == record
    assert back.model_dump_json() == record.model_dump_json()
