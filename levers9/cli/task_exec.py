"""`levers9 exec`: a command in a running task's container, through the gateway: this command's
stdin (`-i`), a terminal (`-t`: raw keys, the window's size on each SIGWINCH), its output, then
its exit code as ours."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import IO, Annotated

import typer

from levers9.cli import gateway_api
from levers9.cli.gateway_api import GatewayUnavailable
from levers9.cli.output import fail
from levers9.cli.runtime import settings_from_env
from levers9.cli.task_access import answered


async def _stdin_chunks() -> AsyncIterator[bytes]:
    """The command's stdin, read in a thread, until EOF."""
    reader = sys.stdin.buffer
    while chunk := await asyncio.to_thread(os.read, reader.fileno(), 64 * 1024):
        yield chunk


def _write(stream: IO[bytes]) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        stream.write(data)
        stream.flush()

    return write


def exec_(
    task_id: Annotated[str, typer.Argument(help="the running task")],
    command: Annotated[list[str], typer.Argument(help="the command, after --")],
    interactive: Annotated[
        bool, typer.Option("--interactive", "-i", help="pass this command's stdin on")
    ] = False,
    tty: Annotated[
        bool, typer.Option("--tty", "-t", help="give it a terminal (-it: an interactive shell)")
    ] = False,
) -> None:
    """Run CMD in a running task's container: its output, then its exit code as ours."""
    settings = settings_from_env()
    terminal = _terminal_size() if tty else None
    raw = interactive and tty and sys.stdin.isatty()
    try:
        with _raw_mode(sys.stdin.fileno()) if raw else contextlib.nullcontext():
            code = answered(
                gateway_api.exec_in_task(
                    settings,
                    task_id,
                    list(command),
                    _inputs(interactive, follow_size=tty) if interactive or tty else None,
                    _write(sys.stdout.buffer),
                    _write(sys.stderr.buffer),
                    terminal,
                )
            )
    except GatewayUnavailable as exc:
        fail([f"exec needs the gateway: {exc}"])
        raise typer.Exit(1) from None
    raise typer.Exit(code)


def _terminal_size() -> tuple[int, int]:
    """(rows, columns) of this terminal; 24x80 when stdout is not one."""
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
    except OSError:
        return 24, 80
    return size.lines, size.columns


@contextlib.contextmanager
def _raw_mode(fd: int) -> Iterator[None]:
    """Keys go to the task's terminal as typed (Ctrl-C included); restored on the way out."""
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    tty.setraw(fd)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


async def _inputs(stdin: bool, follow_size: bool) -> AsyncIterator[bytes | tuple[int, int]]:
    """This command's stdin (with -i) and, with -t, the terminal's new size on each SIGWINCH;
    ends at stdin's EOF (or, without -i, when the command ends)."""
    queue: asyncio.Queue[bytes | tuple[int, int] | None] = asyncio.Queue()
    loop = asyncio.get_running_loop()
    if follow_size:
        loop.add_signal_handler(signal.SIGWINCH, lambda: queue.put_nowait(_terminal_size()))

    async def read() -> None:
        async for chunk in _stdin_chunks():
            await queue.put(chunk)
        await queue.put(None)

    reader = asyncio.create_task(read()) if stdin else None
    try:
        while (item := await queue.get()) is not None:
            yield item
    finally:
        if follow_size:
            loop.remove_signal_handler(signal.SIGWINCH)
        if reader is not None:
            reader.cancel()
