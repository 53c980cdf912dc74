"""The container runtime for process images: one local process group per container.

A container's process runs in its own session (so its whole group can be signalled), with
stdin closed and stdout+stderr merged into one pipe (the order a reader of `kubectl logs`
expects). Like a container, it ends when its main process ends: whatever that process left
behind in its group is killed then. Stopping follows the kubelet: SIGTERM to the group, then
SIGKILL once the grace period is over.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

_CHUNK = 65536
_PUMP_DRAIN_S = 2.0  # how long to wait for the pipe to close after the group is gone


class StartError(Exception):
    """The process could not be started; the message reads like containerd's."""


class ContainerProcess:
    """A started container process whose output goes to `sink` as decoded text."""

    def __init__(self, process: asyncio.subprocess.Process, pump: asyncio.Task[None]) -> None:
        self._process = process
        self._pump = pump

    @property
    def pid(self) -> int:
        return self._process.pid

    @classmethod
    async def start(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        sink: Callable[[str], None],
    ) -> ContainerProcess:
        if not argv:
            raise StartError(
                "failed to create containerd task: failed to create shim task: OCI runtime "
                "create failed: runc create failed: unable to start container process: "
                "error during container init: no command specified: unknown"
            )
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                env=dict(env),
                cwd=cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except (FileNotFoundError, PermissionError, NotADirectoryError) as error:
            detail = (
                f'exec: "{argv[0]}": executable file not found in $PATH'
                if isinstance(error, FileNotFoundError)
                else f'exec: "{argv[0]}": permission denied'
            )
            raise StartError(
                "failed to create containerd task: failed to create shim task: OCI runtime "
                "create failed: runc create failed: unable to start container process: "
                f"error during container init: {detail}: unknown"
            ) from None
        assert process.stdout is not None
        pump = asyncio.create_task(_pump(process.stdout, sink))
        return cls(process, pump)

    async def wait(self) -> int:
        """The exit code, as a runtime reports it (128 + signal for a killed process), once
        the process has exited and its group is gone."""
        code = await self._process.wait()
        self._kill_group(signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._pump), _PUMP_DRAIN_S)
        if not self._pump.done():
            self._pump.cancel()
        return 128 - code if code < 0 else code

    async def stop(self, grace_s: float) -> int:
        """SIGTERM to the group; SIGKILL after `grace_s`; returns the exit code."""
        if self._process.returncode is None:
            self._kill_group(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self._process.wait()), max(grace_s, 0))
            except TimeoutError:
                self._kill_group(signal.SIGKILL)
        return await self.wait()

    def _kill_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, sig)


async def _pump(stream: asyncio.StreamReader, sink: Callable[[str], None]) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        chunk = await stream.read(_CHUNK)
        if not chunk:
            break
        text = decoder.decode(chunk)
        if text:
            sink(text)
    tail = decoder.decode(b"", final=True)
    if tail:
        sink(tail)
