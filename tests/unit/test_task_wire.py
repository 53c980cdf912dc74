"""A task's fields are defined once: the proto TaskSpec and levers9.models.TaskInput name the
same fields, and levers9.task_wire carries every one of them both ways. A field added to one
side and not the other, or left out of the converter, fails here."""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor

from levers9.models import TaskInput
from levers9.proto import gateway_pb2, worker_pb2
from levers9.task_wire import submit_request, task_input, task_spec

PLACEMENT_ONLY = {"gpu_indices"}
"""TaskSpec fields a task gets from its placement, not from its user."""
RECORD_ONLY = {"endpoint", "resume", "max_history_events", "ask_again_seconds"}
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
    spec = task_spec(EVERY_FIELD, gpu_indices=(1, 3))
    assert {field.name for field, _ in spec.ListFields()} == _names(worker_pb2.TaskSpec.DESCRIPTOR)
    assert list(spec.gpu_indices) == [1, 3]


def test_a_task_comes_back_from_the_wire_as_it_went() -> None:
    spec = task_spec(EVERY_FIELD, gpu_indices=(1, 3))
    assert task_input(spec, pool_name="gke-rtx6000", gpus=2) == EVERY_FIELD


def test_a_submit_carries_the_task_and_no_cards_of_its_own_choosing() -> None:
    request = submit_request(EVERY_FIELD)
    assert (request.pool_name, request.gpus) == ("gke-rtx6000", 2)
    assert request.task == task_spec(EVERY_FIELD)
    assert not request.task.gpu_indices
    assert task_input(request.task, pool_name=request.pool_name, gpus=request.gpus) == EVERY_FIELD
