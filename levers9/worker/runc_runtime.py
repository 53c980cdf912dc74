"""The runc runtime (`host: "runc"`): each task in an OCI container of its own image.

For each task: its image from the node's cache (`images.ImageCache`: pulled and unpacked once
per digest), a bundle under the task's directory whose root is an overlay (the cached root
filesystem read-only below, a writable layer of the task's own above), and a `config.json`
made from the image by `umoci raw runtime-config` (which honours the image's Entrypoint, Cmd,
Env, WorkingDir and User as Docker does, resolving a user name in the image's /etc/passwd),
then narrowed here:

- its own PID, mount, IPC and UTS namespaces, and the agent's network namespace: the host's,
  or the pod's when the pool runs on the pod network (tunnel mode);
- runc's default capabilities, `noNewPrivileges`, and memory, CPU and pids limits;
- device nodes for its cards only, from the worker's CDI spec (levers9.worker.cdi):
  `/dev/nvidiaN` for each of its indices, plus `/dev/nvidiactl`, `/dev/nvidia-uvm`,
  `/dev/nvidia-uvm-tools` and `/dev/nvidia-modeset` when the node has them, with cgroup device
  rules that allow those and nothing else of the host's;
- the driver's directories (`/usr/local/nvidia`, the spec's mount) read-only,
  `NVIDIA_VISIBLE_DEVICES` as the process runtime sets it, and the task's own directory at
  `/levers9` for its result file;
- an environment of the image's, the task's and those few variables only: nothing of the
  agent's (its token never sits in any environment a task can read), and none of the agent's
  files (its Secret, its /proc) inside the container.

The command replaces the image's Cmd and keeps its Entrypoint, as `docker run IMAGE CMD`.

Each container runs under a shim of its own session (SHIM: `runc run` in the foreground, the
container's output appended to `container.log` in the task's folder, its exit status written
beside it), with a record beside the runc root (`ContainerRecord`): an agent that is SIGKILLed
leaves its containers running, and one started after it on the same work dir adopts them
(`adopt`: output from where it was, the exit status once it comes) or kills them (`sweep`).
Stopping signals every process of the container (`runc kill --all`), SIGTERM then SIGKILL after
the grace, and returns once its cgroup is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import resource
import shutil
import signal
import subprocess
import time
import tty as termios_tty
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers9.image_reference import ImageReferenceError
from levers9.logs import get_logger
from levers9.worker import cdi
from levers9.worker.cdi import DRIVER_ROOT, DeviceNode
from levers9.worker.images import (
    ImageCache,
    ImageConfig,
    ImagePullError,
    PulledImage,
)
from levers9.worker.runtime import (
    OUTPUT_CHUNK,
    Container,
    ContainerSpec,
    ImageUnavailable,
    StartError,
    drain,
    exec_stdio,
    visible_devices,
)

log = get_logger("levers9.worker")

HOST = "runc"
TASK_MOUNT = "/levers9"
"""The folder of the task's result file inside its container (`LEVERS9_RESULT_PATH`)."""
RUNNING_WITHIN_S = 30.0
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
"""How long runc may take to create a container before the start is a failure."""
NOFILE = 1_048_576
SHM_DEFAULT_BYTES = 8 * 1024**3
"""/dev/shm's cap without a memory limit (tmpfs: nothing is reserved)."""


@dataclass(frozen=True)
class Limits:
    """Per container; None: unlimited."""

    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = 32768


def container_config(
    base: Mapping[str, Any],
    spec: ContainerSpec,
    image: ImageConfig,
    devices: Sequence[DeviceNode],
    *,
    mounts: Sequence[tuple[str, str]] = (),
    limits: Limits = Limits(),
    resolv_conf: Path | None = Path("/etc/resolv.conf"),
) -> dict[str, Any]:
    """The task's OCI runtime config, from the image's (`base`: umoci's) and the task (pure).
    `devices` and `mounts` (host path, container path; read-only) are its CDI edits."""
    config: dict[str, Any] = json.loads(json.dumps(base))
    process = config["process"]
    if spec.command:
        process["args"] = [*image.entrypoint, *spec.command]
    if not process.get("args"):
        raise StartError("the task gives no command and its image has neither Entrypoint nor Cmd")
    env = dict(e.split("=", 1) for e in process.get("env") or [] if "=" in e)
    env.update(spec.env)
    env["NVIDIA_VISIBLE_DEVICES"] = visible_devices(spec.gpu_indices)
    env["LEVERS9_TASK_ID"] = spec.task_id
    env["LEVERS9_RESULT_PATH"] = f"{TASK_MOUNT}/{spec.result_path.name}"
    if any(container == DRIVER_ROOT for _, container in mounts):
        env["PATH"] = ":".join(
            [f"{DRIVER_ROOT}/bin", *[p for p in env.get("PATH", "").split(":") if p]]
        )
        env["LD_LIBRARY_PATH"] = ":".join(
            [f"{DRIVER_ROOT}/lib64", *[p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]]
        )
    process["env"] = [f"{k}={v}" for k, v in env.items()]
    process["terminal"] = False
    process["noNewPrivileges"] = True
    # As many as the agent may open (Docker gives 1048576), not umoci's 1024: data loaders and
    # NCCL open many files; above the agent's own hard limit runc's init is refused.
    nofile = min(NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    process["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile}]
    config["root"] = {"path": "rootfs", "readonly": False}
    config["hostname"] = f"task-{spec.task_id}"[:63]

    binds = [m for m in config.get("mounts") or [] if m.get("destination") != TASK_MOUNT]
    for mount in binds:
        if mount.get("destination") == "/dev/shm":
            # PyTorch's DataLoader and NCCL share tensors through /dev/shm: 64 MiB (Docker's
            # and umoci's default) is the classic "bus error"; it counts against the limit.
            size = limits.memory_bytes or SHM_DEFAULT_BYTES
            options = [o for o in mount.get("options", []) if not o.startswith("size=")]
            mount["options"] = [*options, f"size={size}"]
    binds.append(_bind(str(spec.result_path.parent), TASK_MOUNT, read_only=False))
    for host, container in mounts:
        binds.append(_bind(host, container, read_only=True))
    if resolv_conf is not None and resolv_conf.exists():
        binds.append(_bind(str(resolv_conf), "/etc/resolv.conf", read_only=True))
    config["mounts"] = binds

    linux = config.setdefault("linux", {})
    linux["cgroupsPath"] = cgroup_path(spec.task_id)
    namespaces = [n for n in linux.get("namespaces") or [] if n.get("type") != "network"]
    for kind in ("pid", "ipc", "uts", "mount"):
        if not any(n.get("type") == kind for n in namespaces):
            namespaces.append({"type": kind})
    linux["namespaces"] = namespaces
    linux["devices"] = [
        {
            "path": d.path,
            "type": "c",
            "major": d.major,
            "minor": d.minor,
            "fileMode": 0o666,
            "uid": 0,
            "gid": 0,
        }
        for d in devices
    ]
    resources = linux.setdefault("resources", {})
    resources["devices"] = [
        {"allow": False, "access": "rwm"},
        *(
            {"allow": True, "type": "c", "major": d.major, "minor": d.minor, "access": "rwm"}
            for d in devices
        ),
    ]
    if limits.memory_bytes is not None:
        resources["memory"] = {"limit": limits.memory_bytes, "swap": limits.memory_bytes}
    if limits.cpus is not None:
        period = 100_000
        resources["cpu"] = {"quota": int(limits.cpus * period), "period": period}
    if limits.pids is not None:
        resources["pids"] = {"limit": limits.pids}
    return config


def cgroup_path(task_id: str) -> str:
    """The container's cgroup, under one of ours (relative to each hierarchy's root)."""
    return f"/levers9/l9-{task_id}"


def oom_killed(task_id: str, cgroup_root: Path = Path("/sys/fs/cgroup")) -> bool:
    """Whether the kernel's OOM killer killed a process of the task's cgroup: cgroup v1's
    `memory.oom_control` (`oom_kill N`) or v2's `memory.events` (`oom_kill N`). Read before
    the container is deleted (its cgroup goes with it)."""
    relative = cgroup_path(task_id).lstrip("/")
    for path in (
        cgroup_root / "memory" / relative / "memory.oom_control",
        cgroup_root / relative / "memory.events",
        cgroup_root / "unified" / relative / "memory.events",
    ):
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                    return True
    return False


def cgroup_dirs(task_id: str, cgroup_root: Path = Path("/sys/fs/cgroup")) -> list[Path]:
    """The container's cgroup in each hierarchy it exists in (v1's per controller, v2's)."""
    relative = cgroup_path(task_id).lstrip("/")
    found = [cgroup_root / relative] if (cgroup_root / relative).is_dir() else []
    with contextlib.suppress(OSError):
        for hierarchy in sorted(cgroup_root.iterdir()):
            if (hierarchy / relative).is_dir():
                found.append(hierarchy / relative)
    return found


def remove_cgroups(
    task_id: str, cgroup_root: Path = Path("/sys/fs/cgroup"), within_s: float = 10.0
) -> list[str]:
    """SIGKILL to every process still in the container's cgroups, then removes them; the ones
    that could not be removed (named, for the log), none when all went."""
    deadline = time.monotonic() + within_s
    left = cgroup_dirs(task_id, cgroup_root)
    while left:
        for directory in left:
            _kill_members(directory)
            with contextlib.suppress(OSError):
                directory.rmdir()
        left = [d for d in left if d.is_dir()]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    return [str(d) for d in left]


def _kill_members(directory: Path) -> None:
    kill = directory / "cgroup.kill"
    if kill.exists():  # cgroup v2 (5.14+): the kernel kills them all at once
        with contextlib.suppress(OSError):
            kill.write_text("1")
        return
    with contextlib.suppress(OSError):
        for pid in (directory / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)


def _bind(source: str, destination: str, read_only: bool) -> dict[str, Any]:
    options = ["rbind", "nosuid", "nodev", "ro" if read_only else "rw"]
    return {"type": "bind", "source": source, "destination": destination, "options": options}


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
        )


def container_id(task_id: str) -> str:
    return f"l9-{task_id}"


class RuncContainer:
    """One task's container, started by this agent (its shim a child of ours) or adopted from
    an agent before it (its shim a process we can only watch)."""

    host = HOST

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
        self.task_id = record.task_id
        self.image = image
        self.oom_killed = False
        self.lost = ""
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
        await self._runtime._remove(self.id)
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


class RuncRuntime:
    """Runs tasks in runc containers (see the module's docstring)."""

    def __init__(
        self,
        images: ImageCache,
        state_dir: Path,
        *,
        dev_root: Path = Path("/dev"),
        driver_root: Path = Path(DRIVER_ROOT),
        cards: Sequence[int] | None = None,
        limits: Limits = Limits(),
        runc: str = "runc",
        umoci: str = "umoci",
    ) -> None:
        """`cards`: the worker's (default: every `/dev/nvidiaN` of the node). Generates their
        CDI spec (levers9.worker.cdi) and writes it beside `state_dir`; raises cdi.CdiError
        when it cannot (the worker then exits with `failed to generate CDI spec`)."""
        self._images = images
        self._state = state_dir
        self._limits = limits
        self._runc, self._umoci = runc, umoci
        held = cdi.node_cards(dev_root) if cards is None else cards
        self._cdi = cdi.generate(dev_root, driver_root, held)
        state_dir.mkdir(parents=True, exist_ok=True)
        self._records = state_dir.parent / "containers"
        self._records.mkdir(exist_ok=True)
        self.cdi_spec = cdi.write(self._cdi, state_dir.parent / "cdi")

    def _runc_argv(self, *args: str) -> list[str]:
        """`runc --root <this worker's state> ARGS`."""
        return [self._runc, "--root", str(self._state), *args]

    @property
    def host(self) -> str:
        return HOST

    def host_for(self, image: str) -> str:
        return HOST

    async def start(self, spec: ContainerSpec, output: Callable[[bytes], None]) -> Container:
        if not spec.image:
            raise StartError("the task names no image")
        try:
            image = await self._images.pull(spec.image)
        except (ImagePullError, ImageReferenceError) as error:
            raise ImageUnavailable(str(error)) from None
        release = contextlib.ExitStack()
        release.enter_context(self._images.in_use(image.digest))
        try:
            return await self._start(spec, image, output, release)
        except BaseException:
            release.close()
            raise

    async def _start(
        self,
        spec: ContainerSpec,
        image: PulledImage,
        output: Callable[[bytes], None],
        release: contextlib.ExitStack,
    ) -> RuncContainer:
        name = container_id(spec.task_id)
        bundle = spec.work_dir.parent / "bundle"
        spec.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            edits = cdi.edits(self._cdi, spec.gpu_indices)
        except cdi.UnresolvableDevices as error:
            raise StartError(str(error)) from None
        base = await self._runtime_config(image, bundle)
        # The result folder is the container user's to write (the image's User, often not root).
        results = spec.result_path.parent
        results.mkdir(parents=True, exist_ok=True)
        user = base.get("process", {}).get("user", {})
        os.chown(results, int(user.get("uid", 0)), int(user.get("gid", 0)))
        limits = dataclasses.replace(
            self._limits,
            memory_bytes=spec.memory_bytes or self._limits.memory_bytes,
            cpus=spec.cpu_millis / 1000 if spec.cpu_millis else self._limits.cpus,
        )
        config = container_config(
            base,
            spec,
            image.config,
            edits.device_nodes,
            mounts=edits.mounts,
            limits=limits,
        )
        await self._overlay(image.rootfs, bundle)
        release.callback(_unmount, bundle / "rootfs")
        (bundle / "config.json").write_text(json.dumps(config))
        log_path, exit_path = spec.work_dir.parent / "container.log", spec.work_dir.parent / "exit"
        exit_path.unlink(missing_ok=True)
        log_path.write_bytes(b"")
        shim = await asyncio.create_subprocess_exec(
            "sh",
            "-c",
            SHIM,
            "levers9-shim",
            str(log_path),
            str(exit_path),
            # --keep: its cgroup stays until _remove, an OOM kill is read there first.
            *self._runc_argv("run", "--keep", "--bundle", str(bundle), name),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            # Its own session: neither a signal to the agent's group nor the agent's end
            # reaches it; a restarted agent adopts the container (adopt).
            start_new_session=True,
        )
        record = ContainerRecord(
            task_id=spec.task_id,
            bundle=bundle,
            log=log_path,
            exit=exit_path,
            shim_pid=shim.pid,
            image_reference=image.reference,
            image_digest=image.digest,
            rootfs=image.rootfs,
        )
        self._keep(record)
        container = RuncContainer(self, record, image, shim, output, 0, release)
        await self._running(container)
        log.info(
            "container started",
            task_id=spec.task_id,
            image=image.reference,
            digest=image.digest,
            cached=image.cached,
            cards=list(spec.gpu_indices),
        )
        return container

    async def _running(self, container: RuncContainer) -> None:
        """Returns once runc has created the container (so `exec` finds it) or the container
        has already ended; `runc run` forks it a moment after it is spawned."""
        deadline = asyncio.get_running_loop().time() + RUNNING_WITHIN_S
        while not container.exited:
            if await self._status(container.id) in ("running", "stopped"):
                return
            if asyncio.get_running_loop().time() > deadline:
                await container.stop(0)
                raise StartError(f"runc did not create the container within {RUNNING_WITHIN_S} s")
            await asyncio.sleep(0.01)

    async def _status(self, name: str) -> str:
        """runc's word for the container ("created", "running", "stopped"), "" without one."""
        state = await asyncio.create_subprocess_exec(
            *self._runc_argv("state", name),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await state.communicate()
        return str(json.loads(out).get("status", "")) if state.returncode == 0 else ""

    # -- what an agent before this one left ------------------------------------------------

    async def adopt(
        self, task_id: str, output: Callable[[bytes], None], offset: int
    ) -> Container | None:
        """The container an agent before this one started for the task, followed from here:
        its output from `offset` of its log, its exit status once it ends; None when there is
        no record of one."""
        try:
            record = ContainerRecord.load(self._record_path(container_id(task_id)).read_text())
        except (OSError, ValueError, KeyError) as error:
            log.info("no container to adopt", task_id=task_id, why=str(error))
            return None
        image = PulledImage(
            reference=record.image_reference,
            digest=record.image_digest,
            rootfs=record.rootfs,
            config=ImageConfig(),
            cached=True,
            bytes_pulled=0,
        )
        release = contextlib.ExitStack()
        release.enter_context(self._images.in_use(record.image_digest))
        release.callback(_unmount, record.bundle / "rootfs")
        container = RuncContainer(self, record, image, None, output, offset, release)
        log.info(
            "container adopted",
            task_id=task_id,
            status=await self._status(record.container_id) or "gone",
            shim_alive=not container.exited,
        )
        return container

    async def sweep(self, keep: Collection[str]) -> list[str]:
        """Kills and removes every container of this runc root, and what it left (cgroups, its
        overlay, its record), but those of the tasks in `keep`; returns their tasks' ids."""
        listed = await self._list()
        recorded = {p.stem: p for p in self._records.glob("*.json")}
        swept = []
        for name in sorted(set(listed) | set(recorded)):
            task_id = name.removeprefix("l9-")
            if task_id in keep:
                continue
            bundle = listed.get(name)
            with contextlib.suppress(OSError, ValueError, KeyError):
                bundle = bundle or ContainerRecord.load(recorded[name].read_text()).bundle
            await self._signal(name, signal.SIGKILL)
            await self._remove(name)
            if bundle is not None:
                await asyncio.to_thread(_unmount, bundle / "rootfs")
            self._forget(name)
            log.warning("container swept", task_id=task_id, bundle=str(bundle or ""))
            swept.append(task_id)
        return swept

    async def _list(self) -> dict[str, Path | None]:
        """The containers of this runc root, by id, with their bundles."""
        listed = await asyncio.create_subprocess_exec(
            *self._runc_argv("list", "--format", "json"),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        out, _ = await listed.communicate()
        try:
            entries = json.loads(out or b"null") or []
        except ValueError:
            entries = []
        return {
            str(e["id"]): Path(e["bundle"]) if e.get("bundle") else None
            for e in entries
            if isinstance(e, dict) and e.get("id")
        }

    def _record_path(self, name: str) -> Path:
        return self._records / f"{name}.json"

    def _keep(self, record: ContainerRecord) -> None:
        path = self._record_path(record.container_id)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(record.dump())
        temporary.replace(path)

    def _forget(self, name: str) -> None:
        self._record_path(name).unlink(missing_ok=True)

    async def _runtime_config(self, image: PulledImage, bundle: Path) -> dict[str, Any]:
        """umoci's runtime config for the image (its user resolved in the cached root)."""
        await asyncio.to_thread(shutil.rmtree, bundle, True)
        await asyncio.to_thread(bundle.mkdir, parents=True)
        target = bundle / "image-config.json"
        tag = f"sha256-{image.digest.removeprefix('sha256:')}"
        await _run(
            self._umoci,
            "raw",
            "runtime-config",
            "--image",
            f"{self._images.layout}:{tag}",
            "--rootfs",
            str(image.rootfs),
            str(target),
        )
        document: dict[str, Any] = json.loads(target.read_text())
        return document

    async def _overlay(self, lower: Path, bundle: Path) -> None:
        upper, work, root = bundle / "upper", bundle / "overlay-work", bundle / "rootfs"
        for folder in (upper, work, root):
            folder.mkdir(parents=True, exist_ok=True)
        await _run(
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={lower},upperdir={upper},workdir={work}",
            str(root),
        )

    async def _signal(self, container_id: str, sig: signal.Signals) -> None:
        """`sig` to every process in the container's cgroup (`runc kill --all`)."""
        with contextlib.suppress(StartError):
            await _run(*self._runc_argv("kill", "--all", container_id, sig.name))

    async def _remove(self, container_id: str) -> None:
        """Deletes the container (SIGKILL to whatever is left in it) and its cgroup; a cgroup
        runc left (a process that outlived its init in a shared PID namespace, a delete that
        failed) is emptied and removed here."""
        with contextlib.suppress(StartError):
            await _run(*self._runc_argv("delete", "--force", container_id))
        left = await asyncio.to_thread(remove_cgroups, container_id.removeprefix("l9-"))
        if left:
            log.error("container cgroup left behind", container=container_id, cgroups=left)

    async def exec(
        self, container: Container, command: Sequence[str], terminal: int | None = None
    ) -> asyncio.subprocess.Process:
        """`runc exec`; with `terminal`, `runc exec --tty` on it: runc gives the command a
        terminal inside the container (its /dev/pts), relays it to `terminal`, takes its size
        from `terminal` and follows it on SIGWINCH."""
        if not isinstance(container, RuncContainer):
            raise StartError("not a container of the runc runtime")
        if not command:
            raise StartError("exec needs a command")
        tty = []
        if terminal is not None:
            # The container's own terminal (runc's, in its /dev/pts) does the line discipline;
            # this one only relays, so it must not translate too (`\r\r\n`, a double echo):
            # raw before runc starts rather than whenever runc gets to setting it so.
            termios_tty.setraw(terminal)
            tty = ["--tty"]
        return await asyncio.create_subprocess_exec(
            *self._runc_argv("exec", *tty, container.id, *command),
            **exec_stdio(terminal),
            start_new_session=True,
        )


async def _run(*argv: str) -> None:
    try:
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )
    except FileNotFoundError:
        raise StartError(f"{argv[0]} is not installed on this worker") from None
    _, err = await process.communicate()
    if process.returncode != 0:
        words = err.decode(errors="replace").strip().splitlines()
        raise StartError(f"{argv[0]} {argv[1]}: {words[-1] if words else 'failed'}")


def _unmount(root: Path) -> None:
    """The task's overlay, once its container is gone (lazily: nothing may hold it by then)."""
    subprocess.run(["umount", "-l", str(root)], capture_output=True, check=False, timeout=30)
