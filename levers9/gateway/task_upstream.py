"""Where a task's logs, exec and port-forward calls go: its worker's own WorkerService (with
that worker's token), or, for a tunnelled worker whose session another replica holds, that
replica's gateway (`Replicas`: how this replica dials another). Both answer as an `Upstream`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import grpc
from grpc import aio

from levers9.proto import gateway_pb2, gateway_pb2_grpc, worker_pb2, worker_pb2_grpc


@dataclass(frozen=True)
class Replicas:
    """This replica among the others: its own queue (tunnel sessions it holds) and how it
    dials another replica's gateway (TLS as the CLI dials the gateway, the certificate's name
    being the advertised one, not the pod's address)."""

    task_queue: str
    credentials: grpc.ChannelCredentials | None = None
    server_name: str | None = None

    def channel(self, address: str) -> aio.Channel:
        if self.credentials is None:
            return aio.insecure_channel(address)
        options = (("grpc.ssl_target_name_override", self.server_name),) if self.server_name else ()
        return aio.secure_channel(address, self.credentials, options=options)


PortForwardCall = grpc.aio.StreamStreamCall[
    worker_pb2.PortForwardRequest, worker_pb2.PortForwardResponse
]


class Upstream(Protocol):
    @property
    def via(self) -> str | None:
        """The replica relayed through, if any."""

    def logs(self, request: worker_pb2.StreamLogsRequest) -> AsyncIterator[worker_pb2.LogChunk]:
        """The task's output from the worker."""

    def exec(
        self, requests: AsyncIterator[worker_pb2.ExecRequest]
    ) -> AsyncIterator[worker_pb2.ExecResponse]:
        """A command in the task's container."""

    def port_forward(self) -> PortForwardCall:
        """One TCP connection to a published port of the task's container, as a call its
        caller writes and reads (no request iterator: one task hop less a message)."""


@dataclass(frozen=True)
class WorkerUpstream:
    """The worker's own WorkerService, with its own token."""

    stub: worker_pb2_grpc.WorkerServiceAsyncStub
    metadata: tuple[tuple[str, str], ...]
    via: str | None = None

    def logs(self, request: worker_pb2.StreamLogsRequest) -> AsyncIterator[worker_pb2.LogChunk]:
        return aiter(self.stub.StreamLogs(request, metadata=self.metadata))

    def exec(
        self, requests: AsyncIterator[worker_pb2.ExecRequest]
    ) -> AsyncIterator[worker_pb2.ExecResponse]:
        return aiter(self.stub.Exec(requests, metadata=self.metadata))

    def port_forward(self) -> PortForwardCall:
        return self.stub.PortForward(metadata=self.metadata)


@dataclass(frozen=True)
class ReplicaUpstream:
    """Another replica's gateway, which holds the worker's tunnel session."""

    stub: gateway_pb2_grpc.TasksAsyncStub
    metadata: tuple[tuple[str, str], ...]
    via: str | None = None

    def logs(self, request: worker_pb2.StreamLogsRequest) -> AsyncIterator[worker_pb2.LogChunk]:
        relayed = gateway_pb2.StreamTaskLogsRequest(
            task_id=request.task_id, follow=request.follow, offset=request.offset
        )
        return aiter(self.stub.StreamTaskLogs(relayed, metadata=self.metadata))

    def exec(
        self, requests: AsyncIterator[worker_pb2.ExecRequest]
    ) -> AsyncIterator[worker_pb2.ExecResponse]:
        return aiter(self.stub.ExecTask(requests, metadata=self.metadata))

    def port_forward(self) -> PortForwardCall:
        return self.stub.PortForward(metadata=self.metadata)


async def feed(
    call: PortForwardCall, requests: AsyncIterator[worker_pb2.PortForwardRequest]
) -> None:
    """Writes `requests` onto `call`, then half-closes it (the connection's end of stream)."""
    with contextlib.suppress(aio.AioRpcError, asyncio.InvalidStateError):
        async for request in requests:
            await call.write(request)
        await call.done_writing()


class Unroutable(Exception):
    """The worker's tunnel is held by another replica and the call cannot be relayed there."""
