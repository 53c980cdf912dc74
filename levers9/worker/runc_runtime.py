"""The runc runtime (`host: "runc"`): each task in an OCI container of its own image.

For each task: its image from the node's cache (`images.ImageCache`: pulled and unpacked once
per digest), a bundle under the task's directory whose root is an overlay (the cached root
filesystem read-only below, a writable layer of the task's own above), and a `config.json`
made from the image by `umoci raw runtime-config`, then narrowed for the task
(levers9.worker.runc_config: namespaces, limits, its cards' devices, the driver, its env).

Each container runs under a shim of its own session, with a record beside the runc root
(levers9.worker.runc_container): an agent that is SIGKILLed leaves its containers running, and
one started after it on the same work dir adopts them (`adopt`: output from where it was, the
exit status once it comes) or kills them (`sweep`). Stopping signals every process of the
container (`runc kill --all`), SIGTERM then SIGKILL after the grace, and returns once its cgroup
is gone (levers9.worker.cgroups).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import tty as termios_tty
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from levers9.core.image_reference import ImageReferenceError
from levers9.logs import get_logger
from levers9.worker import cdi
from levers9.worker.cdi import DRIVER_ROOT
from levers9.worker.cgroups import remove_cgroups
from levers9.worker.images import (
    ImageCache,
    ImageConfig,
    ImagePullError,
    PulledImage,
)
from levers9.worker.runc_config import DEFAULT_LIMITS, Limits, container_config
from levers9.worker.runc_container import HOST, SHIM, ContainerRecord, RuncContainer, container_id
from levers9.worker.runtime import (
    Container,
    ContainerSpec,
    ImageUnavailable,
    StartError,
    exec_stdio,
)

log = get_logger("levers9.worker")

RUNNING_WITHIN_S = 30.0
"""How long runc may take to create a container before the start is a failure."""


class RuncRuntime:
    """Runs tasks in runc containers (see the module's docstring). A runtime speaking runc's
    command line (runsc) subclasses it: its name (`host`), its global flags (`_runc_argv`),
    what `run` adds (`RUN_FLAGS`), what a task may ask of it (`_refuse`) and its `exec`."""

    host: str = HOST
    """What TaskStatus.host reports, and the tag of its containers' records."""
    RUN_FLAGS: tuple[str, ...] = ("--keep",)
    """`run --keep`: its cgroup stays until _remove, an OOM kill is read there first."""

    def __init__(
        self,
        images: ImageCache,
        state_dir: Path,
        *,
        dev_root: Path = Path("/dev"),
        driver_root: Path = Path(DRIVER_ROOT),
        cards: Sequence[int] | None = None,
        limits: Limits = DEFAULT_LIMITS,
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

    def host_for(self, image: str, runtime: str = "") -> str:
        return self.host

    def _refuse(self, spec: ContainerSpec) -> str | None:
        """Why this runtime cannot run the task (None: it can)."""
        return None if spec.image else "the task names no image"

    async def start(self, spec: ContainerSpec, output: Callable[[bytes], None]) -> Container:
        refused = self._refuse(spec)
        if refused is not None:
            raise StartError(refused)
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
            *self._runc_argv("run", *self.RUN_FLAGS, "--bundle", str(bundle), name),
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
            host=self.host,
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
        if record.host != self.host:
            return None  # another runtime's (runc's or runsc's) container
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
        recorded = {p.stem: p for p in self._records.glob("*.json") if self._owns(p)}
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

    def _owns(self, path: Path) -> bool:
        """Whether the record at `path` is of this runtime's containers (an unreadable one is
        runc's: records older than the runtime's tag were all runc's)."""
        try:
            return ContainerRecord.load(path.read_text()).host == self.host
        except (OSError, ValueError, KeyError):
            return self.host == HOST

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
            raise StartError(f"not a container of the {self.host} runtime")
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
