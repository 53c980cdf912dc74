"""The runc runtime (`host: "runc"`): each task in an OCI container of its own image.

For each task: its image from the node's cache (`images.ImageCache`: pulled and unpacked once
per digest, and once per digest and user-namespace range owned by that range), a bundle under
the task's directory whose root is an overlay (the cached root filesystem read-only below, a
writable layer of the task's own above, on a filesystem of its own of `Limits.disk_bytes`), and
a `config.json` made from the image by `umoci raw runtime-config`, then narrowed for the task
(levers9.agent.runc_config: namespaces, its user namespace and seccomp profile, limits, its
cards' devices, the driver, its env). The task's range is claimed from the node's slots
(levers9.agent.id_ranges) and held by its shim; its user namespace is made with its network
namespace in it (levers9.agent.task_network). A task's end names the limit it ran into
(`_limit_hit`: pids, disk; the memory limit is the container's `oom_killed`).

Each container runs under a shim of its own session, with a record beside the runc root
(levers9.agent.runc_container): an agent that is SIGKILLed leaves its containers running, and
one started after it on the same work dir adopts them (`adopt`: output from where it was, the
exit status once it comes) or kills them (`sweep`). Stopping signals every process of the
container (`runc kill --all`), SIGTERM then SIGKILL after the grace, and returns once its cgroup
is gone (levers9.agent.cgroups).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tty as termios_tty
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from levers9.agent import cdi, checkpoints
from levers9.agent.cdi import DRIVER_ROOT
from levers9.agent.cgroups import TASK_ROOTS, pids_limited, remove_cgroups
from levers9.agent.disks import Owner
from levers9.agent.id_ranges import FIRST_ID, IdRange, IdRanges, NoIdRange, slot_of
from levers9.agent.images import (
    ImageCache,
    ImageConfig,
    ImagePullError,
    PulledImage,
)
from levers9.agent.runc_config import DEFAULT_LIMITS, Limits, UserNamespace, container_config
from levers9.agent.runc_container import HOST, SHIM, ContainerRecord, RuncContainer, container_id
from levers9.agent.runtime import (
    NO_IMAGE,
    Container,
    ContainerSpec,
    ImageUnavailable,
    StartError,
    exec_stdio,
)
from levers9.agent.seccomp import DEFAULT_PROFILE, load_profile
from levers9.agent.task_network import TaskNetworks
from levers9.agent.task_storage import TaskStorage
from levers9.core.image_reference import ImageReferenceError
from levers9.core.workspaces import name_problem
from levers9.logs import get_logger

log = get_logger("levers9.agent")

LAYER_FILE = "layer.ext4"
"""The task's writable layer's filesystem, a sparse file in its bundle."""
DISK_FULL_BELOW = 1024**2
"""A writable layer with less than this free (or no inode) is full: the task's failure says so."""
RUNNING_WITHIN_S = 30.0
NO_RESTORE = (
    "runc cannot restore a checkpoint on this worker: its checkpoints need CRIU, which the agent"
    " does not drive; restore it with --runtime runsc (a checkpoint is restored only into the"
    " runtime that took it)"
)
"""How long runc may take to create a container before the start is a failure."""


class RuncRuntime:
    """Runs tasks in runc containers (see the module's docstring). A runtime speaking runc's
    command line (runsc) subclasses it: its name (`host`), its global flags (`_runc_argv`),
    what `run` adds (`RUN_FLAGS`), what a task may ask of it (`_refuse`) and its `exec`."""

    host: str = HOST
    """What TaskStatus.host reports, and the tag of its containers' records."""
    RUN_FLAGS: tuple[str, ...] = ("--keep",)
    """`run --keep`: its cgroup stays until _remove, an OOM kill is read there first."""
    USER_NAMESPACE = True
    """Each task in a user namespace of its own range (levers9.agent.id_ranges)."""
    SECCOMP = True
    """Each task under the seccomp profile (levers9.agent.seccomp)."""
    VOLUME_BACKEND = ""
    """What FUSE-mounts its tasks' volumes (levers9.agent.volumes.BACKENDS); "": the
    storage's (rclone)."""

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
        seccomp_profile: Path | None = None,
        id_ranges: IdRanges | None = None,
        networks: TaskNetworks | None = None,
        storage: TaskStorage | None = None,
    ) -> None:
        """`cards`: the worker's (default: every `/dev/nvidiaN` of the node). Generates their
        CDI spec (levers9.agent.cdi) and writes it beside `state_dir`; raises cdi.CdiError
        when it cannot (the worker then exits with `failed to generate CDI spec`).
        `seccomp_profile`: the tasks' (default: levers9.agent.seccomp's; SeccompProfileError
        when it is not a profile). `id_ranges`: the node's user-namespace ranges (default:
        under `userns/` beside `state_dir`; the agent passes the image cache's, which every
        agent of the node shares).
        `networks`: the tasks' own networks (default: under `networks/` beside `state_dir`,
        no CIDR allowed beyond the public internet). `storage`: the tasks' volumes and disks
        (default: volumes under `volumes/` beside `state_dir`, no durable disks)."""
        self._images = images
        self._state = state_dir
        self._networks = networks or TaskNetworks(state_dir.parent / "networks")
        self._storage = storage or TaskStorage(state_dir.parent / "volumes")
        self._limits = limits
        self._runc, self._umoci = runc, umoci
        self._seccomp = load_profile(seccomp_profile or DEFAULT_PROFILE)
        self._id_ranges = id_ranges or IdRanges(state_dir.parent / "userns")
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
        if spec.workspace and (problem := name_problem(spec.workspace)) is not None:
            return f"workspace {problem}"  # it names the container (runc_config)
        if spec.restore_from is not None:
            return NO_RESTORE
        return None if spec.image else NO_IMAGE

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
        ids = self._claim_ids()
        if ids is not None:
            release.callback(ids.release)
        user_namespace, lower = await self._root(image, ids)
        owner = ids.host_id if ids is not None else 0
        # The result folder is the container user's to write (the image's User, often not root).
        results = spec.result_path.parent
        results.mkdir(parents=True, exist_ok=True)
        user = base.get("process", {}).get("user", {})
        uid, gid = owner + int(user.get("uid", 0)), owner + int(user.get("gid", 0))
        os.chown(results, uid, gid)
        # Its volumes and disks, mounted for its user (unmounted at its end, however it ends).
        release.callback(self._storage.detach, spec.task_id)
        size = ids.size if ids is not None else 0
        storage = await self._storage.attach(
            spec.task_id, spec.mounts, Owner(uid, gid, owner, size), self.VOLUME_BACKEND
        )
        limits = dataclasses.replace(
            self._limits,
            memory_bytes=spec.memory_bytes or self._limits.memory_bytes,
            cpus=spec.cpu_millis / 1000 if spec.cpu_millis else self._limits.cpus,
        )
        network = await self._networks.create(
            spec.task_id, (ids.host_id, ids.size) if ids is not None else None
        )
        release.callback(self._networks.remove, spec.task_id)
        config = container_config(
            base,
            spec,
            image.config,
            edits.device_nodes,
            mounts=(*edits.mounts, *self._own_mounts()),
            storage=[(str(b.source), b.destination, b.read_only) for b in storage],
            limits=limits,
            resolv_conf=network.resolv_conf,
            network=network.netns,
            user_namespace=(
                dataclasses.replace(user_namespace, path=network.userns)
                if user_namespace is not None
                else None
            ),
            seccomp=self._seccomp if self.SECCOMP else None,
        )
        release.callback(_unmount_bundle, bundle)
        await self._overlay(lower, bundle, limits.disk_bytes, owner, self._layer_seed(spec))
        if user_namespace is not None and not user_namespace.shifted_root:
            await asyncio.to_thread(_mount_points, root_mount(bundle), config)
        config["root"]["path"] = str(root_mount(bundle))
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
            *self._run_argv(spec, bundle, name),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            # Its own session: neither a signal to the agent's group nor the agent's end
            # reaches it; a restarted agent adopts the container (adopt).
            start_new_session=True,
            # It (and its runc) holds the task's id range while the container runs.
            pass_fds=(ids.fd,) if ids is not None else (),
        )
        if ids is not None:
            ids.release()
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
            user_ids=owner,
        )
        self._keep(record)
        container = RuncContainer(self, record, image, shim, output, 0, release)
        container.netns = network.netns
        await self._running(container)
        log.info(
            "container started",
            task_id=spec.task_id,
            image=image.reference,
            digest=image.digest,
            cached=image.cached,
            cards=list(spec.gpu_indices),
            user_ids=owner,
        )
        return container

    def _run_argv(self, spec: ContainerSpec, bundle: Path, name: str) -> list[str]:
        """What the shim runs: `runc run` (a runtime that restores: its restore)."""
        return self._runc_argv("run", *self.RUN_FLAGS, "--bundle", str(bundle), name)

    def _layer_seed(self, spec: ContainerSpec) -> Path | None:
        """What the task's writable layer starts with (a restore's copy of it); None: empty."""
        return None

    def _own_mounts(self) -> tuple[tuple[str, str], ...]:
        """What this runtime binds into every task read-only (host path, container path) for
        its own use; none."""
        return ()

    async def checkpoint(self, container: RuncContainer, path: Path, meta: dict[str, Any]) -> int:
        """runc's checkpoint needs CRIU: refused (CheckpointRefused) with `criu check`'s word;
        nothing is written and the task runs on."""
        code, said = await checkpoints.probe("criu", "check")
        why = f"`criu check` fails on this machine: {said}" if code else "the agent drives none"
        raise checkpoints.CheckpointRefused(
            f"task {container.task_id} runs under runc, whose checkpoint needs CRIU, and {why};"
            " run tasks to be checkpointed with --runtime runsc"
        )

    def _claim_ids(self) -> IdRange | None:
        """The task's user-namespace range (None: this runtime gives none); StartError when
        the node has none free. A range a record of this runtime names is skipped too (its
        container outlived its shim)."""
        if not self.USER_NAMESPACE:
            return None
        recorded = set()
        for path in self._records.glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                recorded.add(ContainerRecord.load(path.read_text()).user_ids)
        try:
            return self._id_ranges.claim(frozenset(slot_of(i) for i in recorded if i >= FIRST_ID))
        except NoIdRange as error:
            raise StartError(str(error)) from None

    async def _root(
        self, image: PulledImage, ids: IdRange | None
    ) -> tuple[UserNamespace | None, Path]:
        """The task's user namespace and the root below its writable layer: the image's root
        shifted to its range by the image cache; an images source that shifts none (the GPU
        check's) gives the image's own root, owned by the node's root and so read-only to the
        task (which gets a tmpfs /tmp and its mount points made here)."""
        if ids is None:
            return None, image.rootfs
        if isinstance(self._images, ImageCache):
            try:
                root = await self._images.shifted(image.digest, ids.host_id, ids.size)
            except ImagePullError as error:
                raise ImageUnavailable(str(error)) from None
            return UserNamespace(ids.host_id, ids.size), root
        log.warning(
            "image root not shifted: read-only to the task",
            image=image.reference,
            images=type(self._images).__name__,
        )
        return UserNamespace(ids.host_id, ids.size, shifted_root=False), image.rootfs

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
        release.callback(self._storage.detach, task_id)
        release.callback(_unmount_bundle, record.bundle)
        network = await self._networks.adopt(task_id)
        release.callback(self._networks.remove, task_id)
        container = RuncContainer(self, record, image, None, output, offset, release)
        container.netns = network.netns if network is not None else None
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
                await asyncio.to_thread(_unmount_bundle, bundle)
            self._forget(name)
            log.warning("container swept", task_id=task_id, bundle=str(bundle or ""))
            swept.append(task_id)
        # Networks, volumes and disks of tasks none of whose containers runs (an agent killed
        # mid-start, or a task that ended while no agent ran).
        self._networks.sweep(keep)
        await asyncio.to_thread(self._storage.sweep, keep)
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

    async def _overlay(
        self, lower: Path, bundle: Path, disk_bytes: int, owner: int, seed: Path | None = None
    ) -> None:
        """The task's root: an overlay of `lower` and its writable layer, which is a filesystem
        of `disk_bytes` of its own (ext4 on a sparse file, loop-mounted: on disk rather than in
        memory as a tmpfs would be, its size a hard cap that one task filling it cannot pass to
        the node; made in about 0.02 s), its upper folder owned by `owner` (the task's root)."""
        layer, image_file = bundle / "layer", bundle / LAYER_FILE
        root = root_mount(bundle)
        for folder in (layer, root):
            folder.mkdir(parents=True, exist_ok=True)
        if shutil.which("mkfs.ext4") is None:
            # Only where the runtime is built by hand on a bare machine (the GPU check): the
            # worker image carries e2fsprogs, and the agent's tasks always get the cap.
            log.warning("writable layer without a cap", why="no mkfs.ext4 on this machine")
        else:
            with image_file.open("wb") as sparse:
                sparse.truncate(disk_bytes)
            await _run("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", str(image_file))
            await _run("mount", "-o", "loop,nosuid,nodev", str(image_file), str(layer))
        upper, work = layer / "upper", layer / "work"
        for folder in (upper, work):
            folder.mkdir(exist_ok=True)
            os.chown(folder, owner, owner)
        os.chmod(upper, os.stat(lower).st_mode & 0o7777)
        if seed is not None:
            # A restored task's writable layer, as its checkpoint copied it (before the overlay
            # is mounted over it: an overlay's upper folder must not change under it).
            await checkpoints.copy_tree(seed, upper)
        await _run(
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={lower},upperdir={upper},workdir={work}",
            str(root),
        )

    async def _detach_storage(self, task_id: str) -> str:
        """Unmounts the task's volumes and disks (its container gone): a volume's unmount waits
        for its FUSE process's last uploads; what went wrong with them ("" when nothing)."""
        return "; ".join(await asyncio.to_thread(self._storage.detach, task_id))

    def _limit_hit(self, record: ContainerRecord) -> str:
        """Which of its limits the ended container ran into, besides memory ("" for none): a
        fork refused at its pids limit, its writable layer full. Read before its cgroup and
        its layer go."""
        limit = pids_limited(record.task_id)
        if limit:
            return f"pids limit: the task reached its limit of {limit} processes"
        layer = record.bundle / "layer"
        with contextlib.suppress(OSError):
            if layer.is_mount():
                room = os.statvfs(layer)
                if room.f_bavail * room.f_frsize < DISK_FULL_BELOW or room.f_favail == 0:
                    size = (record.bundle / LAYER_FILE).stat().st_size
                    return f"disk full: the task filled its writable layer ({_size(size)})"
        return ""

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


def _size(count: int) -> str:
    """Bytes as the largest binary unit that keeps it at least 1 (`20 GiB`, `16 MiB`)."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if count >= scale:
            return f"{count / scale:.3g} {unit}"
    return f"{count} bytes"


def _mount_points(root: Path, config: dict[str, Any]) -> None:
    """Each mount's destination made in the task's root (a root the task does not own: runc,
    in its user namespace, could not make them); a bound file's as an empty file."""
    for mount in config.get("mounts") or ():
        target = root / str(mount["destination"]).lstrip("/")
        source = Path(str(mount.get("source", "")))
        if mount.get("type") == "bind" and source.exists() and not source.is_dir():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.touch(exist_ok=True)
        else:
            target.mkdir(parents=True, exist_ok=True)
        for option in mount.get("options") or ():
            if mount.get("type") == "tmpfs" and option.startswith("mode="):
                # runc gives a tmpfs the mode of the folder it covers (the image's /tmp may
                # be 0755): the folder takes the mode the mount asks for.
                target.chmod(int(option.removeprefix("mode="), 8))


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


def root_mount(bundle: Path) -> Path:
    """Where the task's root (its overlay) is mounted: under TASK_ROOTS, not in its bundle, whose
    folders above may be closed to the task's ids (a 0700 work dir): runc binds the root from
    inside the task's user namespace."""
    return TASK_ROOTS / hashlib.sha256(str(bundle).encode()).hexdigest()[:16]


def _unmount_bundle(bundle: Path) -> None:
    """The task's overlay and its writable layer's filesystem (its file then deleted: the
    loop device goes with the last reference)."""
    _unmount(root_mount(bundle))
    with contextlib.suppress(OSError):
        root_mount(bundle).rmdir()
    if (bundle / "layer").is_mount():
        _unmount(bundle / "layer")
    (bundle / LAYER_FILE).unlink(missing_ok=True)


def _unmount(root: Path) -> None:
    """The task's overlay, once its container is gone (lazily: nothing may hold it by then)."""
    subprocess.run(["umount", "-l", str(root)], capture_output=True, check=False, timeout=30)
