"""A task's published ports on this worker.

A task in a container has a network namespace of its own (levers9.agent.task_network): its
ports are its own, reached only through the agent, which dials them inside its namespace
(`connect`, the readiness probe). Two tasks may publish the same port on one worker. Its
container is told where it is reached (`LEVERS9_HOST`: 127.0.0.1 of its namespace, and `PORT`,
its first port, unless it set them); binding 0.0.0.0 works too.

A task of the process runtime (the agent's own tests) shares the worker's network: it claims
its ports on this worker, a second running one that names one of them fails at once (`port 8080
is already published by task <id> on this worker`), and it is told the worker's pod IP.

Once its first port accepts connections (or answers 2xx to `ready_path`), the task is `ready`:
a `container.ready` phase, reported at once. `connect` opens a connection to a published port
of a running task (WorkerService.PortForward).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable

from levers9.agent import task_network
from levers9.agent.process_runtime import HOST as PROCESS_HOST
from levers9.agent.runtime import Streams
from levers9.agent.task_errors import InvalidTask, PortUnavailable
from levers9.agent.task_record import CONTAINER_READY, RUNNING, TaskRecord
from levers9.contract import ready_path_problem
from levers9.logs import get_logger
from levers9.proto import worker_pb2

# The supervisor's log: what this module logs is the task manager's doing.
log = get_logger("levers9.agent.supervisor")

READY_POLL_S = (0.1, 1.0)
"""How often readiness is probed until the first port answers: from the first, doubling to the
second."""
PROBE_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 10.0
SHARED_NETWORK = frozenset({PROCESS_HOST})
"""The runtimes (a task's `host`) whose tasks share the worker's network; every other one gives
each task a namespace of its own."""


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


def shares_network(record: TaskRecord) -> bool:
    return record.host in SHARED_NETWORK


def reached_at(record: TaskRecord, task_host: str) -> str:
    """Where the task's ports are reached, as it is told (`LEVERS9_HOST`): the worker's pod IP
    (`task_host`) when it shares the worker's network, else its own namespace's loopback."""
    return task_host if shares_network(record) else task_network.TASK_LOOPBACK


def port_conflict(record: TaskRecord, others: Iterable[TaskRecord]) -> tuple[str, str] | None:
    """(reason, detail) when the task shares the worker's network and another running task
    that shares it too published one of its ports."""
    if not shares_network(record):
        return None
    for other in others:
        if other is record or other.state != RUNNING or not shares_network(other):
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
    host = reached_at(record, task_host)
    while record.state == RUNNING and record.ending is None:
        answer = await probe_once(_opener(record, task_host), host, port, path)
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


async def connect(record: TaskRecord, task_host: str, port: int) -> Streams:
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
            return await _opener(record, task_host)(port)
    except (OSError, TimeoutError) as error:
        why = str(error) or type(error).__name__
        raise PortUnavailable(
            f"task {task_id}: nothing accepts connections on port {port}"
            f"{'' if record.ready else ' yet (it is starting)'}: {why}"
        ) from None


def _opener(record: TaskRecord, task_host: str) -> Callable[[int], Awaitable[Streams]]:
    """Opens a connection to one of the task's ports: through its runtime's relay when it has
    one (a gVisor sandbox's own network stack), inside its network namespace when it has one of
    its own, else at the worker's `task_host`."""
    dialer = record.container.dialer if record.container is not None else None
    if dialer is not None:
        return dialer
    netns = record.container.netns if record.container is not None else None
    if netns is not None:
        return lambda port: task_network.open_connection(netns, port)
    return lambda port: asyncio.open_connection(task_host, port)


async def probe_once(
    opener: Callable[[int], Awaitable[Streams]], host: str, port: int, path: str
) -> str | None:
    """What answered (the probe's detail), or None when the port does not answer yet. `host`
    is what the request's Host header names."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            reader, writer = await opener(port)
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
