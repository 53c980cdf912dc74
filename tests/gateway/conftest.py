"""Gateway fixtures: a worker token secret, an agent, the gateway on 127.0.0.1 in front of the
Temporal dev server, and recorder workflows standing in for the worker and task records."""

from __future__ import annotations

import io
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import grpc
import pytest
from pydantic import SecretStr
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9 import logs
from levers9.gateway.server import Gateway
from levers9.proto import gateway_pb2_grpc
from levers9.records.workers import TemporalWorkerRecords, WorkerRecords
from tests.gateway.agents import Agent
from tests.gateway.recorder import RecorderWorkflow, Seen
from tests.waiting import eventually

if TYPE_CHECKING:
    # Only the type checker knows the async stub class; at runtime GatewayStub builds it.
    from levers9.proto.gateway_pb2_grpc import GatewayAsyncStub

LOOPBACK = "127.0.0.1:0"


@dataclass(frozen=True)
class Recorders:
    """Starts recorder workflows under the ids the gateway signals, and reads what they got."""

    client: Client
    task_queue: str

    async def start(
        self, workflow_id: str, *, placed_on: Agent | None = None
    ) -> WorkflowHandle[RecorderWorkflow, None]:
        """A recorder under `workflow_id`; `placed_on`: a task's, whose record (its memo, as
        TaskWorkflow writes it when placed) names that agent's worker."""
        memo = (
            {"record": {"pool_name": placed_on.pool_name, "worker_id": placed_on.worker_id}}
            if placed_on is not None
            else None
        )
        return await self.client.start_workflow(
            RecorderWorkflow.run,
            id=workflow_id,
            task_queue=self.task_queue,
            execution_timeout=timedelta(minutes=5),
            memo=memo,
        )

    async def seen(self, handle: WorkflowHandle[RecorderWorkflow, None], count: int) -> Seen:
        """What the recorder holds once it has `count` signals (signals land in order)."""
        seen = Seen()

        async def arrived() -> bool:
            nonlocal seen
            seen = await handle.query(RecorderWorkflow.seen)
            return seen.count >= count

        await eventually(arrived, within=10)
        return seen


@pytest.fixture
def secret() -> SecretStr:
    return SecretStr(f"secret-marker-{uuid.uuid4().hex}")


@pytest.fixture
def agent(secret: SecretStr) -> Agent:
    return Agent.new(secret)


@pytest.fixture
async def recorders(dev_env: WorkflowEnvironment, task_queue: str) -> AsyncIterator[Recorders]:
    async with Worker(dev_env.client, task_queue=task_queue, workflows=[RecorderWorkflow]):
        yield Recorders(dev_env.client, task_queue)


@pytest.fixture
def log_stream() -> io.StringIO:
    out = io.StringIO()
    logs.setup("DEBUG", out)
    return out


@pytest.fixture
def records(dev_env: WorkflowEnvironment) -> TemporalWorkerRecords:
    return TemporalWorkerRecords(dev_env.client)


@dataclass(frozen=True)
class Serving:
    """A started gateway and a channel to it."""

    port: int
    channel: grpc.aio.Channel
    stub: GatewayAsyncStub


@asynccontextmanager
async def serve(
    records: WorkerRecords, secret: SecretStr, tunnelled: dict[str, bool] | None = None
) -> AsyncIterator[Serving]:
    gateway = Gateway(records, secret, tunnelled=tunnelled)
    port = await gateway.start(LOOPBACK)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Serving(port, channel, gateway_pb2_grpc.GatewayStub(channel))
    finally:
        await gateway.stop(grace=0)


@pytest.fixture
async def serving(records: TemporalWorkerRecords, secret: SecretStr) -> AsyncIterator[Serving]:
    async with serve(records, secret) as started:
        yield started


@pytest.fixture
def stub(serving: Serving) -> GatewayAsyncStub:
    return serving.stub
