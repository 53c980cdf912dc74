"""The CLI's side of `levers9.v1.Tasks` on the controlplane's gateway: submit a task, read its
record (waiting for its end), stream its output as its worker writes it. The CLI holds the
operator token; it never dials a worker, never holds a worker's token, and on this path never
loads the Temporal SDK (what makes `levers9 run` and `levers9 task get` start at once).
"""

from __future__ import annotations

import asyncio
import codecs
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import grpc
from grpc import aio

from levers9.config import ControlplaneSettings
from levers9.models import TaskInput, TaskRecord
from levers9.proto import gateway_pb2, gateway_pb2_grpc, worker_pb2
from levers9.rpc import bearer, tls
from levers9.rpc.channel import gateway_channel
from levers9.task_wire import record_from_message, submit_request

T = TypeVar("T")
S = TypeVar("S")
PORT_CHUNK = 64 * 1024
CALL_TIMEOUT_S = 10.0
"""Past any honest answer of the gateway (a wait adds its own seconds)."""


class GatewayUnavailable(Exception):
    """The gateway cannot be asked (no operator token, unreachable, TLS files unusable); the
    message says why and what to do. The caller may fall back to Temporal."""


class GatewayDenied(GatewayUnavailable):
    """The gateway refused the token (UNAUTHENTICATED) or the call to it (PERMISSION_DENIED):
    a reader may not fall back to Temporal around that answer."""


class NoToken(GatewayUnavailable):
    """The CLI has no token to ask the gateway with: Temporal (the operator's way without one)
    is the way it was asked, and its error the one to show."""


class GatewayRefused(Exception):
    """The gateway answered no (not found, invalid, unauthenticated); the message is its own."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code


def _metadata(settings: ControlplaneSettings) -> tuple[tuple[str, str]]:
    token = settings.operator_token()
    if token is None:
        raise NoToken(
            "no token: levers9 login --token TOKEN, or set LEVERS9_TOKEN (or"
            " LEVERS9_API_TOKEN / LEVERS9_API_TOKEN_FILE); `levers9 dev up` writes the operator's"
        )
    return bearer.metadata(token.get_secret_value())


def _credentials(settings: ControlplaneSettings) -> grpc.ChannelCredentials | None:
    try:
        return tls.gateway_client_credentials(settings)
    except tls.TlsError as exc:
        raise GatewayUnavailable(str(exc)) from None


def _translate(exc: aio.AioRpcError, address: str, connected: bool = True) -> Exception:
    details = exc.details() or ""
    unanswered = exc.code() == grpc.StatusCode.UNAVAILABLE and not details.startswith("worker")
    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and not connected:
        unanswered, details = True, f"no connection before the call's deadline: {details}"
    if unanswered:
        return GatewayUnavailable(
            f"the gateway at {address} did not answer ({details});"
            " levers9 login --controlplane HOST:PORT, or set LEVERS9_GATEWAY_ADDRESS, to where"
            " it listens"
        )
    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
        return GatewayUnavailable(f"the gateway at {address} is older than this CLI ({details})")
    if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return GatewayDenied(f"{exc.code().name}: {details}")
    return GatewayRefused(exc.code(), details)


@asynccontextmanager
async def _tasks(
    settings: ControlplaneSettings,
) -> AsyncIterator[tuple[gateway_pb2_grpc.TasksAsyncStub, tuple[tuple[str, str]]]]:
    """The gateway's Tasks stub and the token's metadata; a failed call inside is
    GatewayUnavailable or GatewayRefused."""
    async with gateway_stub(settings, gateway_pb2_grpc.TasksStub) as (stub, metadata):
        yield stub, metadata


@asynccontextmanager
async def gateway_stub(
    settings: ControlplaneSettings, make: Callable[[grpc.aio.Channel], S]
) -> AsyncIterator[tuple[S, tuple[tuple[str, str]]]]:
    """A stub of one of the gateway's services (`make`: its class) and the metadata of the
    CLI's token (the operator's, or a workspace's); a failed call inside is GatewayUnavailable
    or GatewayRefused."""
    metadata = _metadata(settings)
    address = settings.cli_gateway_address()
    async with gateway_channel(address, _credentials(settings)) as channel:
        try:
            yield make(channel), metadata
        except aio.AioRpcError as exc:
            # A gateway that drops the connection attempt (no route, a balancer without
            # backends) ends the call at its deadline: that, too, is one that did not answer.
            connected = channel.get_state() == grpc.ChannelConnectivity.READY
            raise _translate(exc, address, connected) from None


async def _unary(
    settings: ControlplaneSettings,
    call: Callable[[gateway_pb2_grpc.TasksAsyncStub, tuple[tuple[str, str]]], Awaitable[T]],
) -> T:
    async with _tasks(settings) as (stub, metadata):
        return await call(stub, metadata)


async def submit_task(settings: ControlplaneSettings, task: TaskInput) -> None:
    """Starts the task's record through the gateway (a retried submit starts nothing twice)."""
    request = submit_request(task)
    await _unary(
        settings, lambda stub, md: stub.SubmitTask(request, metadata=md, timeout=CALL_TIMEOUT_S)
    )


async def task_record(
    settings: ControlplaneSettings, task_id: str, wait_s: float = 0.0
) -> TaskRecord | None:
    """The record now, or (`wait_s` > 0) once the task has ended or `wait_s` has passed; None
    when the controlplane knows no such task."""
    request = gateway_pb2.GetTaskRecordRequest(task_id=task_id, wait_seconds=wait_s)
    try:
        reply = await _unary(
            settings,
            lambda stub, md: stub.GetTaskRecord(
                request, metadata=md, timeout=CALL_TIMEOUT_S + wait_s
            ),
        )
    except GatewayRefused as exc:
        if exc.code == grpc.StatusCode.NOT_FOUND:
            return None
        raise
    return record_from_message(reply.record)


async def list_tasks(settings: ControlplaneSettings, pool_name: str | None) -> list[TaskRecord]:
    """Every task record (of one pool), page by page over one connection."""
    records: list[TaskRecord] = []
    token = b""
    async with _tasks(settings) as (stub, metadata):
        while True:
            request = gateway_pb2.ListTasksRequest(pool_name=pool_name or "", page_token=token)
            reply = await stub.ListTasks(request, metadata=metadata, timeout=CALL_TIMEOUT_S)
            records.extend(record_from_message(message) for message in reply.records)
            token = reply.next_page_token
            if not token:
                return records


async def cancel_task(settings: ControlplaneSettings, task_id: str, reason: str = "") -> bool:
    """Tells the task to cancel; False when no such task runs."""
    request = gateway_pb2.CancelTaskRecordRequest(task_id=task_id, reason=reason)
    try:
        await _unary(
            settings,
            lambda stub, md: stub.CancelTask(request, metadata=md, timeout=CALL_TIMEOUT_S),
        )
    except GatewayRefused as exc:
        if exc.code == grpc.StatusCode.NOT_FOUND:
            return False
        raise
    return True


async def exec_in_task(
    settings: ControlplaneSettings,
    task_id: str,
    command: list[str],
    stdin: AsyncIterator[bytes | tuple[int, int]] | None,
    stdout: Callable[[bytes], None],
    stderr: Callable[[bytes], None],
    terminal: tuple[int, int] | None = None,
) -> int:
    """Runs `command` in the task's container through the gateway; its output to `stdout` and
    `stderr` as it comes, `stdin` (None: none) to it; returns its exit code. With `terminal`
    (rows, columns) the command gets a terminal of its own of that size, and `stdin` may carry
    (rows, columns) when the caller's terminal is resized."""

    async def requests() -> AsyncIterator[worker_pb2.ExecRequest]:
        start = worker_pb2.ExecStart(task_id=task_id, command=command, tty=terminal is not None)
        if terminal is not None:
            start.size.rows, start.size.cols = terminal
        yield worker_pb2.ExecRequest(start=start)
        if stdin is not None:
            async for item in stdin:
                if isinstance(item, tuple):
                    size = worker_pb2.TerminalSize(rows=item[0], cols=item[1])
                    yield worker_pb2.ExecRequest(resize=size)
                else:
                    yield worker_pb2.ExecRequest(stdin=item)

    code = 0
    async with _tasks(settings) as (stub, metadata):
        async for response in stub.ExecTask(requests(), metadata=metadata):
            kind = response.WhichOneof("message")
            if kind == "stdout":
                stdout(response.stdout)
            elif kind == "stderr":
                stderr(response.stderr)
            elif kind == "exit_code":
                code = response.exit_code
    return code


PortForwarder = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def port_forwarder(
    settings: ControlplaneSettings, task_id: str, port: int
) -> AsyncIterator[PortForwarder]:
    """One gateway channel for a `port-forward` session; the callable carries one accepted
    connection to `port` of the task's container (Tasks/PortForward) until either side ends.
    A connection the gateway refuses raises GatewayRefused / GatewayUnavailable."""
    metadata = _metadata(settings)
    address = settings.cli_gateway_address()
    async with gateway_channel(address, _credentials(settings)) as channel:
        stub = gateway_pb2_grpc.TasksStub(channel)

        async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            async def requests() -> AsyncIterator[worker_pb2.PortForwardRequest]:
                start = worker_pb2.PortForwardStart(task_id=task_id, port=port)
                yield worker_pb2.PortForwardRequest(start=start)
                while data := await reader.read(PORT_CHUNK):
                    yield worker_pb2.PortForwardRequest(data=data)

            try:
                async for response in stub.PortForward(requests(), metadata=metadata):
                    writer.write(response.data)
                    await writer.drain()
            except aio.AioRpcError as exc:
                raise _translate(exc, address) from None

        yield forward


async def stream_task_logs(
    settings: ControlplaneSettings, task_id: str, *, follow: bool, offset: int = 0
) -> AsyncIterator[str]:
    """The task's output from `offset`, decoded as it arrives (UTF-8, a character split across
    chunks is kept for the next one); with `follow`, until the task's process exits."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    request = gateway_pb2.StreamTaskLogsRequest(task_id=task_id, follow=follow, offset=offset)
    try:
        async with _tasks(settings) as (stub, metadata):
            async for chunk in stub.StreamTaskLogs(request, metadata=metadata):
                text = decoder.decode(chunk.data)
                if text:
                    yield text
    except GatewayRefused as exc:  # no stream to be had: the caller shows the record's tail
        raise GatewayUnavailable(str(exc)) from None
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


async def who_am_i(settings: ControlplaneSettings) -> gateway_pb2.WhoAmIResponse:
    """Who the settings' token makes the caller (UNAUTHENTICATED for a bad one:
    GatewayUnavailable saying why)."""
    async with gateway_stub(settings, gateway_pb2_grpc.WorkspacesStub) as (stub, metadata):
        reply: gateway_pb2.WhoAmIResponse = await stub.WhoAmI(
            gateway_pb2.WhoAmIRequest(), metadata=metadata, timeout=CALL_TIMEOUT_S
        )
        return reply


async def pool_names(settings: ControlplaneSettings) -> tuple[list[str], str]:
    """The pools a task may name, as the gateway lists them for any token, and the caller's
    workspace's default pool ("": none)."""
    async with gateway_stub(settings, gateway_pb2_grpc.WorkspacesStub) as (stub, metadata):
        reply = await stub.ListPoolNames(
            gateway_pb2.ListPoolNamesRequest(), metadata=metadata, timeout=CALL_TIMEOUT_S
        )
        return list(reply.pool_names), reply.default_pool
