"""`levers9.v1.Tasks/StreamTaskLogs`: the CLI's log stream, relayed by the controlplane.

The spec's firewall rule exists for this: "the controlplane dials each worker to stream logs".
The CLI never reaches a worker itself; it asks the gateway with the operator token, and the
gateway finds the task's worker in the task record (Temporal), dials the worker's advertised
address with that worker's own token (over TLS checked against the worker CA when the worker
registered it), and relays `WorkerService/StreamLogs` chunk by chunk.

- A task not yet placed is waited for (with `follow`), polling its record.
- The worker unreachable, or gone mid-stream: UNAVAILABLE naming the worker and its address,
  and where the record's tail is (`levers9 task logs <id>`).
- No such task: NOT_FOUND. A wrong or missing operator token: UNAUTHENTICATED.
Tokens never appear in a message or a log line.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

import grpc
from grpc import aio
from pydantic import SecretStr
from temporalio.client import Client

from levers9.gateway.auth import bearer_token
from levers9.gateway.errors import Unauthenticated
from levers9.models import TERMINAL, TaskRecord
from levers9.proto import gateway_pb2, gateway_pb2_grpc, worker_pb2, worker_pb2_grpc
from levers9.rpc import bearer
from levers9.rpc.worker_tls import worker_channel
from levers9.task_records import task_record
from levers9.tokens import operator_token_matches, worker_token

PLACEMENT_POLL_S = 0.5
"""How often a follower re-reads the record of a task that is not placed yet."""

Context = grpc.aio.ServicerContext[gateway_pb2.StreamTaskLogsRequest, worker_pb2.LogChunk]


class TaskRecords(Protocol):
    async def get(self, task_id: str) -> TaskRecord | None: ...


class TemporalTaskRecords:
    """Task records as the task workflows hold them."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def get(self, task_id: str) -> TaskRecord | None:
        return await task_record(self._client, task_id)


class TaskLogsService(gateway_pb2_grpc.TasksServicer):
    def __init__(self, records: TaskRecords, secret: SecretStr) -> None:
        self._records = records
        self._secret = secret

    async def StreamTaskLogs(
        self, request: gateway_pb2.StreamTaskLogsRequest, context: Context
    ) -> AsyncIterator[worker_pb2.LogChunk]:
        try:
            token = bearer_token(context.invocation_metadata() or ())
        except Unauthenticated as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        if not operator_token_matches(self._secret.get_secret_value(), token):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "operator token does not match this controlplane's secret: use the token"
                " `levers9 dev up` wrote (LEVERS9_API_TOKEN_FILE), or LEVERS9_API_TOKEN",
            )
        if not request.task_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "task_id is required")
        record = await self._placed(request.task_id, request.follow, context)
        if record is None or record.worker_id is None or record.address is None:
            return  # ended without ever running: there is no output to relay
        secret = self._secret.get_secret_value()
        token = worker_token(secret, record.worker_id)
        upstream = worker_pb2.StreamLogsRequest(
            task_id=request.task_id, follow=request.follow, offset=request.offset
        )
        try:
            async with worker_channel(
                record.address, record.worker_id, record.tls, secret
            ) as channel:
                stub = worker_pb2_grpc.WorkerServiceStub(channel)
                call = stub.StreamLogs(upstream, metadata=bearer.metadata(token))
                async for chunk in call:
                    yield chunk
        except aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.NOT_FOUND:
                await context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"worker {record.worker_id} no longer has task {request.task_id}'s output;"
                    f" `levers9 task logs {request.task_id}` shows the record's tail",
                )
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"worker {record.worker_id} at {record.address} did not stream logs"
                f" ({code.name}: {exc.details()}); `levers9 task logs {request.task_id}`"
                " shows the record's tail",
            )

    async def _placed(self, task_id: str, follow: bool, context: Context) -> TaskRecord | None:
        """The record once the task has a worker; None when it ended without one."""
        while True:
            record = await self._records.get(task_id)
            if record is None:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"no task {task_id}")
            if record.address is not None:
                return record
            if record.state in TERMINAL or not follow:
                return None
            await asyncio.sleep(PLACEMENT_POLL_S)
