"""Whatever a caller sends the agent's WorkerService, it answers with a status the project chose
(hypothesis, a fixed seed: `derandomize`): a task accepted and run to an end, or a refusal
(INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, UNAVAILABLE) whose message says why; never
UNKNOWN or INTERNAL, which is what an exception escaping a handler becomes.

Drawn: every field of a TaskSpec but the command (a task that is accepted really runs, so its
command stays `python -c pass`), and task ids of any text for GetTask, CancelTask and StreamLogs
(bytes that are no message: tests/reliability/test_bad_input.py). Against a real WorkerService on
127.0.0.1 with the process runtime (tests/agent/conftest.py)."""

from __future__ import annotations

import sys

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from levers9.proto import worker_pb2
from tests.agent.conftest import ServedWorker
from tests.agent.kit import AUTH
from tests.properties import examples
from tests.waiting import eventually

EXAMPLES = examples(40)
CHOSEN = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE,
}
INT32 = st.integers(-(2**31), 2**31 - 1)
TEXT = st.text(max_size=80)
ENDED = {
    worker_pb2.TASK_STATE_SUCCEEDED,
    worker_pb2.TASK_STATE_FAILED,
    worker_pb2.TASK_STATE_CANCELLED,
    worker_pb2.TASK_STATE_LOST,
}
SPECS = st.builds(
    worker_pb2.TaskSpec,
    task_id=st.one_of(TEXT, st.sampled_from(["", "../../etc", "a/b", ".", "x" * 300])),
    image=TEXT,
    env=st.dictionaries(st.one_of(st.sampled_from(["A", "B_1"]), TEXT), TEXT, max_size=3),
    gpu_indices=st.lists(st.one_of(st.sampled_from([0, 1]), INT32), max_size=3),
    memory_bytes=st.integers(-(2**63), 2**63 - 1),
    cpu_millis=INT32,
    ports=st.one_of(st.just([]), st.lists(st.one_of(st.integers(20000, 20010), INT32), max_size=3)),
    ready_path=st.one_of(st.just(""), st.just("/healthz"), TEXT),
    stop_grace_seconds=INT32,
)


def refused_with_reason(error: grpc.aio.AioRpcError) -> None:
    assert error.code() in CHOSEN, f"{error.code()}: {error.details()}"
    details = error.details() or ""
    assert details.strip(), f"{error.code()} without a message"
    assert "Traceback" not in details, details
    assert "Unexpected <class" not in details, details


@EXAMPLES
@given(spec=SPECS)
async def test_any_task_spec_runs_to_an_end_or_is_refused(
    served: ServedWorker, spec: worker_pb2.TaskSpec
) -> None:
    spec.command[:] = [sys.executable, "-c", "pass"]
    try:
        await served.stub.RunTask(worker_pb2.RunTaskRequest(task=spec), metadata=AUTH)
    except grpc.aio.AioRpcError as error:
        refused_with_reason(error)
        return
    # Accepted: it reaches an end of its own (a failure names its reason), and is not left
    # running to hold cards or ports for the next example.
    status = worker_pb2.TaskStatus()

    async def ended() -> bool:
        nonlocal status
        status = await served.stub.GetTask(
            worker_pb2.GetTaskRequest(task_id=spec.task_id), metadata=AUTH
        )
        return status.state in ENDED

    await eventually(ended, within=15)
    if status.state == worker_pb2.TASK_STATE_FAILED:
        assert status.reason.strip(), status


@EXAMPLES
@given(task_id=st.one_of(TEXT, st.binary(max_size=40).map(lambda b: b.decode("latin-1"))))
async def test_any_task_id_is_found_or_refused(served: ServedWorker, task_id: str) -> None:
    calls = (
        served.stub.GetTask(worker_pb2.GetTaskRequest(task_id=task_id), metadata=AUTH),
        served.stub.CancelTask(worker_pb2.CancelTaskRequest(task_id=task_id), metadata=AUTH),
    )
    for call in calls:
        try:
            await call
        except grpc.aio.AioRpcError as error:
            refused_with_reason(error)
    logs = served.stub.StreamLogs(
        worker_pb2.StreamLogsRequest(task_id=task_id, offset=-5), metadata=AUTH
    )
    try:
        async for _ in logs:
            pass
    except grpc.aio.AioRpcError as error:
        refused_with_reason(error)


# What the draws found: before these refusals the agent accepted both and failed late (a NUL in
# a value as `the worker could not start it: ValueError('embedded null byte')` after accepting
# it; a ready path of any text written into its probe's request line).
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            worker_pb2.TaskSpec(task_id="t-nul", command=["true"], env={"A": "x\0y"}),
            "the value of A holds a NUL byte",
        ),
        (
            worker_pb2.TaskSpec(task_id="t-arg", command=["echo", "a\0b"]),
            "argument 1 of the command holds a NUL byte",
        ),
        (
            worker_pb2.TaskSpec(task_id="t-name", command=["true"], env={"1BAD-KEY": "x"}),
            "'1BAD-KEY' is not a variable name",
        ),
        (
            worker_pb2.TaskSpec(
                task_id="t-ready", command=["true"], ports=[8000], ready_path="/a b\r\nX: y"
            ),
            "ready_path: '/a b\\r\\nX: y' must be printable ASCII without spaces",
        ),
    ],
)
async def test_what_no_process_can_take_is_refused_before_anything_runs(
    served: ServedWorker, spec: worker_pb2.TaskSpec, message: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await served.stub.RunTask(worker_pb2.RunTaskRequest(task=spec), metadata=AUTH)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (refused.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as unknown:
        await served.stub.GetTask(worker_pb2.GetTaskRequest(task_id=spec.task_id), metadata=AUTH)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND  # nothing was recorded
