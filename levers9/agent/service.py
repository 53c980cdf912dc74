"""WorkerService: what the controlplane calls on this worker (RunTask, GetTask, CancelTask,
StreamLogs, Exec, PortForward), over `supervisor.TaskManager`; ListNodeDisks and DeleteNodeDisk
over the machine's durable disks (levers9.agent.disks). Errors map to gRPC codes the
caller can act on: an unknown task is NOT_FOUND, a malformed one (or a port it did not publish)
INVALID_ARGUMENT, Exec or PortForward on an ended task FAILED_PRECONDITION, a task while the
worker shuts down (or a port nothing accepts on yet) UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import struct
import termios
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from grpc import aio

from levers9.agent import checkpoints
from levers9.agent.disks import DiskStore, disk_id_problem
from levers9.agent.runtime import StartError
from levers9.agent.supervisor import TaskManager, store_access
from levers9.agent.task_errors import (
    InvalidTask,
    PortUnavailable,
    ShuttingDown,
    TaskNotFound,
    TaskNotRunning,
)
from levers9.agent.task_storage import NO_DISKS
from levers9.contract import PORT_CONNECTED_HEADER
from levers9.proto import worker_pb2, worker_pb2_grpc
from levers9.rpc.malformed import read_checked

T = TypeVar("T")
Context = aio.ServicerContext[Any, Any]
_CHUNK = 64 * 1024

_CODES: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (TaskNotFound, grpc.StatusCode.NOT_FOUND),
    (InvalidTask, grpc.StatusCode.INVALID_ARGUMENT),
    (TaskNotRunning, grpc.StatusCode.FAILED_PRECONDITION),
    (StartError, grpc.StatusCode.FAILED_PRECONDITION),
    (ShuttingDown, grpc.StatusCode.UNAVAILABLE),
    (PortUnavailable, grpc.StatusCode.UNAVAILABLE),
    (checkpoints.CheckpointRefused, grpc.StatusCode.FAILED_PRECONDITION),
    (checkpoints.ImageInvalid, grpc.StatusCode.INVALID_ARGUMENT),
    (checkpoints.CheckpointFailed, grpc.StatusCode.INTERNAL),
)


async def _answer(context: Context, call: Callable[[], Awaitable[T]]) -> T:
    """Runs `call`, turning the task errors into the status codes above."""
    try:
        return await call()
    except tuple(kind for kind, _ in _CODES) as error:
        code = next(c for kind, c in _CODES if isinstance(error, kind))
        await context.abort(code, str(error))
        raise  # abort raises; this keeps type checkers honest


class WorkerService(worker_pb2_grpc.WorkerServiceServicer):
    def __init__(self, tasks: TaskManager, disks: DiskStore | None = None) -> None:
        """`disks`: this machine's durable disks (None: the Job gives no durableDisksPath)."""
        self._tasks = tasks
        self._disks = disks

    async def ListNodeDisks(
        self, request: worker_pb2.ListNodeDisksRequest, context: Context
    ) -> worker_pb2.ListNodeDisksResponse:
        if self._disks is None:
            return worker_pb2.ListNodeDisksResponse()
        found = await asyncio.to_thread(self._disks.disks)
        return worker_pb2.ListNodeDisksResponse(
            disks=[
                worker_pb2.NodeDisk(
                    disk_id=d.disk_id,
                    size_bytes=d.size_bytes,
                    used_bytes=d.used_bytes,
                    task_id=d.task_id,
                )
                for d in found
            ]
        )

    async def DeleteNodeDisk(
        self, request: worker_pb2.DeleteNodeDiskRequest, context: Context
    ) -> worker_pb2.DeleteNodeDiskResponse:
        disks = self._disks
        if disks is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, NO_DISKS)
            raise AssertionError  # abort raises
        problem = disk_id_problem(request.disk_id)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)

        async def delete() -> bool:
            return await asyncio.to_thread(disks.delete, request.disk_id)

        deleted = await _answer(context, delete)
        return worker_pb2.DeleteNodeDiskResponse(deleted=deleted)

    async def RunTask(
        self, request: worker_pb2.RunTaskRequest, context: Context
    ) -> worker_pb2.RunTaskResponse:
        already = await _answer(
            context,
            lambda: self._tasks.run(
                request.task,
                request.volumes,
                request.disks,
                request.checkpoint_store if request.HasField("checkpoint_store") else None,
            ),
        )
        return worker_pb2.RunTaskResponse(task_id=request.task.task_id, already_running=already)

    async def CheckpointTask(
        self, request: worker_pb2.CheckpointTaskRequest, context: Context
    ) -> worker_pb2.CheckpointTaskResponse:
        """See worker.proto: the task checkpointed to its workspace's `name`, and ended."""

        async def take() -> worker_pb2.CheckpointTaskResponse:
            store = store_access(request.store) if request.HasField("store") else None
            return await self._tasks.checkpoint(request.task_id, request.name, store)

        return await _answer(context, take)

    async def DeleteCheckpoint(
        self, request: worker_pb2.DeleteCheckpointRequest, context: Context
    ) -> worker_pb2.DeleteCheckpointResponse:
        """See worker.proto: the image removed from this machine (`box delete`)."""

        async def delete() -> bool:
            return await self._tasks.delete_checkpoint(request.workspace, request.name)

        return worker_pb2.DeleteCheckpointResponse(deleted=await _answer(context, delete))

    async def GetTask(
        self, request: worker_pb2.GetTaskRequest, context: Context
    ) -> worker_pb2.TaskStatus:
        async def get() -> worker_pb2.TaskStatus:
            return self._tasks.status(request.task_id)

        return await _answer(context, get)

    async def CancelTask(
        self, request: worker_pb2.CancelTaskRequest, context: Context
    ) -> worker_pb2.CancelTaskResponse:
        cancelled = await _answer(context, lambda: self._tasks.cancel(request.task_id))
        return worker_pb2.CancelTaskResponse(cancelled=cancelled)

    async def StreamLogs(
        self, request: worker_pb2.StreamLogsRequest, context: Context
    ) -> AsyncIterator[worker_pb2.LogChunk]:
        async def find() -> Any:
            return self._tasks.output(request.task_id)

        output = await _answer(context, find)
        async for offset, data in output.chunks(request.offset, request.follow):
            yield worker_pb2.LogChunk(data=data, offset=offset)

    async def Exec(
        self, request_iterator: AsyncIterator[worker_pb2.ExecRequest], context: Context
    ) -> AsyncIterator[worker_pb2.ExecResponse]:
        first = await anext(request_iterator, None)
        if first is None or not first.HasField("start"):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "Exec starts with an ExecStart message"
            )
            return
        start = first.start
        master: int | None = None
        follower: int | None = None
        if start.tty:
            master, follower = os.openpty()
            _resize(master, start.size)
        try:
            process = await _answer(
                context, lambda: self._tasks.exec(start.task_id, start.command, follower)
            )
        finally:
            if follower is not None:
                os.close(follower)  # the command holds it now; we keep the leader end
        streamed = (
            _exec_stream(process, request_iterator)
            if master is None
            else _terminal_stream(process, master, request_iterator)
        )
        try:
            async for response in streamed:
                yield response
        finally:
            if process.returncode is None:  # the caller went away: so does the command
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()

    async def PortForward(  # type: ignore[override]  # grpc.aio: written through context
        self, request_iterator: AsyncIterator[worker_pb2.PortForwardRequest], context: Context
    ) -> None:
        # The call is read and written through `context` (no request iterator, no response
        # generator): one task hop less each way a message, on the endpoints' request path.
        first = await read_checked(context)
        if not isinstance(first, worker_pb2.PortForwardRequest) or not first.HasField("start"):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "PortForward starts with a PortForwardStart"
            )
            return
        start = first.start
        reader, writer = await _answer(
            context, lambda: self._tasks.connect(start.task_id, start.port)
        )
        await context.send_initial_metadata(((PORT_CONNECTED_HEADER, "1"),))
        try:
            await forward_port(context, reader, writer)
        except OSError as error:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"task {start.task_id} port {start.port}: the connection broke: {error}",
            )


async def forward_port(
    context: Context, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Copies the caller's `data` into the connection (the call's end of writing: a
    half-close) and writes what the connection sends onto the call until it closes its side;
    the connection is closed when this ends, however it ends."""

    async def feed() -> None:
        while (request := await read_checked(context)) is not grpc.aio.EOF:
            assert isinstance(request, worker_pb2.PortForwardRequest)
            if request.data:
                writer.write(request.data)
                await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    feeding = asyncio.create_task(feed())
    try:
        while data := await reader.read(_CHUNK):
            await context.write(worker_pb2.PortForwardResponse(data=data))
    finally:
        feeding.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await feeding
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def _resize(master: int, size: worker_pb2.TerminalSize) -> None:
    if size.rows and size.cols:
        winsize = struct.pack("HHHH", min(size.rows, 0xFFFF), min(size.cols, 0xFFFF), 0, 0)
        fcntl.ioctl(master, termios.TIOCSWINSZ, winsize)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


async def _terminal_stream(
    process: asyncio.subprocess.Process,
    master: int,
    requests: AsyncIterator[worker_pb2.ExecRequest],
) -> AsyncIterator[worker_pb2.ExecResponse]:
    """An exec on a terminal: what the terminal shows as stdout (its output and its echo of the
    input), the caller's keys to it, its size followed (the command's runtime hears SIGWINCH),
    then the exit code. The leader end reads EIO once the command and its runtime are gone."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes | None] = asyncio.Queue()

    def readable() -> None:
        try:
            data = os.read(master, _CHUNK)
        except OSError:  # EIO: nothing holds the follower end any more
            data = b""
        if data:
            chunks.put_nowait(data)
        else:
            loop.remove_reader(master)
            chunks.put_nowait(None)

    async def feed() -> None:
        async for request in requests:
            kind = request.WhichOneof("message")
            if kind == "stdin":
                await asyncio.to_thread(_write_all, master, request.stdin)
            elif kind == "resize":
                _resize(master, request.resize)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGWINCH)

    loop.add_reader(master, readable)
    feeder = asyncio.create_task(feed())
    try:
        while (chunk := await chunks.get()) is not None:
            yield worker_pb2.ExecResponse(stdout=chunk)
        code = await process.wait()
        yield worker_pb2.ExecResponse(exit_code=128 - code if code < 0 else code)
    finally:
        loop.remove_reader(master)
        feeder.cancel()
        await asyncio.gather(feeder, return_exceptions=True)
        os.close(master)


async def _exec_stream(
    process: asyncio.subprocess.Process, requests: AsyncIterator[worker_pb2.ExecRequest]
) -> AsyncIterator[worker_pb2.ExecResponse]:
    """stdin from `requests` to the process; its stdout, stderr, then its exit code back."""
    assert process.stdin is not None
    assert process.stdout is not None
    assert process.stderr is not None
    queue: asyncio.Queue[worker_pb2.ExecResponse | None] = asyncio.Queue()
    stdin = process.stdin

    async def feed() -> None:
        with contextlib.suppress(ConnectionError, BrokenPipeError):
            async for request in requests:
                if request.HasField("stdin"):
                    stdin.write(request.stdin)
                    await stdin.drain()
            stdin.close()  # the caller half-closed: EOF for the command

    async def pump(stream: asyncio.StreamReader, wrap: Callable[[bytes], Any]) -> None:
        while chunk := await stream.read(_CHUNK):
            await queue.put(wrap(chunk))
        await queue.put(None)

    tasks = [
        asyncio.create_task(feed()),
        asyncio.create_task(pump(process.stdout, lambda b: worker_pb2.ExecResponse(stdout=b))),
        asyncio.create_task(pump(process.stderr, lambda b: worker_pb2.ExecResponse(stderr=b))),
    ]
    try:
        open_streams = 2
        while open_streams:
            item = await queue.get()
            if item is None:
                open_streams -= 1
            else:
                yield item
        code = await process.wait()
        yield worker_pb2.ExecResponse(exit_code=128 - code if code < 0 else code)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
