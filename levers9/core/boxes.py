"""Boxes (`levers9 box ...`): a workspace's long-lived task with a shell, published ports and a
home on a disk or a volume, that stops and starts again under its name.

A box is a record (BoxWorkflow, `box:<workspace>:<name>`) that holds the task it runs as a
template (`BoxState.task`) and starts it as a task (TaskWorkflow, `task:<box>-<n>`) whenever
the box should run and no task of it does. `box stop` cancels that task, `box start` starts a
new one from the template with the same home (its disk or volume): what the processes held in
memory is lost until checkpoint restore lands (the record says so in its `stopped` reason).
`--idle-stop`: a box nobody has used (exec, shell, ports, ssh) for that long is stopped by its
record's timer; the gateway tells the record of each use.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from levers9.core.workspaces import name_problem
from levers9.models import TaskInput

BOX_WORKFLOW = "BoxWorkflow"
MAX_BOX_NAME_CHARS = 40
KEEP_ALIVE = ("sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done")
"""A box's command when it names none: keeps the container up until it is stopped (and stops
at once on SIGTERM, which plain `sleep` as PID 1 ignores)."""
MAX_IDLE_STOP_S = 30 * 24 * 3600
MIN_IDLE_STOP_S = 60
MAX_EVENTS = 20
"""The record keeps its last this many events (`box get` shows them)."""

RUNNING = "running"
STOPPED = "stopped"
DELETING = "deleting"
NO_CHECKPOINT = (
    "no checkpoint: the box's processes were stopped and start fresh; its home ({home}) keeps"
    " its files"
)


def box_workflow_id(workspace: str, name: str) -> str:
    return f"box:{workspace}:{name}"


def box_name_problem(name: str) -> str | None:
    """Why `name` cannot name a box (None: it can): a DNS label of at most 40 characters."""
    problem = name_problem(name)
    if problem is not None:
        return problem.replace("a workspace is named", "a box is named").replace("team-a", "dev")
    if len(name) > MAX_BOX_NAME_CHARS:
        return f"{name!r} is longer than {MAX_BOX_NAME_CHARS} characters"
    return None


def idle_stop_problem(seconds: int) -> str | None:
    """Why `--idle-stop` cannot be this many seconds (0: never)."""
    if seconds == 0 or MIN_IDLE_STOP_S <= seconds <= MAX_IDLE_STOP_S:
        return None
    return f"{seconds} s is not between {MIN_IDLE_STOP_S} s and 30 days (0: never)"


def parse_duration(text: str) -> int:
    """`90s`, `30m`, `2h`, `1d` (or plain seconds) as seconds; ValueError naming the form."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip()
    unit = units.get(text[-1:]) if text else None
    number = text[:-1] if unit is not None else text
    if not number.isdigit():
        raise ValueError(f"{text!r} is not a duration: give e.g. 90s, 30m, 2h or 1d")
    return int(number) * (unit or 1)


class BoxEvent(BaseModel):
    at: datetime
    kind: str
    message: str


class BoxState(BaseModel):
    """The box's record, also its memo (`record`): what `levers9 box get` shows."""

    name: str
    workspace: str
    task: TaskInput
    """The task it runs, as a template: each start is this with a new task id."""
    idle_stop_seconds: int = 0
    created_at: datetime
    state: str = RUNNING
    """running (its task runs or waits to), stopped, deleting"""
    task_id: str = ""
    """Its current (or last) task."""
    starts: int = 0
    reason: str = ""
    """Why it is stopped (`box stop`, idle, its task ended) and what was kept."""
    last_used_at: datetime | None = None
    events: list[BoxEvent] = Field(default_factory=list)

    def note(self, at: datetime, kind: str, message: str) -> None:
        self.events.append(BoxEvent(at=at, kind=kind, message=message))
        del self.events[:-MAX_EVENTS]

    def home(self) -> str:
        """Where its files survive a stop: its disks and volumes, or nothing."""
        kept = [f"{m.kind} {m.name} at {m.path}" for m in self.task.mounts]
        return ", ".join(kept) or "none: no --disk or --volume"

    def idle_deadline(self) -> datetime | None:
        """When it is stopped for want of use (None: never, or it is not running)."""
        if not self.idle_stop_seconds or self.state != RUNNING:
            return None
        since = self.last_used_at or self.created_at
        return since + timedelta(seconds=self.idle_stop_seconds)


class BoxInput(BaseModel):
    state: BoxState
    max_history_events: int = Field(default=2_000, ge=50)
    """Continue as new (with the state) past this many events: the uses the gateway reports."""


def box_task_id(name: str, start: int, unique: str) -> str:
    """The id of a box's `start`-th task: `<box>-<n>-<hex>`, so its tasks read as its own."""
    return f"{name}-{start}-{unique}"
