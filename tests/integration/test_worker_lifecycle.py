"""The worker record on the time-skipping server (minutes pass in milliseconds), Kubernetes
activities mocked by name: pending -> available on registration; heartbeats keep it; heartbeats
saying idle for the pool's idle minutes wind it down (Job deleted, `stopped`), a busy one never;
silence past the record TTL expires it (`expired`, Job deleted); a pending worker shows
ImagePullBackOff with the spec's fix, ends `failed` when its Job fails, and `expired` when its
Job is deleted or it never registers.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from temporalio import activity
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.models import (
    PodState,
    WorkerHeartbeat,
    WorkerInput,
    WorkerJobInput,
    WorkerRecord,
    WorkerRegistration,
    WorkerTimings,
)
from workflows.worker import WorkerWorkflow

pytestmark = pytest.mark.integration

TIMINGS = WorkerTimings(idle_seconds=300, record_ttl_seconds=600, pod_check_seconds=10)
REGISTRATION = WorkerRegistration(
    worker_id="w", pod_uid="uid", address="127.0.20.2:40000", gpus=2, visible_devices=(0, 1)
)


@dataclass
class Cluster:
    """The Kubernetes activities, mocked by name: what the pod says, what was deleted."""

    pod: PodState = field(default_factory=lambda: PodState(exists=True, phase="Pending"))
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    @activity.defn(name="create_worker_job")
    async def create_worker_job(self, input: WorkerJobInput) -> str:
        self.created.append(input.worker_id)
        return f"worker-{input.pool_name}-{input.worker_id}"

    @activity.defn(name="describe_worker_pod")
    async def describe_worker_pod(self, input: WorkerJobInput) -> PodState:
        return self.pod

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
        workflows=[WorkerWorkflow],
        activities=[
            mocked.create_worker_job,
            mocked.describe_worker_pod,
            mocked.delete_worker_job,
        ],
    ):
        yield mocked


async def _start(
    env: WorkflowEnvironment, task_queue: str
) -> WorkflowHandle[WorkerWorkflow, WorkerRecord]:
    worker_id = uuid.uuid4().hex[:8]
    return await env.client.start_workflow(
        WorkerWorkflow.run,
        WorkerInput(
            pool_name="gke-rtx6000",
            node_name="gke-node",
            worker_id=worker_id,
            machine_id="m",
            gpus=2,
            timings=TIMINGS,
        ),
        id=f"worker:gke-rtx6000:{worker_id}",
        task_queue=task_queue,
    )


async def _record(handle: WorkflowHandle[WorkerWorkflow, WorkerRecord]) -> WorkerRecord:
    record = await handle.query(WorkerWorkflow.record)
    assert record is not None
    return record


async def test_available_then_idle_wind_down(
    time_env: WorkflowEnvironment, task_queue: str, cluster: Cluster
) -> None:
    handle = await _start(time_env, task_queue)
    await time_env.sleep(5)
    assert (await _record(handle)).state == "pending"
    await handle.signal(WorkerWorkflow.register, REGISTRATION)
    await time_env.sleep(1)
    record = await _record(handle)
    assert (record.state, record.address, record.visible_devices) == (
        "available",
        "127.0.20.2:40000",
        (0, 1),
    )
    idle = WorkerHeartbeat(worker_id="w", running_tasks=0)
    for _ in range(4):  # idle heartbeats for 4 minutes: not yet the 5 idle minutes
        await time_env.sleep(60)
        await handle.signal(WorkerWorkflow.heartbeat, idle)
    await time_env.sleep(1)
    assert (await _record(handle)).state == "available"
    await time_env.sleep(60)
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
        await time_env.sleep(240)
        await handle.signal(WorkerWorkflow.heartbeat, busy)
    await time_env.sleep(1)
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
    await time_env.sleep(200)
    await handle.signal(WorkerWorkflow.heartbeat, idle)
    await time_env.sleep(1)
    assert (await _record(handle)).state == "available", "200 s idle is not 5 minutes"
    await time_env.sleep(110)
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
        await time_env.sleep(60)
        await handle.signal(WorkerWorkflow.heartbeat, busy)
    await time_env.sleep(1)
    assert (await _record(handle)).state == "available"
    assert cluster.deleted == []
    await handle.signal(WorkerWorkflow.stop)
    assert (await handle.result()).reason == "stopped by the controlplane"


async def test_image_pull_backoff_then_job_failed(
    time_env: WorkflowEnvironment, task_queue: str, cluster: Cluster
) -> None:
    cluster.pod = PodState(exists=True, phase="Pending", waiting_reason="ImagePullBackOff")
    handle = await _start(time_env, task_queue)
    await time_env.sleep(15)
    record = await _record(handle)
    assert record.state == "pending"
    assert record.condition == (
        "ImagePullBackOff: image not in the project's registry:"
        " rerun deploy/gke/attach-gke-pool.sh (it copies latest)"
    )
    cluster.pod = PodState(exists=True, phase="Failed", job_failed=True, message="exit code 1")
    final = await handle.result()
    assert (final.state, final.reason) == ("failed", "exit code 1")


async def test_node_gone_while_pending_stops_the_record_as_the_machine_would(
    time_env: WorkflowEnvironment, task_queue: str, cluster: Cluster
) -> None:
    handle = await _start(time_env, task_queue)
    await time_env.sleep(5)
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
    await time_env.sleep(5)
    cluster.pod = PodState(exists=False, job_exists=False)
    final = await handle.result()
    assert (final.state, final.reason) == ("expired", "its Job was deleted")
    assert cluster.deleted == [], "nothing left to delete"


async def test_never_registered_expires(
    time_env: WorkflowEnvironment, task_queue: str, cluster: Cluster
) -> None:
    handle = await _start(time_env, task_queue)
    before = datetime.now(UTC)
    final = await handle.result()
    assert (final.state, final.reason) == ("expired", "never registered within the record TTL")
    assert cluster.deleted == [final.worker_id]
    assert datetime.now(UTC) - before < timedelta(minutes=1), "ten minutes skipped"
