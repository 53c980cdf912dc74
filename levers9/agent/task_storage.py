"""A task's volumes and disks on this worker, from before its container starts to its end.

`attach` mounts each of the task's mounts (levers9.agent.volumes: a FUSE mount of the bucket at
`<agent work dir>/volumes/<task dir>/<name>`; levers9.agent.disks: the disk's ext4 image
loop-mounted under durableDisksPath) for the container's user, and gives the runtime what to
bind where; a mount that fails undoes those made before it. `detach` (the task's end, however it
ends) unmounts them all: every file the task wrote to a volume is then an object in its bucket,
and a disk's data is in its file. `sweep` (the agent's start) does the same for every task the
agent does not follow (one that ended while no agent ran, or one whose start an agent died in).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from levers9.agent import volumes
from levers9.agent.disks import DiskAccess, DiskError, DiskStore, Owner
from levers9.agent.runtime import StartError, StorageMount
from levers9.agent.task_record import directory_name
from levers9.logs import get_logger

log = get_logger("levers9.agent.task_storage")

NO_DISKS = (
    "this worker keeps no durable disks: its Job sets no LEVERS9_DURABLE_DISKS_PATH (the pool's"
    " durableDisksPath)"
)


@dataclass(frozen=True)
class Bind:
    """One mount made for a task: where it is on the node, where its container sees it."""

    source: Path
    destination: str
    read_only: bool


class TaskStorage:
    """The volumes and disks of this worker's tasks (see the module's docstring)."""

    def __init__(
        self,
        volumes_dir: Path,
        disks: DiskStore | None = None,
        *,
        backend: str = volumes.DEFAULT_BACKEND,
    ) -> None:
        self.volumes_dir = volumes_dir
        self.disks = disks
        self.backend = backend

    def task_dir(self, task_id: str) -> Path:
        return self.volumes_dir / directory_name(task_id)

    @property
    def holder(self) -> str:
        """What marks this agent's disks among those of the machine's other agents."""
        return str(self.volumes_dir)

    async def attach(
        self,
        task_id: str,
        mounts: Collection[StorageMount],
        owner: Owner,
        backend: str = "",
    ) -> list[Bind]:
        """Mounts each of `mounts` for the task (files owned by `owner`; its volumes by
        `backend`, "": this storage's); what to bind where.
        StartError (VolumeError, DiskError) naming the mount when one cannot be: nothing of
        the task's is left mounted then."""
        binds: list[Bind] = []
        if not mounts:
            return binds
        try:
            for mount in mounts:
                binds.append(await self._attach(task_id, mount, owner, backend or self.backend))
        except BaseException:
            self.detach(task_id)
            raise
        return binds

    async def _attach(self, task_id: str, mount: StorageMount, owner: Owner, backend: str) -> Bind:
        if mount.kind == "volume":
            if mount.volume is None:
                raise StartError(f"volume {mount.name}: no access to it came with the task")
            self.volumes_dir.mkdir(parents=True, exist_ok=True)
            self.volumes_dir.chmod(0o711)
            # One volume may be mounted at two paths (one of them :ro, say): a point each.
            taken = len(volumes.mounts_under(self.task_dir(task_id)))
            target = self.task_dir(task_id) / (f"{mount.name}.{taken}" if taken else mount.name)
            await volumes.mount(
                mount.volume,
                target,
                volumes.Owner(owner.uid, owner.gid),
                mount.read_only,
                backend=backend,
            )
            return Bind(target, mount.path, mount.read_only)
        if mount.disk is None:
            raise StartError(f"disk {mount.name}: no access to it came with the task")
        if self.disks is None:
            raise DiskError(f"disk {mount.name}: {NO_DISKS}")
        access = DiskAccess(mount.name, mount.disk.disk_id, mount.disk.size_bytes)
        point = await self.disks.attach(access, task_id, owner, holder=self.holder)
        return Bind(point, mount.path, mount.read_only)

    def detach(self, task_id: str) -> list[str]:
        """Unmounts every volume and disk of the task (its volumes' last uploads done first);
        what their FUSE processes said went wrong (`volume NAME: x.txt: Failed to copy: ...`)."""
        folder = self.task_dir(task_id)
        problems = []
        for point in volumes.mounts_under(folder):
            error = volumes.unmount(point)
            if error:
                problems.append(f"volume {point.name.split('.')[0]}: {error}")
        if folder.is_dir():
            for child in folder.iterdir():
                if child.is_dir() and not volumes.mounted(child):
                    volumes.unmount(child)  # its leftovers (cache, pid, log) only
            with contextlib.suppress(OSError):
                folder.rmdir()
        if self.disks is not None:
            self.disks.sweep(self.holder, keep=(), tasks={task_id})
        return problems

    def sweep(self, keep: Collection[str]) -> list[str]:
        """Unmounts the volumes and disks of every task of this agent but those in `keep`;
        the folders and disk ids swept."""
        kept = {directory_name(task_id) for task_id in keep}
        swept = []
        if self.volumes_dir.is_dir():
            for folder in sorted(self.volumes_dir.iterdir()):
                if folder.name in kept or not folder.is_dir():
                    continue
                for point in volumes.mounts_under(folder):
                    volumes.unmount(point)
                for child in folder.iterdir():
                    if child.is_dir() and not volumes.mounted(child):
                        volumes.unmount(child)
                with contextlib.suppress(OSError):
                    folder.rmdir()
                swept.append(folder.name)
        if self.disks is not None:
            swept += self.disks.sweep(self.holder, keep=keep)
        if swept:
            log.warning("task storage swept", swept=swept)
        return swept
