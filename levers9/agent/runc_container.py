"""One runc container of a task, and what it leaves where an agent started later finds it.

Each container runs under a shim of its own session (`SHIM`: `runc run` in the foreground, the
container's output appended to `container.log` in the task's folder, its exit status written
beside it), with a record beside the runc root (`ContainerRecord`). A `RuncContainer` is one the
agent started (its shim a child of the agent) or adopted from an agent before it (its shim a
process it can only watch): its output relayed from the log as it grows, its end read from the
exit file, and on its end the container deleted through its runtime (levers9.agent.runc_runtime).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from levers9.agent.cgroups import oom_killed
from levers9.agent.images import PulledImage
from levers9.agent.runtime import OUTPUT_CHUNK, Streams, drain

if TYPE_CHECKING:
    from levers9.agent.runc_runtime import RuncRuntime

HOST = "runc"
SHIM = (
    'log=$1 code=$2; shift 2; "$@" </dev/null >>"$log" 2>&1; echo $? >"$code.tmp"'
    ' && mv "$code.tmp" "$code"'
)
"""Each container's shim (`sh -c SHIM levers9-shim LOG EXIT runc ... run ...`): `runc run` in
the foreground, the container's output appended to LOG and its exit status written to EXIT,
both where an agent started after this one finds them."""
SHIM_POLL_S = 0.2
"""How often an adopted container's shim (not our child) is looked for."""
RELAY_POLL_S = (0.02, 0.25)
"""How often the container's log is read for new output: from the first, doubling to the
second while it is quiet."""


@dataclass(frozen=True)
class ContainerRecord:
    """What an agent started in this runc root, kept as JSON beside it (`containers/<id>.json`)
    so that an agent started after this one (this one SIGKILLed, say) can adopt the container:
    follow its output, read its exit status, and clean up after it."""

    task_id: str
    bundle: Path
    log: Path
    """The container's stdout and stderr, as its shim appends them."""
    exit: Path
    """Its exit status, written by its shim once `runc run` returns."""
    shim_pid: int
    image_reference: str
    image_digest: str
    rootfs: Path
    host: str = HOST
    """The runtime that runs it (`runc`, `runsc`): they share the records' folder."""
    user_ids: int = 0
    """The node's id its user namespace's 0 is (levers9.agent.id_ranges); 0: none."""

    @property
    def container_id(self) -> str:
        return container_id(self.task_id)

    def dump(self) -> str:
        fields = dataclasses.asdict(self)
        return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in fields.items()})

    @classmethod
    def load(cls, text: str) -> ContainerRecord:
        raw = json.loads(text)
        return cls(
            task_id=str(raw["task_id"]),
            bundle=Path(raw["bundle"]),
            log=Path(raw["log"]),
            exit=Path(raw["exit"]),
            shim_pid=int(raw["shim_pid"]),
            image_reference=str(raw["image_reference"]),
            image_digest=str(raw["image_digest"]),
            rootfs=Path(raw["rootfs"]),
            host=str(raw.get("host", HOST)),
            user_ids=int(raw.get("user_ids", 0)),
        )


def container_id(task_id: str) -> str:
    return f"l9-{task_id}"


class RuncContainer:
    """One task's container, started by this agent (its shim a child of ours) or adopted from
    an agent before it (its shim a process we can only watch)."""

    def __init__(
        self,
        runtime: RuncRuntime,
        record: ContainerRecord,
        image: PulledImage,
        shim: asyncio.subprocess.Process | None,
        output: Callable[[bytes], None],
        offset: int,
        release: contextlib.ExitStack,
    ) -> None:
        self.id = record.container_id
        self.host = record.host
        self.bundle = record.bundle
        self.task_id = record.task_id
        self.image = image
        self.oom_killed = False
        self.limit_hit = ""
        self.storage_error = ""
        self.lost = ""
        self.netns: Path | None = None
        self.dialer: Callable[[int], Awaitable[Streams]] | None = None
        """Set by a runtime whose sandbox its netns does not reach (runsc)."""
        """Its network namespace (levers9.agent.task_network), set by its runtime."""
        self._runtime = runtime
        self._record = record
        self._shim = shim
        self._release = release
        self._exited = asyncio.create_task(self._shim_gone(), name=f"{self.id}-shim")
        self._relay = asyncio.create_task(
            _relay(record.log, offset, output, self._exited), name=f"{self.id}-output"
        )
        self._ending: asyncio.Task[int] | None = None

    @property
    def exited(self) -> bool:
        return self._exited.done()

    async def wait(self) -> int:
        if self._ending is None:
            self._ending = asyncio.create_task(self._end(), name=f"{self.id}-end")
        return await asyncio.shield(self._ending)

    async def stop(self, grace_s: float) -> int:
        """SIGTERM to every process of the container (not only its PID 1, which may ignore it,
        as a shell does), SIGKILL to every one once `grace_s` is over; returns once none is left."""
        if not self._exited.done():
            await self._runtime._signal(self.id, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self._exited), max(grace_s, 0))
            except TimeoutError:
                await self._runtime._signal(self.id, signal.SIGKILL)
        return await self.wait()

    async def checkpoint(self, path: Path, meta: dict[str, Any]) -> int:
        """Checkpoints it to the image folder `path` through its runtime (which ends it);
        returns the image's size. levers9.agent.checkpoints' errors when it cannot."""
        return await self._runtime.checkpoint(self, path, meta)

    async def _shim_gone(self) -> None:
        if self._shim is not None:
            await self._shim.wait()
            return
        # Not our child: no wait() to be had, only /proc to look at.
        while _shim_alive(self._record.shim_pid, self.id):  # noqa: ASYNC110
            await asyncio.sleep(SHIM_POLL_S)

    async def _end(self) -> int:
        await self._exited
        await drain(self._relay)
        code = _exit_status(self._record.exit)
        self.oom_killed = oom_killed(self.task_id)
        self.limit_hit = self._runtime._limit_hit(self._record)
        await self._runtime._remove(self.id)
        # Its volumes' last uploads (and its disks' sync) before its end is reported: off the
        # event loop, as they may take a while; the release below finds them done.
        self.storage_error = await self._runtime._detach_storage(self.task_id)
        self._release.close()
        self._runtime._forget(self.id)
        if code is None:
            # Its shim died before runc returned (killed with the agent's process group, say):
            # the container was killed above, its status is not to be had.
            self.lost = "the container's exit status was lost with its shim"
            return 128 + signal.SIGKILL
        return code


async def _relay(
    log_path: Path, offset: int, output: Callable[[bytes], None], exited: asyncio.Task[None]
) -> None:
    """The container's log file to `output`, from `offset`, as it grows; once the shim has
    exited (nothing writes any more), to its end."""
    pause = RELAY_POLL_S[0]
    with log_path.open("rb") as reader:
        reader.seek(offset)
        while True:
            done = exited.done()
            chunk = reader.read(OUTPUT_CHUNK)
            if chunk:
                output(chunk)
                pause = RELAY_POLL_S[0]
                continue
            if done:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(exited), pause)
            pause = min(pause * 2, RELAY_POLL_S[1])


def _shim_alive(pid: int, container: str) -> bool:
    """Whether `pid` is still the container's shim (not gone, not a zombie, not reused)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return False
    state = stat.rpartition(")")[2].split()[:1]
    return state not in (["Z"], ["X"], []) and container.encode() in cmdline.split(b"\0")


def _exit_status(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None
