"""BoxWorkflow (`box:<workspace>:<name>`): a box's record (`levers9 box create`).

    create -> start its task (a TaskWorkflow child from the box's template, left running across
    continue-as-new) -> follow it -> `stop` (Update: cancel it; the box reads stopped, with what
    was kept. Its worker is asked for a checkpoint first (activity `checkpoint_task`, patch
    `box-stop-checkpoints`; on the queue of the replica holding a tunnelled worker's session,
    from `checkpoint_queue`, patch `checkpoint-on-its-replica`): stopped with the image's
    name; refused, a runsc box runs on with an event `stop-refused` saying why, another is
    cancelled as before with the refusal's words)
    (behind patch `updates-return-at-once` the Update answers at once, the box reading
    `stopping` with the image's name; the run takes it and the record says the outcome)
    -> `start` (Update: a new task from the template, the same home; `restore_from` the
    checkpoint if one was taken: anywhere in the pool when the box has a checkpoint volume
    (`--checkpoints`) and the worker uploaded the image there, else pinned to the node that
    holds it) -> ... ->
    `delete` (Update: cancel its task, end; behind patch `box-delete-removes-images` it first
    removes every checkpoint image taken of the box (`images`) from its volume (activity
    `delete_stored_checkpoint`) and its node (`disk_worker`, then `delete_node_checkpoint` on
    that worker's queue), and answers with an event per image saying where any stays: a node
    with no worker now, a volume that refused; behind patch `updates-return-at-once` it answers
    at once and the run's result, the record, says so)

The task started in this run is followed through its child handle: when it ends by itself (its
command exited, its worker was lost) the box reads stopped with the task's end as the reason.
After a continue-as-new the gateway tells the record (signal `task_ended`) when it finds the
box's task ended. Signal `used` (from the gateway, at each exec, shell, ports or ssh use) moves
the idle deadline of `--idle-stop`; the record's timer stops the box when it passes (a runsc
box checkpointed as by `stop`, patch `idle-stop-checkpoints`; refused, stopped without one).

The record is also its memo (`record`), so the gateway reads a box without a Temporal worker.
It continues as new with its state past `max_history_events`.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, FailureError
from temporalio.workflow import ChildWorkflowHandle, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.dispatch import TaskActivities
    from levers9.box_state import (
        BoxCheckpoint,
        BoxImage,
        BoxInput,
        BoxState,
        CheckpointOutcome,
        NodeImage,
        StoredImage,
    )
    from levers9.core.boxes import (
        BOX_WORKFLOW,
        DELETING,
        NO_CHECKPOINT,
        RUNNING,
        STOPPED,
        box_task_id,
    )
    from levers9.core.disks import DiskFile
    from levers9.core.workspaces import DEFAULT_WORKSPACE
    from levers9.models import TASK_WORKFLOW, TaskRecord, task_workflow_id
    from levers9.search_attributes import WORKSPACE
    from workflows.steps import failure_reason


CHECKPOINT_PATCH = "box-stop-checkpoints"
"""`box stop` of a runsc box checkpoints its task (histories recorded before it cancel it)."""
CHECKPOINT_RETRY = RetryPolicy(maximum_attempts=2)
REPLICA_PATCH = "checkpoint-on-its-replica"
"""`checkpoint_task` runs on the queue of the replica holding a tunnelled worker's session (read
first by `checkpoint_queue`), as a task's own calls do; histories before it ran it on the shared
queue, where only that replica could reach such a worker."""
IDLE_PATCH = "idle-stop-checkpoints"
"""`--idle-stop` of a runsc box checkpoints it as `box stop` does (before: stopped without one)."""
RESTORE_REFUSALS = ("restore_from:", "restore refused:")
"""How the agent's refusal of a task's restore begins (a missing, corrupted or foreign image)."""
AT_ONCE_PATCH = "updates-return-at-once"
"""`stop` (when it checkpoints) and `delete` (when it removes images) answer at once, the box
reading `stopping` / `deleting`; the run does the work and the record says the outcome, which
the caller reads (levers9.records.boxes). Histories before it held the Update open meanwhile."""
IMAGES_PATCH = "box-delete-removes-images"
"""`box delete` removes the box's checkpoint images (histories before it left them)."""
IMAGE_TIMEOUT = timedelta(minutes=2)
IMAGE_RETRY = RetryPolicy(maximum_attempts=3, maximum_interval=timedelta(seconds=10))
ROUTE_TIMEOUT = timedelta(seconds=30)
REPLICA_PICKUP = timedelta(seconds=20)
"""How long the replica holding the worker's tunnel has to pick the checkpoint up (gone: the box
runs on, and the stop says why)."""


@workflow.defn(name=BOX_WORKFLOW)
class BoxWorkflow:
    @workflow.init
    def __init__(self, input: BoxInput) -> None:
        self._state: BoxState = input.state
        self._live = input.state.state == RUNNING and bool(input.state.task_id)
        """Its current task runs (or waits to): set once started, cleared once it is cancelled
        or has ended."""
        self._cancel: list[tuple[str, str]] = []
        self._changed = True
        self._follow: asyncio.Task[None] | None = None
        self._checkpoint: str = ""
        """`box stop` asked for a checkpoint of its task under this name (`_act` takes it)."""
        self._stop_reason = ""
        self._idle = False
        """The checkpoint asked for is `--idle-stop`'s: refused, the box is stopped all the same."""
        self._removing = False
        """The box's checkpoint images are being removed (`delete`; the run's last work)."""
        self._elsewhere = False
        """`box start --elsewhere`: its restore goes to another machine than the one that took
        its checkpoint (kept in a volume)."""

    @workflow.query
    def box(self) -> BoxState:
        return self._state

    @workflow.signal
    def used(self) -> None:
        self._state.last_used_at = workflow.now()
        self._changed = True

    @workflow.signal
    def task_ended(self, task_id: str, state: str, reason: str) -> None:
        """Its task ended (the gateway read so from the task's record)."""
        self._ended(task_id, state, reason)

    @workflow.update
    async def stop(self, reason: str) -> BoxState:
        state = self._state
        if (
            state.state == RUNNING
            and self._live
            and not self._checkpoint
            and workflow.patched(CHECKPOINT_PATCH)
        ):
            # `_act` asks its worker for a checkpoint: stopped with the image's name; refused,
            # a runsc box runs on with why, another is stopped as before, saying why not.
            self._checkpoint = f"{state.name}-{state.starts}-{workflow.uuid4().hex[:8]}"
            self._stop_reason = reason or "box stop"
            self._changed = True
            if workflow.patched(AT_ONCE_PATCH):
                # Accepted: the run takes the checkpoint; the caller reads the outcome in the
                # record (query `box`) once `stopping` is cleared.
                state.stopping = self._checkpoint
                self._publish()
                return state
        elif state.state == RUNNING and state.stopping and workflow.patched(AT_ONCE_PATCH):
            return state  # a checkpoint is being taken: its outcome answers this stop too
        elif state.state == RUNNING:
            self._stop(reason or "box stop")
        await workflow.wait_condition(lambda: not self._changed)
        return state

    @workflow.update
    async def start(self, elsewhere: bool = False) -> BoxState:
        """Starts a stopped box (restoring its checkpoint); `elsewhere`: on another machine
        than the one that took the checkpoint (the gateway checks it is in a volume)."""
        state = self._state
        if state.state == STOPPED:
            self._elsewhere = elsewhere
            state.state = RUNNING
            state.reason = ""
            state.last_used_at = workflow.now()
            self._changed = True
        await workflow.wait_condition(lambda: not self._changed)
        return state

    @workflow.update
    async def delete(self) -> BoxState:
        state = self._state
        if state.state != DELETING:
            if self._live:
                self._cancel.append((state.task_id, f"box {state.name} deleted"))
                self._live = False
            state.state = DELETING
            state.note(workflow.now(), "delete", "deleted: its task is stopped")
            self._changed = True
            self._removing = bool(self._images()) and workflow.patched(IMAGES_PATCH)
            if self._removing and workflow.patched(AT_ONCE_PATCH):
                # Accepted: the run removes the images and ends with the record (its result)
                # saying where each went; the caller waits for that result.
                self._publish()
                return state
        await workflow.wait_condition(lambda: not self._removing)
        return state

    def _images(self) -> list[BoxImage]:
        """Every checkpoint image taken of it (and the one a record of older code kept)."""
        state = self._state
        images = list(state.images)
        if state.checkpoint and all(i.name != state.checkpoint for i in images):
            images.append(
                BoxImage(
                    name=state.checkpoint,
                    node=state.checkpoint_node,
                    volume=state.task.checkpoint_volume if state.checkpoint_stored else "",
                    stored=state.checkpoint_stored,
                )
            )
        return images

    def _idle_stop(self) -> None:
        """`--idle-stop`: a runsc box is checkpointed as by `box stop` (patch
        `idle-stop-checkpoints`); refused, it is stopped all the same, saying why no checkpoint
        was kept; another box is stopped without one."""
        state = self._state
        why = f"idle for {state.idle_stop_seconds} s (--idle-stop)"
        runsc = state.task.runtime == "runsc" and self._live
        if runsc and not self._checkpoint and workflow.patched(IDLE_PATCH):
            self._checkpoint = f"{state.name}-{state.starts}-{workflow.uuid4().hex[:8]}"
            self._stop_reason = why
            self._idle = True
            self._changed = True
        elif not self._checkpoint:
            self._stop(why)

    def _stop(self, why: str, refused: str = "") -> None:
        state = self._state
        now = workflow.now()
        if self._live:
            self._cancel.append((state.task_id, f"box {state.name} stopped: {why}"))
            self._live = False
        state.state = STOPPED
        state.reason = f"{why}; {NO_CHECKPOINT.format(home=state.home())}{refused}"
        state.note(now, "stop", state.reason)
        self._changed = True

    def _ended(self, task_id: str, end: str, reason: str) -> None:
        state = self._state
        if task_id != state.task_id or not self._live:
            return
        self._live = False
        if state.state == RUNNING:
            why = f"its task {task_id} ended {end}" + (f": {reason}" if reason else "")
            state.state = STOPPED
            state.reason = f"{why} (levers9 box start {state.name} starts it again)"
            refused = reason.startswith(RESTORE_REFUSALS)
            if end == "failed" and state.restored_from and refused:
                # Its image is gone or unusable: the processes it held are lost for good.
                why = (
                    f"its checkpoint {state.restored_from} could not be restored (task"
                    f" {task_id}: {reason}): its processes are lost"
                )
                state.reason = (
                    f"{why}; levers9 box start {state.name} starts it fresh, with its home"
                    f" ({state.home()})"
                )
            state.note(workflow.now(), "ended", why)
        self._changed = True

    def _publish(self) -> None:
        workflow.upsert_memo({"record": self._state.model_dump(mode="json")})

    @workflow.run
    async def run(self, input: BoxInput) -> BoxState:
        state = self._state
        while True:
            await self._act()
            self._publish()
            self._changed = False
            if state.state == DELETING:
                break
            if workflow.info().get_current_history_length() > input.max_history_events:
                # An Update in flight waits for this loop to act on it: it goes first.
                await workflow.wait_condition(
                    lambda: self._changed or workflow.all_handlers_finished()
                )
                if not self._changed:
                    workflow.continue_as_new(input.model_copy(update={"state": state}))
                continue
            deadline = state.idle_deadline()
            timeout = None if deadline is None else deadline - workflow.now()
            with contextlib.suppress(TimeoutError):
                if timeout is None or timeout.total_seconds() > 0:
                    await workflow.wait_condition(lambda: self._changed, timeout=timeout)
            deadline = state.idle_deadline()
            if deadline is not None and workflow.now() >= deadline and state.state == RUNNING:
                self._idle_stop()
        await self._act()
        if self._removing:
            for image in self._images():
                await self._remove_image(image)
            self._removing = False
            self._publish()
        await workflow.wait_condition(workflow.all_handlers_finished)
        return state

    async def _remove_image(self, image: BoxImage) -> None:
        """Removes one checkpoint image from its volume and its node; an event says where it
        went, or where it stays and why."""
        state = self._state
        said: list[str] = []
        if image.stored:
            try:
                await workflow.execute_activity_method(
                    TaskActivities.delete_stored_checkpoint,
                    StoredImage(workspace=state.workspace, volume=image.volume, name=image.name),
                    schedule_to_close_timeout=IMAGE_TIMEOUT,
                    retry_policy=IMAGE_RETRY,
                )
                said.append(f"removed from volume {image.volume}")
            except ActivityError as exc:
                said.append(
                    f"stays in volume {image.volume} at {image.stored} ({failure_reason(exc)}):"
                    " remove it there"
                )
        nodes = [image.node] if image.node else []
        for task_id in image.restored_by if image.stored else []:
            # A restore from the volume fetched the image onto its own node.
            with contextlib.suppress(ActivityError):  # its record is gone: so is the node's
                node: str = await workflow.execute_activity_method(
                    TaskActivities.task_node,
                    task_id,
                    schedule_to_close_timeout=IMAGE_TIMEOUT,
                    retry_policy=IMAGE_RETRY,
                )
                if node and node not in nodes:
                    nodes.append(node)
        for node in nodes:
            said.append(await self._remove_from_node(image, node))
        removed = f"checkpoint {image.name}: " + "; ".join(said)
        state.note(workflow.now(), "delete-checkpoint", removed)

    async def _remove_from_node(self, image: BoxImage, node: str) -> str:
        state = self._state
        kept = (
            f"stays on node {node} (its worker's checkpoints folder,"
            f" {state.workspace}/{image.name})"
        )
        file = DiskFile(pool_name=state.task.pool_name, node_name=node, disk_id="")
        try:
            worker: DiskFile | None = await workflow.execute_activity_method(
                TaskActivities.disk_worker,
                file,
                schedule_to_close_timeout=IMAGE_TIMEOUT,
                retry_policy=IMAGE_RETRY,
            )
            if worker is None:
                return f"{kept}: the node has no worker now; remove it there"
            removed: bool = await workflow.execute_activity_method(
                TaskActivities.delete_node_checkpoint,
                NodeImage(worker=worker, workspace=state.workspace, name=image.name),
                task_queue=worker.task_queue or workflow.info().task_queue,
                schedule_to_close_timeout=IMAGE_TIMEOUT,
                retry_policy=IMAGE_RETRY,
                summary=f"DeleteCheckpoint on worker {worker.worker_id} ({node})",
            )
        except ActivityError as exc:
            return f"{kept} ({failure_reason(exc)}): remove it there"
        return f"removed from node {node}" if removed else f"node {node} held none"

    async def _act(self) -> None:
        state = self._state
        if self._checkpoint:
            await self._checkpoint_task(self._checkpoint)
            self._checkpoint = ""
            self._idle = False
            state.stopping = ""
        while self._cancel:
            task_id, reason = self._cancel.pop(0)
            handle = workflow.get_external_workflow_handle(task_workflow_id(task_id))
            with contextlib.suppress(FailureError):  # its record ended meanwhile
                await handle.signal("cancel", reason)
        if state.state == RUNNING and not self._live:
            await self._start_task()

    async def _checkpoint_task(self, name: str) -> None:
        """CheckpointTask of its task: stopped with the image's name; or, refused or failed,
        its task runs on and the event says why (`box stop` answers with it)."""
        state = self._state
        if state.state != RUNNING or not self._live:
            return
        task_id = state.task_id
        try:
            queue = ""
            if workflow.patched(REPLICA_PATCH):
                queue = await workflow.execute_activity_method(
                    TaskActivities.checkpoint_queue,
                    task_id,
                    start_to_close_timeout=ROUTE_TIMEOUT,
                    retry_policy=CHECKPOINT_RETRY,
                )
            outcome = await workflow.execute_activity_method(
                TaskActivities.checkpoint_task,
                BoxCheckpoint(
                    task_id=task_id,
                    name=name,
                    workspace=state.workspace,
                    volume=state.task.checkpoint_volume,
                ),
                start_to_close_timeout=timedelta(minutes=6),
                schedule_to_start_timeout=REPLICA_PICKUP if queue else None,
                retry_policy=CHECKPOINT_RETRY,
                task_queue=queue or None,
            )
        except ActivityError as exc:
            outcome = CheckpointOutcome(refused=failure_reason(exc))
        idle = self._idle
        if outcome.refused and (outcome.not_running or state.task.runtime != "runsc" or idle):
            self._stop(self._stop_reason, f" (the worker took none: {outcome.refused})")
            return
        if outcome.refused:
            why = f"no checkpoint of task {task_id}: {outcome.refused}; the box runs on"
            state.note(workflow.now(), "stop-refused", why)
            return
        self._live = False
        state.checkpoint = outcome.name
        state.checkpoint_node = outcome.node
        state.checkpoint_stored = outcome.stored
        state.checkpoint_sha256 = outcome.stored_sha256
        state.images.append(
            BoxImage(
                name=outcome.name,
                node=outcome.node,
                volume=state.task.checkpoint_volume if outcome.stored else "",
                stored=outcome.stored,
            )
        )
        state.state = STOPPED
        taken = (
            f"{self._stop_reason or 'box stop'}; checkpointed to {outcome.name}"
            f" ({outcome.size_bytes} bytes in"
            f" {outcome.seconds:.1f} s)"
        )
        volume = state.task.checkpoint_volume
        node = outcome.node or "the node that took it"
        if outcome.stored:
            kept = (
                f", kept in volume {volume} ({outcome.store_seconds:.1f} s): box start restores"
                " its processes on any machine of the pool"
            )
        elif volume:
            kept = (
                f", kept on {node} only: its upload to volume {volume} failed"
                f" ({outcome.store_error}); box start restores its processes there"
            )
        else:
            kept = (
                f", kept on {node} only (no checkpoint volume: box create --checkpoints VOLUME"
                " keeps them in one): box start restores its processes there"
            )
        state.reason = taken + kept
        state.note(workflow.now(), "stop", state.reason)

    async def _start_task(self) -> None:
        state = self._state
        state.starts += 1
        task_id = box_task_id(state.name, state.starts, workflow.uuid4().hex[:8])
        task = state.task.model_copy(update={"task_id": task_id, "workspace": state.workspace})
        restore = state.checkpoint
        if restore:
            # Once: a restore that fails leaves the box stopped, and its next start is fresh.
            # An image kept in the checkpoint volume is fetched by whichever machine takes it;
            # one kept on its node only pins the restore there.
            pinned = state.checkpoint_node and not state.checkpoint_stored
            pin = {"node": state.checkpoint_node} if pinned else {}
            if self._elsewhere and state.checkpoint_stored and state.checkpoint_node:
                pin = {"avoid_node": state.checkpoint_node}
            restoring = {"restore_from": restore, "restore_sha256": state.checkpoint_sha256}
            task = task.model_copy(update={**restoring, **pin})
            for image in state.images:
                if image.name == restore:
                    image.restored_by.append(task_id)
            state.checkpoint = ""
            state.checkpoint_node = ""
            state.checkpoint_stored = ""
            state.checkpoint_sha256 = ""
        self._elsewhere = False
        attributes = (
            TypedSearchAttributes([SearchAttributePair(WORKSPACE, state.workspace)])
            if state.workspace != DEFAULT_WORKSPACE
            else None
        )
        handle: ChildWorkflowHandle[object, TaskRecord] = await workflow.start_child_workflow(
            TASK_WORKFLOW,
            task,
            id=task_workflow_id(task_id),
            task_queue=workflow.info().task_queue,
            parent_close_policy=ParentClosePolicy.ABANDON,
            static_summary=f"box {state.name} of workspace {state.workspace}",
            search_attributes=attributes,
            result_type=TaskRecord,
        )
        state.task_id = task_id
        state.restored_from = restore
        self._live = True
        restored = f", its processes restored from checkpoint {restore}" if restore else ""
        state.note(workflow.now(), "start", f"started task {task_id}{restored}")
        self._follow = asyncio.create_task(self._follow_task(handle, task_id))

    async def _follow_task(
        self, handle: ChildWorkflowHandle[object, TaskRecord], task_id: str
    ) -> None:
        try:
            record = await handle
        except FailureError as exc:
            self._ended(task_id, "failed", str(exc))
            return
        self._ended(task_id, record.state, record.reason)
