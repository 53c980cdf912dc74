"""Tasks on this worker: their records, their cards, their phases, their end.

A task is accepted once per id (a retried RunTask finds the record and starts nothing), gets
the cards it names if they are this worker's and free (else it fails with the spec's
`not enough GPUs available: requested=<n> visible=<m>`), runs in the runtime, and on exit keeps
its exit code, result JSON and log tail until the controlplane fetches them; every end is also
reported to the gateway. Phases carry timestamps: `worker.gpu_assignment`, `container.start`,
`container.ready`, `container.exit` (and `task.result` when the result file is unusable).

Ports. A task's containers share the worker's network namespace, so a task that publishes ports
(`levers9 run --port 8080`) claims them on this worker: a second running task that names one of
them fails at once (`port 8080 is already published by task <id> on this worker`; the pool's
placement keeps such tasks apart, so this is the guard, not the rule). Its container is told
where it is reached (`LEVERS9_HOST`, the worker's pod IP, and `PORT`, its first port, unless it
set them); binding 0.0.0.0 works too. Once its first port accepts connections (or answers 2xx
to `ready_path`), the task is `ready`: a `container.ready` phase, reported at once.
`connect(task_id, port)` opens a connection to a published port of a running task
(WorkerService.PortForward).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

from google.protobuf import json_format

from levers9.contract import ready_path_problem, task_input_problem
from levers9.logs import get_logger
from levers9.proto import worker_pb2
from levers9.worker.output import TaskOutput
from levers9.worker.runtime import (
    Container,
    ContainerSpec,
    ImageUnavailable,
    Runtime,
    StartError,
    TaskDefaults,
)

log = get_logger("levers9.worker.supervisor")
NO_DEFAULTS = TaskDefaults()

State: TypeAlias = worker_pb2.TaskState.ValueType
RUNNING: State = worker_pb2.TASK_STATE_RUNNING
SUCCEEDED: State = worker_pb2.TASK_STATE_SUCCEEDED
FAILED: State = worker_pb2.TASK_STATE_FAILED
CANCELLED: State = worker_pb2.TASK_STATE_CANCELLED
LOST: State = worker_pb2.TASK_STATE_LOST

GPU_ASSIGNMENT = "worker.gpu_assignment"
PORTS = "worker.ports"
IMAGE_PULL = "image.pull"
OOM_KILLED = "OOMKilled"
"""The reason of a task the kernel killed at its memory limit (Kubernetes' word)."""
CONTAINER_START = "container.start"
CONTAINER_EXIT = "container.exit"
CONTAINER_READY = "container.ready"
READY_POLL_S = (0.1, 1.0)
"""How often readiness is probed until the first port answers: from the first, doubling to the
second."""
PROBE_TIMEOUT_S = 2.0
START_WAIT_S = 5.0
"""How long RunTask waits for the task's start before it answers (accepted, still starting)."""
CONNECT_TIMEOUT_S = 10.0
TASK_RESULT = "task.result"
SHUT_DOWN = "worker shut down"
ORPHANED = "the worker restarted and found its container without a record: killed"
NO_CONTAINER = "the worker restarted and could not follow it (killed, if it still ran)"
TASK_FILE = "task.json"
"""In each task's directory: its spec, cards and latest status, for an agent started later."""

STOP_GRACE_S = 10.0
"""A stopped task's grace between SIGTERM and SIGKILL when its spec names none (as `docker stop`):
every process of its container gets SIGTERM, and SIGKILL once the grace is over."""
KEEP_FINISHED = 256
RESULT_LIMIT_BYTES = 1 << 20  # well under gRPC's 4 MiB message limit
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

Reporter = Callable[[worker_pb2.TaskStatus], None]


class TaskNotFound(LookupError):
    pass


class TaskNotRunning(RuntimeError):
    pass


class InvalidTask(ValueError):
    pass


class ShuttingDown(RuntimeError):
    pass


class PortUnavailable(ConnectionError):
    """Nothing accepts connections on the task's port (yet); the message says which."""


@dataclass
class TaskRecord:
    spec: worker_pb2.TaskSpec
    directory: Path
    output: TaskOutput
    host: str
    clock: Callable[[], float]
    state: State = RUNNING
    exit_code: int = 0
    result_json: str = ""
    reason: str = ""
    phases: list[worker_pb2.Phase] = field(default_factory=list)
    cards: tuple[int, ...] = ()
    container: Container | None = None
    image_digest: str = ""
    ending: tuple[State, str] | None = None
    """Set when the agent ends the task (cancel, shutdown): the state and reason to record."""
    stopping: asyncio.Task[int] | None = None
    """Its container's stop, once begun: one per task, never abandoned half-way."""
    fetched: bool = False
    ready: bool = False
    finished: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def task_id(self) -> str:
        return self.spec.task_id

    @property
    def grace_s(self) -> float:
        return float(self.spec.stop_grace_seconds) if self.spec.stop_grace_seconds else STOP_GRACE_S

    @property
    def result_path(self) -> Path:
        """In a folder of its own: the runc runtime mounts that folder (only) in the container."""
        return self.directory / "result" / "result.json"

    def phase(self, name: str, error: str = "", detail: str = "") -> None:
        at = int(self.clock() * 1000)
        self.phases.append(worker_pb2.Phase(name=name, at_unix_ms=at, error=error, detail=detail))

    def status(self) -> worker_pb2.TaskStatus:
        return worker_pb2.TaskStatus(
            task_id=self.task_id,
            state=self.state,
            exit_code=self.exit_code,
            result_json=self.result_json,
            reason=self.reason,
            phases=self.phases,
            log_tail=self.output.tail(),
            host=self.host,
            image_digest=self.image_digest,
            image=self.spec.image,
            ready=self.ready,
        )


class TaskManager:
    """The worker's tasks (see module doc)."""

    def __init__(
        self,
        runtime: Runtime,
        visible: Sequence[int],
        work_dir: Path,
        report: Reporter,
        *,
        clock: Callable[[], float] = time.time,
        keep_finished: int = KEEP_FINISHED,
        defaults: TaskDefaults = NO_DEFAULTS,
        task_host: str = "127.0.0.1",
    ) -> None:
        self._runtime = runtime
        self._task_host = task_host
        self._defaults = defaults
        self._visible = tuple(visible)
        self._dir = work_dir / "tasks"
        self._report = report
        self._clock = clock
        self._keep = keep_finished
        self._records: dict[str, TaskRecord] = {}
        self._finished: list[str] = []
        self._watchers: set[asyncio.Task[Any]] = set()
        self._idle_since: float | None = clock()
        self._closed = False

    @property
    def visible(self) -> tuple[int, ...]:
        return self._visible

    @property
    def running(self) -> int:
        return sum(1 for r in self._records.values() if r.state == RUNNING)

    @property
    def idle_since(self) -> float | None:
        """When the last task ended (or the agent started); None while tasks run."""
        return self._idle_since

    # -- the calls ---------------------------------------------------------------------------

    async def run(self, spec: worker_pb2.TaskSpec) -> bool:
        """Accepts and starts a task; True when a task of that id was already accepted."""
        if not spec.task_id:
            raise InvalidTask("task_id is required")
        if spec.task_id in self._records:
            return True
        if not spec.command:
            raise InvalidTask("command is required")
        refused = task_input_problem(spec.command, spec.env)
        if refused is not None:  # the controlplane refused it at submit; a caller that is not
            raise InvalidTask(refused)  # the controlplane is refused here, before anything runs
        if self._closed:
            raise ShuttingDown("the worker is shutting down")
        _check_ports(spec)
        record = self._accept(spec)
        for phase, check in ((GPU_ASSIGNMENT, self._assign), (PORTS, self._claim_ports)):
            problem = check(record)
            if problem is not None:
                reason, detail = problem
                record.phase(phase, detail)
                self._finish(record, FAILED, reason)
                return False
            if phase == GPU_ASSIGNMENT or record.spec.ports:
                record.phase(phase)
        # A pull of a 20 GB image takes minutes: RunTask answers once the task is accepted
        # and its start under way (or done, for most: within START_WAIT_S); the task's
        # record learns the rest from its reports.
        starting = asyncio.create_task(self._starting(record), name=f"{spec.task_id}-start")
        self._watchers.add(starting)
        starting.add_done_callback(self._watchers.discard)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(starting), START_WAIT_S)
        return False

    def status(self, task_id: str) -> worker_pb2.TaskStatus:
        record = self._record(task_id)
        status = record.status()
        if record.state != RUNNING:
            record.fetched = True
            self._evict()
        return status

    def output(self, task_id: str) -> TaskOutput:
        return self._record(task_id).output

    async def cancel(self, task_id: str) -> bool:
        """Stops the task's container (SIGTERM to all of it, SIGKILL after its grace) and returns
        once it is gone and its end recorded; False when it had already ended (or was told to)."""
        record = self._record(task_id)
        if record.state != RUNNING or record.ending is not None:
            return False
        record.ending = (CANCELLED, "cancelled")
        if record.container is None:
            # Still starting (its image pulling): the pull goes on (the cache keeps it), its
            # container is stopped as it starts, and the end is reported then.
            return True
        # Shielded: a caller that gives up (its RPC's deadline) must not leave a container that
        # ignored SIGTERM running without its SIGKILL.
        await asyncio.shield(self._stop(record, record.container))
        await record.finished.wait()
        return True

    async def exec(
        self, task_id: str, command: Sequence[str], terminal: int | None = None
    ) -> asyncio.subprocess.Process:
        record = self._record(task_id)
        if record.state != RUNNING or record.container is None:
            raise TaskNotRunning(f"task {task_id} is not running")
        return await self._runtime.exec(record.container, command, terminal)

    async def connect(
        self, task_id: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection to `port` of the running task's container (one it published)."""
        record = self._record(task_id)
        if record.state != RUNNING or record.container is None:
            raise TaskNotRunning(f"task {task_id} is not running: its ports are closed")
        if port not in record.spec.ports:
            published = ", ".join(map(str, record.spec.ports)) or "none"
            raise InvalidTask(
                f"task {task_id} did not publish port {port} (published: {published});"
                " run it with --port"
            )
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await asyncio.open_connection(self._task_host, port)
        except (OSError, TimeoutError) as error:
            why = str(error) or type(error).__name__
            raise PortUnavailable(
                f"task {task_id}: nothing accepts connections on port {port}"
                f"{'' if record.ready else ' yet (it is starting)'}: {why}"
            ) from None

    async def shutdown(self, grace_s: float, reason: str = SHUT_DOWN) -> None:
        """Kills every running task and records it LOST with `reason`."""
        self._closed = True
        running = [r for r in self._records.values() if r.state == RUNNING]
        for record in running:
            record.ending = record.ending or (LOST, reason)
        await asyncio.gather(
            *(
                self._stop(r, r.container, min(grace_s, r.grace_s))
                for r in running
                if r.container is not None
            )
        )
        await asyncio.gather(*(r.finished.wait() for r in running))

    # -- a task's life -----------------------------------------------------------------------

    def _accept(self, given: worker_pb2.TaskSpec) -> TaskRecord:
        spec = self._with_defaults(given)
        directory = self._dir / _directory_name(spec.task_id)
        shutil.rmtree(directory, ignore_errors=True)  # a task id reused after eviction
        record = TaskRecord(
            spec=spec,
            directory=directory,
            output=TaskOutput(directory / "output.log"),
            host=self._runtime.host_for(spec.image),
            clock=self._clock,
        )
        self._records[spec.task_id] = record
        self._idle_since = None
        log.info("task accepted", task_id=spec.task_id, gpu_indices=list(spec.gpu_indices))
        _save(record)
        return record

    def _with_defaults(self, given: worker_pb2.TaskSpec) -> worker_pb2.TaskSpec:
        """The task as it runs: the pool's default image, memory and CPUs where it named none."""
        spec = worker_pb2.TaskSpec()
        spec.CopyFrom(given)
        spec.image = spec.image or self._defaults.image
        spec.memory_bytes = spec.memory_bytes or self._defaults.memory_bytes
        spec.cpu_millis = spec.cpu_millis or self._defaults.cpu_millis
        return spec

    def _assign(self, record: TaskRecord) -> tuple[str, str] | None:
        """Gives the task its cards; (reason, detail) when it cannot have them."""
        wanted = tuple(sorted(set(record.spec.gpu_indices)))
        busy = {c for r in self._records.values() if r.state == RUNNING for c in r.cards}
        foreign = [c for c in wanted if c not in self._visible]
        taken = [c for c in wanted if c in busy]
        if foreign or taken:
            free = len([c for c in self._visible if c not in busy])
            visible = len(self._visible) if foreign else free
            reason = f"not enough GPUs available: requested={len(wanted)} visible={visible}"
            shown = ",".join(map(str, self._visible)) or "none"
            detail = (
                f"cards {foreign} are not this worker's (visible: {shown})"
                if foreign
                else f"cards {taken} are in use by other tasks"
            )
            return reason, detail
        record.cards = wanted
        _save(record)
        return None

    def _claim_ports(self, record: TaskRecord) -> tuple[str, str] | None:
        """(reason, detail) when another running task of this worker published one of its
        ports (they share the worker's network)."""
        for other in self._records.values():
            if other is record or other.state != RUNNING:
                continue
            taken = sorted(set(record.spec.ports) & set(other.spec.ports))
            if taken:
                reason = (
                    f"port {taken[0]} is already published by task {other.task_id} on this worker"
                )
                return reason, f"ports {taken} are in use by task {other.task_id}"
        return None

    def _task_env(self, spec: worker_pb2.TaskSpec) -> dict[str, str]:
        env = dict(spec.env)
        if spec.ports:
            env.setdefault("LEVERS9_HOST", self._task_host)
            env.setdefault("PORT", str(spec.ports[0]))
        return env

    async def _starting(self, record: TaskRecord) -> None:
        try:
            await self._start(record)
        except Exception as error:  # a bug must not leave the task running forever
            log.error("task start failed", task_id=record.task_id, error=repr(error))
            record.phase(CONTAINER_START, repr(error))
            self._finish(record, FAILED, f"the worker could not start it: {error!r}")

    async def _start(self, record: TaskRecord) -> None:
        spec = record.spec
        container_spec = ContainerSpec(
            task_id=spec.task_id,
            image=spec.image,
            command=tuple(spec.command),
            env=self._task_env(spec),
            gpu_indices=record.cards,
            result_path=record.result_path,
            work_dir=record.directory / "work",
            memory_bytes=spec.memory_bytes,
            cpu_millis=spec.cpu_millis,
        )
        try:
            container = await self._runtime.start(container_spec, record.output.write)
        except ImageUnavailable as error:
            record.phase(IMAGE_PULL, str(error))
            self._finish(record, FAILED, str(error))
            return
        except StartError as error:
            record.phase(CONTAINER_START, str(error))
            self._finish(record, FAILED, str(error))
            return
        record.container = container
        pulled = container.image
        if pulled is not None:
            record.image_digest = pulled.digest
            detail = "cached" if pulled.cached else f"pulled {pulled.bytes_pulled} bytes"
            record.phase(IMAGE_PULL, detail=detail)
        record.phase(CONTAINER_START)
        self._tell(record)  # its record shows the start (runtime, image) at once
        self._follow(record, container)

    def _follow(self, record: TaskRecord, container: Container) -> None:
        """Watches the running container to its end, and probes its port until it is ready."""
        watcher = asyncio.create_task(self._watch(record, container), name=record.task_id)
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        if record.spec.ports and not record.ready:
            probe = asyncio.create_task(self._probe(record), name=f"{record.task_id}-ready")
            self._watchers.add(probe)
            probe.add_done_callback(self._watchers.discard)

    async def _probe(self, record: TaskRecord) -> None:
        """Until the task's first port answers (or the task ends): then `ready`, reported."""
        port, path = record.spec.ports[0], record.spec.ready_path
        pause, longest = READY_POLL_S
        while record.state == RUNNING and record.ending is None:
            answer = await _probe_once(self._task_host, port, path)
            if answer is not None:
                if record.state != RUNNING:
                    return
                record.ready = True
                record.phase(CONTAINER_READY, detail=answer)
                log.info("task ready", task_id=record.task_id, port=port, probe=answer)
                self._tell(record)
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await record.finished.wait()
            pause = min(pause * 2, longest)

    def _stop(
        self, record: TaskRecord, container: Container, grace_s: float | None = None
    ) -> asyncio.Task[int]:
        """Its container's stop, begun once and left to finish whoever waits for it."""
        if record.stopping is None:
            grace = record.grace_s if grace_s is None else grace_s
            record.stopping = asyncio.create_task(
                container.stop(grace), name=f"{record.task_id}-stop"
            )
            self._watchers.add(record.stopping)
            record.stopping.add_done_callback(self._watchers.discard)
        return record.stopping

    async def _watch(self, record: TaskRecord, container: Container) -> None:
        if record.ending is not None:  # cancelled or shut down while it was starting
            await self._stop(record, container)
        code = await container.wait()
        record.exit_code = code
        record.phase(CONTAINER_EXIT)
        record.result_json = self._result(record)
        if record.ending is not None:
            state, reason = record.ending
        elif container.lost:
            state, reason = LOST, container.lost
        elif code == 0:
            state, reason = SUCCEEDED, ""
        elif container.oom_killed:
            state, reason = FAILED, OOM_KILLED
        else:
            state, reason = FAILED, f"exited with code {code}"
        self._finish(record, state, reason)

    def _result(self, record: TaskRecord) -> str:
        path = record.result_path
        if not path.exists():
            return ""
        try:
            with path.open("rb") as reader:
                data = reader.read(RESULT_LIMIT_BYTES + 1)
            if len(data) > RESULT_LIMIT_BYTES:
                raise ValueError(f"larger than {RESULT_LIMIT_BYTES} bytes")
            text = data.decode()
            json.loads(text)
        except (OSError, ValueError) as error:
            record.phase(TASK_RESULT, f"result file not used: {error}")
            return ""
        return text.strip()

    def _finish(self, record: TaskRecord, state: State, reason: str) -> None:
        record.state = state
        record.reason = reason
        record.cards = ()
        record.output.close()
        record.finished.set()
        self._finished.append(record.task_id)
        if self.running == 0:
            self._idle_since = self._clock()
        log.info(
            "task ended",
            task_id=record.task_id,
            state=worker_pb2.TaskState.Name(state),
            exit_code=record.exit_code,
            reason=reason,
        )
        self._tell(record)
        self._evict()

    def _tell(self, record: TaskRecord) -> None:
        """Keeps the task's record where a restarted agent finds it, and reports it."""
        _save(record)
        self._report(record.status())

    # -- what an agent before this one left --------------------------------------------------

    async def adopt(self) -> None:
        """Takes over what an agent before this one (killed, say) left in the work dir: its
        ended tasks as they ended (not reported again), its running tasks' containers (output
        followed on, the end reported once it comes, their cards held until then), and kills
        every container it finds no record of, or whose task it cannot follow, reporting those
        tasks lost."""
        adopted: dict[str, TaskRecord] = {}
        orphaned: list[TaskRecord] = []
        for saved in sorted(self._dir.glob(f"*/{TASK_FILE}")):
            record = self._load(saved)
            if record is None or record.task_id in self._records:
                continue
            self._records[record.task_id] = record
            if record.state != RUNNING:
                record.finished.set()
                self._finished.append(record.task_id)
                continue
            container = await self._runtime.adopt(
                record.task_id, record.output.write, record.output.size
            )
            if container is None:
                orphaned.append(record)
                continue
            record.container = container
            adopted[record.task_id] = record
        for task_id in await self._runtime.sweep(keep=adopted):
            if task_id not in self._records:
                record = self._accept(worker_pb2.TaskSpec(task_id=task_id))
                self._finish(record, LOST, ORPHANED)
        for record in orphaned:
            self._finish(record, LOST, NO_CONTAINER)
        for record in adopted.values():
            assert record.container is not None
            log.info("task adopted", task_id=record.task_id, cards=list(record.cards))
            self._follow(record, record.container)
        self._idle_since = None if self.running else self._clock()

    def _load(self, saved: Path) -> TaskRecord | None:
        try:
            kept = json.loads(saved.read_text())
            spec = json_format.ParseDict(kept["spec"], worker_pb2.TaskSpec())
            status = json_format.ParseDict(kept["status"], worker_pb2.TaskStatus())
            cards = tuple(int(c) for c in kept.get("cards", ()))
        except (OSError, ValueError, KeyError, TypeError, json_format.ParseError) as error:
            log.warning("task record unreadable", path=str(saved), error=str(error))
            return None
        record = TaskRecord(
            spec=spec,
            directory=saved.parent,
            output=TaskOutput(saved.parent / "output.log", resume=True),
            host=status.host,
            clock=self._clock,
            state=status.state or RUNNING,
            exit_code=status.exit_code,
            result_json=status.result_json,
            reason=status.reason,
            phases=list(status.phases),
            cards=cards if status.state == RUNNING else (),
            image_digest=status.image_digest,
            ready=status.ready,
        )
        if record.state != RUNNING:
            record.output.close()
        return record

    # -- bookkeeping -------------------------------------------------------------------------

    def _record(self, task_id: str) -> TaskRecord:
        record = self._records.get(task_id)
        if record is None:
            raise TaskNotFound(f"task {task_id} is not known to this worker")
        return record

    def _evict(self) -> None:
        """Forgets the oldest finished tasks beyond `keep_finished`: fetched ones first, and
        unfetched ones too once there are four times as many (memory stays bounded)."""
        while len(self._finished) > self._keep:
            fetched = [t for t in self._finished if self._records[t].fetched]
            if fetched:
                victim = fetched[0]
            elif len(self._finished) > 4 * self._keep:
                victim = self._finished[0]
            else:
                return
            self._finished.remove(victim)
            record = self._records.pop(victim)
            with contextlib.suppress(OSError):
                shutil.rmtree(record.directory)


def _save(record: TaskRecord) -> None:
    """The task's spec, cards and status to its directory (replaced whole, never half-written)."""
    status = record.status()
    status.ClearField("log_tail")  # output.log holds it
    kept = {
        "spec": json_format.MessageToDict(record.spec),
        "status": json_format.MessageToDict(status),
        "cards": list(record.cards),
    }
    path = record.directory / TASK_FILE
    temporary = path.with_suffix(".tmp")
    with contextlib.suppress(OSError):  # its directory evicted meanwhile
        temporary.write_text(json.dumps(kept))
        temporary.replace(path)


def _check_ports(spec: worker_pb2.TaskSpec) -> None:
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


async def _probe_once(host: str, port: int, path: str) -> str | None:
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


def _directory_name(task_id: str) -> str:
    # Task ids come from the controlplane; the directory name must be safe whatever they hold.
    digest = hashlib.sha256(task_id.encode()).hexdigest()[:12]
    return f"{_UNSAFE.sub('_', task_id)[:64]}-{digest}"
