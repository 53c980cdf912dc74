"""What the dev stack's worker agents left on this machine: `levers9 dev status` lists it, `levers9
dev down` removes it.

Each agent keeps its work dir under its node's `WORK_ROOT` (levers9.contract), which the sandbox
maps to `<state>/nodes/<node>/var/lib/levers9/work/<worker-id>/`: its runc root (`runc/`) and
runsc root (`runsc/`: gVisor's sandboxes), a record per container (`containers/`), its tasks
(`tasks/*/task.json`), each task's network (`networks/*/`: the namespace's bind mount and its
slirp4netns' pid and start time) and its pid and start time (`agent.json`). The containers'
shims (and the slirp4netns) run in sessions of their own, so an agent that was SIGKILLed (the
sandbox's kubelet does so to an agent slow to stop) leaves them running, with their cgroups
(`/levers9/l9-<task>`) and their overlays.

A stray is what no running agent looks after: an agent of a stack that is down, a container of a
runc root (a sandbox of a runsc root) whose agent is gone, the cgroup of a task of such a work
dir, a task that ran as a process of such an agent (`processes/`), the slirp4netns of a task
network of such a work dir (`networks/`), and any mount under the stack's state dir (overlays,
FUSE volumes, writable layers, namespaces) but those in a running agent's work dir, and the
tasks' roots (overlays under /run/levers9/roots) whose layers are under it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from levers9.agent.cgroups import TASK_ROOTS, cgroup_dirs, remove_cgroups
from levers9.contract import AGENT_FILE, WORK_ROOT

KILL_WITHIN_S = 10.0
RUNC_TIMEOUT_S = 30.0
RUNSC = "runsc"
"""gVisor's runtime: its root beside runc's, its command line runc's."""


@dataclass(frozen=True)
class Stray:
    kind: str
    """"agent", "container" (runc's), "sandbox" (runsc's), "process", "network", "cgroup" or
    "mount"."""
    name: str
    """Its pid, container id, task id (a process, a network), cgroup directory or mount point."""
    where: str
    """The work dir (runc root) it was found in, or the mount's filesystem type."""
    pid: int | None = None

    def row(self) -> dict[str, object]:
        return {"kind": self.kind, "name": self.name, "where": self.where, "pid": self.pid}


@dataclass(frozen=True)
class _WorkDir:
    path: Path
    agent: int | None
    """The agent's pid while it runs (its start time matching), else None."""


def find(state_dir: Path, *, stack_running: bool) -> list[Stray]:
    """The strays of the stack whose sandbox keeps its state in `state_dir`; with the stack
    down, its agents too (nothing of it should run)."""
    strays: list[Stray] = []
    work_dirs = _work_dirs(state_dir)
    for work in work_dirs:
        if work.agent is not None:
            if stack_running:
                continue
            strays.append(Stray("agent", str(work.agent), str(work.path), work.agent))
        containers = _containers(work.path)
        strays += [Stray("container", name, str(work.path), pid) for name, pid in containers]
        sandboxes = _containers(work.path, RUNSC)
        strays += [Stray("sandbox", name, str(work.path), pid) for name, pid in sandboxes]
        containers += sandboxes
        strays += [
            Stray("process", task, str(work.path), pid) for task, pid in _processes(work.path)
        ]
        strays += [
            Stray("network", task, str(work.path), pid) for task, pid in _networks(work.path)
        ]
        tasks = {name.removeprefix("l9-") for name, _ in containers} | _task_ids(work.path)
        strays += [
            Stray("cgroup", str(directory), str(work.path))
            for task_id in sorted(tasks)
            for directory in cgroup_dirs(task_id)
        ]
    tended = [w.path for w in work_dirs if w.agent is not None and stack_running]
    strays += [
        Stray("mount", point, kind)
        for point, kind in _mounts_under(state_dir)
        if not any(Path(point).is_relative_to(t) for t in tended)
    ]
    strays += [
        Stray("mount", point, "overlay")
        for point, layers in _task_roots(state_dir)
        if not any(str(t) in layers for t in tended)
    ]
    return strays


def remove(state_dir: Path, strays: list[Stray], progress: Callable[[str], None]) -> list[Stray]:
    """Kills and removes `strays` (found under `state_dir`): agents first (they would start
    containers), then the containers, their cgroups, and the mounts (deepest first); returns
    those still there."""
    for stray in strays:
        progress(f"removing stray {stray.kind} {stray.name} ({stray.where})")
    for stray in strays:
        if stray.kind == "agent" and stray.pid is not None:
            _kill(stray.pid)
    for stray in strays:
        if stray.kind in ("process", "network") and stray.pid is not None:
            _kill(stray.pid, group=True)
    for stray in strays:
        if stray.kind in ("container", "sandbox"):
            binary = RUNSC if stray.kind == "sandbox" else "runc"
            runc = [binary, "--root", str(Path(stray.where) / binary)]
            _run([*runc, "kill", "--all", stray.name, "KILL"])
            _run([*runc, "delete", "--force", stray.name])
            remove_cgroups(stray.name.removeprefix("l9-"))
    for stray in strays:
        if stray.kind == "cgroup":
            remove_cgroups(Path(stray.name).name.removeprefix("l9-"))
    for stray in sorted((s for s in strays if s.kind == "mount"), key=lambda s: -len(s.name)):
        _run(["umount", "-l", stray.name])
        if Path(stray.name).parent == TASK_ROOTS:  # made for the mount: it goes with it
            with contextlib.suppress(OSError):
                Path(stray.name).rmdir()
    removed = {(s.kind, s.name) for s in strays}
    return [s for s in find(state_dir, stack_running=False) if (s.kind, s.name) in removed]


def _work_dirs(state_dir: Path) -> list[_WorkDir]:
    found = []
    for path in sorted(state_dir.glob(f"nodes/*/{WORK_ROOT.lstrip('/')}/*")):
        if path.is_dir():
            found.append(_WorkDir(path, _running_agent(path / AGENT_FILE)))
    return found


def _running_agent(agent_file: Path) -> int | None:
    try:
        kept = json.loads(agent_file.read_text())
        pid, start = int(kept["pid"]), int(kept["start"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if _start_ticks(pid) == start else None


def _start_ticks(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _containers(work: Path, runtime: str = "runc") -> list[tuple[str, int | None]]:
    """(id, pid) of every container in the work dir's root of `runtime` (runc, runsc)."""
    if not (work / runtime).is_dir():
        return []
    listed = _run([runtime, "--root", str(work / runtime), "list", "--format", "json"])
    try:
        entries = json.loads(listed or "null") or []
    except ValueError:
        return []
    return [(str(e["id"]), int(e.get("pid") or 0) or None) for e in entries if e.get("id")]


def _processes(work: Path) -> list[tuple[str, int]]:
    """(task id, pid) of every task that ran as a process of the work dir's agent, still running."""
    found = []
    for record in sorted((work / "processes").glob("*.json")):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            kept = json.loads(record.read_text())
            pid, start = int(kept["pid"]), int(kept["start"])
            if _start_ticks(pid) == start:
                found.append((str(kept.get("task_id", record.stem)), pid))
    return found


def _networks(work: Path) -> list[tuple[str, int]]:
    """(task id, pid) of the slirp4netns of every task network of the work dir, still running
    (its namespace's bind mount is a mount under the state dir, a stray of its own)."""
    found = []
    for folder in sorted((work / "networks").glob("*/")):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            kept = json.loads((folder / "slirp4netns.json").read_text())
            pid, start = int(kept["pid"]), int(kept["start"])
            if _start_ticks(pid) == start:
                task_id = (folder / "task_id").read_text() if (folder / "task_id").exists() else ""
                found.append((task_id or folder.name, pid))
    return found


def _task_ids(work: Path) -> set[str]:
    """The tasks the work dir holds a record of (their containers' cgroups are named so)."""
    ids = {p.stem.removeprefix("l9-") for p in (work / "containers").glob("*.json")}
    for saved in (work / "tasks").glob("*/task.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            ids.add(str(json.loads(saved.read_text())["spec"]["taskId"]))
    return ids


def _mounts_under(root: Path) -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount at or below `root`."""
    prefix = str(root.resolve())
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")
            kind = fields[fields.index("-") + 1]
            if point == prefix or point.startswith(prefix + "/"):
                found.append((point, kind))
    return found


def _task_roots(state_dir: Path) -> list[tuple[str, str]]:
    """(mount point, its layers) of every task root (TASK_ROOTS: mounted outside the work dir)
    whose layers are under `state_dir`."""
    prefix = str(state_dir.resolve()) + "/"
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")
            layers = fields[-1]
            if Path(point).parent == TASK_ROOTS and prefix in layers:
                found.append((point, layers))
    return found


def _kill(pid: int, *, group: bool = False) -> None:
    """SIGKILL to the process (its group, the session it leads), then waits until it is gone."""
    start = _start_ticks(pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WITHIN_S
    while start is not None and _start_ticks(pid) == start and time.monotonic() < deadline:
        time.sleep(0.05)


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=RUNC_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout
