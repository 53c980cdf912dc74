"""Durable disks on this machine: each an ext4 image file under the pool's `durableDisksPath`
(LEVERS9_DURABLE_DISKS_PATH, a hostPath of the worker Job), loop-mounted for the one task that
uses it and bound into its container.

A disk's file is `<durableDisksPath>/<disk_id>.ext4`, made on its first use (DiskAccess.size_bytes
allocated on the node, `mkfs.ext4`): its size is a hard cap (a write past it is ENOSPC in the
task, never a full node). It outlives its tasks, the agent and the worker Job; only DeleteDisk
removes it. While a task uses it, it is mounted at `<durableDisksPath>/.mounts/<disk_id>` (beside
it a `<disk_id>.task` naming the task), which is how any agent of the machine knows it is busy:
a second task is refused (`disk NAME is in use by task T on this machine`).

Each task runs in a user namespace of its own id range (levers9.agent.id_ranges), which differs
from one task to the next: at mount, the files the previous task's range owned are shifted to
this task's (`<disk_id>.owner` keeps the range that owns them), so a later task owns what an
earlier one wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from levers9.agent.runtime import StartError
from levers9.agent.volumes import mounted
from levers9.logs import get_logger

log = get_logger("levers9.agent.disks")

SUFFIX = ".ext4"
MIN_BYTES = 16 * 1024**2
"""The least a disk may be (ext4's own structures need a few MiB)."""
_DISK_ID = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")


class DiskError(StartError):
    """A disk could not be mounted (or removed): the message names it and why."""


class DiskBusy(DiskError):
    """The disk is mounted for another task of this machine."""


@dataclass(frozen=True)
class DiskAccess:
    """What mounts one disk (worker.proto DiskAccess)."""

    name: str
    disk_id: str
    size_bytes: int


@dataclass(frozen=True)
class Owner:
    """Who owns the disk's root as the node sees it (the container's user's host ids), and the
    id range of the task's user namespace (`base`, `size`; 0: none), to which the files of the
    previous task's range are shifted."""

    uid: int
    gid: int
    base: int = 0
    size: int = 0


@dataclass(frozen=True)
class DiskInfo:
    """One disk's file on this machine (ListDisks)."""

    disk_id: str
    size_bytes: int
    used_bytes: int
    task_id: str
    """The task it is mounted for, "" when none."""


def disk_id_problem(disk_id: str) -> str | None:
    if not _DISK_ID.fullmatch(disk_id) or ".." in disk_id:
        return f"disk_id {disk_id!r} is not lowercase letters, digits and . _ - (at most 128)"
    return None


class DiskStore:
    """The durable disks of this machine (see the module's docstring)."""

    def __init__(self, root: Path, points: Path | None = None) -> None:
        self.root = root
        self.points = points or root / ".mounts"
        self._attaching: set[str] = set()

    def image(self, disk_id: str) -> Path:
        return self.root / f"{disk_id}{SUFFIX}"

    def point(self, disk_id: str) -> Path:
        return self.points / disk_id

    def user(self, disk_id: str) -> str:
        """The task the disk is mounted for on this machine, "" when none."""
        if not mounted(self.point(disk_id)):
            return ""
        return self._marker(disk_id)[0] or "?"

    def _marker(self, disk_id: str) -> tuple[str, str]:
        """(task, holder) of the disk's mount: the task it is for, the agent that made it."""
        with contextlib.suppress(OSError):
            task, _, holder = (self.points / f"{disk_id}.task").read_text().partition("\n")
            return task.strip(), holder.strip()
        return "", ""

    async def attach(
        self, access: DiskAccess, task_id: str, owner: Owner, holder: str = ""
    ) -> Path:
        """Mounts the disk (made on first use) for `task_id` of the agent `holder`, its root
        `owner`'s; its mount point. DiskBusy when another task has it; DiskError naming it
        otherwise."""
        name = f"disk {access.name}"
        problem = disk_id_problem(access.disk_id)
        if problem is not None:
            raise DiskError(f"{name}: {problem}")
        if access.size_bytes < MIN_BYTES:
            raise DiskError(f"{name}: size_bytes {access.size_bytes} is under {MIN_BYTES} (16Mi)")
        user = self.user(access.disk_id)
        if access.disk_id in self._attaching or (user and user != task_id):
            raise DiskBusy(
                f"{name} is in use by task {user or 'starting'} on this machine: a disk is"
                " mounted for one task at a time"
            )
        self._attaching.add(access.disk_id)
        try:
            if user:  # this task's already (a retried start)
                return self.point(access.disk_id)
            return await asyncio.to_thread(self._attach, access, task_id, owner, holder)
        finally:
            self._attaching.discard(access.disk_id)

    def _attach(self, access: DiskAccess, task_id: str, owner: Owner, holder: str) -> Path:
        name = f"disk {access.name}"
        for folder in (self.root, self.points):
            folder.mkdir(parents=True, exist_ok=True)
        # The task's user namespace binds the mount point: it must be able to reach it.
        os.chmod(self.points, 0o711)
        image = self.image(access.disk_id)
        if not image.exists():
            self._create(access, image)
        elif image.stat().st_size < access.size_bytes:
            self._grow(access, image)
        point = self.point(access.disk_id)
        point.mkdir(exist_ok=True)
        _run(name, "mount", "-o", "loop,nosuid,nodev", str(image), str(point))
        _direct_io(point)
        try:
            self._own(access.disk_id, point, owner)
            (self.points / f"{access.disk_id}.task").write_text(f"{task_id}\n{holder}\n")
        except BaseException:
            self.detach(access.disk_id)
            raise
        log.info("disk mounted", disk=access.name, disk_id=access.disk_id, task_id=task_id)
        return point

    def _create(self, access: DiskAccess, image: Path) -> None:
        if shutil.which("mkfs.ext4") is None:
            raise DiskError(f"disk {access.name}: mkfs.ext4 is not installed on this worker")
        fresh = image.with_name(f".{image.name}.new")
        try:
            _reserve(fresh, access.size_bytes, access.name)
            _run(f"disk {access.name}", "mkfs.ext4", "-q", "-F", "-m", "0", str(fresh))
        except BaseException:
            fresh.unlink(missing_ok=True)
            raise
        fresh.replace(image)
        log.info("disk created", disk=access.name, disk_id=access.disk_id, bytes=access.size_bytes)

    def _grow(self, access: DiskAccess, image: Path) -> None:
        """The disk's file and filesystem grown to `size_bytes` (a disk is never shrunk)."""
        _reserve(image, access.size_bytes, access.name)
        _run(f"disk {access.name}", "e2fsck", "-f", "-p", str(image), ok=(0, 1))
        _run(f"disk {access.name}", "resize2fs", str(image))

    def _own(self, disk_id: str, point: Path, owner: Owner) -> None:
        """The disk's files owned by the task's range (shifted from the previous one's)."""
        record = self.root / f".{disk_id}.owner"
        before = 0
        with contextlib.suppress(OSError, ValueError):
            before = int(record.read_text().split()[0])
        if owner.size and before and before != owner.base:
            _shift(point, before, owner.base, owner.size)
        os.chown(point, owner.uid, owner.gid)
        os.chmod(point, 0o755)
        if owner.size:
            record.write_text(f"{owner.base} {owner.size}\n")

    def detach(self, disk_id: str) -> None:
        """Unmounts the disk (its data synced to its file first); safe when it is not mounted."""
        point = self.point(disk_id)
        if mounted(point):
            subprocess.run(
                ["sync", "-f", str(point)], capture_output=True, check=False, timeout=120
            )
            done = subprocess.run(
                ["umount", str(point)], capture_output=True, check=False, timeout=120
            )
            if done.returncode != 0:
                subprocess.run(
                    ["umount", "-l", str(point)], capture_output=True, check=False, timeout=60
                )
            log.info("disk unmounted", disk_id=disk_id)
        (self.points / f"{disk_id}.task").unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            point.rmdir()

    def sweep(
        self, holder: str, keep: Collection[str], tasks: Collection[str] | None = None
    ) -> list[str]:
        """Unmounts every disk the agent `holder` mounted for a task not in `keep` (of
        `tasks` only, when given); the disk ids."""
        swept = []
        for marker in sorted(self.points.glob("*.task")) if self.points.is_dir() else ():
            task, made_by = self._marker(marker.stem)
            if made_by != holder or task in keep or (tasks is not None and task not in tasks):
                continue
            self.detach(marker.stem)
            swept.append(marker.stem)
        return swept

    def disks(self) -> list[DiskInfo]:
        """Every disk file of this machine, with its use."""
        found = []
        for image in sorted(self.root.glob(f"*{SUFFIX}")) if self.root.is_dir() else ():
            disk_id = image.name.removesuffix(SUFFIX)
            size = image.stat().st_size
            found.append(DiskInfo(disk_id, size, self._used(disk_id, image), self.user(disk_id)))
        return found

    def _used(self, disk_id: str, image: Path) -> int:
        point = self.point(disk_id)
        if mounted(point):
            room = os.statvfs(point)
            return (room.f_blocks - room.f_bfree) * room.f_frsize
        done = subprocess.run(
            ["dumpe2fs", "-h", str(image)], capture_output=True, text=True, check=False
        )
        fields = dict(
            (k.strip(), v.strip())
            for k, _, v in (line.partition(":") for line in done.stdout.splitlines())
        )
        try:
            count, free = int(fields["Block count"]), int(fields["Free blocks"])
            return (count - free) * int(fields["Block size"])
        except (KeyError, ValueError):
            return image.stat().st_blocks * 512

    def delete(self, disk_id: str) -> bool:
        """Removes the disk's file; False when there was none. DiskBusy while a task has it."""
        problem = disk_id_problem(disk_id)
        if problem is not None:
            raise DiskError(problem)
        user = self.user(disk_id)
        if user:
            raise DiskBusy(f"disk {disk_id} is in use by task {user} on this machine")
        image = self.image(disk_id)
        existed = image.exists()
        image.unlink(missing_ok=True)
        (self.root / f".{disk_id}.owner").unlink(missing_ok=True)
        if existed:
            log.info("disk deleted", disk_id=disk_id)
        return existed


def _reserve(path: Path, size: int, name: str) -> None:
    """`path` made `size` bytes long with all its blocks allocated on the node (fallocate): a
    disk's room is the node's promise, not an overcommit that a full node breaks mid-write as
    EIO in the task; and a first write into allocated blocks is about four times faster than
    into a sparse file's holes here (benchmarks/README.md). DiskError when the node has no
    room for it."""
    with path.open("ab") as file:
        try:
            os.posix_fallocate(file.fileno(), 0, size)
        except OSError as error:
            raise DiskError(
                f"disk {name}: the node has no room for {size} bytes under its durableDisksPath"
                f" ({error.strerror})"
            ) from None


def _direct_io(point: Path) -> None:
    """The loop device under `point` reads and writes its file with direct I/O: no second copy
    of each block in the node's page cache (the ext4 above keeps one). About four times the
    sequential write of a buffered loop device here (benchmarks/README.md)."""
    device = ""
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as table:
        for line in table:
            fields = line.split()
            if len(fields) > 4 and fields[4] == str(point) and " - " in line:
                device = line.split(" - ", 1)[1].split()[1]
    if not device.startswith("/dev/loop"):
        return
    done = subprocess.run(
        ["losetup", "--direct-io=on", device], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        log.warning("disk without direct I/O", device=device, why=done.stderr.strip()[-200:])


def _shift(root: Path, before: int, after: int, size: int) -> None:
    """Every file under `root` whose uid or gid is in [before, before + size) moved by
    after - before (the one file system only)."""

    def moved(value: int) -> int:
        return value - before + after if before <= value < before + size else value

    device = root.stat().st_dev
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if os.lstat(os.path.join(folder, d)).st_dev == device]
        for entry in [folder, *(os.path.join(folder, f) for f in files)]:
            info = os.lstat(entry)
            uid, gid = moved(info.st_uid), moved(info.st_gid)
            if (uid, gid) != (info.st_uid, info.st_gid):
                mode = info.st_mode
                os.lchown(entry, uid, gid)
                if not os.path.islink(entry):
                    os.chmod(entry, mode & 0o7777)  # chown drops setuid/setgid bits


def _run(name: str, *argv: str, ok: tuple[int, ...] = (0,)) -> None:
    """`argv`; DiskError naming the disk and the tool's last words unless it exits with one of
    `ok` (e2fsck: 1 is "errors corrected")."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)
    except FileNotFoundError:
        raise DiskError(f"{name}: {argv[0]} is not installed on this worker") from None
    if done.returncode not in ok:
        words = (done.stderr or done.stdout).strip().splitlines()
        raise DiskError(f"{name}: {argv[0]} failed: {words[-1] if words else done.returncode}")
