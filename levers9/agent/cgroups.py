"""A runc container's cgroups: where they are, whether the kernel's OOM killer struck there or a
fork was refused at the pids limit, and their removal when runc left them behind.

Each container's cgroup is `/levers9/l9-<task>` in every hierarchy (cgroup v1's per controller,
v2's unified one). The runc runtime reads an OOM kill there before it deletes the container and
empties and removes what `runc delete` left; the sandbox's stray sweep (sandbox.strays) removes
those of agents that are gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

TASK_ROOTS = Path("/run/levers9/roots")
"""Where the runc runtime mounts each task's root (levers9.agent.runc_runtime.root_mount): not
a cgroup, but like them a thing of the container's outside its work dir, which the stray sweep
looks for here too."""


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


def pids_limited(task_id: str, cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """The task's pids limit when a fork of the task's cgroup was refused at it (its
    `pids.events` says `max N`, N > 0: cgroup v1's pids hierarchy or v2's), else 0. Read
    before the container is deleted."""
    relative = cgroup_path(task_id).lstrip("/")
    for folder in (
        cgroup_root / "pids" / relative,
        cgroup_root / relative,
        cgroup_root / "unified" / relative,
    ):
        with contextlib.suppress(OSError, ValueError):
            events = dict(
                line.split(" ", 1) for line in (folder / "pids.events").read_text().splitlines()
            )
            if int(events.get("max", "0")) > 0:
                limit = (folder / "pids.max").read_text().strip()
                return int(limit) if limit.isdigit() else 1
    return 0


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
