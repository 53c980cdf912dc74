"""The `levers9.v1.Gateway` servicer: authenticate, validate, signal, answer in gRPC terms.

Every call is checked in that order: a caller without this worker's token learns nothing about
what a valid request looks like. What the agent gets back tells it what to do:

| status | meaning | the agent |
| - | - | - |
| UNAUTHENTICATED | no token, or not this worker's | has a bug or is not ours |
| INVALID_ARGUMENT | the field the message starts with | has a bug |
| NOT_FOUND | its record expired or ended | stops (the controlplane starts a new worker) |
| PERMISSION_DENIED | a report for a task not placed on this worker | drops the report |
| FAILED_PRECONDITION | a tunnel registration before its tunnel is open here | opens it first |
| UNAVAILABLE | Temporal cannot be reached now | retries |
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Never, TypeVar

import grpc
from pydantic import SecretStr

from levers9.gateway import convert
from levers9.gateway.auth import authenticate
from levers9.gateway.errors import Rejection, clipped
from levers9.gateway.tunnel import Context as TunnelContext
from levers9.gateway.tunnel import TunnelHub
from levers9.logs import get_logger
from levers9.proto import gateway_pb2, gateway_pb2_grpc
from levers9.records.workers import (
    NotPlacedHere,
    RecordNotFound,
    RecordsUnavailable,
    WorkerRecords,
)

T = TypeVar("T")
Context = grpc.aio.ServicerContext[Any, Any]

UNKNOWN_WORKER = "unknown worker; its record expired"
UNKNOWN_TASK = "unknown task; its record is gone"
TEMPORAL_UNAVAILABLE = "the controlplane cannot record this now (Temporal unavailable); retry"

log = get_logger(__name__)


NO_TUNNEL = (
    "tunnel: this gateway holds no tunnel session for the worker; open Gateway.Tunnel first,"
    " on the same channel, then register"
)


NEEDS_TLS = (
    "tls: this pool's workers serve TLS with the certificate issued with their Job; a"
    " registration without it (or through a tunnel) is refused"
)
NEEDS_TUNNEL = "tunnel: this pool's workers register through their tunnel (kubernetes.tunnel)"


class GatewayService(gateway_pb2_grpc.GatewayServicer):
    def __init__(
        self,
        records: WorkerRecords,
        secret: SecretStr,
        heartbeat_seconds: int,
        tunnels: TunnelHub | None = None,
        tunnelled: Mapping[str, bool] | None = None,
        token_generation: int = 1,
        load_pool: Callable[[str], Awaitable[bool]] | None = None,
    ) -> None:
        """`load_pool`: loads a joined cluster's pool that `tunnelled` lacks (joined while
        this replica ran, its agent's session held by another)."""
        self._records = records
        self._token_generation = token_generation
        self._secret = secret
        self._heartbeat_seconds = heartbeat_seconds
        self._tunnels = tunnels
        self._tunnelled = tunnelled
        self._load_pool = load_pool

    async def Tunnel(
        self,
        request_iterator: AsyncIterator[gateway_pb2.TunnelFrame],
        context: TunnelContext,
    ) -> AsyncIterator[gateway_pb2.TunnelFrame]:
        if self._tunnels is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, "this controlplane does not serve tunnels"
            )
        async for frame in self._tunnels.serve(request_iterator, context):
            yield frame

    async def Register(
        self, request: gateway_pb2.RegisterRequest, context: Context
    ) -> gateway_pb2.RegisterResponse:
        async def register() -> gateway_pb2.RegisterResponse:
            if (
                self._load_pool is not None
                and self._tunnelled is not None
                and request.pool_name not in self._tunnelled
            ):
                await self._load_pool(request.pool_name)
            self._check_transport(request)
            tunnel = None
            if request.tunnel:
                if self._tunnels is not None:
                    tunnel = self._tunnels.endpoint(request.pool_name, request.worker_id)
                if tunnel is None:
                    raise Rejection(grpc.StatusCode.FAILED_PRECONDITION, NO_TUNNEL)
            registration = convert.registration(request, tunnel)
            await self._records.register(request.pool_name, registration)
            log.info(
                "worker registered",
                pool_name=request.pool_name,
                worker_id=request.worker_id,
                address=registration.address,
            )
            return gateway_pb2.RegisterResponse(heartbeat_seconds=self._heartbeat_seconds)

        return await self._admit(context, "Register", request.worker_id, register)

    def _check_transport(self, request: gateway_pb2.RegisterRequest) -> None:
        """A worker registers the way its pool's workers were made to: a pool without the
        tunnel issued it a certificate (with its Job), so it serves TLS; a tunnelled pool's
        worker comes through its tunnel. Anything else is someone with a worker's token trying
        to receive that worker's commands elsewhere, in plaintext."""
        if self._tunnelled is None:
            return
        tunnelled = self._tunnelled.get(request.pool_name)
        if tunnelled is None:
            raise Rejection(
                grpc.StatusCode.PERMISSION_DENIED,
                f"pool {clipped(request.pool_name)} is not loaded on this controlplane",
            )
        if tunnelled and not request.tunnel:
            raise Rejection(grpc.StatusCode.PERMISSION_DENIED, NEEDS_TUNNEL)
        if not tunnelled and (request.tunnel or not request.tls):
            raise Rejection(grpc.StatusCode.PERMISSION_DENIED, NEEDS_TLS)

    async def Heartbeat(
        self, request: gateway_pb2.HeartbeatRequest, context: Context
    ) -> gateway_pb2.HeartbeatResponse:
        async def beat() -> gateway_pb2.HeartbeatResponse:
            await self._records.heartbeat(request.pool_name, convert.heartbeat(request))
            return gateway_pb2.HeartbeatResponse()

        return await self._admit(context, "Heartbeat", request.worker_id, beat)

    async def ReportTask(
        self, request: gateway_pb2.ReportTaskRequest, context: Context
    ) -> gateway_pb2.ReportTaskResponse:
        async def report() -> gateway_pb2.ReportTaskResponse:
            task_report = convert.task_report(request)
            await self._records.report(task_report)
            log.info(
                "task reported",
                task_id=task_report.task_id,
                state=task_report.state,
                pool_name=request.pool_name,
                worker_id=request.worker_id,
            )
            return gateway_pb2.ReportTaskResponse()

        return await self._admit(context, "ReportTask", request.worker_id, report)

    async def _admit(
        self, context: Context, method: str, worker_id: str, serve: Callable[[], Awaitable[T]]
    ) -> T:
        try:
            metadata = context.invocation_metadata() or ()
            authenticate(self._secret, worker_id, metadata, self._token_generation)
            return await serve()
        except Rejection as exc:
            await self._reject(context, method, worker_id, exc)
        except RecordNotFound as exc:
            gone = UNKNOWN_TASK if method == "ReportTask" else UNKNOWN_WORKER
            message = f"{gone} ({exc.workflow_id})"
            await self._reject(
                context, method, worker_id, Rejection(grpc.StatusCode.NOT_FOUND, message)
            )
        except NotPlacedHere as exc:
            await self._reject(
                context, method, worker_id, Rejection(grpc.StatusCode.PERMISSION_DENIED, str(exc))
            )
        except RecordsUnavailable as exc:
            log.error(
                "cannot record worker call", error=str(exc), method=method, worker_id=worker_id
            )
            await context.abort(grpc.StatusCode.UNAVAILABLE, TEMPORAL_UNAVAILABLE)

    @staticmethod
    async def _reject(context: Context, method: str, worker_id: str, rejection: Rejection) -> Never:
        log.warning(
            "rejected worker call",
            reason=rejection.message,
            worker_id=clipped(worker_id),
            method=method,
        )
        await context.abort(rejection.code, rejection.message)
