"""A task that mounts a durable disk runs only on the disk's node: on the dev server, TaskWorkflow
and PoolWorkflow with the real task activities (request_placement, run_task), two workers on two
nodes (each a recording WorkerService), and the disk's record on the first node. While a task
without the disk holds that node's worker, a task with the disk waits (`waiting for disk data's
machine N`) and a later task without it takes the other node's free worker; once the machine
frees, the disk's task runs there, its RunTask carrying the disk (name, id, size). A second task
of the disk waits for the first to let it go (`waiting for disk data: task T uses it`), then
runs on the same worker; the first's end has the disk's record read its use from the node.
When the disk's node is no machine of the pool any more, a task with the disk fails with the
disk's lost reason instead of waiting. A deleted disk's record has the worker of its node
remove its file (DeleteNodeDisk), and says so.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import grpc
import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.dispatch import TaskActivities
from levers9.config import ControlplaneSettings
from levers9.core.disks import DiskState
from levers9.core.storage import TaskMount
from levers9.core.task_reports import TaskReport
from levers9.models import (
    MACHINE_WORKFLOW,
    POOL_WORKFLOW,
    MachineRecord,
    PoolInput,
    TaskInput,
    TaskRecord,
    WorkerSlotInput,
    pool_workflow_id,
    task_workflow_id,
)
from levers9.proto import worker_pb2, worker_pb2_grpc
from levers9.records.disks import TemporalDiskRecords
from levers9.records.tasks import start_task, task_record
from levers9.search_attributes import POOL_NAME
from tests.waiting import eventually
from workflows import RUNNER
from workflows.disk import DiskWorkflow
from workflows.pool import PoolWorkflow
from workflows.task import TaskWorkflow

pytestmark = pytest.mark.integration

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SIZE = 64 * 2**20
USED = 3 * 2**20


@workflow.defn(name=MACHINE_WORKFLOW)
class StandingMachine:
    """A machine's record as MachineWorkflow keeps it (its memo, given at start), standing."""

    @workflow.run
    async def run(self, _: object) -> None:
        await workflow.wait_condition(lambda: False)


class RecordingAgent(worker_pb2_grpc.WorkerServiceServicer):
    """A worker's WorkerService: keeps each RunTaskRequest; its tasks run until told."""

    def __init__(self) -> None:
        self.requests: list[worker_pb2.RunTaskRequest] = []
        self.deleted: list[str] = []

    async def RunTask(
        self, request: worker_pb2.RunTaskRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.RunTaskResponse:
        self.requests.append(request)
        return worker_pb2.RunTaskResponse(task_id=request.task.task_id)

    async def GetTask(
        self, request: worker_pb2.GetTaskRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.TaskStatus:
        return worker_pb2.TaskStatus(
            task_id=request.task_id, state=worker_pb2.TaskState.TASK_STATE_RUNNING
        )

    async def ListNodeDisks(
        self, request: worker_pb2.ListNodeDisksRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.ListNodeDisksResponse:
        """Each disk a task of it mounted, as holding USED bytes."""
        ids = sorted({d.disk_id for run in self.requests for d in run.disks})
        return worker_pb2.ListNodeDisksResponse(
            disks=[worker_pb2.NodeDisk(disk_id=d, size_bytes=SIZE, used_bytes=USED) for d in ids]
        )

    async def DeleteNodeDisk(
        self,
        request: worker_pb2.DeleteNodeDiskRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> worker_pb2.DeleteNodeDiskResponse:
        self.deleted.append(request.disk_id)
        return worker_pb2.DeleteNodeDiskResponse(deleted=True)

    def ran(self) -> list[str]:
        return [r.task.task_id for r in self.requests]


@dataclass(frozen=True)
class Pool:
    client: Client
    task_queue: str
    name: str
    disk: DiskState
    nodes: tuple[str, str]
    agents: tuple[RecordingAgent, RecordingAgent]

    def task(self, stem: str, disk: bool = True) -> TaskInput:
        mounts = (TaskMount(kind="disk", name="data", path="/data"),) if disk else ()
        return TaskInput(
            task_id=f"{stem}-{uuid.uuid4().hex[:8]}",
            pool_name=self.name,
            command=("true",),
            gpus=1,
            workspace="team-a",
            mounts=mounts,
        )

    async def record(self, task_id: str) -> TaskRecord:
        record = await task_record(self.client, task_id, where_queued=True)
        assert record is not None
        return record

    async def until(self, task_id: str, state: str) -> TaskRecord:
        seen: list[TaskRecord] = []

        async def reached() -> bool:
            seen.append(await self.record(task_id))
            return seen[-1].state == state

        try:
            await eventually(reached, within=30)
        except TimeoutError:
            raise AssertionError(f"{task_id} is {seen[-1]}, never {state}") from None
        return seen[-1]


async def _machine(client: Client, task_queue: str, pool: str, node: str) -> None:
    record = MachineRecord(
        pool_name=pool,
        node_name=node,
        machine_id=node,
        status="available",
        machine=True,
        gpu_type="nvidia-l4",
        total_gpus=1,
        free_gpus=1,
        free_cpu_millis=4000,
        free_memory_bytes=2**34,
        workers=(),
        observed_at=NOW,
    )
    await client.start_workflow(
        MACHINE_WORKFLOW,
        None,
        id=f"machine:{pool}:{node}",
        task_queue=task_queue,
        memo={"record": record.model_dump(mode="json")},
        search_attributes=TypedSearchAttributes([SearchAttributePair(POOL_NAME, pool)]),
    )


@pytest.fixture
async def pool(dev_env: WorkflowEnvironment, task_queue: str) -> AsyncIterator[Pool]:
    client = dev_env.client
    suffix = uuid.uuid4().hex[:8]
    name = f"disks-{suffix}"
    nodes = (f"gpu-a-{suffix}", f"gpu-b-{suffix}")
    settings = ControlplaneSettings.model_validate(
        {"taskQueue": task_queue, "workerTokenSecret": f"secret-{suffix}"}
    )
    activities = TaskActivities(client, settings)
    records = TemporalDiskRecords(client, task_queue)
    agents = (RecordingAgent(), RecordingAgent())  # type: ignore[abstract]
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(
            Worker(
                client,
                task_queue=task_queue,
                workflows=[TaskWorkflow, PoolWorkflow, DiskWorkflow, StandingMachine],
                activities=[
                    activities.request_placement,
                    activities.run_task,
                    activities.get_task,
                    activities.cancel_task,
                    activities.worker_ended,
                    activities.worker_route,
                    activities.disk_worker,
                    activities.delete_node_disk,
                    activities.node_disk_use,
                ],
                workflow_runner=RUNNER,
            )
        )
        handle = await client.start_workflow(
            POOL_WORKFLOW,
            PoolInput(pool_name=name),
            id=pool_workflow_id(name),
            task_queue=task_queue,
        )
        for index, (node, agent) in enumerate(zip(nodes, agents, strict=True)):
            server = grpc.aio.server()
            worker_pb2_grpc.add_WorkerServiceServicer_to_server(agent, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            stack.push_async_callback(server.stop, 0)
            await _machine(client, task_queue, name, node)
            await handle.signal(
                "worker_available",
                WorkerSlotInput(
                    worker_id=f"w-{index}",
                    node_name=node,
                    address=f"127.0.0.1:{port}",
                    devices=(0,),
                    node_gpus=1,
                ),
            )
        disk = DiskState(
            name="data",
            workspace="team-a",
            pool_name=name,
            node_name=nodes[0],
            disk_id=f"team-a.data.{suffix}",
            size_bytes=SIZE,
            created_at=NOW,
        )
        await records.create(disk)

        async def machines_listed() -> bool:
            return await records.machine_nodes(name) == set(nodes)

        await eventually(machines_listed, within=30)
        try:
            yield Pool(client, task_queue, name, disk, nodes, agents)
        finally:
            query = f"TaskQueue='{task_queue}' AND ExecutionStatus='Running'"
            async for execution in client.list_workflows(query):
                with contextlib.suppress(RPCError):  # it ended since it was listed
                    await client.get_workflow_handle(execution.id).terminate("test done")


async def _waits(pool: Pool, task_id: str, reason: str) -> None:
    """Until the queued task's record says it waits, then that it waits for `reason`."""

    async def queued() -> bool:
        return (await pool.record(task_id)).queue is not None

    await eventually(queued, within=30)
    record = await pool.record(task_id)
    assert record.state == "queued"
    assert record.queue is not None
    assert record.queue.reason == reason


async def _end(pool: Pool, task_id: str, worker_id: str) -> None:
    """Its worker reports it succeeded (as the gateway signals a ReportTask)."""
    handle = pool.client.get_workflow_handle(task_workflow_id(task_id))
    report = TaskReport(
        pool_name=pool.name, worker_id=worker_id, task_id=task_id, state="succeeded"
    )
    await handle.signal("report", report)
    await pool.until(task_id, "succeeded")


async def test_tasks_with_a_disk_run_only_on_its_node_and_wait_for_it_with_the_reason(
    pool: Pool,
) -> None:
    disk_node, other_node = pool.nodes
    filler = pool.task("filler", disk=False)
    first, second = pool.task("first"), pool.task("second")
    free = pool.task("free", disk=False)
    # A task without the disk takes the disk node's worker (the first by id of two equals).
    await start_task(pool.client, pool.task_queue, filler)
    assert (await pool.until(filler.task_id, "running")).worker_id == "w-0"
    # The disk's task waits for that machine, though the other node's worker is free ...
    await start_task(pool.client, pool.task_queue, first)
    await _waits(pool, first.task_id, f"waiting for disk data's machine {disk_node}")
    # ... which a task without the disk then takes, while the disk's task still waits.
    await start_task(pool.client, pool.task_queue, free)
    elsewhere = await pool.until(free.task_id, "running")
    assert (elsewhere.worker_id, elsewhere.node_name) == ("w-1", other_node)
    assert (await pool.record(first.task_id)).state == "queued"
    # The machine frees: the disk's task runs there, its RunTask carrying the disk.
    await _end(pool, filler.task_id, "w-0")
    placed = await pool.until(first.task_id, "running")
    assert (placed.worker_id, placed.node_name) == ("w-0", disk_node)
    request = pool.agents[0].requests[-1]
    assert [(d.name, d.disk_id, d.size_bytes) for d in request.disks] == [
        ("data", pool.disk.disk_id, SIZE)
    ]
    # A second task of the disk waits for the first to let it go, then runs there.
    await start_task(pool.client, pool.task_queue, second)
    await _waits(pool, second.task_id, f"waiting for disk data: task {first.task_id} uses it")
    await _end(pool, first.task_id, "w-0")
    # Its pool tells the disk's record the task ended: it reads the disk's use from the node.
    records = TemporalDiskRecords(pool.client, pool.task_queue)

    async def used() -> bool:
        disk = await records.get(pool.disk.workspace, pool.disk.name)
        return disk is not None and disk.used_bytes == USED

    await eventually(used, within=30)
    then = await pool.until(second.task_id, "running")
    assert (then.worker_id, then.node_name) == ("w-0", disk_node)
    assert pool.agents[0].ran() == [filler.task_id, first.task_id, second.task_id]
    assert pool.agents[1].ran() == [free.task_id]
    assert [[d.name for d in r.disks] for r in pool.agents[0].requests] == [[], ["data"], ["data"]]


async def test_a_task_with_a_disk_whose_node_left_the_pool_fails_with_the_reason(
    pool: Pool,
) -> None:
    disk_node = pool.nodes[0]
    await pool.client.get_workflow_handle(f"machine:{pool.name}:{disk_node}").terminate("gone")
    records = TemporalDiskRecords(pool.client, pool.task_queue)

    async def gone() -> bool:
        return disk_node not in await records.machine_nodes(pool.name)

    await eventually(gone, within=30)
    task = pool.task("lost")
    await start_task(pool.client, pool.task_queue, task)
    failed = await pool.until(task.task_id, "failed")
    assert failed.reason == (
        f"disk data is lost: its node {disk_node} is no longer a machine of pool {pool.name}"
        " (a disk lives on its node's own disk, as a local SSD)"
    )
    assert pool.agents[0].ran() == []


async def test_a_deleted_disks_file_is_removed_by_a_worker_of_its_node(pool: Pool) -> None:
    records = TemporalDiskRecords(pool.client, pool.task_queue)
    assert await records.delete(pool.disk.workspace, pool.disk.name) is not None
    ended = await records.ended(pool.disk, within=30)
    assert ended is not None
    assert (ended.file_removed, ended.file) == (
        True,
        f"its file removed from node {pool.nodes[0]}",
    )
    assert pool.agents[0].deleted == [pool.disk.disk_id]
    assert pool.agents[1].deleted == []
