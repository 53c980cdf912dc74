"""One task on this worker: its record (spec, cards, state, phases, result), the phase names it
carries, and its copy on disk (`task.json` in the task's directory) from which an agent started
later takes the task over.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

from google.protobuf import json_format

from levers9.agent.output import TaskOutput
from levers9.agent.runtime import Container
from levers9.logs import get_logger
from levers9.proto import worker_pb2

log = get_logger("levers9.agent.supervisor")

State: TypeAlias = worker_pb2.TaskState.ValueType
RUNNING: State = worker_pb2.TASK_STATE_RUNNING
SUCCEEDED: State = worker_pb2.TASK_STATE_SUCCEEDED
FAILED: State = worker_pb2.TASK_STATE_FAILED
CANCELLED: State = worker_pb2.TASK_STATE_CANCELLED
LOST: State = worker_pb2.TASK_STATE_LOST

GPU_ASSIGNMENT = "worker.gpu_assignment"
PORTS = "worker.ports"
IMAGE_PULL = "image.pull"
CONTAINER_START = "container.start"
CONTAINER_EXIT = "container.exit"
CONTAINER_READY = "container.ready"
TASK_RESULT = "task.result"
TASK_FILE = "task.json"
"""In each task's directory: its spec, cards and latest status, for an agent started later."""

STOP_GRACE_S = 10.0
"""A stopped task's grace between SIGTERM and SIGKILL when its spec names none (as `docker stop`):
every process of its container gets SIGTERM, and SIGKILL once the grace is over."""
RESULT_LIMIT_BYTES = 1 << 20  # well under gRPC's 4 MiB message limit
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


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
            attempt=self.spec.attempt,
        )


def read_result(record: TaskRecord) -> str:
    """The task's result file as its result JSON: "" when it wrote none, or one that is not
    JSON or too large (a `task.result` phase says why)."""
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


def save(record: TaskRecord) -> None:
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


def load(saved: Path, clock: Callable[[], float]) -> TaskRecord | None:
    """A task's record as `save` kept it in its directory; None when it cannot be read (logged)."""
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
        clock=clock,
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


def directory_name(task_id: str) -> str:
    # Task ids come from the controlplane; the directory name must be safe whatever they hold.
    digest = hashlib.sha256(task_id.encode()).hexdigest()[:12]
    return f"{_UNSAFE.sub('_', task_id)[:64]}-{digest}"
