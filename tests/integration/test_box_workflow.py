"""BoxWorkflow on the time-skipping server, its task a stand-in TaskWorkflow (registered under
the task record's name: it runs until its `cancel` signal, or ends `failed` at once when its
command is `false`), so that the box's own timers and messages are what is tested:

- `--idle-stop`: a box nobody uses is stopped once the idle time has passed (its task told to
  cancel, the box's reason says so and that no checkpoint was taken); a use (signal `used`)
  moves the deadline; a runsc box is checkpointed as by `stop` (refused: stopped without one);
- a task that ends by itself leaves the box stopped with the task's end, and `start` starts a
  new task of the same template;
- past `max_history_events` the record continues as new with its state, and still acts;
- a checkpoint its worker kept in the box's checkpoint volume is restored by a task pinned to
  no node, with the sha256 the upload answered; one kept on its node only (no volume, or its
  upload failed) pins the restore there, and the stop's reason says which;
- a restore whose image is gone leaves the box stopped saying its processes are lost and that
  the next start is fresh, which it is;
- `delete` removes every checkpoint image taken of the box from its volume and (through a
  worker of its node, on that worker's replica queue) its node, and answers saying so, or where
  an image stays when its node has no worker now.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.box_state import (
    BoxCheckpoint,
    BoxInput,
    BoxState,
    CheckpointOutcome,
    NodeImage,
    StoredImage,
)
from levers9.core.boxes import BOX_WORKFLOW
from levers9.core.disks import DiskFile
from levers9.models import TASK_WORKFLOW, TaskInput, TaskRecord
from levers9.records.boxes import TemporalBoxRecords
from tests.waiting import eventually
from workflows.box import BoxWorkflow

pytestmark = pytest.mark.integration


@workflow.defn(name=TASK_WORKFLOW, sandboxed=False)
class StandInTask:
    def __init__(self) -> None:
        self._cancelled = ""
        self._input: TaskInput | None = None

    @workflow.query
    def input(self) -> TaskInput | None:
        return self._input

    @workflow.signal
    def cancel(self, reason: str = "") -> None:
        self._cancelled = reason or "cancelled"

    @workflow.run
    async def run(self, task: TaskInput) -> TaskRecord:
        self._input = task
        record = TaskRecord(
            task_id=task.task_id,
            pool_name=task.pool_name,
            command=task.command,
            gpus=task.gpus,
            image=task.image,
            state="failed",
            created_at=workflow.now(),
            reason="exit code 1",
        )
        if task.restore_from and task.image == "image-gone":  # as the agent refuses it
            return record.model_copy(
                update={"reason": f"restore_from: no checkpoint {task.restore_from} on this"
                        " machine (/ck/default/x)"}
            )  # fmt: skip
        if task.command != ("false",):
            await workflow.wait_condition(lambda: bool(self._cancelled))
            record = record.model_copy(update={"state": "cancelled", "reason": self._cancelled})
        return record


@activity.defn(name="checkpoint_task")
async def refused_checkpoint(input: BoxCheckpoint) -> CheckpointOutcome:
    """The stand-in task's worker: a runc task's refusal (tests/integration/
    test_boxes_sandbox.py asks a real worker)."""
    return CheckpointOutcome(refused=f"task {input.task_id} runs under runc")


@activity.defn(name="checkpoint_task")
async def kept_checkpoint(input: BoxCheckpoint) -> CheckpointOutcome:
    """A runsc worker on node-a: the image uploaded to the box's checkpoint volume when it names
    one, except a volume named `broken` (its upload fails)."""
    stored = f"s3://b/p/checkpoints/{input.name}/" if input.volume not in ("", "broken") else ""
    failed = "volume broken: AccessDenied" if input.volume == "broken" else ""
    return CheckpointOutcome(
        name=input.name,
        node="node-a",
        size_bytes=1,
        stored=stored,
        store_error=failed,
        stored_sha256="ab" * 32 if stored else "",
    )


@activity.defn(name="checkpoint_queue")
async def shared_queue(task_id: str) -> str:
    """The stand-in task's worker is dialled directly: its checkpoint runs on the shared queue."""
    return ""


@pytest.fixture
async def worker(time_env: WorkflowEnvironment, task_queue: str) -> AsyncIterator[None]:
    async with Worker(
        time_env.client,
        task_queue=task_queue,
        workflows=[BoxWorkflow, StandInTask],
        activities=[refused_checkpoint, shared_queue],
    ):
        yield


async def _box(
    env: WorkflowEnvironment,
    task_queue: str,
    command: tuple[str, ...] = ("sleep", "infinity"),
    idle_stop_seconds: int = 0,
    max_history_events: int = 2_000,
    **task: str,
) -> WorkflowHandle[BoxWorkflow, BoxState]:
    name = f"b{uuid.uuid4().hex[:6]}"
    state = BoxState(
        name=name,
        workspace="default",
        task=TaskInput(task_id="-", pool_name="p", command=command, gpus=0, **task),
        idle_stop_seconds=idle_stop_seconds,
        created_at=datetime.now(UTC),
    )
    handle: WorkflowHandle[BoxWorkflow, BoxState] = await env.client.start_workflow(
        BOX_WORKFLOW,
        BoxInput(state=state, max_history_events=max_history_events),
        id=f"box:default:{name}",
        task_queue=task_queue,
        result_type=BoxState,
    )
    return handle


async def _state(handle: WorkflowHandle[Any, BoxState]) -> BoxState:
    state: BoxState = await handle.query("box", result_type=BoxState)
    return state


async def _stop(
    env: WorkflowEnvironment, handle: WorkflowHandle[Any, BoxState], reason: str
) -> BoxState:
    """`box stop` as the gateway asks it (levers9.records.boxes): the Update answers at once
    while a checkpoint is taken, and the outcome is read from the record."""
    stopped = await TemporalBoxRecords(env.client, "").stop(await _state(handle), reason)
    assert stopped is not None
    return stopped


async def _delete(env: WorkflowEnvironment, handle: WorkflowHandle[Any, BoxState]) -> BoxState:
    deleted = await TemporalBoxRecords(env.client, "").delete(await _state(handle))
    assert deleted is not None
    return deleted


async def _ended(env: WorkflowEnvironment, task_id: str) -> TaskRecord:
    """The stand-in task's record once it ended (it ends on its cancel signal)."""

    async def ended() -> bool:
        return await _task_state(env, task_id) is not None

    await eventually(ended, within=30)
    record = await _task_state(env, task_id)
    assert record is not None
    return record


async def _task_state(env: WorkflowEnvironment, task_id: str) -> TaskRecord | None:
    handle = env.client.get_workflow_handle(f"task:{task_id}", result_type=TaskRecord)
    description = await handle.describe()
    if description.status is None or description.close_time is None:
        return None
    record: TaskRecord = await handle.result()
    return record


async def test_idle_stop_stops_a_box_nobody_used_and_a_use_moves_it(
    time_env: WorkflowEnvironment, task_queue: str, worker: None
) -> None:
    handle = await _box(time_env, task_queue, idle_stop_seconds=600)

    async def started() -> bool:
        return bool((await _state(handle)).task_id)

    await eventually(started, within=30)
    first = (await _state(handle)).task_id
    await time_env.sleep(timedelta(seconds=400))
    await handle.signal("used")
    await time_env.sleep(timedelta(seconds=400))  # 800 s from create, 400 from the use
    assert (await _state(handle)).state == "running"
    await time_env.sleep(timedelta(seconds=300))  # 700 s from the use
    state = await _state(handle)
    assert state.state == "stopped", state
    assert state.reason.startswith("idle for 600 s (--idle-stop); no checkpoint"), state.reason
    ended = await _ended(time_env, first)
    assert (ended.state, ended.reason) == (
        "cancelled",
        f"box {state.name} stopped: " + state.reason.split(";")[0],
    )


# Before the tests that leave a box's workflow task without a Temporal worker: the
# time-skipping server skips no time while one is outstanding.
@pytest.mark.parametrize(
    ("checkpoint", "said"),
    [
        (kept_checkpoint, "idle for 600 s (--idle-stop); checkpointed to "),
        (refused_checkpoint, "idle for 600 s (--idle-stop); no checkpoint"),
    ],
    ids=["checkpointed", "refused-stopped-all-the-same"],
)
async def test_idle_stop_checkpoints_a_runsc_box(
    time_env: WorkflowEnvironment, task_queue: str, checkpoint: Any, said: str
) -> None:
    async with Worker(
        time_env.client,
        task_queue=task_queue,
        workflows=[BoxWorkflow, StandInTask],
        activities=[checkpoint, shared_queue],
    ):
        handle = await _box(time_env, task_queue, idle_stop_seconds=600, runtime="runsc")

        async def started() -> bool:
            return bool((await _state(handle)).task_id)

        await eventually(started, within=30)
        await time_env.sleep(timedelta(seconds=700))

        async def stopped() -> bool:
            return (await _state(handle)).state == "stopped"

        await eventually(stopped, within=30)
        state = await _state(handle)
    assert state.reason.startswith(said), state.reason
    if checkpoint is kept_checkpoint:
        assert state.checkpoint.startswith(f"{state.name}-1-"), state
        assert [i.name for i in state.images] == [state.checkpoint]
    else:
        assert "(the worker took none: task " in state.reason, state.reason
        assert state.checkpoint == ""


async def test_stop_answers_at_once_and_the_record_then_says_the_checkpoint(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    """The `stop` Update answers while its checkpoint is still being taken (the box reads
    `stopping`, its activity held until the Update has answered); the record then says the
    outcome, which `TemporalBoxRecords.stop` reads."""
    taking = asyncio.Event()
    release = asyncio.Event()

    @activity.defn(name="checkpoint_task")
    async def held_checkpoint(input: BoxCheckpoint) -> CheckpointOutcome:
        taking.set()
        await release.wait()
        return await kept_checkpoint(input)

    async with Worker(
        time_env.client,
        task_queue=task_queue,
        workflows=[BoxWorkflow, StandInTask],
        activities=[held_checkpoint, shared_queue],
    ):
        try:
            handle = await _box(time_env, task_queue, runtime="runsc")

            async def started() -> bool:
                return bool((await _state(handle)).task_id)

            await eventually(started, within=30)
            task_id = (await _state(handle)).task_id
            asked = await handle.execute_update("stop", "box stop", result_type=BoxState)
            assert (asked.state, asked.checkpoint) == ("running", ""), asked
            assert asked.stopping.startswith(f"{asked.name}-1-"), asked
            await asyncio.wait_for(taking.wait(), timeout=60)
            state = await _state(handle)
            assert (state.state, state.stopping) == ("running", asked.stopping), state
            # A second stop meanwhile answers at once too, and waits for the same outcome.
            again = TemporalBoxRecords(time_env.client, "").stop(state, "box stop")
            waiting = asyncio.ensure_future(again)
            release.set()
            stopped = await asyncio.wait_for(waiting, timeout=60)
        finally:
            release.set()
    assert stopped is not None
    assert (stopped.state, stopped.stopping, stopped.checkpoint) == (
        "stopped",
        "",
        asked.stopping,
    ), stopped
    assert stopped.reason.startswith(f"box stop; checkpointed to {asked.stopping}"), stopped
    assert [e.kind for e in stopped.events if e.kind == "stop"] == ["stop"]
    assert stopped.task_id == task_id


async def test_a_task_that_ends_leaves_the_box_stopped_and_start_runs_a_new_one(
    time_env: WorkflowEnvironment, task_queue: str, worker: None
) -> None:
    handle = await _box(time_env, task_queue, command=("false",))

    async def stopped() -> bool:
        return (await _state(handle)).state == "stopped"

    await eventually(stopped, within=30)
    state = await _state(handle)
    assert state.reason.startswith(f"its task {state.task_id} ended failed: exit code 1"), state
    assert state.starts == 1
    started: BoxState = await handle.execute_update("start", result_type=BoxState)
    assert started.starts == 2
    assert started.task_id != state.task_id
    assert started.task_id.startswith(f"{state.name}-2-")


async def test_the_record_continues_as_new_with_its_state(
    time_env: WorkflowEnvironment, task_queue: str, worker: None
) -> None:
    handle = await _box(time_env, task_queue, max_history_events=50)

    async def started() -> bool:
        return bool((await _state(handle)).task_id)

    await eventually(started, within=30)
    first_run = (await handle.describe()).run_id
    task_id = (await _state(handle)).task_id
    for _ in range(40):
        await handle.signal("used")

    async def continued() -> bool:
        return (await handle.describe()).run_id != first_run

    await eventually(continued, within=30)
    latest = time_env.client.get_workflow_handle(handle.id, result_type=BoxState)
    state = await _state(latest)
    assert (state.task_id, state.starts, state.state) == (task_id, 1, "running")
    stopped: BoxState = await _stop(time_env, latest, "box stop")
    assert stopped.state == "stopped"
    ended = await _ended(time_env, task_id)
    assert ended.state == "cancelled"


@pytest.mark.parametrize(
    ("volume", "kept", "pinned"),
    [
        ("ckpt", "kept in volume ckpt", ""),
        ("", "kept on node-a only (no checkpoint volume", "node-a"),
        ("broken", "kept on node-a only: its upload to volume broken failed", "node-a"),
    ],
)
async def test_a_restore_is_pinned_only_where_the_image_is_on_its_node_only(
    time_env: WorkflowEnvironment, task_queue: str, volume: str, kept: str, pinned: str
) -> None:
    async with Worker(
        time_env.client,
        task_queue=task_queue,
        workflows=[BoxWorkflow, StandInTask],
        activities=[kept_checkpoint, shared_queue],
    ):
        handle = await _box(time_env, task_queue, runtime="runsc", checkpoint_volume=volume)

        async def started() -> bool:
            return bool((await _state(handle)).task_id)

        await eventually(started, within=30)
        stopped: BoxState = await _stop(time_env, handle, "box stop")
        assert stopped.state == "stopped", stopped
        assert kept in stopped.reason, stopped.reason
        restarted: BoxState = await handle.execute_update("start", result_type=BoxState)
        task = time_env.client.get_workflow_handle(f"task:{restarted.task_id}")

        given: TaskInput | None = None

        async def has_input() -> bool:
            nonlocal given
            given = await task.query("input", result_type=TaskInput)
            return given is not None

        await eventually(has_input, within=30)
        assert given is not None
        assert given.restore_from == stopped.checkpoint, given
        assert (given.node, given.checkpoint_volume) == (pinned, volume)
        # The sha256 its upload answered goes with the restore: the fetched image must match.
        assert given.restore_sha256 == ("ab" * 32 if volume == "ckpt" else "")


async def test_a_tunnelled_workers_checkpoint_runs_on_the_replica_holding_its_tunnel(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    """`checkpoint_queue` names the queue of the replica holding the worker's tunnel session:
    `checkpoint_task` runs there (only that replica reaches the worker), not on the shared
    queue, whose worker here would refuse it."""
    replica = f"replica-{uuid.uuid4().hex[:8]}"

    @activity.defn(name="checkpoint_queue")
    async def replica_queue(task_id: str) -> str:
        return replica

    async with (
        Worker(
            time_env.client,
            task_queue=task_queue,
            workflows=[BoxWorkflow, StandInTask],
            activities=[refused_checkpoint, replica_queue],
        ),
        Worker(time_env.client, task_queue=replica, activities=[kept_checkpoint]),
    ):
        handle = await _box(time_env, task_queue, runtime="runsc")

        async def started() -> bool:
            return bool((await _state(handle)).task_id)

        await eventually(started, within=30)
        stopped: BoxState = await _stop(time_env, handle, "box stop")
    assert stopped.state == "stopped", stopped
    assert stopped.checkpoint, stopped
    assert stopped.checkpoint_node == "node-a"
    history = await handle.fetch_history()
    queues = [
        (e.activity_task_scheduled_event_attributes.activity_type.name,
         e.activity_task_scheduled_event_attributes.task_queue.name)
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]  # fmt: skip
    assert ("checkpoint_queue", task_queue) in queues, queues
    assert ("checkpoint_task", replica) in queues, queues


@pytest.mark.parametrize(
    ("volume", "node_has_worker", "removed"),
    [
        # Its restores fetched the image from the volume onto node-b: removed there too.
        (
            "ckpt",
            True,
            "removed from volume ckpt; removed from node node-a; removed from node node-b",
        ),
        ("", True, "removed from node node-a"),
        ("", False, "stays on node node-a (its worker's checkpoints folder, default/"),
    ],
)
async def test_delete_removes_the_box_s_checkpoint_images_or_says_where_they_stay(
    time_env: WorkflowEnvironment,
    task_queue: str,
    volume: str,
    node_has_worker: bool,
    removed: str,
) -> None:
    replica = f"replica-{uuid.uuid4().hex[:8]}"
    stored: list[tuple[str, str]] = []
    on_node: list[tuple[str, str]] = []

    @activity.defn(name="disk_worker")
    async def disk_worker(file: DiskFile) -> DiskFile | None:
        if not node_has_worker:
            return None
        return file.model_copy(update={"worker_id": "w1", "task_queue": replica})

    @activity.defn(name="task_node")
    async def task_node(task_id: str) -> str:
        return "node-b"

    @activity.defn(name="delete_stored_checkpoint")
    async def delete_stored_checkpoint(image: StoredImage) -> int:
        stored.append((image.volume, image.name))
        return 2

    @activity.defn(name="delete_node_checkpoint")
    async def delete_node_checkpoint(image: NodeImage) -> bool:
        on_node.append((image.worker.node_name, image.name))
        return True

    async with (
        Worker(
            time_env.client,
            task_queue=task_queue,
            workflows=[BoxWorkflow, StandInTask],
            activities=[
                *(kept_checkpoint, shared_queue, disk_worker),
                *(delete_stored_checkpoint, task_node),
            ],
        ),
        Worker(time_env.client, task_queue=replica, activities=[delete_node_checkpoint]),
    ):
        handle = await _box(time_env, task_queue, runtime="runsc", checkpoint_volume=volume)
        taken = []
        for _ in range(2):  # two stops: two images, the first restored by the second start

            async def started() -> bool:
                return bool((await _state(handle)).task_id)

            await eventually(started, within=30)
            stopped: BoxState = await _stop(time_env, handle, "")
            taken.append(stopped.checkpoint)
            await handle.execute_update("start", result_type=BoxState)
        deleted = await _delete(time_env, handle)
        await handle.result()
    said = [e.message for e in deleted.events if e.kind == "delete-checkpoint"]
    gone = "" if node_has_worker else "{name}): the node has no worker now; remove it there"
    assert said == [f"checkpoint {n}: {removed}{gone.format(name=n)}" for n in taken], said
    assert stored == ([(volume, name) for name in taken] if volume else [])
    nodes = ["node-a", "node-b"] if volume else ["node-a"] if node_has_worker else []
    assert on_node == [(node, name) for name in taken for node in nodes]


async def test_a_restore_whose_image_is_gone_says_so_and_the_next_start_is_fresh(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    async with Worker(
        time_env.client,
        task_queue=task_queue,
        workflows=[BoxWorkflow, StandInTask],
        activities=[kept_checkpoint, shared_queue],
    ):
        handle = await _box(time_env, task_queue, runtime="runsc", image="image-gone")

        async def started() -> bool:
            return bool((await _state(handle)).task_id)

        await eventually(started, within=30)
        stopped: BoxState = await _stop(time_env, handle, "")
        restoring: BoxState = await handle.execute_update("start", result_type=BoxState)
        assert restoring.restored_from == stopped.checkpoint

        async def ended() -> bool:
            return (await _state(handle)).state == "stopped"

        await eventually(ended, within=30)
        state = await _state(handle)
        assert f"its checkpoint {stopped.checkpoint} could not be restored" in state.reason
        assert f"no checkpoint {stopped.checkpoint} on this machine" in state.reason
        assert "its processes are lost; levers9 box start" in state.reason, state.reason
        assert "starts it fresh, with its home (none: no --disk or --volume)" in state.reason
        fresh: BoxState = await handle.execute_update("start", result_type=BoxState)
        assert (fresh.state, fresh.restored_from, fresh.starts) == ("running", "", 3)
