"""`Tasks.SubmitTask`'s conversion (levers9/gateway/convert.py), the one door a task comes in by,
over any message (hypothesis; tests/properties.py): a task input that round-trips through the
record's own schema, or InvalidRequest naming a field the message has. The servers' answers to
garbage and to well-formed nonsense are tests/reliability/test_bad_input.py's."""

from __future__ import annotations

import grpc
from hypothesis import given
from hypothesis import strategies as st

from levers9.gateway import convert
from levers9.gateway.errors import InvalidRequest
from levers9.models import TaskInput
from levers9.proto import gateway_pb2
from tests.properties import examples

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=60)
SUBMITS = st.builds(
    gateway_pb2.SubmitTaskRequest,
    task_id=st.one_of(TEXT, st.just("t-0123456789ab")),
    pool_name=st.one_of(TEXT, st.just("gke-rtx6000")),
    command=st.lists(TEXT, max_size=4),
    gpus=st.one_of(INT32, st.integers(0, 8)),
    image=st.one_of(TEXT, st.just("127.0.0.1:5000/tasks/busybox:bb")),
    memory_bytes=st.one_of(INT64, st.just(0), st.just(2**30)),
    cpu_millis=st.one_of(INT32, st.just(0), st.just(500)),
    ports=st.lists(st.one_of(INT32, st.integers(1, 65535)), max_size=3),
    stop_grace_seconds=st.one_of(INT32, st.integers(0, 60)),
)


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
        assert refused.field in gateway_pb2.SubmitTaskRequest.DESCRIPTOR.fields_by_name
        assert refused.message.startswith(f"{refused.field}: "), refused.message
        return
    assert TaskInput.model_validate_json(task.model_dump_json()) == task
    assert task.command == tuple(request.command)
    assert task.task_id == request.task_id
