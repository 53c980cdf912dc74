"""The worker record on the time-skipping server (minutes pass in milliseconds), Kubernetes
activities mocked by name: pending -> available on registration; heartbeats keep it; heartbeats
saying idle for the pool's idle minutes wind it down (Job deleted, `stopped`), a busy one never;
silence past the record TTL expires it (`expired`, Job deleted); a pending worker shows
ImagePullBackOff with the spec's fix, ends `failed` when its Job fails, and `expired` when its
Job is deleted or it never registers.

The liveness window (30 s, three heartbeats), with the real PoolWorkflow as its placement:
silent that long with its Job running, an available worker leaves placement (its card ledger
kept) and comes back on its next heartbeat; silent with its Job failed it ends `failed` with the
agent's exit, and with its Job deleted `expired`, both long before the record TTL; its machine's
`job_finished` ends it without waiting for the window.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle, WorkflowUpdateStage
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.core.placement import PoolState
from levers9.models import (
    PlaceRequest,
    PodState,
    PoolInput,
    WorkerHeartbeat,
    WorkerInput,
    WorkerJobInput,
    WorkerRecord,
    WorkerRegistration,
    WorkerTimings,
    pool_workflow_id,
)
from tests.waiting import eventually, signals_handled
from workflows.pool import PoolWorkflow
from workflows.worker import SILENT, WorkerWorkflow

pytestmark = pytest.mark.integration

TIMINGS = WorkerTimings(idle_seconds=300, record_ttl_seconds=600, pod_check_seconds=10)
"""Every `time_env.sleep` below moves the server's clock across one of these windows (or the
30 s liveness window); where a test only needs the workflow to have acted, it waits for that."""
REGISTRATION = WorkerRegistration(
    worker_id="w", pod_uid="uid", address="127.0.20.2:40000", gpus=2, visible_devices=(0, 1)
)


@dataclass
class Cluster:
    """The Kubernetes activities, mocked by name: what the pod says, how often it was read,
    what was deleted."""

    pod: PodState = field(default_factory=lambda: PodState(exists=True, phase="Pending"))
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    described: int = 0

    @activity.defn(name="create_worker_job")
    async def create_worker_job(self, input: WorkerJobInput) -> str:
        self.created.append(input.worker_id)
        return f"worker-{input.pool_name}-{input.worker_id}"

    @activity.defn(name="describe_worker_pod")
    async def describe_worker_pod(self, input: WorkerJobInput) -> PodState:
        self.described += 1
        return self.pod

    async def read(self, times: int = 1) -> None:
        """Until the record has read the pod `times` times (a pending one's pod check)."""

        async def read_enough() -> bool:
            return self.described >= times

        await eventually(read_enough, within=10, what=f"{times} pod checks")

    @activity.defn(name="delete_worker_job")
    async def delete_worker_job(self, input: WorkerJobInput) -> bool:
        self.deleted.append(input.worker_id)
        return True


@pytest.fixture
async def cluster(time_env: WorkflowEnvironment, task_queue: str) -> AsyncIterator[Cluster]:
    mocked = Cluster()
    async with Worker(
        time_env.client,
        task_queue=task_queue,
        workflows=[WorkerWorkflow, PoolWorkflow],
        activities=[
            mocked.create_worker_job,
            mocked.describe_worker_pod,
            mocked.delete_worker_job,
        ],
    ):
        yield mocked


async def _start(
    env: WorkflowEnvironment, task_queue: str, pool_name: str = "gke-rtx6000"
) -> WorkflowHandle[WorkerWorkflow, WorkerRecord]:
    worker_id = uuid.uuid4().hex[:8]
    return await env.client.start_workflow(
        WorkerWorkflow.run,
        WorkerInput(
            pool_name=pool_name,
            node_name="gke-node",
            worker_id=worker_id,
            machine_id="m",
            gpus=2,
            timings=TIMINGS,
        ),
        id=f"worker:{pool_name}:{worker_id}",
        task_queue=task_queue,
    )


@pytest.fixture
async def pool(
    time_env: WorkflowEnvironment, task_queue: str, cluster: Cluster
) -> AsyncIterator[WorkflowHandle[PoolWorkflow, None]]:
    """A pool of its own (the real placement), ended with the test: a run left on a queue that
    nobody polls any more would stop the server skipping time for the next tests."""
    pool_name = f"live-{uuid.uuid4().hex[:8]}"
    handle = await time_env.client.start_workflow(
        PoolWorkflow.run,
        PoolInput(pool_name=pool_name),
        id=pool_workflow_id(pool_name),
        task_queue=task_queue,
    )
    yield handle
    await handle.terminate("test over")


async def _available_in(
    env: WorkflowEnvironment, task_queue: str, pool: WorkflowHandle[PoolWorkflow, None]
) -> WorkflowHandle[WorkerWorkflow, WorkerRecord]:
    """An available worker of the pool."""
    handle = await _start(env, task_queue, pool.id.removeprefix("pool:"))
    await handle.signal(WorkerWorkflow.register, REGISTRATION)
    announced = {_worker_id(handle): False}

    async def in_placement() -> bool:
        return await _slots(pool) == announced

    await eventually(in_placement, within=10, what="the worker announced to its pool")
    return handle


async def _lived(handle: WorkflowHandle[WorkerWorkflow, WorkerRecord]) -> timedelta:
    """From start to end, in the server's (skipped) time."""
    described = await handle.describe()
    assert described.close_time is not None
    return described.close_time - described.start_time


def _worker_id(handle: WorkflowHandle[WorkerWorkflow, WorkerRecord]) -> str:
    return handle.id.rsplit(":", 1)[1]


async def _slots(pool: WorkflowHandle[PoolWorkflow, None]) -> dict[str, bool]:
    """The pool's workers: whether each is silent."""
    state: PoolState = await pool.query(PoolWorkflow.state)
    return {worker_id: slot.silent for worker_id, slot in state.slots.items()}


async def _record(handle: WorkflowHandle[WorkerWorkflow, WorkerRecord]) -> WorkerRecord:
    record = await handle.query(WorkerWorkflow.record)
    assert record is not None
    return record


async def _until_state(handle: WorkflowHandle[WorkerWorkflow, WorkerRecord], state: str) -> None:
    async def reached() -> bool:
        record = await handle.query(WorkerWorkflow.record)
        return record is not None and record.state == state

    await eventually(reached, within=10, what=f"record {handle.id} {state}")


async def _job_read_after_signal(handle: WorkflowHandle[WorkerWorkflow, WorkerRecord]) -> None:
    """Until the record has read its Job after its last signal and acted on what it read (a
    workflow task completed after the read's result)."""

    async def acted() -> bool:
        events = [e.event_type for e in (await handle.fetch_history()).events]
        signalled = max(
            i for i, t in enumerate(events) if t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        )
        after = events[signalled:]
        if EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED not in after:
            return False
        read = after.index(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
        return EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED in after[read:]

    await eventually(acted, within=10, what=f"record {handle.id} read its Job after the signal")


async def test_available_then_idle_wind_down(
    time_env: WorkflowEnvironment, task_queue: str, cluster: Cluster
) -> None:
    handle = await _start(time_env, task_queue)
    await _until_state(handle, "pending")
    await handle.signal(WorkerWorkflow.register, REGISTRATION)
    await _until_state(handle, "available")
    record = await _record(handle)
    assert (record.state, record.address, record.visible_devices) == (
        "available",
        "127.0.20.2:40000",
        (0, 1),
    )
    idle = WorkerHeartbeat(worker_id="w", running_tasks=0)
    for _ in range(4):  # idle heartbeats for 4 minutes: not yet the 5 idle minutes
        await time_env.sleep(60)  # a minute of the idle window, by the server's clock
        await handle.signal(WorkerWorkflow.heartbeat, idle)
    await signals_handled(time_env.client, handle.id)  # the fourth idle minute's beat taken
    assert (await _record(handle)).state == "available"
    await time_env.sleep(60)  # the fifth idle minute: the pool's idle window elapsed
    await handle.signal(WorkerWorkflow.heartbeat, idle)
    final = await handle.result()  # its heartbeats say idle for 5 minutes: wound down
    assert (final.state, final.reason) == ("stopped", "idle wind-down")
    assert cluster.deleted == [final.worker_id]


async def test_heartbeats_with_tasks_keep_it_then_silence_expires_it(
    time_env: WorkflowEnvironment, task_queue: str, cluster: Cluster
) -> None:
    handle = await _start(time_env, task_queue)
    await handle.signal(WorkerWorkflow.register, REGISTRATION)
    busy = WorkerHeartbeat(worker_id="w", running_tasks=1)
    for _ in range(4):  # 4 x 4 minutes busy: past the idle minutes, never idle
        await time_env.sleep(240)  # four of the idle window's five minutes
        await handle.signal(WorkerWorkflow.heartbeat, busy)
    await signals_handled(time_env.client, handle.id)  # the last busy heartbeat taken
    assert (await _record(handle)).state == "available"
    final = await handle.result()  # heartbeats stop: the record expires after the TTL
    assert (final.state, final.reason) == ("expired", "no heartbeat within the record TTL")
    assert cluster.deleted == [final.worker_id]


async def test_idle_since_counts_from_the_agent(
    time_env: WorkflowEnvironment, task_queue: str, cluster: Cluster
) -> None:
    handle = await _start(time_env, task_queue)
    await handle.signal(WorkerWorkflow.register, REGISTRATION)
    started = await time_env.get_current_time()
    idle = WorkerHeartbeat(worker_id="w", running_tasks=0, idle_since=started)
    await time_env.sleep(200)  # inside the 300 s idle window
    await handle.signal(WorkerWorkflow.heartbeat, idle)
    await signals_handled(time_env.client, handle.id)
    assert (await _record(handle)).state == "available", "200 s idle is not 5 minutes"
    await time_env.sleep(110)  # 310 s since the agent's idle-since: past the idle window
    await handle.signal(WorkerWorkflow.heartbeat, idle)
    final = await handle.result()
    assert final.state == "stopped"
    assert final.last_heartbeat is not None
    assert final.last_heartbeat - started >= timedelta(seconds=300)


async def test_a_stale_idle_heartbeat_does_not_wind_down_a_busy_worker(
    time_env: WorkflowEnvironment, task_queue: str, cluster: Cluster
) -> None:
    handle = await _start(time_env, task_queue)
    await handle.signal(WorkerWorkflow.register, REGISTRATION)
    await handle.signal(WorkerWorkflow.heartbeat, WorkerHeartbeat(worker_id="w", running_tasks=0))
    busy = WorkerHeartbeat(worker_id="w", running_tasks=2)
    for _ in range(8):  # tasks keep it busy for 8 minutes, past the 5 idle ones
        await time_env.sleep(60)  # a minute of the idle window, by the server's clock
        await handle.signal(WorkerWorkflow.heartbeat, busy)
    await signals_handled(time_env.client, handle.id)  # the last busy heartbeat taken
    assert (await _record(handle)).state == "available"
    assert cluster.deleted == []
    await handle.signal(WorkerWorkflow.stop)
    assert (await handle.result()).reason == "stopped by the controlplane"


async def test_image_pull_backoff_then_job_failed(
    time_env: WorkflowEnvironment, task_queue: str, cluster: Cluster
) -> None:
    cluster.pod = PodState(exists=True, phase="Pending", waiting_reason="ImagePullBackOff")
    handle = await _start(time_env, task_queue)
    await cluster.read()
    condition = (
        "ImagePullBackOff: image not in the project's registry:"
        " rerun deploy/gke/attach-gke-pool.sh (it copies latest)"
    )

    async def shown() -> bool:
        record = await handle.query(WorkerWorkflow.record)
        return record is not None and record.condition == condition

    await eventually(shown, within=10, what="the pull failure on the record")
    assert (await _record(handle)).state == "pending"
    cluster.pod = PodState(exists=True, phase="Failed", job_failed=True, message="exit code 1")
    final = await handle.result()
    assert (final.state, final.reason) == ("failed", "exit code 1")


async def test_node_gone_while_pending_stops_the_record_as_the_machine_would(
    time_env: WorkflowEnvironment, task_queue: str, cluster: Cluster
) -> None:
    handle = await _start(time_env, task_queue)
    await cluster.read()  # pending: its first pod check saw the pod Pending
    cluster.pod = PodState(
        exists=False, job_failed=True, message="BackoffLimitExceeded", node_gone=True
    )
    final = await handle.result()
    assert (final.state, final.reason) == ("stopped", "its node gke-node is gone")
    assert cluster.deleted == [final.worker_id], "the failed Job is cleaned up"


async def test_job_deleted_while_pending_expires_the_record(
    time_env: WorkflowEnvironment, task_queue: str, cluster: Cluster
) -> None:
    handle = await _start(time_env, task_queue)
    await cluster.read()  # pending: its first pod check saw the pod Pending
    cluster.pod = PodState(exists=False, job_exists=False)
    final = await handle.result()
    assert (final.state, final.reason) == ("expired", "its Job was deleted")
    assert cluster.deleted == [], "nothing left to delete"


async def test_never_registered_expires(
    time_env: WorkflowEnvironment, task_queue: str, cluster: Cluster
) -> None:
    handle = await _start(time_env, task_queue)
    final = await handle.result()  # the server skips the record TTL's ten minutes
    assert (final.state, final.reason) == ("expired", "never registered within the record TTL")
    assert cluster.deleted == [final.worker_id]
    assert await _lived(handle) >= timedelta(seconds=TIMINGS.record_ttl_seconds)


async def test_silence_takes_it_out_of_placement_until_it_is_heard_again(
    time_env: WorkflowEnvironment,
    task_queue: str,
    cluster: Cluster,
    pool: WorkflowHandle[PoolWorkflow, None],
) -> None:
    cluster.pod = PodState(exists=True, phase="Running")  # hung, or cut off from the gateway
    handle = await _available_in(time_env, task_queue, pool)
    worker_id = _worker_id(handle)
    t1 = await pool.execute_update(
        PoolWorkflow.place, PlaceRequest(pool_name="", task_id="t1", gpus=1)
    )
    await time_env.sleep(20)  # inside the 30 s liveness window
    await handle.signal(WorkerWorkflow.heartbeat, WorkerHeartbeat(worker_id="w", running_tasks=1))
    await signals_handled(time_env.client, handle.id)  # heard: the window counts from here
    await time_env.sleep(25)  # 25 s since it was heard: inside the window
    assert await _slots(pool) == {worker_id: False}
    assert (await _record(handle)).condition is None
    await time_env.sleep(10)  # 35 s: past it
    assert await _slots(pool) == {worker_id: True}
    record = await _record(handle)
    assert (record.state, record.condition) == ("available", SILENT)
    assert cluster.deleted == [], "its Job runs: only the record TTL ends it"
    # Nothing is placed on it meanwhile; the task it holds keeps its card.
    asking = await pool.start_update(
        PoolWorkflow.place,
        PlaceRequest(pool_name="", task_id="t2", gpus=1),
        wait_for_stage=WorkflowUpdateStage.ACCEPTED,
    )

    async def t2_waits() -> bool:  # its request was taken and placement found no worker
        state: PoolState = await pool.query(PoolWorkflow.state)
        return [w.task_id for w in state.waiting] == ["t2"]

    await eventually(t2_waits, within=10, what="t2 waiting in the pool's queue")
    state: PoolState = await pool.query(PoolWorkflow.state)
    assert list(state.placed) == ["t1"]
    await handle.signal(WorkerWorkflow.heartbeat, WorkerHeartbeat(worker_id="w", running_tasks=1))
    t2 = await asking.result()
    assert await _slots(pool) == {worker_id: False}
    assert (await _record(handle)).condition is None
    assert (t1.gpu_indices, t2.gpu_indices) == ((0,), (1,)), "its ledger kept"
    await handle.signal(WorkerWorkflow.stop)
    await handle.result()


async def test_silent_with_its_job_failed_ends_failed_within_the_window(
    time_env: WorkflowEnvironment,
    task_queue: str,
    cluster: Cluster,
    pool: WorkflowHandle[PoolWorkflow, None],
) -> None:
    cluster.pod = PodState(
        exists=True, phase="Failed", job_failed=True, message="Error", exit_code=137
    )
    handle = await _available_in(time_env, task_queue, pool)
    final = await handle.result()
    assert await _lived(handle) < timedelta(seconds=60), "the window, not the 600 s record TTL"
    assert (final.state, final.reason) == ("failed", "its Job failed: Error (exit code 137)")
    assert cluster.deleted == [final.worker_id]
    assert await _slots(pool) == {}, "out of placement"


async def test_silent_with_its_job_deleted_expires_within_the_window(
    time_env: WorkflowEnvironment,
    task_queue: str,
    cluster: Cluster,
    pool: WorkflowHandle[PoolWorkflow, None],
) -> None:
    cluster.pod = PodState(exists=False, job_exists=False)
    handle = await _available_in(time_env, task_queue, pool)
    final = await handle.result()
    assert await _lived(handle) < timedelta(seconds=60)
    assert (final.state, final.reason) == ("expired", "its Job was deleted")
    assert cluster.deleted == [], "nothing left to delete"
    assert await _slots(pool) == {}


async def test_job_finished_ends_it_without_waiting_for_the_window(
    time_env: WorkflowEnvironment,
    task_queue: str,
    cluster: Cluster,
    pool: WorkflowHandle[PoolWorkflow, None],
) -> None:
    handle = await _available_in(time_env, task_queue, pool)
    cluster.pod = PodState(
        exists=True, phase="Failed", job_failed=True, message="Error", exit_code=9
    )
    told = await time_env.get_current_time()
    await handle.signal(WorkerWorkflow.job_finished)
    final = await handle.result()
    ended = (await handle.describe()).close_time
    assert ended is not None
    assert ended - told < timedelta(seconds=10), "the signal ended it, not the 30 s window"
    assert (final.state, final.reason) == ("failed", "its Job failed: Error (exit code 9)")
    assert final.last_heartbeat is not None
    assert await _slots(pool) == {}


async def test_job_finished_with_its_pod_still_running_keeps_it(
    time_env: WorkflowEnvironment,
    task_queue: str,
    cluster: Cluster,
    pool: WorkflowHandle[PoolWorkflow, None],
) -> None:
    """The record reads the Job before it ends: the cluster has the last word."""
    cluster.pod = PodState(exists=True, phase="Running")
    handle = await _available_in(time_env, task_queue, pool)
    await handle.signal(WorkerWorkflow.job_finished)
    await _job_read_after_signal(handle)
    assert (await _record(handle)).state == "available"
    assert await _slots(pool) == {_worker_id(handle): False}
    await handle.signal(WorkerWorkflow.stop)
    await handle.result()


async def test_job_finished_while_pending_ends_it_before_the_next_pod_check(
    time_env: WorkflowEnvironment, task_queue: str, cluster: Cluster
) -> None:
    handle = await _start(time_env, task_queue)
    await cluster.read()  # pending, its next pod check pod_check_seconds (10 s) after the first
    cluster.pod = PodState(exists=True, phase="Failed", job_failed=True, message="exit code 2")
    told = await time_env.get_current_time()
    await handle.signal(WorkerWorkflow.job_finished)
    final = await handle.result()
    assert (final.state, final.reason) == ("failed", "exit code 2")
    ended = (await handle.describe()).close_time
    assert ended is not None
    assert ended - told < timedelta(seconds=5), "the signal, not the 10 s pod check"
