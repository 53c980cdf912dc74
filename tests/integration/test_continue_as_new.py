"""Continue-as-new of the long-lived records under load, on the dev server, with signals arriving
all the while: a machine told 150 observations, a worker sent 150 heartbeats (in bursts of 30),
each with a history cap of 40 events so that it continues as new several times meanwhile. No
signal is lost: the record ends up with the last observation or heartbeat sent, the settings
sent in the first burst hold after every later run, and a stop sent after the heartbeats ends
the worker with its reason. (PoolWorkflow's queue under the same:
tests/integration/test_pool_workflow.py; the egress allowlist: test_egress_workflow.py.)
"""

from __future__ import annotations

import uuid

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.core.capacity import MachineStatus, NodeCapacity, Resources
from levers9.models import (
    MachineInput,
    MachineRecord,
    PodState,
    StopWorker,
    WorkerHeartbeat,
    WorkerInput,
    WorkerJobInput,
    WorkerRegistration,
    WorkerTimings,
)
from tests.waiting import eventually, signals_handled
from workflows.machine import MachineWorkflow
from workflows.worker import WorkerWorkflow

pytestmark = pytest.mark.integration

POOL = "can"
CAP = 40
BURSTS, PER_BURST = 5, 30
SIGNALS = BURSTS * PER_BURST
"""Signals come in bursts, each handled before the next, so that a run past its cap can end
between them: at least every other burst (a continue-as-new that races the next burst's first
signal is refused by Temporal, and the run goes on with it)."""


@activity.defn(name="create_worker_job")
async def create_worker_job(job: WorkerJobInput) -> str:
    return f"worker-{job.worker_id}"


@activity.defn(name="describe_worker_pod")
async def describe_worker_pod(job: WorkerJobInput) -> PodState:
    return PodState(exists=True, phase="Running")


@activity.defn(name="delete_worker_job")
async def delete_worker_job(job: WorkerJobInput) -> bool:
    return True


def _worker(client: Client, task_queue: str) -> Worker:
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[MachineWorkflow, WorkerWorkflow],
        activities=[create_worker_job, describe_worker_pod, delete_worker_job],
    )


async def _runs(client: Client, workflow_id: str) -> list[WorkflowExecutionStatus | None]:
    return [e.status async for e in client.list_workflows(f"WorkflowId = '{workflow_id}'")]


def _observation(n: int) -> NodeCapacity:
    """A cordoned node (no worker is added), its free CPU counting the observations."""
    return NodeCapacity(
        name="node-1",
        machine=False,
        status=MachineStatus.CORDONED,
        gpu_type="RTXPro6000",
        total_gpus=2,
        free=Resources(gpus=2, cpu_millis=1_000 + n, memory_bytes=2**30),
        worker_gpus=0,
        workers=(),
        external_ip="127.0.20.1",
    )


async def test_a_machine_continues_as_new_under_observations_and_loses_none(
    dev_env: WorkflowEnvironment, task_queue: str
) -> None:
    client = dev_env.client
    workflow_id = f"machine:{POOL}:{uuid.uuid4().hex[:8]}"
    async with _worker(client, task_queue):
        handle = await client.start_workflow(
            MachineWorkflow.run,
            MachineInput(pool_name=POOL, node_name="node-1", max_history_events=CAP),
            id=workflow_id,
            task_queue=task_queue,
        )
        settings = WorkerTimings(idle_seconds=42, record_ttl_seconds=420)
        for n in range(SIGNALS):
            await handle.signal(MachineWorkflow.observe, _observation(n))
            if n == 0:
                await handle.signal(MachineWorkflow.settings, settings)
            if n % PER_BURST == PER_BURST - 1:

                async def seen(n: int = n) -> bool:
                    record: MachineRecord | None = await client.get_workflow_handle(
                        workflow_id
                    ).query(MachineWorkflow.record)
                    return record is not None and record.free_cpu_millis == 1_000 + n

                await eventually(seen, within=30)
        runs = await _runs(client, workflow_id)
        assert runs.count(WorkflowExecutionStatus.CONTINUED_AS_NEW) >= 2, runs
        # The settings sent in the first burst are in the input of the run now open.
        latest = await client.get_workflow_handle(workflow_id).fetch_history()
        started = latest.events[0].workflow_execution_started_event_attributes
        [carried] = await client.data_converter.decode(started.input.payloads, [MachineInput])
        assert isinstance(carried, MachineInput)
        assert carried.timings == settings
        # ...and the record is the continued run's memo from its start (else the first run's
        # start memo, none: machine_records would miss the machine until its next observation).
        assert "record" in started.memo.fields
        await handle.signal(MachineWorkflow.gone)
        await handle.result()


async def test_a_worker_continues_as_new_under_heartbeats_and_a_stop_in_them_holds(
    dev_env: WorkflowEnvironment, task_queue: str
) -> None:
    client = dev_env.client
    worker_id = uuid.uuid4().hex[:8]
    workflow_id = f"worker:{POOL}:{worker_id}"
    async with _worker(client, task_queue):
        handle = await client.start_workflow(
            WorkerWorkflow.run,
            WorkerInput(
                pool_name=POOL,
                node_name="node-1",
                worker_id=worker_id,
                machine_id="m1",
                gpus=2,
                max_history_events=CAP,
            ),
            id=workflow_id,
            task_queue=task_queue,
        )
        await handle.signal(
            WorkerWorkflow.register,
            WorkerRegistration(
                worker_id=worker_id,
                pod_uid="uid-1",
                address="127.0.20.1:40000",
                gpus=2,
                visible_devices=(0, 1),
            ),
        )
        for n in range(SIGNALS):
            await handle.signal(
                WorkerWorkflow.heartbeat, WorkerHeartbeat(worker_id=worker_id, running_tasks=n % 3)
            )
            if n == 0:
                await handle.signal(
                    WorkerWorkflow.settings,
                    WorkerTimings(idle_seconds=4_200, record_ttl_seconds=4_200),
                )
            if n % PER_BURST == PER_BURST - 1:
                await signals_handled(client, workflow_id)
        await handle.signal(WorkerWorkflow.stop, StopWorker(reason="stopped amid heartbeats"))
        final = await handle.result()
        assert (final.state, final.reason) == ("stopped", "stopped amid heartbeats")
        assert final.running_tasks == (SIGNALS - 1) % 3  # the last heartbeat's word
        runs = await _runs(client, workflow_id)
        assert runs.count(WorkflowExecutionStatus.CONTINUED_AS_NEW) >= 2, runs
        last = await client.get_workflow_handle(workflow_id).fetch_history()
        started = last.events[0].workflow_execution_started_event_attributes
        [carried] = await client.data_converter.decode(started.input.payloads, [WorkerInput])
        assert isinstance(carried, WorkerInput)
        assert carried.timings.idle_seconds == 4_200
        assert carried.resume is not None
        assert carried.resume.address == "127.0.20.1:40000"
        assert "record" in started.memo.fields, "the record is the continued run's memo"
