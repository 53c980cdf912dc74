"""What runs a task's container: the interface, and what every runtime gives a task.

`supervisor.TaskManager` decides what runs (command, env, cards) and keeps the record; a
`Runtime` makes it run. `process_runtime.ProcessRuntime` runs the command as a child process of
the agent (`host: "process"`); `runc_runtime.RuncRuntime` (`host: "runc"`) implements the same
interface with the image's filesystem. Which of them a pool's tasks get is the pool's `runtime`
setting, looked up in `runtimes.RUNTIMES`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from levers9.agent.disks import DiskAccess
    from levers9.agent.images import PulledImage
    from levers9.agent.volumes import VolumeAccess

NO_CARDS = "void"
"""`NVIDIA_VISIBLE_DEVICES` for a task without cards: the NVIDIA runtime exposes none."""


class StartError(RuntimeError):
    """The container could not be started; the message says why, verbatim."""


class ImageUnavailable(StartError):
    """The task's image could not be had (pulled, unpacked, or its reference read)."""


@dataclass(frozen=True)
class TaskDefaults:
    """The pool's `taskDefaults`, from the Job: what a task that names none of these gets."""

    image: str = ""
    """The pool's `taskDefaults.image`, else the worker's own image (`worker_image`)."""
    memory_bytes: int = 0
    cpu_millis: int = 0
    worker_image: str = ""
    """The worker Job's own image: a task in it runs its command as given, never the image's
    Entrypoint (the agent)."""


@dataclass(frozen=True)
class StorageMount:
    """One volume or disk of a task (TaskSpec.mounts) with what mounts it (RunTaskRequest's
    VolumeAccess or DiskAccess of that name): levers9.agent.task_storage mounts it."""

    kind: str
    """volume or disk"""
    name: str
    path: str
    """Where its container sees it."""
    read_only: bool = False
    volume: VolumeAccess | None = None
    disk: DiskAccess | None = None


@dataclass(frozen=True)
class ContainerSpec:
    """One task's container, as the runtime needs it."""

    task_id: str
    image: str
    command: tuple[str, ...]
    env: Mapping[str, str]
    """The task's own environment; the runtime adds what every task gets
    (`NVIDIA_VISIBLE_DEVICES`, PATH, `LEVERS9_RESULT_PATH`)."""
    gpu_indices: tuple[int, ...]
    result_path: Path
    """Where (on this machine) the task may write its result JSON."""
    work_dir: Path
    """A directory of this task's own on this machine."""
    memory_bytes: int = 0
    """Its container's memory limit; 0: the runtime's default."""
    cpu_millis: int = 0
    """Its container's CPU limit in millicores; 0: the runtime's default."""
    ports: tuple[int, ...] = ()
    """The ports it publishes (the agent dials them in its container)."""
    runtime: str = ""
    """The runtime it asked for (`levers9 run --runtime`); "": the pool's."""
    entrypoint: bool = True
    """Its command follows the image's Entrypoint (as `docker run IMAGE CMD`); False: it runs as
    given (a task in the worker's own image, whose Entrypoint is the agent)."""
    workspace: str = ""
    """The workspace it belongs to (a DNS label the agent checked): its container's
    `levers9.workspace` annotation; "": none is written."""
    pool: str = ""
    """The pool of the worker that runs it: its container's `levers9.pool` annotation; "": none
    is written."""
    mounts: tuple[StorageMount, ...] = ()
    """Its volumes and disks, mounted before it starts and bound in (a runtime that cannot
    refuses it at start)."""
    restore_from: Path | None = None
    """A checkpoint image (levers9.agent.checkpoints) its processes are restored from, rather
    than its command started; a runtime that cannot restore refuses it at start."""


Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]
"""A connection to a task's port, as asyncio.open_connection gives one."""


class Container(Protocol):
    """A started container."""

    @property
    def host(self) -> str:
        """The runtime that runs it: "process", "runc"."""
        ...

    @property
    def image(self) -> PulledImage | None:
        """The image it runs in (None: the process runtime's, no image)."""
        ...

    @property
    def oom_killed(self) -> bool:
        """Once it has exited: the kernel killed it for going over its memory limit."""
        ...

    @property
    def limit_hit(self) -> str:
        """Once it has exited: which of its limits other than memory it ran into ("pids limit:
        ...", "disk full: ..."), "" when none."""
        ...

    @property
    def storage_error(self) -> str:
        """Once it has exited: why what it wrote to a volume may not be in the bucket (an
        upload its FUSE process reported failed), "" when nothing went wrong."""
        ...

    @property
    def lost(self) -> str:
        """Once it has exited: why its exit status is not known ("" when it is)."""
        ...

    @property
    def netns(self) -> Path | None:
        """The network namespace of its own where its published ports are (the agent dials
        them there: levers9.agent.task_network); None: it shares the agent's network."""
        ...

    @property
    def dialer(self) -> Callable[[int], Awaitable[Streams]] | None:
        """How the agent opens a connection to one of its published ports when neither its
        `netns` nor the agent's network reaches them (a gVisor sandbox's own network stack: a
        relay inside it, levers9.agent.runsc_runtime); None: through `netns`."""
        ...

    async def wait(self) -> int:
        """Its exit code once it has exited (128 + signal when killed)."""
        ...

    async def stop(self, grace_s: float) -> int:
        """SIGTERM, SIGKILL after `grace_s`; its exit code."""
        ...


class Runtime(Protocol):
    @property
    def host(self) -> str:
        """What TaskStatus.host reports: "process", "runc"."""
        ...

    def host_for(self, image: str, runtime: str = "") -> str:
        """The host a task of `image` ("" for none) runs on, asking for `runtime` ("": the
        pool's)."""
        ...

    async def start(self, spec: ContainerSpec, output: Callable[[bytes], None]) -> Container:
        """Starts the container; its stdout and stderr go to `output`. Raises StartError."""
        ...

    async def exec(
        self, container: Container, command: Sequence[str], terminal: int | None = None
    ) -> asyncio.subprocess.Process:
        """Runs `command` in the running container's context, with stdin, stdout and stderr
        piped; with `terminal` (a pseudo-terminal's follower end), on that terminal instead.
        Raises StartError."""
        ...

    async def adopt(
        self, task_id: str, output: Callable[[bytes], None], offset: int
    ) -> Container | None:
        """The task's container as an agent before this one left it (running or ended), its
        output from byte `offset` on to `output`; None when this runtime has none for it."""
        ...

    async def sweep(self, keep: Collection[str]) -> list[str]:
        """Kills and removes every container this runtime finds left on the worker but those
        of the tasks in `keep`; the ids of their tasks."""
        ...


def exec_stdio(terminal: int | None) -> dict[str, Any]:
    """An exec's stdin, stdout and stderr: pipes, or all three on the terminal given."""
    if terminal is None:
        pipe = asyncio.subprocess.PIPE
        return {"stdin": pipe, "stdout": pipe, "stderr": pipe}
    return {"stdin": terminal, "stdout": terminal, "stderr": terminal}


OUTPUT_CHUNK = 64 * 1024
DRAIN_S = 2.0
"""How long a container's output may keep flowing once its process is gone."""


def pump_output(
    stream: asyncio.StreamReader, output: Callable[[bytes], None]
) -> asyncio.Task[None]:
    """A task relaying `stream` (a container's stdout and stderr) to `output` until EOF."""

    async def pump() -> None:
        while chunk := await stream.read(OUTPUT_CHUNK):
            output(chunk)

    return asyncio.create_task(pump())


async def drain(pump: asyncio.Task[None]) -> None:
    """Lets the relay finish what is still in the pipe, at most DRAIN_S, then stops it."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(pump), DRAIN_S)
    if not pump.done():
        pump.cancel()


def visible_devices(indices: Sequence[int]) -> str:
    """`NVIDIA_VISIBLE_DEVICES` for a task holding the cards `indices` (node indices)."""
    return ",".join(str(i) for i in indices) or NO_CARDS


def prepend_path(value: str | None, directories: Sequence[Path]) -> str:
    """`directories` first on a PATH-like value, without repeating what is already there."""
    parts = [str(d) for d in directories]
    parts += [p for p in (value or "").split(":") if p and p not in parts]
    return ":".join(parts)


NO_IMAGE = (
    "the task names no image and this worker has none to give it: set the pool's"
    " taskDefaults.image, or run the worker from an image (its Job's LEVERS9_WORKER_IMAGE)"
)
"""Why a task that found no image to run in does not start: no task runs outside a container."""


class ByImage:
    """A task that names an image runs in the image runtime (runc). One that names none (the
    worker found no default image for it) runs in the process runtime where the agent's tests
    gave one (`process`: their knob, `LEVERS9_PROCESS_TASKS`), and fails to start saying why
    everywhere else: no task runs outside a container. Without an image runtime (runc, umoci or
    skopeo missing, or no image cache), a task with an image fails to start and says why
    (`unavailable`)."""

    def __init__(
        self, process: Runtime | None, images: Runtime | None, unavailable: str = ""
    ) -> None:
        self._process = process
        self._images = images
        self._unavailable = unavailable

    @property
    def host(self) -> str:
        return self.host_for("x")

    def host_for(self, image: str, runtime: str = "") -> str:
        if self._images is not None and (image or self._process is None):
            return self._images.host
        return self._process.host if self._process is not None else "runc"

    def _fallback(self) -> Runtime:
        """The process runtime; StartError when there is none (no task runs outside one)."""
        if self._process is None:
            raise StartError(NO_IMAGE)
        return self._process

    async def start(self, spec: ContainerSpec, output: Callable[[bytes], None]) -> Container:
        if not spec.image:
            return await self._fallback().start(spec, output)
        if self._images is None:
            raise StartError(f"this worker cannot run images: {self._unavailable}")
        return await self._images.start(spec, output)

    async def exec(
        self, container: Container, command: Sequence[str], terminal: int | None = None
    ) -> asyncio.subprocess.Process:
        if self._images is not None and container.host == self._images.host:
            return await self._images.exec(container, command, terminal)
        return await self._fallback().exec(container, command, terminal)

    async def adopt(
        self, task_id: str, output: Callable[[bytes], None], offset: int
    ) -> Container | None:
        if self._images is not None:
            adopted = await self._images.adopt(task_id, output, offset)
            if adopted is not None:
                return adopted
        return None if self._process is None else await self._process.adopt(task_id, output, offset)

    async def sweep(self, keep: Collection[str]) -> list[str]:
        swept = [] if self._process is None else await self._process.sweep(keep)
        if self._images is not None:
            swept += await self._images.sweep(keep)
        return swept


class ByRuntime:
    """The runtimes a pool offers (its `runtimes`), by name: a task runs in the one it names
    (`ContainerSpec.runtime`), the pool's `runtime` (`default`) when it names none; one the pool
    does not offer fails to start naming those it does (the controlplane refuses it at submit)."""

    def __init__(self, runtimes: Mapping[str, Runtime], default: str) -> None:
        self._runtimes = dict(runtimes)
        self._default = default

    def _named(self, name: str) -> Runtime:
        found = self._runtimes.get(name or self._default)
        if found is None:
            offered = ", ".join(self._runtimes)
            raise StartError(f"this worker's pool offers the runtimes {offered}, not {name}")
        return found

    @property
    def host(self) -> str:
        return self._runtimes[self._default].host

    def host_for(self, image: str, runtime: str = "") -> str:
        chosen = self._runtimes.get(runtime or self._default, self._runtimes[self._default])
        return chosen.host_for(image)

    async def start(self, spec: ContainerSpec, output: Callable[[bytes], None]) -> Container:
        return await self._named(spec.runtime).start(spec, output)

    async def exec(
        self, container: Container, command: Sequence[str], terminal: int | None = None
    ) -> asyncio.subprocess.Process:
        # A runtime's name is its containers' host; a process runtime's task is the default's.
        chosen = self._runtimes.get(container.host, self._runtimes[self._default])
        return await chosen.exec(container, command, terminal)

    async def adopt(
        self, task_id: str, output: Callable[[bytes], None], offset: int
    ) -> Container | None:
        for runtime in self._runtimes.values():
            adopted = await runtime.adopt(task_id, output, offset)
            if adopted is not None:
                return adopted
        return None

    async def sweep(self, keep: Collection[str]) -> list[str]:
        swept: list[str] = []
        for runtime in self._runtimes.values():
            swept += [t for t in await runtime.sweep(keep) if t not in swept]
        return swept
