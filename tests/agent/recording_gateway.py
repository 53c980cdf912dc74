"""A gateway for the agent to dial in tests: the real gRPC service on 127.0.0.1, recording every
call with its metadata. Like the controlplane's, it forgets workers when it restarts, answering
heartbeats of workers it does not know with NOT_FOUND."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import grpc
from grpc import aio

from levers9.proto import gateway_pb2, gateway_pb2_grpc
from levers9.rpc import bearer

HEARTBEAT_SECONDS = 1


@dataclass
class Calls:
    registers: list[tuple[gateway_pb2.RegisterRequest, str | None]] = field(default_factory=list)
    heartbeats: list[gateway_pb2.HeartbeatRequest] = field(default_factory=list)
    reports: list[gateway_pb2.ReportTaskRequest] = field(default_factory=list)
    refuse_reports: int = 0
    """The next this many ReportTask calls are answered UNAVAILABLE (the worker retries)."""
    refused: list[gateway_pb2.ReportTaskRequest] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class _Servicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(self, calls: Calls) -> None:
        self._calls = calls
        self._known: set[str] = set()

    def _record(self) -> None:
        changed, self._calls.changed = self._calls.changed, asyncio.Event()
        changed.set()

    async def Register(
        self, request: gateway_pb2.RegisterRequest, context: aio.ServicerContext[Any, Any]
    ) -> gateway_pb2.RegisterResponse:
        self._calls.registers.append((request, _presented(context)))
        self._known.add(request.worker_id)
        self._record()
        return gateway_pb2.RegisterResponse(heartbeat_seconds=HEARTBEAT_SECONDS)

    async def Heartbeat(
        self, request: gateway_pb2.HeartbeatRequest, context: aio.ServicerContext[Any, Any]
    ) -> gateway_pb2.HeartbeatResponse:
        if request.worker_id not in self._known:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"worker {request.worker_id} unknown")
        self._calls.heartbeats.append(request)
        self._record()
        return gateway_pb2.HeartbeatResponse()

    async def ReportTask(
        self, request: gateway_pb2.ReportTaskRequest, context: aio.ServicerContext[Any, Any]
    ) -> gateway_pb2.ReportTaskResponse:
        if self._calls.refuse_reports > 0:
            self._calls.refuse_reports -= 1
            self._calls.refused.append(request)
            self._record()
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the gateway is busy")
        self._calls.reports.append(request)
        self._record()
        return gateway_pb2.ReportTaskResponse()

    async def Tunnel(
        self,
        request_iterator: AsyncIterator[gateway_pb2.TunnelFrame],
        context: aio.ServicerContext[gateway_pb2.TunnelFrame, gateway_pb2.TunnelFrame],
    ) -> AsyncIterator[gateway_pb2.TunnelFrame]:
        """These tests' agents dial directly; a tunnel here is a mistake."""
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no tunnel in this gateway")
        yield gateway_pb2.TunnelFrame()  # pragma: no cover - abort raises


class RecordingGateway:
    """`async with RecordingGateway() as gateway`: serving on `gateway.address`."""

    def __init__(self) -> None:
        self.calls = Calls()
        self.port = 0
        self._server: aio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        server = aio.server()
        gateway_pb2_grpc.add_GatewayServicer_to_server(_Servicer(self.calls), server)
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

    async def restart(self) -> None:
        """A new gateway process on the same port: it knows no worker."""
        await self.stop()
        await self.start()

    async def wait_for(self, check: Callable[[Calls], bool], within: float = 15.0) -> None:
        """Waits until `check(calls)` is true."""
        async with asyncio.timeout(within):
            while not check(self.calls):
                await self.calls.changed.wait()

    async def __aenter__(self) -> RecordingGateway:
        await self.start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.stop()


def _presented(context: aio.ServicerContext[Any, Any]) -> str | None:
    """The bearer token the agent presented; None without a usable one."""
    try:
        return bearer.token(context.invocation_metadata())
    except bearer.BearerError:
        return None
