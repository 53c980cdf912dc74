"""Every `workflow.patched(...)` branch replays both ways.

A patch is `if workflow.patched(ID): new else: old`: workflows that reached that point under the
old code must replay with the new code through the old branch, and the ones that ran the new
branch through the new. For each patch of the workflows the test drives the workflow, on the dev
server with its activities replaced, to the patched point twice:

- as the old code ran it: `workflow.patched` answers False while it runs, so the history has no
  marker and the old branch's commands (the code before the patch, by the form of a patch);
- as the new code runs it: the history has the patch's marker and the new branch's commands.

Each history then replays with the real code. The check can fail: the old history replayed by
code whose branch is unguarded (`patched` always True) is a nondeterminism error.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from levers9.capacity import MachineStatus, NodeCapacity, Resources
from levers9.clusters import ClusterState, JoinedCluster, cluster_workflow_id
from levers9.models import (
    ClusterInput,
    MachineInput,
    PlaceRequest,
    PodState,
    PoolInput,
    StopWorker,
    TaskInput,
    TaskRecord,
    WorkerInput,
    WorkerJobInput,
    WorkerRecord,
    WorkerRegistration,
    WorkerSlotInput,
    WorkerTaskInput,
    WorkerTimings,
)
from levers9.placement import Placement
from tests.waiting import eventually, signals_handled
from workflows.cluster import RECORD_MEMO, ClusterWorkflow
from workflows.machine import STOP_WORKERS_WHEN_GONE, MachineWorkflow
from workflows.pool import TELL_AFTER_CONTINUING, PoolWorkflow
from workflows.task import ASK_AGAIN, PLACE_AGAIN, PLACE_BY_SIGNAL, PLACEMENTS, TaskWorkflow
from workflows.worker import (
    ANNOUNCE_ON_CHANGE,
    LEAVE_PLACEMENT_FIRST,
    LIVENESS_WINDOW,
    WorkerWorkflow,
)

pytestmark = pytest.mark.integration

POOL = "patches"


@activity.defn(name="place_task")
async def place_task(request: PlaceRequest) -> Placement:
    return Placement(
        task_id=request.task_id,
        worker_id="w1",
        node_name="node-1",
        address="127.0.20.1:40000",
        gpu_indices=(0,),
    )


ASKED: dict[str, int] = {}


@activity.defn(name="request_placement")
async def request_placement(request: PlaceRequest) -> str:
    """The pool, at once: signals the placement back to the asking record; a task named
    `lost...` has its first request lost (the pool never took it)."""
    ASKED[request.task_id] = ASKED.get(request.task_id, 0) + 1
    if request.task_id.startswith("lost") and ASKED[request.task_id] == 1:
        return ""
    asking = activity.client().get_workflow_handle(activity.info().workflow_id or "")
    await asking.signal("placed", await place_task(request))
    return ""


@activity.defn(name="run_task")
async def run_task(input: WorkerTaskInput) -> bool:
    raise ApplicationError("connection refused", type="WorkerUnavailable", non_retryable=True)


@activity.defn(name="worker_ended")
async def worker_ended(input: WorkerTaskInput) -> bool:
    return True


@activity.defn(name="create_worker_job")
async def create_worker_job(job: WorkerJobInput) -> None:
    return None


@activity.defn(name="describe_worker_pod")
async def describe_worker_pod(job: WorkerJobInput) -> PodState:
    return PodState(exists=True, phase="Running")


@activity.defn(name="delete_worker_job")
async def delete_worker_job(job: WorkerJobInput) -> None:
    return None


async def _start_worker(
    client: Client, task_queue: str, timings: WorkerTimings | None = None
) -> WorkflowHandle[WorkerWorkflow, WorkerRecord]:
    """A one-card worker record of a fresh id, pending."""
    worker_id = uuid.uuid4().hex[:8]
    return await client.start_workflow(
        WorkerWorkflow.run,
        WorkerInput(
            pool_name=POOL,
            node_name="node-1",
            worker_id=worker_id,
            machine_id="m1",
            gpus=1,
            timings=timings or WorkerTimings(),
        ),
        id=f"worker:{POOL}:{worker_id}",
        task_queue=task_queue,
    )


async def _worker_stopped(client: Client, task_queue: str) -> str:
    """A worker that registers, serves, and is stopped (its Job deleted)."""
    handle = await _start_worker(client, task_queue)
    workflow_id = handle.id
    worker_id = workflow_id.removeprefix(f"worker:{POOL}:")
    registration = WorkerRegistration(
        worker_id=worker_id,
        pod_uid="uid-1",
        address="127.0.20.1:40000",
        gpus=1,
        visible_devices=(0,),
    )
    await handle.signal(WorkerWorkflow.register, registration)
    await handle.signal(WorkerWorkflow.stop, StopWorker(reason="test over"))
    await handle.result()
    return workflow_id


async def _worker_registered_again(client: Client, task_queue: str) -> str:
    """An available worker that registers again at another address (its tunnel moved to
    another replica), then is stopped."""
    handle = await _start_worker(client, task_queue)
    workflow_id = handle.id
    worker_id = workflow_id.removeprefix(f"worker:{POOL}:")
    for n in (1, 2):
        registration = WorkerRegistration(
            worker_id=worker_id,
            pod_uid="uid-1",
            address=f"127.0.20.{n}:40000",
            gpus=1,
            visible_devices=(0,),
            task_queue=f"replica-{n}",
        )
        await handle.signal(WorkerWorkflow.register, registration)
        if n == 1:
            # Available and announced at the first address before the second comes: the signal
            # handled is not enough (it may land while the pending check's activity runs, and the
            # first announcement would then carry the second address).
            async def announced() -> bool:
                record = await handle.query(WorkerWorkflow.record)
                return record is not None and record.state == "available"

            await eventually(announced, within=30)
        await signals_handled(client, workflow_id)
    await handle.signal(WorkerWorkflow.stop, StopWorker(reason="test over"))
    await handle.result()
    return workflow_id


async def _worker_gone_silent(client: Client, task_queue: str) -> str:
    """An available worker never heard again: silent after its 1 s liveness window (its pod
    still Running), expired at its 3 s record TTL."""
    timings = WorkerTimings(record_ttl_seconds=3, liveness_seconds=1)
    handle = await _start_worker(client, task_queue, timings)
    worker_id = handle.id.removeprefix(f"worker:{POOL}:")
    registration = WorkerRegistration(
        worker_id=worker_id,
        pod_uid="uid-1",
        address="127.0.20.1:40000",
        gpus=1,
        visible_devices=(0,),
    )
    await handle.signal(WorkerWorkflow.register, registration)
    assert (await handle.result()).state == "expired"
    return handle.id


def _silences(history: WorkflowHistory) -> int:
    """How many times the worker told the pool it fell silent."""
    return sum(
        1
        for e in history.events
        if e.signal_external_workflow_execution_initiated_event_attributes.signal_name
        == "worker_silent"
    )


POOL_CAP = 30


async def _pool_past_its_cap(client: Client, task_queue: str) -> tuple[str, str]:
    """A pool with two one-card workers and a history cap of 30 events, asked for 40 tasks
    (whose records do not exist: each `placed` fails and frees the cards for the next); its
    first run, which passes the cap with placements still to tell."""
    workflow_id = f"pool:{POOL}-{uuid.uuid4().hex[:8]}"
    handle = await client.start_workflow(
        PoolWorkflow.run,
        PoolInput(pool_name=POOL, max_history_events=POOL_CAP),
        id=workflow_id,
        task_queue=task_queue,
    )
    first_run = handle.first_execution_run_id
    assert first_run is not None
    for n in range(2):
        slot = WorkerSlotInput(
            worker_id=f"w{n}",
            node_name=f"node-{n}",
            address=f"127.0.20.{n + 1}:40000",
            devices=(0,),
            node_gpus=1,
        )
        await handle.signal(PoolWorkflow.worker_available, slot)
    for n in range(40):
        await handle.signal(
            PoolWorkflow.request, PlaceRequest(pool_name=POOL, task_id=f"t{n:02d}", gpus=1)
        )

    async def continued() -> bool:
        first = client.get_workflow_handle(workflow_id, run_id=first_run)
        return (await first.describe()).status == WorkflowExecutionStatus.CONTINUED_AS_NEW

    await eventually(continued, within=30)
    await handle.terminate("test over")
    return workflow_id, first_run


def _quiet_past_the_cap(history: WorkflowHistory) -> int:
    """Minus the placements told after the run passed its cap (the new branch tells none)."""
    return -sum(
        1
        for e in history.events[POOL_CAP:]
        if e.signal_external_workflow_execution_initiated_event_attributes.signal_name == "placed"
    )


def _announcements(history: WorkflowHistory) -> int:
    """How many times the worker told the pool its cards."""
    return sum(
        1
        for e in history.events
        if e.signal_external_workflow_execution_initiated_event_attributes.signal_name
        == "worker_available"
    )


def _left_before_the_job_went(history: WorkflowHistory) -> int:
    """1 when `worker_gone` went to the pool before `delete_worker_job` was scheduled."""
    gone = delete = None
    for index, event in enumerate(history.events):
        signal = event.signal_external_workflow_execution_initiated_event_attributes
        if gone is None and signal.signal_name == "worker_gone":
            gone = index
        scheduled = event.activity_task_scheduled_event_attributes
        if delete is None and scheduled.activity_type.name == "delete_worker_job":
            delete = index
    assert gone is not None
    assert delete is not None
    return int(gone < delete)


async def _machine_gone(client: Client, task_queue: str) -> str:
    """A machine with one worker whose node is gone (the reconcile's `gone` signal)."""
    workflow_id = f"machine:{POOL}:{uuid.uuid4().hex[:8]}"
    capacity = NodeCapacity(
        name="node-1",
        machine=True,
        status=MachineStatus.HEALTHY,
        gpu_type="RTXPro6000",
        total_gpus=1,
        free=Resources(gpus=0),
        worker_gpus=1,
        workers=("w1",),
        external_ip="127.0.20.1",
    )
    handle = await client.start_workflow(
        MachineWorkflow.run,
        MachineInput(pool_name=POOL, node_name="node-1", capacity=capacity),
        id=workflow_id,
        task_queue=task_queue,
    )
    await handle.signal(MachineWorkflow.gone)
    await handle.result()
    return workflow_id


async def _task_never_started(client: Client, task_queue: str) -> str:
    """A task whose RunTask never gets through, its worker gone."""
    task_id = uuid.uuid4().hex[:12]
    workflow_id = f"task:{task_id}"
    await client.execute_workflow(
        TaskWorkflow.run,
        TaskInput(task_id=task_id, pool_name=POOL, command=("true",), gpus=1),
        id=workflow_id,
        task_queue=task_queue,
    )
    return workflow_id


async def _task_whose_request_was_lost(client: Client, task_queue: str) -> str:
    """A task whose first request the pool never took, asking again after a second; it is
    cancelled once it has asked again (the old code waits for ever)."""
    task_id = f"lost{uuid.uuid4().hex[:8]}"
    workflow_id = f"task:{task_id}"
    handle = await client.start_workflow(
        TaskWorkflow.run,
        TaskInput(task_id=task_id, pool_name=POOL, command=("true",), ask_again_seconds=1),
        id=workflow_id,
        task_queue=task_queue,
    )

    async def asked_again_or_ended() -> bool:
        if (await handle.describe()).status != WorkflowExecutionStatus.RUNNING:
            return True
        return _requests(await handle.fetch_history()) >= 2

    await eventually(asked_again_or_ended, within=30)
    with contextlib.suppress(RPCError):  # the new code may have ended it by then
        await handle.signal(TaskWorkflow.cancel, "test over")
    await handle.result()
    return workflow_id


def _requests(history: WorkflowHistory) -> int:
    """How many times the record asked the pool."""
    return sum(
        1
        for e in history.events
        if e.activity_task_scheduled_event_attributes.activity_type.name == "request_placement"
    )


async def _cluster_left(client: Client, task_queue: str) -> str:
    """A joined cluster's record started without a memo (as `cluster join` did before the
    record was kept there), then left."""
    spec = JoinedCluster(name=f"c{uuid.uuid4().hex[:8]}", gpu_type="L4", worker_image="w:1")
    state = ClusterState(spec=spec, join_digest="0" * 64, expires_at=datetime.now(UTC))
    handle = await client.start_workflow(
        ClusterWorkflow.run,
        ClusterInput(state=state),
        id=cluster_workflow_id(spec.name),
        task_queue=task_queue,
    )
    await signals_handled(client, handle.id)
    await handle.signal(ClusterWorkflow.leave)
    assert (await handle.result()).leaving
    return handle.id


def _memo_upserts(history: WorkflowHistory) -> int:
    return sum(
        1
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED
    )


@dataclass(frozen=True)
class Patch:
    patch_id: str
    drive: Callable[[Client, str], Awaitable[str | tuple[str, str]]]
    """Runs the workflow to the patched point: its id (the latest run), or id and run."""
    new_branch: EventType.ValueType | Callable[[WorkflowHistory], int]
    """An event only the new branch makes (or a measure of the history it raises)."""


PATCHES = {
    STOP_WORKERS_WHEN_GONE: Patch(
        STOP_WORKERS_WHEN_GONE,
        _machine_gone,
        EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED,
    ),
    PLACE_AGAIN: Patch(
        PLACE_AGAIN, _task_never_started, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ),
    PLACE_BY_SIGNAL: Patch(
        PLACE_BY_SIGNAL, _task_never_started, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ),
    LEAVE_PLACEMENT_FIRST: Patch(LEAVE_PLACEMENT_FIRST, _worker_stopped, _left_before_the_job_went),
    ANNOUNCE_ON_CHANGE: Patch(ANNOUNCE_ON_CHANGE, _worker_registered_again, _announcements),
    TELL_AFTER_CONTINUING: Patch(TELL_AFTER_CONTINUING, _pool_past_its_cap, _quiet_past_the_cap),
    ASK_AGAIN: Patch(ASK_AGAIN, _task_whose_request_was_lost, _requests),
    LIVENESS_WINDOW: Patch(LIVENESS_WINDOW, _worker_gone_silent, _silences),
    RECORD_MEMO: Patch(RECORD_MEMO, _cluster_left, _memo_upserts),
}
WORKFLOWS = [ClusterWorkflow, MachineWorkflow, PoolWorkflow, TaskWorkflow, WorkerWorkflow]


def test_every_patch_in_the_workflows_is_covered() -> None:
    from pathlib import Path

    import workflows

    source = "".join(p.read_text() for p in Path(workflows.__file__).parent.glob("*.py"))
    assert source.count("workflow.patched(") == len(PATCHES)


async def _history(
    env: WorkflowEnvironment, patch: Patch, monkeypatch: pytest.MonkeyPatch, old: bool
) -> WorkflowHistory:
    task_queue = f"tq-{uuid.uuid4()}"
    with monkeypatch.context() as m:
        if old:
            m.setattr(workflow, "patched", lambda patch_id: False)
        async with Worker(
            env.client,
            task_queue=task_queue,
            workflows=WORKFLOWS,
            activities=[
                place_task,
                request_placement,
                run_task,
                worker_ended,
                create_worker_job,
                describe_worker_pod,
                delete_worker_job,
            ],
        ):
            driven = await patch.drive(env.client, task_queue)
    workflow_id, run_id = driven if isinstance(driven, tuple) else (driven, None)
    return await env.client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()


def _markers(history: WorkflowHistory) -> list[bytes]:
    """The recorded markers (a patch's carries its id), serialized."""
    return [
        e.marker_recorded_event_attributes.SerializeToString()
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    ]


def _count(
    history: WorkflowHistory, event_type: EventType.ValueType | Callable[[WorkflowHistory], int]
) -> int:
    if callable(event_type):
        return event_type(history)
    return sum(1 for e in history.events if e.event_type == event_type)


async def _replay(history: WorkflowHistory) -> str | None:
    replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    return None if result.replay_failure is None else str(result.replay_failure)


@pytest.mark.parametrize("patch_id", list(PATCHES))
async def test_both_branches_replay(
    dev_env: WorkflowEnvironment, patch_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    patch = PATCHES[patch_id]
    old = await _history(dev_env, patch, monkeypatch, old=True)
    new = await _history(dev_env, patch, monkeypatch, old=False)

    # Each history went through its own branch.
    assert _markers(old) == []
    assert any(patch_id.encode() in marker for marker in _markers(new))
    assert _count(new, patch.new_branch) > _count(old, patch.new_branch)

    assert await _replay(old) is None, "workflows of the old code replay through the old branch"
    assert await _replay(new) is None, "workflows of the new code replay through the new branch"

    # Unguarded, the new branch would break the old workflows.
    with monkeypatch.context() as m:
        m.setattr(workflow, "patched", lambda patch_id: True)
        failure = await _replay(old)
    assert failure is not None
    assert "Nondeterminism" in failure


async def test_the_branches_do_what_the_patches_say(
    dev_env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old branch of PLACE_AGAIN fails the task at the first lost worker; the new one places
    it again, PLACEMENTS times, before it gives up."""
    patch = PATCHES[PLACE_AGAIN]
    ended = {}
    for old in (True, False):
        history = await _history(dev_env, patch, monkeypatch, old=old)
        completed = history.events[-1].workflow_execution_completed_event_attributes
        [record] = await pydantic_data_converter.decode(completed.result.payloads, [TaskRecord])
        assert isinstance(record, TaskRecord)
        ended[old] = record
    assert ended[True].state == ended[False].state == "failed"
    assert ended[True].reason is not None
    assert ended[True].reason.startswith("worker lost before the task started")
    assert ended[False].reason is not None
    assert ended[False].reason.startswith(f"placed {PLACEMENTS} times, never started")
