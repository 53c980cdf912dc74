"""A box's record as BoxWorkflow holds it (`levers9.core.boxes` says what a box is): its
task's template, its state, its events. Also its memo (`record`)."""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from levers9.core.boxes import MAX_EVENTS, RUNNING
from levers9.core.disks import DiskFile
from levers9.models import TaskInput


class BoxEvent(BaseModel):
    at: datetime
    kind: str
    message: str


class BoxImage(BaseModel):
    """A checkpoint image `box stop` took of the box (`box delete` removes it)."""

    name: str
    node: str = ""
    """The node whose disk holds it."""
    volume: str = ""
    stored: str = ""
    """Where it is kept in that volume ("": on its node only)."""
    restored_by: list[str] = Field(default_factory=list)
    """The tasks restored from it: a stored image is fetched onto their nodes too."""


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
    checkpoint: str = ""
    """The checkpoint `box stop` took of its last task (runsc boxes): its next start restores
    it; "": none (its next task starts fresh)."""
    checkpoint_node: str = ""
    """The node holding that checkpoint: its restore is pinned there unless it is stored."""
    checkpoint_stored: str = ""
    """Where it is kept in the box's checkpoint volume: its restore may run on any machine."""
    checkpoint_sha256: str = ""
    """Its image.tar's sha256 as uploaded: the restore refuses any other (TaskInput's
    restore_sha256)."""
    stopping: str = ""
    """`box stop` asked for a checkpoint of its task under this name and it is being taken
    ("": none): the record says the outcome once it is cleared (stopped, or `stop-refused`)."""
    restored_from: str = ""
    """The checkpoint its current task restores its processes from ("": it started fresh)."""
    images: list[BoxImage] = Field(default_factory=list)
    """Every checkpoint image taken of it, restored or not: `box delete` removes them from their
    node and their volume."""
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


class BoxCheckpoint(BaseModel):
    """CheckpointTask of a box's task (activity `checkpoint_task`): the image's name."""

    task_id: str
    name: str
    workspace: str = ""
    volume: str = ""
    """The box's checkpoint volume: the worker uploads the image there ("": kept on its node)."""


class CheckpointOutcome(BaseModel):
    """What CheckpointTask answered: the image sealed and the task ended (`refused` ""), or
    the worker's refusal (FAILED_PRECONDITION: a runc task, no room...; the task runs on)."""

    name: str = ""
    node: str = ""
    """The node whose disk holds the image: the restore must run there."""
    size_bytes: int = 0
    seconds: float = 0.0
    stored: str = ""
    """Where it was uploaded in the checkpoint volume ("": on its node only)."""
    store_error: str = ""
    """Why it was not uploaded (the volume's error), when a volume was named."""
    store_seconds: float = 0.0
    stored_sha256: str = ""
    """The uploaded image.tar's sha256: its restore must fetch that very image."""
    refused: str = ""
    not_running: bool = False
    """Refused because the task is not running (queued, placed, ended): nothing to keep."""
    asked: int = 0
    """Update `checkpoint` accepted it as the record's ask of this number (`name` given): the
    outcome comes in the record (levers9.records.tasks reads it); 0: this is the outcome."""


class StoredImage(BaseModel):
    """A checkpoint image in a workspace's checkpoint volume (activity
    `delete_stored_checkpoint`: the volume's credentials are read and unsealed there)."""

    workspace: str
    volume: str
    name: str


class NodeImage(BaseModel):
    """A checkpoint image on a node, and the worker of that node to ask (DeleteCheckpoint)."""

    worker: DiskFile
    workspace: str
    name: str
