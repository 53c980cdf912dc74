"""The gateway over real gRPC on 127.0.0.1 in front of the Temporal dev server: Register,
Heartbeat and ReportTask arrive as signals with the right payloads; bad tokens and bad requests
are refused before anything is signalled; a record that is gone is NOT_FOUND; oversized messages
and garbage bytes do not take the server down; health answers; logs never hold a token.
"""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import SecretStr
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.testing import WorkflowEnvironment

from levers9.core.task_reports import TaskPhase, TaskReport
from levers9.gateway.convert import MAX_LOG_TAIL_BYTES, MAX_REASON_BYTES
from levers9.gateway.server import SERVICE_NAME, Gateway, GatewayError
from levers9.gateway.task_records import TemporalTaskRecords
from levers9.gateway.task_service import MAX_LIST_PAGE_BYTES, MAX_LIST_PAGE_SIZE
from levers9.models import (
    TASK_WORKFLOW,
    TaskInput,
    TaskRecord,
    WorkerHeartbeat,
    WorkerRegistration,
    task_workflow_id,
)
from levers9.proto import gateway_pb2, gateway_pb2_grpc
from levers9.records.tasks import start_task
from levers9.records.workers import TemporalWorkerRecords
from levers9.rpc import bearer
from levers9.search_attributes import POOL_NAME
from levers9.tokens import command_token, operator_token, worker_token
from tests.gateway.agents import NODE_IP_ADDRESS, Agent, Metadata
from tests.gateway.conftest import LOOPBACK, Recorders, Serving, serve
from tests.waiting import eventually

pytestmark = pytest.mark.integration

if TYPE_CHECKING:
    from levers9.proto.gateway_pb2_grpc import GatewayAsyncStub as Stub
    from levers9.proto.gateway_pb2_grpc import TasksAsyncStub as TasksStub


async def _status(call: Awaitable[object]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


def _task_id() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


async def test_calls_arrive_as_signals(stub: Stub, agent: Agent, recorders: Recorders) -> None:
    worker = await recorders.start(agent.workflow_id)
    task_id = _task_id()
    task = await recorders.start(task_workflow_id(task_id), placed_on=agent)

    response = await stub.Register(agent.register(), metadata=agent.metadata())
    await stub.Heartbeat(agent.heartbeat(running_tasks=1), metadata=agent.metadata())
    await stub.ReportTask(agent.report(task_id), metadata=agent.metadata())

    assert response.heartbeat_seconds == 10
    seen = await recorders.seen(worker, count=2)
    assert seen.registrations == [
        WorkerRegistration(
            worker_id=agent.worker_id,
            pod_uid="6b1f0a52-3c1e-4d8e-9a51-2f0c8e7d1a10",
            address=NODE_IP_ADDRESS,
            gpus=2,
            visible_devices=(0, 1),
            gpu_product="NVIDIA RTX PRO 6000 Blackwell Server Edition",
            agent_version="0.1.0",
        )
    ]
    assert seen.heartbeats == [
        WorkerHeartbeat(
            worker_id=agent.worker_id,
            running_tasks=1,
            idle_since=datetime(2026, 9, 10, 0, 26, 40, tzinfo=UTC),
        )
    ]
    assert (await recorders.seen(task, count=1)).reports == [
        TaskReport(
            pool_name=agent.pool_name,
            worker_id=agent.worker_id,
            task_id=task_id,
            state="succeeded",
            result_json='{"cuda": true, "matmul_ok": true}',
            phases=(
                TaskPhase(name="container.start", at=datetime(2026, 9, 10, 0, 26, 41, tzinfo=UTC)),
                TaskPhase(
                    name="worker.gpu_assignment",
                    at=datetime(2026, 9, 10, 0, 26, 41, 500_000, tzinfo=UTC),
                ),
            ),
            log_tail="matmul ok\n",
            host="runc",
        )
    ]


@pytest.mark.parametrize(
    "metadata",
    [
        pytest.param(lambda agent, other: agent.metadata("l9w1.forged-marker-token"), id="forged"),
        pytest.param(lambda agent, other: agent.metadata(other.token), id="other-workers"),
        pytest.param(lambda agent, other: (), id="missing"),
        pytest.param(
            lambda agent, other: (("authorization", f"Basic {agent.token}"),), id="not-bearer"
        ),
    ],
)
async def test_bad_token_is_unauthenticated_and_nothing_is_signalled(
    stub: Stub,
    agent: Agent,
    secret: SecretStr,
    recorders: Recorders,
    metadata: Callable[[Agent, Agent], Metadata],
) -> None:
    worker = await recorders.start(agent.workflow_id)
    task = await recorders.start(task_workflow_id(task_id := _task_id()), placed_on=agent)
    other = Agent.new(secret)
    bad = metadata(agent, other)

    for call in (
        stub.Register(agent.register(), metadata=bad),
        stub.Heartbeat(agent.heartbeat(), metadata=bad),
        stub.ReportTask(agent.report(task_id), metadata=bad),
    ):
        error = await _status(call)
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        assert agent.token not in (error.details() or "")
        assert other.token not in (error.details() or "")

    await stub.Heartbeat(agent.heartbeat(running_tasks=3), metadata=agent.metadata())
    await stub.ReportTask(agent.report(task_id, reason="marker"), metadata=agent.metadata())
    seen = await recorders.seen(worker, 1)
    assert [h.running_tasks for h in seen.heartbeats] == [3]
    assert seen.registrations == []
    assert [r.reason for r in (await recorders.seen(task, 1)).reports] == ["marker"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"advertised_address": "gke-rtx6000-pool-4f2a-node-1:50051"}, "advertised_address"),
        ({"advertised_address": "203.0.113.7"}, "advertised_address"),
        ({"gpus": -1}, "gpus"),
        ({"gpus": 65}, "gpus"),
        ({"node_name": ""}, "node_name"),
        ({"pool_name": ""}, "pool_name"),
    ],
)
async def test_invalid_register_names_the_field_and_signals_nothing(
    stub: Stub, agent: Agent, recorders: Recorders, fields: dict[str, object], field: str
) -> None:
    worker = await recorders.start(agent.workflow_id)

    error = await _status(stub.Register(agent.register(**fields), metadata=agent.metadata()))

    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error.details() or "").startswith(f"{field}: ")
    await stub.Heartbeat(agent.heartbeat(), metadata=agent.metadata())
    assert (await recorders.seen(worker, 1)).registrations == []


async def test_node_name_says_to_advertise_the_external_ip(stub: Stub, agent: Agent) -> None:
    request = agent.register(advertised_address="gke-rtx6000-pool-4f2a-node-1:50051")

    error = await _status(stub.Register(request, metadata=agent.metadata()))

    assert "external IP" in (error.details() or "")
    assert "dial tcp: lookup" in (error.details() or "")


async def test_unknown_worker_is_not_found(stub: Stub, agent: Agent) -> None:
    for call in (
        stub.Register(agent.register(), metadata=agent.metadata()),
        stub.Heartbeat(agent.heartbeat(), metadata=agent.metadata()),
    ):
        error = await _status(call)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert "unknown worker; its record expired" in (error.details() or "")


async def test_ended_worker_record_is_not_found(
    stub: Stub, agent: Agent, recorders: Recorders
) -> None:
    worker = await recorders.start(agent.workflow_id)
    await worker.terminate("record expired")

    error = await _status(stub.Heartbeat(agent.heartbeat(), metadata=agent.metadata()))

    assert error.code() == grpc.StatusCode.NOT_FOUND


async def test_report_for_unknown_task_is_not_found(stub: Stub, agent: Agent) -> None:
    error = await _status(stub.ReportTask(agent.report(_task_id()), metadata=agent.metadata()))

    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert "unknown task" in (error.details() or "")


async def test_a_report_for_another_workers_task_is_refused_and_not_recorded(
    stub: Stub, agent: Agent, secret: SecretStr, recorders: Recorders
) -> None:
    """A valid token of worker B cannot report (and so fill the history of) a task placed on
    worker A: refused before any signal; A's own report of it lands."""
    task_id = _task_id()
    task = await recorders.start(task_workflow_id(task_id), placed_on=agent)
    other = Agent.new(secret)
    for _ in range(3):
        error = await _status(
            stub.ReportTask(other.report(task_id, reason="flood"), metadata=other.metadata())
        )
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert error.details() == f"task {task_id} is not placed on worker {other.worker_id}"
    await stub.ReportTask(agent.report(task_id, reason="mine"), metadata=agent.metadata())
    seen = await recorders.seen(task, count=1)
    assert [r.reason for r in seen.reports] == ["mine"]
    signals = [
        e
        for e in (await task.fetch_history()).events
        if e.HasField("workflow_execution_signaled_event_attributes")
    ]
    assert len(signals) == 1


async def test_huge_message_is_refused_and_the_server_stays_up(
    stub: Stub, agent: Agent, recorders: Recorders
) -> None:
    worker = await recorders.start(agent.workflow_id)
    huge = agent.register(agent_version="x" * (10 * 1024 * 1024))

    error = await _status(stub.Register(huge, metadata=agent.metadata()))

    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    await stub.Register(agent.register(), metadata=agent.metadata())
    assert len((await recorders.seen(worker, 1)).registrations) == 1


async def test_garbage_bytes_do_not_take_the_server_down(
    serving: Serving, agent: Agent, recorders: Recorders
) -> None:
    worker = await recorders.start(agent.workflow_id)
    reader, writer = await asyncio.open_connection("127.0.0.1", serving.port)
    writer.write(b"GET / HTTP/1.1\r\n\r\n" + bytes(range(256)) * 64)
    await writer.drain()
    async with asyncio.timeout(5):
        await reader.read()  # the server hangs up on a connection that is not HTTP/2
    writer.close()

    await serving.stub.Heartbeat(agent.heartbeat(), metadata=agent.metadata())
    assert len((await recorders.seen(worker, 1)).heartbeats) == 1


@pytest.mark.parametrize("service", ["", SERVICE_NAME])
async def test_health_is_serving(serving: Serving, service: str) -> None:
    health = health_pb2_grpc.HealthStub(serving.channel)

    response = await health.Check(health_pb2.HealthCheckRequest(service=service))

    assert response.status == health_pb2.HealthCheckResponse.SERVING


async def test_stop_reports_not_serving(records: TemporalWorkerRecords, secret: SecretStr) -> None:
    gateway = Gateway(records, secret)
    port = await gateway.start(LOOPBACK)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(service=SERVICE_NAME)
        )
        statuses = watch.__aiter__()
        assert (await anext(statuses)).status == health_pb2.HealthCheckResponse.SERVING
        stopping = asyncio.create_task(gateway.stop(grace=2))
        assert (await anext(statuses)).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
        await stopping


async def test_a_taken_port_is_an_error(
    serving: Serving, records: TemporalWorkerRecords, secret: SecretStr
) -> None:
    taken = f"127.0.0.1:{serving.port}"
    with pytest.raises(GatewayError, match=f"cannot listen on {taken}"):
        await Gateway(records, secret).start(taken)


async def test_logs_name_the_worker_never_a_token_or_the_secret(
    log_stream: io.StringIO, stub: Stub, agent: Agent, secret: SecretStr, recorders: Recorders
) -> None:
    worker = await recorders.start(agent.workflow_id)
    forged = "l9w1.forged-marker-token"

    await stub.Register(agent.register(), metadata=agent.metadata())
    await _status(stub.Heartbeat(agent.heartbeat(), metadata=agent.metadata(forged)))
    await recorders.seen(worker, 1)

    text = log_stream.getvalue()
    assert (
        f"worker registered pool_name={agent.pool_name} worker_id={agent.worker_id}"
        f" address={NODE_IP_ADDRESS}"
    ) in text
    assert "rejected worker call reason=" in text
    assert f"worker_id={agent.worker_id}" in text.split("rejected worker call", 1)[1]
    for hidden in (secret.get_secret_value(), agent.token, forged):
        assert hidden not in text


@pytest.mark.parametrize(
    ("tunnelled", "fields", "refusal"),
    [
        (False, {"tls": False}, "tls: this pool's workers serve TLS"),
        (False, {"tls": True, "tunnel": True, "advertised_address": ""}, "tls: this pool's"),
        (True, {"tls": True}, "tunnel: this pool's workers register through their tunnel"),
    ],
    ids=["plaintext downgrade", "tunnel instead of TLS", "direct instead of tunnel"],
)
async def test_a_registration_not_as_its_pool_makes_workers_is_refused(
    records: TemporalWorkerRecords,
    secret: SecretStr,
    agent: Agent,
    recorders: Recorders,
    tunnelled: bool,
    fields: dict[str, object],
    refusal: str,
) -> None:
    """With a worker's token, someone registering it at their own address in plaintext (or
    through a tunnel of their own) would receive its tenants' commands: refused before any
    signal, and the TLS registration its pool issued a certificate for still lands."""
    worker = await recorders.start(agent.workflow_id)
    async with serve(records, secret, tunnelled={agent.pool_name: tunnelled}) as started:
        error = await _status(
            started.stub.Register(agent.register(**fields), metadata=agent.metadata())
        )
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert refusal in (error.details() or "")
        unknown = Agent.new(secret, pool_name="not-loaded")
        error = await _status(
            started.stub.Register(unknown.register(tls=True), metadata=unknown.metadata())
        )
        assert (error.code(), error.details()) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "pool not-loaded is not loaded on this controlplane",
        )
        if not tunnelled:
            await started.stub.Register(agent.register(tls=True), metadata=agent.metadata())
            seen = await recorders.seen(worker, count=1)
            assert [r.tls for r in seen.registrations] == [True]
    signals = [
        e
        for e in (await worker.fetch_history()).events
        if e.HasField("workflow_execution_signaled_event_attributes")
    ]
    assert len(signals) == (0 if tunnelled else 1)


async def test_the_operator_token_rotates_on_its_own_generation(
    dev_env: WorkflowEnvironment, records: TemporalWorkerRecords, secret: SecretStr
) -> None:
    """`operatorTokenGeneration: 2`: the first generation's token is refused, the second's is
    taken, from the same root secret (no worker token changes)."""
    tasks = TemporalTaskRecords(dev_env.client, f"tq-{uuid.uuid4().hex[:8]}")
    gateway = Gateway(records, secret, tasks=tasks, operator_generation=2)
    port = await gateway.start(LOOPBACK)
    request = gateway_pb2.GetTaskRecordRequest(task_id="t-no-such-task")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = gateway_pb2_grpc.TasksStub(channel)
            old = bearer.metadata(operator_token(secret.get_secret_value()))
            denied = await _status(stub.GetTaskRecord(request, metadata=old, timeout=10))
            assert denied.code() == grpc.StatusCode.UNAUTHENTICATED
            new = bearer.metadata(operator_token(secret.get_secret_value(), 2))
            answered = await _status(stub.GetTaskRecord(request, metadata=new, timeout=10))
            assert answered.code() == grpc.StatusCode.NOT_FOUND  # past the check
    finally:
        await gateway.stop(grace=0)
    assert operator_token(secret.get_secret_value(), 2) != operator_token(secret.get_secret_value())


async def test_worker_tokens_rotate_on_their_own_generation(
    records: TemporalWorkerRecords, secret: SecretStr, agent: Agent, recorders: Recorders
) -> None:
    """`workerTokenGeneration: 2`: a worker's token of the first generation is refused, the
    second's is taken (and so is its command token of the second generation), from the same
    root secret; the operator token does not change."""
    worker = await recorders.start(agent.workflow_id)
    gateway = Gateway(records, secret, token_generation=2)
    port = await gateway.start(LOOPBACK)
    value = secret.get_secret_value()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            old = await _status(stub.Heartbeat(agent.heartbeat(), metadata=agent.metadata()))
            assert old.code() == grpc.StatusCode.UNAUTHENTICATED
            renewed = agent.metadata(worker_token(value, agent.worker_id, 2))
            await stub.Heartbeat(agent.heartbeat(running_tasks=4), metadata=renewed)
        seen = await recorders.seen(worker, count=1)
        assert [h.running_tasks for h in seen.heartbeats] == [4]
    finally:
        await gateway.stop(grace=0)
    assert command_token(value, agent.worker_id, 2) != command_token(value, agent.worker_id)
    assert operator_token(value) == operator_token(value, 1)


async def _list_tasks(
    stub: TasksStub, secret: SecretStr, pool_name: str = "", page_size: int = 0
) -> tuple[list[gateway_pb2.TaskRecord], list[int]]:
    """Every page ListTasks gives, followed to the last: the records, and each answer's size."""
    metadata = bearer.metadata(operator_token(secret.get_secret_value()))
    records: list[gateway_pb2.TaskRecord] = []
    sizes: list[int] = []
    token = b""
    while True:
        request = gateway_pb2.ListTasksRequest(
            pool_name=pool_name, page_size=page_size, page_token=token
        )
        reply = await stub.ListTasks(request, metadata=metadata, timeout=10)
        records.extend(reply.records)
        sizes.append(reply.ByteSize())
        token = reply.next_page_token
        if not token:
            return records, sizes


@asynccontextmanager
async def _tasks_gateway(
    client: Client, records: TemporalWorkerRecords, secret: SecretStr, task_queue: str
) -> AsyncIterator[TasksStub]:
    gateway = Gateway(records, secret, tasks=TemporalTaskRecords(client, task_queue))
    port = await gateway.start(LOOPBACK)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield gateway_pb2_grpc.TasksStub(channel)
    finally:
        await gateway.stop(grace=0)


async def test_list_tasks_pages_through_one_pools_typed_records(
    dev_env: WorkflowEnvironment, records: TemporalWorkerRecords, secret: SecretStr
) -> None:
    """Five tasks of one pool, one of another: pages of two give the five, each once, typed as
    GetTaskRecord gives them; no pool named gives all six."""
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    alpha = [TaskInput(task_id=_task_id(), pool_name="alpha", command=("true",)) for _ in range(5)]
    beta = TaskInput(task_id=_task_id(), pool_name="beta", command=("true",))
    for task in (*alpha, beta):
        await start_task(dev_env.client, task_queue, task)
    async with _tasks_gateway(dev_env.client, records, secret, task_queue) as stub:

        async def all_listed() -> bool:
            return len((await _list_tasks(stub, secret))[0]) == 6

        await eventually(all_listed, within=20)  # visibility catches up
        listed, sizes = await _list_tasks(stub, secret, "alpha", page_size=2)
    assert sorted(r.task_id for r in listed) == sorted(t.task_id for t in alpha)
    assert len(sizes) == 3
    assert {(r.pool_name, r.state, tuple(r.command)) for r in listed} == {
        ("alpha", "queued", ("true",))
    }
    assert all(r.HasField("created_at") for r in listed)


async def test_list_tasks_keeps_each_answer_under_its_byte_bound(
    dev_env: WorkflowEnvironment, records: TemporalWorkerRecords, secret: SecretStr
) -> None:
    """Twenty records as large as a worker makes them (a full log tail, reason and a result):
    about 3.6 MiB in all, over two answers of at most MAX_LIST_PAGE_BYTES, each record once."""
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    ids = []
    for _ in range(20):
        task = TaskInput(task_id=_task_id(), pool_name="big", command=("true",))
        record = TaskRecord.queued(task, datetime.now(UTC)).model_copy(
            update={
                "log_tail": "x" * MAX_LOG_TAIL_BYTES,
                "reason": "r" * MAX_REASON_BYTES,
                "result_json": '"' + "y" * 100_000 + '"',
            }
        )
        await dev_env.client.start_workflow(
            TASK_WORKFLOW,
            task,
            id=task_workflow_id(task.task_id),
            task_queue=task_queue,
            search_attributes=TypedSearchAttributes([SearchAttributePair(POOL_NAME, "big")]),
            memo={"record": record.model_dump(mode="json")},
        )
        ids.append(task.task_id)
    async with _tasks_gateway(dev_env.client, records, secret, task_queue) as stub:

        async def all_listed() -> bool:
            return len((await _list_tasks(stub, secret, "big"))[0]) == 20

        await eventually(all_listed, within=20)
        listed, sizes = await _list_tasks(stub, secret, "big", page_size=MAX_LIST_PAGE_SIZE)
    assert sorted(r.task_id for r in listed) == sorted(ids)
    assert len(sizes) >= 2
    assert max(sizes) <= MAX_LIST_PAGE_BYTES
    assert {len(r.log_tail) for r in listed} == {MAX_LOG_TAIL_BYTES}


async def test_list_tasks_names_the_field_it_refuses(
    dev_env: WorkflowEnvironment, records: TemporalWorkerRecords, secret: SecretStr
) -> None:
    metadata = bearer.metadata(operator_token(secret.get_secret_value()))
    cases = [
        (gateway_pb2.ListTasksRequest(pool_name="Not_A_Pool"), "pool_name: 'Not_A_Pool' is not"),
        (gateway_pb2.ListTasksRequest(pool_name="a' OR 'b"), "pool_name: "),
        (gateway_pb2.ListTasksRequest(page_size=-1), "page_size: -1 is not 0"),
        (gateway_pb2.ListTasksRequest(page_size=MAX_LIST_PAGE_SIZE + 1), "page_size: "),
        (gateway_pb2.ListTasksRequest(page_token=b"garbage"), "page_token: not one ListTasks"),
        (
            gateway_pb2.ListTasksRequest(page_token=b"\x01\0\0\0\0" + bytes(16) + b"garbage"),
            "page_token: not one ListTasks",
        ),
    ]
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    async with _tasks_gateway(dev_env.client, records, secret, task_queue) as stub:
        for request, problem in cases:
            refused = await _status(stub.ListTasks(request, metadata=metadata, timeout=10))
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, problem
            assert (refused.details() or "").startswith(problem), refused.details()
        # A real token, for another pool than it was given for.
        for _ in range(2):
            task = TaskInput(task_id=_task_id(), pool_name="a", command=("true",))
            await start_task(dev_env.client, task_queue, task)

        async def paged() -> bytes:
            asked = gateway_pb2.ListTasksRequest(pool_name="a", page_size=1)
            return (await stub.ListTasks(asked, metadata=metadata, timeout=10)).next_page_token

        async def two_listed() -> bool:
            return bool(await paged())

        await eventually(two_listed, within=20)
        other = gateway_pb2.ListTasksRequest(pool_name="b", page_token=await paged())
        moved = await _status(stub.ListTasks(other, metadata=metadata, timeout=10))
        assert moved.code() == grpc.StatusCode.INVALID_ARGUMENT
        forged = await _status(
            stub.ListTasks(
                gateway_pb2.ListTasksRequest(), metadata=bearer.metadata("l9o1.x"), timeout=10
            )
        )
        assert forged.code() == grpc.StatusCode.UNAUTHENTICATED
