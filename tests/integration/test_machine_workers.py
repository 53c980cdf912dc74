"""A machine and its worker records on the dev server, the Kubernetes activities mocked by name:
an observation that lists the machine's own worker among the node's finished Jobs (its agent
killed) makes the machine tell that record `job_finished`, once, and no other record; the record
ends `failed` with the agent's exit, and the machine starts the node's next worker at once.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.core.capacity import MachineStatus, NodeCapacity, Resources
from levers9.models import (
    MachineInput,
    PodState,
    WorkerJobInput,
    WorkerRecord,
    WorkerRegistration,
    machine_workflow_id,
    worker_workflow_id,
)
from tests.waiting import eventually, signals_handled
from workflows.machine import MachineWorkflow
from workflows.worker import WorkerWorkflow

pytestmark = pytest.mark.integration

POOL = "machine-workers"
NODE = "node-1"
KILLED = PodState(exists=True, phase="Failed", job_failed=True, message="Error", exit_code=137)


@dataclass
class Cluster:
    """Worker Jobs by worker id, as the mocked activities see them."""

    created: list[str] = field(default_factory=list)
    pods: dict[str, PodState] = field(default_factory=dict)

    @activity.defn(name="create_worker_job")
    async def create_worker_job(self, job: WorkerJobInput) -> str:
        self.created.append(job.worker_id)
        return f"worker-{job.worker_id}"

    @activity.defn(name="describe_worker_pod")
    async def describe_worker_pod(self, job: WorkerJobInput) -> PodState:
        return self.pods.get(job.worker_id, PodState(exists=True, phase="Running"))

    @activity.defn(name="delete_worker_job")
    async def delete_worker_job(self, job: WorkerJobInput) -> bool:
        return True


def _node(workers: tuple[str, ...] = (), finished: tuple[str, ...] = ()) -> NodeCapacity:
    held = 2 if workers else 0
    return NodeCapacity(
        name=NODE,
        machine=True,
        status=MachineStatus.HEALTHY,
        gpu_type="RTXPro6000",
        total_gpus=2,
        free=Resources(gpus=2 - held, cpu_millis=8_000, memory_bytes=2**34),
        worker_gpus=held,
        workers=workers,
        external_ip="127.0.20.1",
        finished_workers=finished,
    )


async def test_a_finished_job_ends_its_record_and_the_machine_starts_the_next_worker(
    dev_env: WorkflowEnvironment, task_queue: str
) -> None:
    client = dev_env.client
    pool = f"{POOL}-{uuid.uuid4().hex[:6]}"
    cluster = Cluster()
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[MachineWorkflow, WorkerWorkflow],
        activities=[
            cluster.create_worker_job,
            cluster.describe_worker_pod,
            cluster.delete_worker_job,
        ],
    ):
        machine = await client.start_workflow(
            MachineWorkflow.run,
            MachineInput(pool_name=pool, node_name=NODE),
            id=machine_workflow_id(pool, NODE),
            task_queue=task_queue,
            start_signal="observe",
            start_signal_args=[_node()],
        )

        async def created(count: int) -> None:
            async def enough() -> bool:
                return len(cluster.created) >= count

            await eventually(enough, within=30)

        await created(1)
        [first] = cluster.created
        worker = client.get_workflow_handle(
            worker_workflow_id(pool, first), result_type=WorkerRecord
        )
        registration = WorkerRegistration(
            worker_id=first,
            pod_uid="uid",
            address="127.0.20.1:40000",
            gpus=2,
            visible_devices=(0, 1),
        )
        await worker.signal(WorkerWorkflow.register, registration)
        await machine.signal(MachineWorkflow.observe, _node(workers=(first,)))
        await signals_handled(client, machine.id)

        cluster.pods[first] = KILLED
        finished = _node(finished=(first, "someone-elses"))
        await machine.signal(MachineWorkflow.observe, finished)
        await machine.signal(MachineWorkflow.observe, finished)  # the next pass, the same
        async with asyncio.timeout(15):  # before the 30 s liveness window could end it
            ended = await worker.result()
        assert (ended.state, ended.reason) == ("failed", "its Job failed: Error (exit code 137)")
        await created(2)
        assert cluster.created[1] != first

        history = await machine.fetch_history()
        told = [
            e.signal_external_workflow_execution_initiated_event_attributes
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED
            and e.signal_external_workflow_execution_initiated_event_attributes.signal_name
            == "job_finished"
        ]
        assert [t.workflow_execution.workflow_id for t in told] == [worker.id]
        await machine.terminate("test over")
        await client.get_workflow_handle(worker_workflow_id(pool, cluster.created[1])).terminate(
            "test over"
        )
