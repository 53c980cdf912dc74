"""The Temporal side of the gateway: `TemporalWorkerRecords` signals `worker:<pool>:<id>` and
`task:<id>` on the dev server; a missing workflow is `RecordNotFound`; a Temporal frontend that
refuses (PERMISSION_DENIED) or keeps answering UNAVAILABLE is `RecordsUnavailable`, which the
gateway answers with UNAVAILABLE so the agent retries."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import grpc
import pytest
from pydantic import SecretStr
from temporalio.api.workflowservice.v1 import GetSystemInfoResponse
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from levers9.gateway.convert import heartbeat, registration, task_report
from levers9.gateway.service import TEMPORAL_UNAVAILABLE
from levers9.models import task_workflow_id
from levers9.records.workers import (
    RecordNotFound,
    RecordsUnavailable,
    TemporalWorkerRecords,
)
from tests.gateway.agents import Agent
from tests.gateway.conftest import LOOPBACK, Recorders, serve

pytestmark = pytest.mark.integration


class _RefusingFrontend(grpc.GenericRpcHandler):
    """A Temporal frontend that lets clients connect, then answers every call with `code`."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any]:
        if details.method.endswith("/GetSystemInfo"):
            return grpc.unary_unary_rpc_method_handler(self._system_info)
        return grpc.unary_unary_rpc_method_handler(self._refuse)

    async def _system_info(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        return bytes(GetSystemInfoResponse().SerializeToString())

    async def _refuse(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        await context.abort(self._code, "temporal frontend refuses")


@pytest.fixture(params=[grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.PERMISSION_DENIED])
async def refusing_client(request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([_RefusingFrontend(request.param)])
    port = server.add_insecure_port(LOOPBACK)
    await server.start()
    yield await Client.connect(f"127.0.0.1:{port}", data_converter=pydantic_data_converter)
    await server.stop(grace=0)


@pytest.fixture
def down_records(refusing_client: Client) -> TemporalWorkerRecords:
    # The client itself retries UNAVAILABLE for ~10 s; the deadline is what bounds the wait.
    return TemporalWorkerRecords(refusing_client, signal_deadline=timedelta(seconds=0.5))


async def test_signals_reach_the_records(
    records: TemporalWorkerRecords, agent: Agent, recorders: Recorders
) -> None:
    worker = await recorders.start(agent.workflow_id)
    task = await recorders.start(task_workflow_id("t-records"), placed_on=agent)

    await records.register(agent.pool_name, registration(agent.register()))
    await records.heartbeat(agent.pool_name, heartbeat(agent.heartbeat()))
    await records.report(task_report(agent.report("t-records")))

    seen = await recorders.seen(worker, count=2)
    assert [r.worker_id for r in seen.registrations] == [agent.worker_id]
    assert [h.worker_id for h in seen.heartbeats] == [agent.worker_id]
    assert [r.task_id for r in (await recorders.seen(task, count=1)).reports] == ["t-records"]


async def test_missing_workflow_is_record_not_found(
    records: TemporalWorkerRecords, agent: Agent
) -> None:
    with pytest.raises(RecordNotFound) as caught:
        await records.heartbeat(agent.pool_name, heartbeat(agent.heartbeat()))
    assert caught.value.workflow_id == agent.workflow_id


async def test_refusing_temporal_is_records_unavailable(
    down_records: TemporalWorkerRecords, agent: Agent
) -> None:
    with pytest.raises(RecordsUnavailable, match=f"signal register to {agent.workflow_id}"):
        await down_records.register(agent.pool_name, registration(agent.register()))


async def test_gateway_answers_unavailable_when_temporal_is(
    down_records: TemporalWorkerRecords, secret: SecretStr, agent: Agent
) -> None:
    async with serve(down_records, secret) as serving:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await serving.stub.Heartbeat(agent.heartbeat(), metadata=agent.metadata())
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details() == TEMPORAL_UNAVAILABLE
