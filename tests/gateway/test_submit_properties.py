"""`Tasks.SubmitTask`'s conversion (levers9/gateway/convert.py), the one door a task comes in by,
over any message (hypothesis; tests/properties.py): a task input that round-trips through the
record's own schema and back to the TaskSpec it came as (levers9.task_wire), or InvalidRequest
naming a field the message has (`task.ports`: a field of its TaskSpec). The servers' answers to
garbage and to well-formed nonsense are tests/reliability/test_bad_input.py's."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.gateway import convert
from levers9.gateway.errors import InvalidRequest
from levers9.models import TaskInput
from levers9.proto import gateway_pb2, worker_pb2
from levers9.task_wire import task_spec
from tests.properties import examples

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=60)
SPECS = st.builds(
    worker_pb2.TaskSpec,
    task_id=st.one_of(TEXT, st.just("t-0123456789ab")),
    command=st.lists(TEXT, max_size=4),
    image=st.one_of(TEXT, st.just("127.0.0.1:5000/tasks/busybox:bb")),
    env=st.dictionaries(st.one_of(TEXT, st.just("PORT")), TEXT, max_size=2),
    gpu_indices=st.one_of(st.just([]), st.lists(INT32, max_size=2)),
    memory_bytes=st.one_of(INT64, st.just(0), st.just(2**30)),
    cpu_millis=st.one_of(INT32, st.just(0), st.just(500)),
    ports=st.lists(st.one_of(INT32, st.integers(1, 65535)), max_size=3),
    ready_path=st.one_of(TEXT, st.just(""), st.just("/health")),
    stop_grace_seconds=st.one_of(INT32, st.integers(0, 60)),
    runtime=st.one_of(TEXT, st.sampled_from(["", "runc", "runsc"])),
    retries=st.one_of(INT32, st.integers(0, 100)),
    on_preempt=st.one_of(TEXT, st.sampled_from(["", "requeue", "checkpoint"])),
    checkpoint_volume=st.one_of(st.just(""), st.just("ckpt")),
    mounts=st.lists(
        st.builds(
            worker_pb2.TaskMount,
            kind=st.one_of(TEXT, st.sampled_from(["volume", "disk"])),
            name=st.one_of(TEXT, st.just("data")),
            path=st.one_of(TEXT, st.sampled_from(["/data", "/proc", "/"])),
            read_only=st.booleans(),
        ),
        max_size=3,
    ),
)
SUBMITS = st.builds(
    gateway_pb2.SubmitTaskRequest,
    pool_name=st.one_of(TEXT, st.just("gke-rtx6000")),
    gpus=st.one_of(INT32, st.integers(0, 8)),
    task=st.one_of(SPECS, st.none()),
)


def _names_a_field(path: str) -> bool:
    """`path` ("task.ports") is a field of SubmitTaskRequest, through its messages."""
    descriptor = gateway_pb2.SubmitTaskRequest.DESCRIPTOR
    *outer, last = path.split(".")
    for name in outer:
        field = descriptor.fields_by_name.get(name)
        if field is None or field.message_type is None:
            return False
        descriptor = field.message_type
    return last in descriptor.fields_by_name


@examples(200)
@given(request=SUBMITS)
def test_any_submit_becomes_a_task_input_or_names_its_field(
    request: gateway_pb2.SubmitTaskRequest,
) -> None:
    refused: InvalidRequest | None = None
    try:
        task = convert.submitted_task(request)
    except InvalidRequest as error:
        refused = error
    if refused is not None:
        assert refused.code == grpc.StatusCode.INVALID_ARGUMENT
        assert _names_a_field(refused.field), refused.field
        assert refused.message.startswith(f"{refused.field}: "), refused.message
        return
    assert TaskInput.model_validate_json(task.model_dump_json()) == task
    sent = worker_pb2.TaskSpec()
    sent.CopyFrom(request.task)
    sent.workspace = sent.workspace or "default"  # "" on the wire: an older client's default
    assert task_spec(task) == sent


ARG = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=20)
WELL_FORMED = st.builds(
    gateway_pb2.SubmitTaskRequest,
    pool_name=st.just("gke-rtx6000"),
    gpus=st.integers(0, 8),
    task=st.builds(
        worker_pb2.TaskSpec,
        task_id=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
        command=st.lists(ARG, min_size=1, max_size=4),
        image=st.sampled_from(["", "127.0.0.1:5000/tasks/busybox:bb"]),
        env=st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True), ARG),
        memory_bytes=st.one_of(st.just(0), st.integers(2**23, 2**40)),
        cpu_millis=st.integers(0, 4096 * 1000),
        ports=st.lists(st.integers(1, 65535), unique=True, min_size=1, max_size=3),
        ready_path=st.sampled_from(["", "/", "/health?ready=1"]),
        stop_grace_seconds=st.integers(0, 3600),
        runtime=st.sampled_from(["", "runc", "runsc"]),
        retries=st.integers(0, 100),
        on_preempt=st.sampled_from(["", "requeue"]),
        # "" on the wire is `default` (an older client's): a well-formed submit names one.
        workspace=st.sampled_from(["default", "team-a"]),
    ),
)


@examples(100)
@given(request=WELL_FORMED)
def test_a_well_formed_submit_is_the_task_it_carries(
    request: gateway_pb2.SubmitTaskRequest,
) -> None:
    """Every field of the submitted TaskSpec reaches the record's input, and back unchanged."""
    task = convert.submitted_task(request)
    assert task_spec(task) == request.task
    assert (task.pool_name, task.gpus) == (request.pool_name, request.gpus)


def test_on_preempt_checkpoint_is_refused_without_a_volume_or_under_runc() -> None:
    def submit(**spec: str) -> gateway_pb2.SubmitTaskRequest:
        task = worker_pb2.TaskSpec(task_id="t-1", command=["true"], workspace="team-a")
        for name, value in spec.items():
            setattr(task, name, value)
        return gateway_pb2.SubmitTaskRequest(pool_name="gke-rtx6000", gpus=0, task=task)

    cases: list[tuple[dict[str, str], str]] = [
        ({"on_preempt": "move"}, "'move' is not one of requeue, checkpoint"),
        ({"on_preempt": "checkpoint"}, "checkpoint needs --checkpoints VOLUME"),
        (
            {"on_preempt": "checkpoint", "checkpoint_volume": "ckpt", "runtime": "runc"},
            "checkpoint needs --runtime runsc",
        ),
    ]
    for spec, said in cases:
        with pytest.raises(InvalidRequest) as refused:
            convert.submitted_task(submit(**spec))
        assert refused.value.field == "task.on_preempt"
        assert said in refused.value.message, refused.value.message
    task = convert.submitted_task(
        submit(on_preempt="checkpoint", checkpoint_volume="ckpt", runtime="runsc")
    )
    assert (task.on_preempt, task.checkpoint_volume) == ("checkpoint", "ckpt")
