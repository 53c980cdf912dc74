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
from collections.abc import Callable, Mapping, Sequence
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
    Container,
    ContainerSpec,
    ImageUnavailable,
    StartError,
    drain,
    exec_stdio,
    pump_output,
    visible_devices,
)

log = get_logger("levers9.worker")

HOST = "runc"
TASK_MOUNT = "/levers9"
"""The folder of the task's result file inside its container (`LEVERS9_RESULT_PATH`)."""
RUNNING_WITHIN_S = 30.0
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


class RuncContainer:
    """One task's running container."""

    host = HOST

    def __init__(
        self,
        runtime: RuncRuntime,
        task_id: str,
        container_id: str,
        process: asyncio.subprocess.Process,
        pump: asyncio.Task[None],
        image: PulledImage,
        release: contextlib.ExitStack,
    ) -> None:
        self.id = container_id
        self.task_id = task_id
        self.image = image
        self.oom_killed = False
        self._runtime = runtime
        self._process = process
        self._pump = pump
        self._release = release
        self._code: int | None = None

    async def wait(self) -> int:
        if self._code is not None:
            return self._code
        code = await self._process.wait()
        await drain(self._pump)
        self.oom_killed = oom_killed(self.task_id)
        await self._runtime._remove(self.id)
        self._release.close()
        self._code = 128 - code if code < 0 else code
        return self._code

    async def stop(self, grace_s: float) -> int:
        """SIGTERM to every process of the container (not only its PID 1, which may ignore it,
        as a shell does), SIGKILL to every one once `grace_s` is over; returns once none is left."""
        if self._process.returncode is None:
            await self._runtime._signal(self.id, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(self._process.wait()), max(grace_s, 0))
            except TimeoutError:
                await self._runtime._signal(self.id, signal.SIGKILL)
        return await self.wait()


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
        container_id = f"l9-{spec.task_id}"
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
        process = await asyncio.create_subprocess_exec(
            # --keep: its cgroup stays until _remove, an OOM kill is read there first.
            *self._runc_argv("run", "--keep", "--bundle", str(bundle), container_id),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        assert process.stdout is not None
        pump = pump_output(process.stdout, output)
        await self._running(container_id, process)
        log.info(
            "container started",
            task_id=spec.task_id,
            image=image.reference,
            digest=image.digest,
            cached=image.cached,
            cards=list(spec.gpu_indices),
        )
        return RuncContainer(self, spec.task_id, container_id, process, pump, image, release)

    async def _running(self, container_id: str, process: asyncio.subprocess.Process) -> None:
        """Returns once runc has created the container (so `exec` finds it) or the container
        has already ended; `runc run` forks it a moment after it is spawned."""
        deadline = asyncio.get_running_loop().time() + RUNNING_WITHIN_S
        while process.returncode is None:
            state = await asyncio.create_subprocess_exec(
                *self._runc_argv("state", container_id),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
            )
            out, _ = await state.communicate()
            if state.returncode == 0 and json.loads(out).get("status") in ("running", "stopped"):
                return
            if asyncio.get_running_loop().time() > deadline:
                await self._signal(container_id, signal.SIGKILL)
                raise StartError(f"runc did not create the container within {RUNNING_WITHIN_S} s")
            await asyncio.sleep(0.01)

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
