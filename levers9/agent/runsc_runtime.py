"""The runsc runtime (`host: "runsc"`): each task in a gVisor sandbox, a kernel of its own in
user space between the task and the node's.

Everything but the runtime binary is the runc runtime's (levers9.agent.runc_runtime): the image
cache, the overlay bundle, the OCI config (levers9.agent.runc_config), the shim and its record,
adoption and the sweep. runsc speaks runc's command line; what differs is here:

- its global flags: `--platform=ptrace` (the platform every kernel has: systrap needs a newer
  gVisor than Debian's 2022 build, kvm needs /dev/kvm), `--network=none` (the sandbox has only
  its loopback, no way out);
- its published ports, reached through a relay inside the sandbox (`_relay`): the worker's
  static busybox, bound read-only at /.levers9/busybox, run by `runsc exec` per connection,
  checks the port listens (/proc/net/tcp) and relays it (`nc 127.0.0.1 PORT`) over the exec's
  stdio. Why not gVisor's own network stack (`--network=sandbox` on the task's namespace, which
  runs here once /proc/sys/net is hidden from this build's root-namespace check): its save
  refuses any TCP connection not closed (a server that closed first keeps one in FIN_WAIT2 or
  TIME_WAIT for 60 s), and this build's failed save ends the sandbox, so a box stopped within a
  minute of a request would be lost. Loopback connections save and restore; the relay's are
  loopback ones, so a checkpoint right after a request works;
- no `run --keep` (runsc has none): its cgroup goes with the sandbox, so an OOM kill is seen as
  the kill (exit 137), not named `OOMKilled`;
- what it cannot give a task, refused at start with the fix: cards (GPUs need gVisor's nvproxy,
  which this build lacks), and published ports on a worker without the relay's busybox;
- `exec` with a terminal: runsc has no `--tty`; the command's process JSON (the container's
  own, its args replaced) says `terminal: true` and the agent's terminal is handed in as its
  stdio, which the sandbox's kernel drives (its size, its line discipline).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import json
import os
import signal
import socket
import struct
import time
import tty as termios_tty
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from levers9.agent import checkpoints
from levers9.agent.images import ImageCache, PulledImage
from levers9.agent.runc_container import RuncContainer
from levers9.agent.runc_runtime import RuncRuntime
from levers9.agent.runtime import Container, ContainerSpec, StartError, Streams, exec_stdio
from levers9.logs import get_logger

log = get_logger("levers9.agent")

HOST = "runsc"
PLATFORM = "ptrace"
NETWORK = "none"
SANDBOX_KILL_AFTER_S = 0.5
"""How long `runsc kill --all KILL` has to end a sandbox before its process is killed."""
CHECKPOINT_MARGIN_BYTES = 16 * 1024**2
"""Room a checkpoint needs beyond the sandbox's memory and writable layer."""
LAYER_COPY_S = 600.0
"""How long the copy of a checkpointed task's writable layer may take."""
NO_GPUS = (
    "runsc (gVisor) on this worker cannot give a task GPUs: its gVisor has no nvproxy; run it"
    " with --runtime runc, or install a gVisor with nvproxy (release 20230605 or later) in the"
    " worker image"
)
RELAY = "/.levers9/busybox"
"""Where the relay binary is bound in every sandbox (read-only)."""
RELAY_SOURCE = Path("/bin/busybox")
"""The worker's static busybox (Debian's busybox-static): it runs in any image, even one with
no libc."""
LISTENING = b"+"
"""What the relay says once the port listens, before it relays."""
NO_PORTS = (
    "runsc (gVisor) on this worker cannot publish a task's ports: the relay into its sandbox,"
    f" a static busybox at {RELAY_SOURCE} (Debian's busybox-static), is not in the worker image;"
    " run it with --runtime runc"
)


class RunscRuntime(RuncRuntime):
    """Runs tasks in gVisor sandboxes (see the module's docstring)."""

    host = HOST
    RUN_FLAGS = ()
    USER_NAMESPACE = False
    """gVisor's own kernel stands between the task and the node's; this runsc (2022) refuses
    to join a user namespace by path (`gofer: error setting namespace of type user`)."""
    VOLUME_BACKEND = "s3fs"
    """Its gofer serves a volume's FUSE mount: files it creates through rclone 1.60's mount fail
    with EIO, through s3fs's they are made (tests/agent/test_storage.py)."""

    def __init__(
        self, images: ImageCache, state_dir: Path, relay: Path = RELAY_SOURCE, **options: Any
    ) -> None:
        """RuncRuntime's, with no cards (NO_GPUS) and runsc as its binary unless `runc` names
        another; `relay`, the static busybox its ports are relayed by."""
        super().__init__(images, state_dir, **{"runc": "runsc", **options, "cards": ()})
        self._checkpointing: dict[str, tuple[Path, Path, asyncio.Future[None]]] = {}
        """Containers being checkpointed: their bundle, where their layer goes, and its copy."""
        self._restoring: dict[str, str] = {}
        """Tasks being restored: the image digest their checkpoint was taken of."""
        self._relay_mounts = ((str(relay), RELAY),) if _is_static(relay) else ()
        """The relay's bind (`_own_mounts`), read once: the worker image does not change."""
        self._relays: set[asyncio.Task[None]] = set()
        """The relays running (each reaped when its connection ends)."""

    def _runc_argv(self, *args: str) -> list[str]:
        """`runsc --root <state> --platform=ptrace --network=none ARGS`."""
        root = super()._runc_argv()
        return [*root, f"--platform={PLATFORM}", f"--network={NETWORK}", *args]

    def _refuse(self, spec: ContainerSpec) -> str | None:
        if spec.gpu_indices:
            return NO_GPUS
        if spec.ports and not self._own_mounts():
            return NO_PORTS
        return super()._refuse(dataclasses.replace(spec, restore_from=None))

    def _own_mounts(self) -> tuple[tuple[str, str], ...]:
        """The relay (RELAY), in every sandbox whether or not it publishes ports, so that a
        checkpoint is restored into the same mounts; none on a worker without a static one."""
        return self._relay_mounts

    # -- its published ports (the module's docstring) ------------------------------------

    async def _relay(self, container: RuncContainer, port: int) -> Streams:
        """A connection to `port` of the sandbox: `runsc exec` of the relay, its stdin and
        stdout one end of a socket pair, the other returned. ConnectionRefusedError when
        nothing listens on the port."""
        ours, theirs = socket.socketpair()
        try:
            relay = await asyncio.create_subprocess_exec(
                *self._runc_argv("exec", container.id, RELAY, "sh", "-c", _relay_script(port)),
                stdin=theirs.fileno(),
                stdout=theirs.fileno(),
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        try:
            reader, writer = await asyncio.open_connection(sock=ours)
        except BaseException:
            ours.close()
            _kill(relay)
            raise
        try:
            said = await reader.read(len(LISTENING))
        except BaseException:
            writer.close()
            _kill(relay)
            raise
        if said != LISTENING:
            writer.close()
            assert relay.stderr is not None
            why = (await relay.stderr.read()).decode(errors="replace").strip()
            await relay.wait()
            raise ConnectionRefusedError(
                errno.ECONNREFUSED,
                f"nothing listens on port {port} in the sandbox"
                + (f" ({why.splitlines()[-1]})" if why else ""),
            )
        reaping = asyncio.create_task(_reap(relay))
        self._relays.add(reaping)
        reaping.add_done_callback(self._relays.discard)
        return reader, writer

    # -- checkpoint and restore (levers9.agent.checkpoints) --------------------------------

    async def checkpoint(self, container: RuncContainer, path: Path, meta: dict[str, Any]) -> int:
        """`runsc checkpoint` of the task's sandbox into a staging folder beside `path`, its
        writable layer copied there once the sandbox is gone (`_remove`), then sealed (manifest
        of checksums, fsync, rename: levers9.agent.checkpoints.seal); returns the image's size.
        The checkpoint ends the task. When `runsc checkpoint` fails the task runs on, nothing is
        left (CheckpointFailed says so); when what follows fails the task has ended and no
        image is left either."""
        if container.exited:
            raise checkpoints.CheckpointRefused(f"task {container.task_id} is not running")
        if await asyncio.to_thread(path.exists):
            raise checkpoints.CheckpointRefused(
                f"checkpoint {path.name} exists: delete it or take another name"
            )
        await self._room_for(container, path)
        staging = checkpoints.staging(path)
        copied: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._checkpointing[container.id] = (container.bundle, staging / checkpoints.LAYER, copied)
        started = time.monotonic()
        code, said = await checkpoints.probe(
            *self._runc_argv(
                "checkpoint", "--image-path", str(staging / checkpoints.STATE), container.id
            )
        )
        if code != 0:
            self._checkpointing.pop(container.id, None)
            checkpoints.discard(staging)
            # A save that failed leaves the sandbox's kernel paused: it goes on.
            await checkpoints.probe(*self._runc_argv("resume", container.id))
            running = not container.exited
            raise checkpoints.CheckpointFailed(
                f"runsc checkpoint failed: {said}; no image was kept and the task "
                + ("runs on" if running else "has ended")
            )
        dumped = time.monotonic()
        try:
            # The sandbox is gone: the container's end removes it, copying its writable layer
            # into the staging folder first (`_remove`).
            await asyncio.wait_for(container.wait(), LAYER_COPY_S)
            await copied
            size = await asyncio.to_thread(
                checkpoints.seal,
                staging,
                path,
                {**meta, "runtime": self.host, "image_digest": container.image.digest},
            )
        except BaseException:
            self._checkpointing.pop(container.id, None)
            checkpoints.discard(staging)
            raise
        log.info(
            "task checkpointed",
            task_id=container.task_id,
            image=str(path),
            bytes=size,
            checkpoint_s=round(dumped - started, 3),
            seal_s=round(time.monotonic() - dumped, 3),
        )
        return size

    async def _room_for(self, container: RuncContainer, path: Path) -> None:
        """CheckpointRefused when the image's filesystem has less room than the sandbox's memory
        and writable layer need (with a margin): this gVisor's save that fails midway (no space
        left) ends the sandbox, so that failure is refused before it can happen."""
        memory = await self._sandbox_stats(container.id)
        layer = await asyncio.to_thread(_tree_bytes, container.bundle / "layer" / "upper")
        await asyncio.to_thread(path.parent.mkdir, parents=True, exist_ok=True)
        room = await asyncio.to_thread(os.statvfs, path.parent)
        free = room.f_bavail * room.f_frsize
        needed = memory + layer + CHECKPOINT_MARGIN_BYTES
        if free < needed:
            raise checkpoints.CheckpointRefused(
                f"not enough room for checkpoint {path.name}: {free} bytes free in {path.parent},"
                f" about {needed} needed (memory {memory}, writable layer {layer}); the task runs"
                " on"
            )

    async def _sandbox_stats(self, container_id: str) -> int:
        """The sandbox's memory in use (`runsc events --stats`), 0 when it cannot be read."""
        code, said = await checkpoints.probe(*self._runc_argv("events", "--stats", container_id))
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return int(json.loads(said)["data"]["memory"]["usage"]["usage"]) if code == 0 else 0
        return 0

    async def _remove(self, container_id: str) -> None:
        held = self._checkpointing.pop(container_id, None)
        if held is not None:
            bundle, target, copied = held
            try:
                await checkpoints.copy_tree(bundle / "layer" / "upper", target)
            except Exception as error:  # told to the checkpoint, which fails with it
                if not copied.done():
                    copied.set_exception(error)
            else:
                if not copied.done():
                    copied.set_result(None)
        await super()._remove(container_id)

    async def _signal(self, container_id: str, sig: signal.Signals) -> None:
        """RuncRuntime's; on SIGKILL, the sandbox's own process too once the signal has been
        given a moment: this gVisor's sandbox of a restored container does not see its init
        end (`runsc ps` empty, `runsc restore` waiting on), so killing its processes alone
        never ends it."""
        sandbox = await self._sandbox_pid(container_id) if sig == signal.SIGKILL else 0
        await super()._signal(container_id, sig)
        if sandbox:
            await asyncio.sleep(SANDBOX_KILL_AFTER_S)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if _is_sandbox(sandbox):
                    os.kill(sandbox, signal.SIGKILL)

    async def _sandbox_pid(self, container_id: str) -> int:
        state = await asyncio.create_subprocess_exec(
            *self._runc_argv("state", container_id),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await state.communicate()
        with contextlib.suppress(ValueError, TypeError):
            return int(json.loads(out).get("pid", 0)) if state.returncode == 0 else 0
        return 0

    async def start(self, spec: ContainerSpec, output: Callable[[bytes], None]) -> Container:
        """RuncRuntime's; a restore's image verified first (every checksum, its runtime), its
        image's digest once pulled (`_start`)."""
        if spec.restore_from is not None and self._refuse(spec) is None:
            try:
                meta = await asyncio.to_thread(checkpoints.verify, spec.restore_from)
            except checkpoints.ImageInvalid as error:
                raise StartError(f"restore refused: {error}") from None
            if meta.get("runtime") != self.host:
                raise StartError(
                    f"restore refused: checkpoint {spec.restore_from.name} was taken under"
                    f" {meta.get('runtime')}, not {self.host}: restore it with its runtime"
                )
            self._restoring[spec.task_id] = str(meta.get("image_digest", ""))
        try:
            return await super().start(spec, output)
        finally:
            self._restoring.pop(spec.task_id, None)

    async def _start(
        self,
        spec: ContainerSpec,
        image: PulledImage,
        output: Callable[[bytes], None],
        release: contextlib.ExitStack,
    ) -> RuncContainer:
        wanted = self._restoring.get(spec.task_id)
        if wanted is not None and wanted != image.digest:
            name = spec.restore_from.name if spec.restore_from else ""
            raise StartError(
                f"restore refused: checkpoint {name} was taken of image {wanted}, and"
                f" {spec.image} is {image.digest}: restore it into the image it was taken of"
            )
        container = await super()._start(spec, image, output, release)
        container.dialer = functools.partial(self._relay, container)
        return container

    async def adopt(
        self, task_id: str, output: Callable[[bytes], None], offset: int
    ) -> Container | None:
        """RuncRuntime's, its ports reached through the relay as a started one's are."""
        container = await super().adopt(task_id, output, offset)
        if isinstance(container, RuncContainer):
            container.dialer = functools.partial(self._relay, container)
        return container

    def _run_argv(self, spec: ContainerSpec, bundle: Path, name: str) -> list[str]:
        """`runsc restore` of its image (which creates the sandbox: no `create` before it)."""
        if spec.restore_from is None:
            return super()._run_argv(spec, bundle, name)
        state = spec.restore_from / checkpoints.STATE
        return self._runc_argv("restore", "--image-path", str(state), "--bundle", str(bundle), name)

    def _layer_seed(self, spec: ContainerSpec) -> Path | None:
        return None if spec.restore_from is None else spec.restore_from / checkpoints.LAYER

    async def exec(
        self, container: Container, command: Sequence[str], terminal: int | None = None
    ) -> asyncio.subprocess.Process:
        """`runsc exec`; with `terminal`, the container's process JSON with its args replaced
        and `terminal: true`, the terminal given as its stdio."""
        if terminal is None or not isinstance(container, RuncContainer) or not command:
            return await super().exec(container, command, terminal)
        config = json.loads((container.bundle / "config.json").read_text())
        process = {**config["process"], "args": list(command), "terminal": True}
        path = container.bundle / f"exec-{uuid.uuid4().hex}.json"
        path.write_text(json.dumps(process))
        # The sandbox's terminal does the line discipline; this one only relays (see runc's).
        termios_tty.setraw(terminal)
        try:
            return await asyncio.create_subprocess_exec(
                *self._runc_argv("exec", "--process", str(path), container.id),
                **exec_stdio(terminal),
                start_new_session=True,
            )
        except FileNotFoundError:
            raise StartError(f"{self._runc} is not installed on this worker") from None


def _is_sandbox(pid: int) -> bool:
    """Whether `pid` is (still) a gVisor sandbox process (not reused by another)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"runsc-sandbox")
    except OSError:
        return False


def _tree_bytes(folder: Path) -> int:
    """What the files under `folder` hold (0 when it is not there)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


def _relay_script(port: int) -> str:
    """The relay's shell (busybox's): `LISTENING` and the relay when something listens on
    `port` (state 0A in /proc/net/tcp or tcp6), else exit 3 saying so."""
    listens = f"^ *[0-9]+: [0-9A-F]+:{port:04X} [0-9A-F]+:[0-9A-F]+ 0A "
    return (
        f"{RELAY} grep -qsE '{listens}' /proc/net/tcp /proc/net/tcp6"
        f" || {{ echo 'port {port}: not listening' >&2; exit 3; }};"
        f" printf {LISTENING.decode()}; exec {RELAY} nc 127.0.0.1 {port}"
    )


async def _reap(relay: asyncio.subprocess.Process) -> None:
    """Waits for a relay's end (its connection's), its stderr read so that it never blocks."""
    if relay.stderr is not None:
        with contextlib.suppress(OSError):
            await relay.stderr.read()
    await relay.wait()


def _kill(relay: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        relay.kill()


PT_INTERP = 3


def _is_static(path: Path) -> bool:
    """Whether `path` is a 64-bit ELF executable with no interpreter (it needs no libc in the
    image it runs in)."""
    try:
        with path.open("rb") as binary:
            head = binary.read(64)
            if len(head) < 64 or head[:5] != b"\x7fELF\x02":
                return False
            order = "<" if head[5] == 1 else ">"
            (phoff,) = struct.unpack_from(order + "Q", head, 32)
            phentsize, phnum = struct.unpack_from(order + "HH", head, 54)
            binary.seek(phoff)
            table = binary.read(phentsize * phnum)
        kinds = [struct.unpack_from(order + "I", table, i * phentsize)[0] for i in range(phnum)]
    except (OSError, struct.error):  # unreadable, or a truncated program header table
        return False
    return PT_INTERP not in kinds
