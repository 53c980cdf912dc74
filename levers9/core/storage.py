"""A task's storage: the workspace volumes and durable disks it mounts (`levers9 run --volume
NAME:/data[:ro]`, `--disk NAME:/scratch`), as the CLI, the gateway, the record and the agent
all read them. Pure: parsing and checks only.

A volume is a workspace's bucket (`s3://BUCKET[/PREFIX]`, or `gs://` through its S3 interface)
mounted by FUSE with the workspace's own credentials; a disk is a size-limited filesystem on one
machine's `durableDisksPath`, which pins the tasks that use it to that machine.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict

from levers9.contract import DNS_LABEL

MountKind = Literal["volume", "disk"]
MAX_MOUNTS = 16
"""Volumes and disks of one task, together."""
RESERVED_PATHS = ("/proc", "/sys", "/dev", "/etc/hosts", "/etc/resolv.conf", "/etc/hostname")
"""Paths the runtime owns: a mount there, or under them, is refused."""
_PATH = re.compile(r"/[A-Za-z0-9._/@+=-]{0,254}")


class TaskMount(BaseModel):
    """One volume or disk of a task and where its container sees it (TaskSpec.mounts)."""

    model_config = ConfigDict(frozen=True)

    kind: str
    """volume or disk"""
    name: str
    """The workspace's volume or disk (a DNS label)."""
    path: str
    """Absolute, in the container."""
    read_only: bool = False


def mount_path_problem(path: str) -> str | None:
    """Why `path` cannot be a mount point in a task's container, or None."""
    if not _PATH.fullmatch(path):
        return f"{path!r} is not an absolute path of letters, digits and . _ / @ + = -"
    parts = path.split("/")
    if any(part in (".", "..") for part in parts):
        return f"{path!r} has . or .. in it"
    normal = "/" + "/".join(p for p in parts if p)
    if normal == "/":
        return "/ is the task's own root: mount it at a directory, e.g. /data"
    for reserved in RESERVED_PATHS:
        if normal == reserved or normal.startswith(reserved + "/"):
            return f"{normal} is the runtime's ({reserved}): choose another path, e.g. /data"
    return None


def parse_mount(kind: str, given: str) -> TaskMount:
    """`NAME:/path[:ro]` (as `docker run -v`) as a TaskMount; ValueError naming what is wrong.
    A disk is never read-only here (one task writes it at a time)."""
    option = "--volume" if kind == "volume" else "--disk"
    parts = given.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"{option} {given!r}: give NAME:/path or NAME:/path:ro")
    name, path = parts[0], parts[1]
    read_only = False
    if len(parts) == 3:
        if parts[2] not in ("ro", "rw"):
            raise ValueError(f"{option} {given!r}: the third part is ro or rw, not {parts[2]!r}")
        read_only = parts[2] == "ro"
    mount = TaskMount(kind=kind, name=name, path=path, read_only=read_only)
    problem = mount_problem(mount)
    if problem is not None:
        raise ValueError(f"{option} {given!r}: {problem}")
    return mount


def mount_problem(mount: TaskMount) -> str | None:
    """Why one mount cannot be, or None."""
    if mount.kind not in ("volume", "disk"):
        return f"kind {mount.kind!r} is neither volume nor disk"
    if not DNS_LABEL.fullmatch(mount.name):
        return f"{mount.name!r} is not a {mount.kind} name (a lowercase DNS label)"
    return mount_path_problem(mount.path)


def mounts_problem(mounts: tuple[TaskMount, ...] | list[TaskMount]) -> str | None:
    """Why a task's mounts, together, cannot be (each one's problem, too many, one path twice,
    one inside another, a disk twice), or None."""
    if len(mounts) > MAX_MOUNTS:
        return f"{len(mounts)} volumes and disks, at most {MAX_MOUNTS}"
    seen: list[str] = []
    disks: set[str] = set()
    for mount in mounts:
        problem = mount_problem(mount)
        if problem is not None:
            return problem
        path = "/" + "/".join(p for p in mount.path.split("/") if p)
        for other in seen:
            if path == other or path.startswith(other + "/") or other.startswith(path + "/"):
                return f"{path} and {other}: one mount point inside another"
        seen.append(path)
        if mount.kind == "disk":
            if mount.name in disks:
                return f"disk {mount.name} twice: a disk is mounted once per task"
            disks.add(mount.name)
    return None
