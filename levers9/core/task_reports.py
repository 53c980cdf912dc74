"""What a worker reports about a task: signal `report` to `TaskWorkflow` (`task:<task-id>`).

Pure (no gRPC, no I/O), so a workflow may import it. The gateway builds it from the agent's
`TaskStatus` (`levers9/proto/worker.proto`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

TaskState = Literal["running", "succeeded", "failed", "cancelled", "lost"]


class TaskPhase(BaseModel):
    """One step of a task on the worker, e.g. `worker.gpu_assignment`, with its error if any."""

    model_config = ConfigDict(frozen=True)

    name: str
    at: datetime | None = None
    error: str = ""
    detail: str = ""
    """What the step did (`image.pull`: `cached`, or the bytes pulled)."""


class TaskReport(BaseModel):
    """Signal `report` to `task:<task-id>`: the task's state as its worker sees it.

    `pool_name` and `worker_id` are the reporting worker's (its token proved the id), so the
    task can ignore a report from a worker it was not given to.
    """

    model_config = ConfigDict(frozen=True)

    pool_name: str
    worker_id: str
    task_id: str
    state: TaskState
    exit_code: int | None = 0
    """The container's exit code; None when it never ran (it failed to start: no exit code
    at all, never a 0 that reads like success)."""
    result_json: str = ""
    """What the task printed as its result, verbatim (not parsed here)."""
    reason: str = ""
    """Why it failed, verbatim."""
    phases: tuple[TaskPhase, ...] = ()
    log_tail: str = ""
    host: str = ""
    """The runtime that ran it: `process`, `runc`."""
    image_digest: str = ""
    """The manifest digest the task's image resolved to (runc)."""
    image: str = ""
    """The image it ran in: its own, or the pool's default (empty from an older worker)."""
    ready: bool = False
    """Its first published port answered (`container.ready`)."""
    attempt: int = 0
    """The attempt of the task the worker ran (TaskSpec.attempt); 0 from an older worker."""
