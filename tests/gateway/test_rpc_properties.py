"""Whatever an agent sends the gateway, it answers with a status the gateway's table chose
(levers9/gateway/service.py; hypothesis, a fixed seed: `derandomize`): accepted, or refused
UNAUTHENTICATED, INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED, FAILED_PRECONDITION or
UNAVAILABLE with a message; never UNKNOWN or INTERNAL, which is what an exception escaping a
handler becomes. The gateway then still takes a good call. `Tasks.SubmitTask`'s conversion, drawn
the same way, gives a task input or names the field it refuses.

Drawn: every field of Register, Heartbeat and ReportTask (under the worker's own token and ids,
so the draws reach validation rather than stopping at the token check), and bytes that are no
message at all for each method. Against a real Gateway on 127.0.0.1 in front of the Temporal dev
server, its worker record a recorder workflow (tests/gateway/conftest.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.client import WorkflowHandle

from levers9.gateway import convert
from levers9.gateway.errors import InvalidRequest
from levers9.models import TaskInput
from levers9.proto import gateway_pb2, worker_pb2
from tests.gateway.agents import Agent
from tests.gateway.conftest import Recorders, Serving
from tests.gateway.recorder import RecorderWorkflow

if TYPE_CHECKING:
    from levers9.proto.gateway_pb2_grpc import GatewayAsyncStub as Stub

pytestmark = pytest.mark.integration

EXAMPLES = settings(
    max_examples=30,
    derandomize=True,
    database=None,
    deadline=timedelta(seconds=20),  # generous on a loaded machine; a hang still fails
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
CHOSEN = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNAVAILABLE,
}
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=60)
REGISTER_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "node_name": TEXT,
        "pod_uid": TEXT,
        "advertised_address": st.one_of(TEXT, st.just("127.0.0.1:0"), st.just("[::1]:99999")),
        "gpus": INT32,
        "visible_devices": st.lists(INT32, max_size=5),
        "gpu_product": TEXT,
        "agent_version": TEXT,
        "tunnel": st.booleans(),
    },
)
HEARTBEAT_FIELDS = st.fixed_dictionaries(
    {}, optional={"running_tasks": INT32, "idle_since_unix_ms": INT64}
)
PHASES = st.lists(
    st.builds(worker_pb2.Phase, name=TEXT, at_unix_ms=INT64, error=TEXT, detail=TEXT), max_size=3
)
STATUSES = st.builds(
    worker_pb2.TaskStatus,
    task_id=st.one_of(TEXT, st.just("t-0123456789ab")),
    state=st.integers(-3, 9),
    exit_code=INT32,
    result_json=st.one_of(TEXT, st.just('{"ok": true}')),
    reason=TEXT,
    phases=PHASES,
    log_tail=TEXT,
    host=TEXT,
    image_digest=TEXT,
    image=TEXT,
    ready=st.booleans(),
)


def refused_with_reason(error: grpc.aio.AioRpcError) -> None:
    assert error.code() in CHOSEN, f"{error.code()}: {error.details()}"
    details = error.details() or ""
    assert details.strip(), f"{error.code()} without a message"
    assert "Traceback" not in details, details
    assert "Unexpected <class" not in details, details


async def answered(call: Any) -> None:
    try:
        await call
    except grpc.aio.AioRpcError as error:
        refused_with_reason(error)


@pytest.fixture
async def worker(agent: Agent, recorders: Recorders) -> WorkflowHandle[RecorderWorkflow, None]:
    """The agent's worker record (a recorder), started once for all of a test's examples."""
    return await recorders.start(agent.workflow_id)


async def still_taken(
    stub: Stub, agent: Agent, recorders: Recorders, worker: WorkflowHandle[RecorderWorkflow, None]
) -> None:
    """After the draws a good heartbeat still arrives as a signal: the server is up and the
    record took nothing that broke it."""
    before = (await recorders.seen(worker, 0)).heartbeats
    await stub.Heartbeat(agent.heartbeat(), metadata=agent.metadata())
    assert len((await recorders.seen(worker, len(before) + 1)).heartbeats) == len(before) + 1


@EXAMPLES
@given(register=REGISTER_FIELDS, heartbeat=HEARTBEAT_FIELDS, status=STATUSES)
async def test_any_agent_call_is_taken_or_refused_with_a_reason(
    stub: Stub,
    agent: Agent,
    recorders: Recorders,
    worker: WorkflowHandle[RecorderWorkflow, None],
    register: dict[str, Any],
    heartbeat: dict[str, Any],
    status: worker_pb2.TaskStatus,
) -> None:
    metadata = agent.metadata()
    await answered(stub.Register(agent.register(**register), metadata=metadata))
    await answered(stub.Heartbeat(agent.heartbeat(**heartbeat), metadata=metadata))
    report = gateway_pb2.ReportTaskRequest(
        pool_name=agent.pool_name, worker_id=agent.worker_id, status=status
    )
    await answered(stub.ReportTask(report, metadata=metadata))
    await still_taken(stub, agent, recorders, worker)


METHODS = ("Register", "Heartbeat", "ReportTask")


@EXAMPLES
@given(method=st.sampled_from(METHODS), body=st.binary(min_size=1, max_size=64))
async def test_bytes_that_are_no_message_are_refused_naming_it(
    serving: Serving,
    agent: Agent,
    recorders: Recorders,
    worker: WorkflowHandle[RecorderWorkflow, None],
    method: str,
    body: bytes,
) -> None:
    unary: Any = serving.channel.unary_unary(f"/levers9.v1.Gateway/{method}")  # raw bytes
    await answered(unary(body, metadata=agent.metadata()))
    await still_taken(serving.stub, agent, recorders, worker)


SUBMITS = st.builds(
    gateway_pb2.SubmitTaskRequest,
    task_id=st.one_of(TEXT, st.just("t-0123456789ab")),
    pool_name=st.one_of(TEXT, st.just("gke-rtx6000")),
    command=st.lists(TEXT, max_size=4),
    gpus=INT32,
    image=st.one_of(TEXT, st.just("127.0.0.1:5000/tasks/busybox:bb")),
    memory_bytes=INT64,
    cpu_millis=INT32,
    ports=st.lists(INT32, max_size=3),
    stop_grace_seconds=INT32,
)


@EXAMPLES
@given(request=SUBMITS)
def test_any_submit_becomes_a_task_input_or_names_its_field(
    request: gateway_pb2.SubmitTaskRequest,
) -> None:
    """`Tasks.SubmitTask`'s conversion, the one door a task comes in by: a record input that
    round-trips through the record's own schema, or InvalidRequest naming a field the message
    has."""
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
