"""A task's published ports on this worker.

A task's containers share the worker's network namespace, so a task that publishes ports
(`levers9 run --port 8080`) claims them on this worker: a second running task that names one of
them fails at once (`port 8080 is already published by task <id> on this worker`; the pool's
placement keeps such tasks apart, so this is the guard, not the rule). Its container is told
where it is reached (`LEVERS9_HOST`, the worker's pod IP, and `PORT`, its first port, unless it
set them); binding 0.0.0.0 works too. Once its first port accepts connections (or answers 2xx
to `ready_path`), the task is `ready`: a `container.ready` phase, reported at once.
`connect` opens a connection to a published port of a running task (WorkerService.PortForward).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable

from levers9.contract import ready_path_problem
from levers9.logs import get_logger
from levers9.proto import worker_pb2
from levers9.worker.task_errors import InvalidTask, PortUnavailable
from levers9.worker.task_record import CONTAINER_READY, RUNNING, TaskRecord

# The supervisor's log: what this module logs is the task manager's doing.
log = get_logger("levers9.worker.supervisor")

READY_POLL_S = (0.1, 1.0)
"""How often readiness is probed until the first port answers: from the first, doubling to the
second."""
PROBE_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 10.0


def check_ports(spec: worker_pb2.TaskSpec) -> None:
    """Refuses (InvalidTask) a port that is not a TCP port or is named twice, and a ready_path
    that is malformed or has no port to probe."""
    ports = list(spec.ports)
    bad = [p for p in ports if not 0 < p < 65536]
    if bad:
        raise InvalidTask(f"ports: {bad[0]} is not a TCP port (1-65535)")
    if len(set(ports)) != len(ports):
        raise InvalidTask(f"ports: {ports} names a port twice")
    problem = ready_path_problem(spec.ready_path)
    if problem is not None:
        raise InvalidTask(f"ready_path: {problem}")
    if spec.ready_path and not spec.ports:
        raise InvalidTask("ready_path: needs a port to probe (ports is empty)")


def port_conflict(record: TaskRecord, others: Iterable[TaskRecord]) -> tuple[str, str] | None:
    """(reason, detail) when another running task of this worker published one of its
    ports (they share the worker's network)."""
    for other in others:
        if other is record or other.state != RUNNING:
            continue
        taken = sorted(set(record.spec.ports) & set(other.spec.ports))
        if taken:
            reason = f"port {taken[0]} is already published by task {other.task_id} on this worker"
            return reason, f"ports {taken} are in use by task {other.task_id}"
    return None


def task_env(spec: worker_pb2.TaskSpec, task_host: str) -> dict[str, str]:
    """The task's environment: its own, and where it is reached when it publishes ports."""
    env = dict(spec.env)
    if spec.ports:
        env.setdefault("LEVERS9_HOST", task_host)
        env.setdefault("PORT", str(spec.ports[0]))
    return env


async def probe_until_ready(
    record: TaskRecord, task_host: str, tell: Callable[[TaskRecord], None]
) -> None:
    """Until the task's first port answers (or the task ends): then `ready`, told."""
    port, path = record.spec.ports[0], record.spec.ready_path
    pause, longest = READY_POLL_S
    while record.state == RUNNING and record.ending is None:
        answer = await probe_once(task_host, port, path)
        if answer is not None:
            if record.state != RUNNING:
                return
            record.ready = True
            record.phase(CONTAINER_READY, detail=answer)
            log.info("task ready", task_id=record.task_id, port=port, probe=answer)
            tell(record)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(pause):
                await record.finished.wait()
        pause = min(pause * 2, longest)


async def connect(
    record: TaskRecord, task_host: str, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection to `port` of the task's container (one it published)."""
    task_id = record.task_id
    if port not in record.spec.ports:
        published = ", ".join(map(str, record.spec.ports)) or "none"
        raise InvalidTask(
            f"task {task_id} did not publish port {port} (published: {published});"
            " run it with --port"
        )
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            return await asyncio.open_connection(task_host, port)
    except (OSError, TimeoutError) as error:
        why = str(error) or type(error).__name__
        raise PortUnavailable(
            f"task {task_id}: nothing accepts connections on port {port}"
            f"{'' if record.ready else ' yet (it is starting)'}: {why}"
        ) from None


async def probe_once(host: str, port: int, path: str) -> str | None:
    """What answered (the probe's detail), or None when the port does not answer yet."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                if not path:
                    return f"port {port} accepts connections"
                request = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n"
                writer.write(request.encode("latin-1"))
                await writer.drain()
                line = await reader.readline()
            finally:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
    except (OSError, TimeoutError, UnicodeError):
        return None
    parts = line.split()
    if len(parts) >= 2 and parts[1].isdigit() and 200 <= int(parts[1]) < 300:
        return f"GET {path} on port {port}: {int(parts[1])}"
    return None
