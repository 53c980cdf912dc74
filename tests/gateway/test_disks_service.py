"""Durable disks through the gateway's Disks service, on the dev server with a Temporal worker
hosting DiskWorkflow, WorkspaceWorkflow and PoolWorkflow, and machine records standing in for
MachineWorkflow's: a workspace token creates a disk in its own workspace on a Ready machine of
the pool (the answer names the node and why), lists, gets and deletes its own; another
workspace's token gets and deletes it exactly as a missing one (NOT_FOUND, same words) and the
disk is untouched (no Update in its history); a delete is refused while a task that mounts it
waits in the pool, and goes once that task leaves (the answer saying its file stays, and where,
while its node has no worker); a disk whose node is no machine of its pool
any more reads `lost`; sizes, pools and names the gateway cannot take are refused naming the
field; a task submitted with a disk its workspace does not have is refused at submit.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from pydantic import SecretStr
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.dispatch import TaskActivities
from levers9.config import ControlplaneSettings
from levers9.core.disks import disk_workflow_id
from levers9.core.storage import TaskMount
from levers9.disk_wire import disk_from_message
from levers9.gateway.server import Gateway
from levers9.gateway.task_records import TemporalTaskRecords
from levers9.models import (
    MACHINE_WORKFLOW,
    POOL_WORKFLOW,
    MachineRecord,
    PlaceRequest,
    PoolInput,
    TaskInput,
    pool_workflow_id,
)
from levers9.proto import disks_pb2, disks_pb2_grpc, gateway_pb2, gateway_pb2_grpc
from levers9.records.disks import TemporalDiskRecords
from levers9.records.workers import TemporalWorkerRecords
from levers9.records.workspaces import TemporalWorkspaceRecords
from levers9.rpc import bearer
from levers9.search_attributes import POOL_NAME
from levers9.task_wire import submit_request
from levers9.temporal import sync_reconcile_schedules
from levers9.tokens import operator_token
from tests.gateway.conftest import LOOPBACK
from tests.waiting import eventually
from workflows import RUNNER
from workflows.disk import DiskWorkflow
from workflows.pool import PoolWorkflow
from workflows.workspace import WorkspaceWorkflow

if TYPE_CHECKING:
    from levers9.proto.disks_pb2_grpc import DisksAsyncStub
    from levers9.proto.gateway_pb2_grpc import TasksAsyncStub, WorkspacesAsyncStub

Metadata = tuple[tuple[str, str], ...]
TIMEOUT_S = 10
NOW = datetime(2026, 1, 1, tzinfo=UTC)
MIB = 2**20


@workflow.defn(name=MACHINE_WORKFLOW)
class StandingMachine:
    """A machine's record as MachineWorkflow keeps it (its memo, given at start), standing."""

    @workflow.run
    async def run(self, _: object) -> None:
        await workflow.wait_condition(lambda: False)


@dataclass(frozen=True)
class Plane:
    client: Client
    disks: DisksAsyncStub
    tasks: TasksAsyncStub
    records: TemporalDiskRecords
    operator: Metadata
    a: Metadata
    b: Metadata
    workspace_a: str
    workspace_b: str
    pool: str
    empty_pool: str
    task_queue: str
    workspaces: WorkspacesAsyncStub

    def machine_id(self, node: str) -> str:
        return f"machine:{self.pool}:{node}"


async def _machine(client: Client, task_queue: str, pool: str, node: str, ready: bool) -> None:
    record = MachineRecord(
        pool_name=pool,
        node_name=node,
        machine_id=node,
        status="available",
        machine=ready,
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
async def plane(
    dev_env: WorkflowEnvironment, secret: SecretStr, task_queue: str
) -> AsyncIterator[Plane]:
    client = dev_env.client
    records = TemporalDiskRecords(client, task_queue)
    gateway = Gateway(
        TemporalWorkerRecords(client),
        secret,
        tasks=TemporalTaskRecords(client, task_queue),
        workspaces=TemporalWorkspaceRecords(client, task_queue),
        disks=records,
    )
    suffix = uuid.uuid4().hex[:8]
    pool, empty = f"pool-{suffix}", f"empty-{suffix}"
    settings = ControlplaneSettings.model_validate(
        {
            "taskQueue": task_queue,
            "reconcileIntervalSeconds": 3600,  # no pass starts here
            "workerTokenSecret": secret.get_secret_value(),
        }
    )
    tasks = TaskActivities(client, settings)
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(
            Worker(
                client,
                task_queue=task_queue,
                workflows=[WorkspaceWorkflow, DiskWorkflow, PoolWorkflow, StandingMachine],
                activities=[tasks.disk_worker, tasks.delete_node_disk],
                workflow_runner=RUNNER,
            )
        )
        port = await gateway.start(LOOPBACK)
        stack.push_async_callback(gateway.stop, 0)
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
        operator = bearer.metadata(operator_token(secret.get_secret_value()))
        workspaces = gateway_pb2_grpc.WorkspacesStub(channel)
        tokens = []
        for name in (f"a-{suffix}", f"b-{suffix}"):
            await workspaces.CreateWorkspace(
                gateway_pb2.CreateWorkspaceRequest(name=name), metadata=operator, timeout=TIMEOUT_S
            )
            made = await workspaces.CreateWorkspaceToken(
                gateway_pb2.CreateWorkspaceTokenRequest(workspace=name),
                metadata=operator,
                timeout=TIMEOUT_S,
            )
            tokens.append(bearer.metadata(made.token))
        await sync_reconcile_schedules(client, [pool, empty], settings)
        await _machine(client, task_queue, pool, f"gpu-b-{suffix}", ready=True)
        await _machine(client, task_queue, pool, f"gpu-a-{suffix}", ready=True)
        await _machine(client, task_queue, pool, f"gpu-0-{suffix}", ready=False)

        async def machines_listed() -> bool:
            return len(await records.rooms(pool)) == 3

        await eventually(machines_listed, within=30)
        try:
            yield Plane(
                client,
                disks_pb2_grpc.DisksStub(channel),
                gateway_pb2_grpc.TasksStub(channel),
                records,
                operator,
                tokens[0],
                tokens[1],
                f"a-{suffix}",
                f"b-{suffix}",
                pool,
                empty,
                task_queue,
                workspaces,
            )
        finally:
            await sync_reconcile_schedules(client, [], settings)
            for disk in await records.list(pool_name=pool):
                await records.delete(disk.workspace, disk.name)
            query = f"TaskQueue='{task_queue}' AND ExecutionStatus='Running'"
            async for execution in client.list_workflows(query):
                with contextlib.suppress(RPCError):  # it ended since it was listed
                    await client.get_workflow_handle(execution.id).terminate("test done")


async def _refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    return refused.value


async def _create(
    plane: Plane, metadata: Metadata, name: str, size: int = 64 * MIB
) -> disks_pb2.CreateDiskResponse:
    request = disks_pb2.CreateDiskRequest(name=name, size_bytes=size, pool_name=plane.pool)
    return await plane.disks.CreateDisk(request, metadata=metadata, timeout=TIMEOUT_S)


async def _listed(plane: Plane, metadata: Metadata, wanted: list[tuple[str, str]]) -> None:
    """Until the listing to `metadata` is `wanted` (name, workspace): the visibility store
    lists a new workflow a moment after it started."""
    seen: list[list[tuple[str, str]]] = []

    async def listed() -> bool:
        reply = await plane.disks.ListDisks(
            disks_pb2.ListDisksRequest(pool_name=plane.pool), metadata=metadata
        )
        seen.append(sorted((d.name, d.workspace) for d in reply.disks))
        return seen[-1] == sorted(wanted)

    try:
        await eventually(listed, within=30)
    except TimeoutError:
        raise AssertionError(f"listed {seen[-1]}, not {sorted(wanted)}") from None


async def test_a_workspace_creates_lists_gets_and_deletes_its_own_disk(plane: Plane) -> None:
    made = await _create(plane, plane.a, "data")
    view = disk_from_message(made.disk)
    # The machines hold no disk yet: the first Ready one by name, and the answer says so.
    assert (view.disk.workspace, view.disk.pool_name) == (plane.workspace_a, plane.pool)
    assert view.disk.node_name == f"gpu-a-{plane.workspace_a.removeprefix('a-')}"
    assert view.disk.chosen == "the first of 2 Ready machines (none holds more disks)"
    assert (view.disk.size_bytes, view.state, view.disk.used_bytes) == (64 * MIB, "ready", None)
    assert view.disk.disk_id.startswith(f"{plane.workspace_a}.data.")
    # The next goes to the other Ready machine: its node holds no disk yet.
    second = disk_from_message((await _create(plane, plane.a, "scratch")).disk)
    assert second.disk.node_name == f"gpu-b-{plane.workspace_a.removeprefix('a-')}"
    assert second.disk.chosen.startswith("the Ready machine whose node holds the fewest disks")
    await _listed(plane, plane.a, [("data", plane.workspace_a), ("scratch", plane.workspace_a)])
    got = await plane.disks.GetDisk(disks_pb2.GetDiskRequest(name="data"), metadata=plane.a)
    assert disk_from_message(got.disk) == view
    again = await _refused(_create(plane, plane.a, "data"))
    assert again.code() == grpc.StatusCode.ALREADY_EXISTS
    deleted = await plane.disks.DeleteDisk(
        disks_pb2.DeleteDiskRequest(name="data"), metadata=plane.a
    )
    assert deleted.disk.state == "deleting"
    assert not deleted.file_removed
    assert deleted.file == (
        f"its file {view.disk.disk_id}.ext4 stays under durableDisksPath on node"
        f" {view.disk.node_name} (the node has no worker now): remove it there"
    )
    gone = await _refused(
        plane.disks.GetDisk(disks_pb2.GetDiskRequest(name="data"), metadata=plane.a)
    )
    assert gone.code() == grpc.StatusCode.NOT_FOUND
    await _listed(plane, plane.a, [("scratch", plane.workspace_a)])


async def test_another_workspaces_disk_is_not_found_as_a_missing_one_and_untouched(
    plane: Plane,
) -> None:
    view = disk_from_message((await _create(plane, plane.a, "data")).disk)
    missing = await _refused(
        plane.disks.GetDisk(disks_pb2.GetDiskRequest(name="nothing"), metadata=plane.b)
    )
    # By name (looked up in b's own workspace): NOT_FOUND, in the words of a missing disk.
    for call in (
        plane.disks.GetDisk(disks_pb2.GetDiskRequest(name="data"), metadata=plane.b),
        plane.disks.DeleteDisk(disks_pb2.DeleteDiskRequest(name="data"), metadata=plane.b),
    ):
        refused = await _refused(call)
        assert refused.code() == grpc.StatusCode.NOT_FOUND
        assert refused.details() == (missing.details() or "").replace("nothing", "data")
    # Naming a's workspace: PERMISSION_DENIED for every call, in words that are the same for a
    # workspace that does not exist (levers9.gateway.scope).
    for named_workspace in (plane.workspace_a, "no-such-team"):
        naming: list[Any] = [
            plane.disks.GetDisk(
                disks_pb2.GetDiskRequest(name="data", workspace=named_workspace),
                metadata=plane.b,
            ),
            plane.disks.DeleteDisk(
                disks_pb2.DeleteDiskRequest(name="data", workspace=named_workspace),
                metadata=plane.b,
            ),
            plane.disks.ListDisks(
                disks_pb2.ListDisksRequest(workspace=named_workspace), metadata=plane.b
            ),
            plane.disks.CreateDisk(
                disks_pb2.CreateDiskRequest(
                    name="x", size_bytes=64 * MIB, pool_name=plane.pool, workspace=named_workspace
                ),
                metadata=plane.b,
            ),
        ]
        for refused_call in naming:
            denied = await _refused(refused_call)
            assert denied.code() == grpc.StatusCode.PERMISSION_DENIED
            assert denied.details() == (
                f"workspace: a workspace token (workspace {plane.workspace_b}) acts on its own"
                f" workspace's disks only, not on workspace {named_workspace!r}; leave"
                " --workspace out, or ask the operator"
            )
    # The operator lists every workspace's; b lists none of a's.
    await _listed(plane, plane.operator, [("data", plane.workspace_a)])
    await _listed(plane, plane.b, [])
    # Untouched: still a's, and its record was told nothing.
    got = await plane.disks.GetDisk(disks_pb2.GetDiskRequest(name="data"), metadata=plane.a)
    assert disk_from_message(got.disk) == view
    handle = plane.client.get_workflow_handle(disk_workflow_id(plane.workspace_a, "data"))
    history = await handle.fetch_history()
    assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED not in {
        e.event_type for e in history.events
    }


async def test_a_disk_in_use_is_not_deleted_until_its_task_leaves(plane: Plane) -> None:
    view = disk_from_message((await _create(plane, plane.a, "data")).disk)
    pool = await plane.client.start_workflow(
        POOL_WORKFLOW,
        PoolInput(pool_name=plane.pool),
        id=pool_workflow_id(plane.pool),
        task_queue=plane.task_queue,
        start_signal="requests",
        start_signal_args=[
            [
                PlaceRequest(
                    pool_name=plane.pool,
                    task_id="t-uses-data",
                    gpus=1,
                    workspace=plane.workspace_a,
                    node=view.disk.node_name,
                    pinned_by="disk data",
                    disk_ids=(view.disk.disk_id,),
                )
            ]
        ],
    )
    refused = await _refused(
        plane.disks.DeleteDisk(disks_pb2.DeleteDiskRequest(name="data"), metadata=plane.a)
    )
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (refused.details() or "").startswith("disk data is in use by task t-uses-data:")
    got = await plane.disks.GetDisk(disks_pb2.GetDiskRequest(name="data"), metadata=plane.a)
    assert got.disk.state == "ready"
    await pool.signal("release", "t-uses-data")

    async def deleted() -> bool:
        try:
            await plane.disks.DeleteDisk(disks_pb2.DeleteDiskRequest(name="data"), metadata=plane.a)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            return False
        return True

    await eventually(deleted, within=15)


async def test_a_disk_whose_node_left_the_pool_is_lost(plane: Plane) -> None:
    view = disk_from_message((await _create(plane, plane.a, "data")).disk)
    await plane.client.get_workflow_handle(plane.machine_id(view.disk.node_name)).terminate(
        "node gone"
    )

    async def lost() -> bool:
        got = await plane.disks.GetDisk(disks_pb2.GetDiskRequest(name="data"), metadata=plane.a)
        return got.disk.state == "lost"

    await eventually(lost, within=30)
    got = await plane.disks.GetDisk(disks_pb2.GetDiskRequest(name="data"), metadata=plane.a)
    assert got.disk.reason == (
        f"disk data is lost: its node {view.disk.node_name} is no longer a machine of pool"
        f" {plane.pool} (a disk lives on its node's own disk, as a local SSD)"
    )


@pytest.mark.parametrize(
    ("request_fields", "code", "message"),
    [
        ({"size_bytes": MIB}, "INVALID_ARGUMENT", "size_bytes: 1Mi is below the 16Mi"),
        ({"size_bytes": 2**50}, "INVALID_ARGUMENT", "size_bytes: 1Pi is above 64Ti"),
        ({"name": "Bad_Name"}, "INVALID_ARGUMENT", "name: 'Bad_Name' is not a DNS label"),
        ({"pool_name": "nope"}, "INVALID_ARGUMENT", "pool_name: no pool 'nope'"),
        ({"pool_name": ""}, "INVALID_ARGUMENT", "pool_name: missing"),
        ({"pool_name": "EMPTY"}, "FAILED_PRECONDITION", "pool EMPTY has no Ready machine"),
    ],
)
async def test_a_disk_the_gateway_cannot_make_is_refused_naming_the_field(
    plane: Plane, request_fields: dict[str, Any], code: str, message: str
) -> None:
    fields: dict[str, Any] = {"name": "data", "size_bytes": 64 * MIB, "pool_name": plane.pool}
    fields.update(request_fields)
    if fields["pool_name"] == "EMPTY":
        fields["pool_name"] = plane.empty_pool
        message = message.replace("EMPTY", plane.empty_pool)
    refused = await _refused(
        plane.disks.CreateDisk(disks_pb2.CreateDiskRequest(**fields), metadata=plane.a)
    )
    assert (refused.code().name, (refused.details() or "")[: len(message)]) == (code, message)
    assert await plane.records.get(plane.workspace_a, fields["name"]) is None


async def test_a_task_naming_a_disk_its_workspace_lacks_is_refused_at_submit(
    plane: Plane,
) -> None:
    await _create(plane, plane.a, "data")
    task = TaskInput(
        task_id=f"t-{uuid.uuid4().hex[:8]}",
        pool_name=plane.pool,
        command=("true",),
        mounts=(TaskMount(kind="disk", name="data", path="/data"),),
    )
    refused = await _refused(plane.tasks.SubmitTask(submit_request(task), metadata=plane.b))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details() == (
        f"task.mounts: no disk data in workspace {plane.workspace_b} (`levers9 disk list`;"
        " `levers9 disk create` makes one)"
    )
    handle = plane.client.get_workflow_handle(f"task:{task.task_id}")
    with pytest.raises(Exception, match="not found"):
        await handle.describe()


async def test_a_workspace_with_disks_is_not_deleted_until_they_are(plane: Plane) -> None:
    """Else a workspace made again under its name would find the old one's disks: the refusal
    names each and the command that deletes it."""
    await _create(plane, plane.b, "keep")
    await _create(plane, plane.b, "notes")
    await _listed(plane, plane.b, [("keep", plane.workspace_b), ("notes", plane.workspace_b)])
    workspaces = plane.workspaces
    delete = gateway_pb2.DeleteWorkspaceRequest(name=plane.workspace_b)
    refused = await _refused(
        workspaces.DeleteWorkspace(delete, metadata=plane.operator, timeout=TIMEOUT_S)
    )
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    w = plane.workspace_b
    assert refused.details() == (
        f"workspace {w} has 2 disk(s) (keep: `levers9 disk delete keep --workspace {w}`;"
        f" notes: `levers9 disk delete notes --workspace {w}`): delete them first, then"
        " delete it"
    )
    # Still there, and still its team's.
    got = await plane.disks.GetDisk(disks_pb2.GetDiskRequest(name="keep"), metadata=plane.b)
    assert got.disk.workspace == w
    for name in ("keep", "notes"):
        await plane.disks.DeleteDisk(
            disks_pb2.DeleteDiskRequest(name=name, workspace=w), metadata=plane.operator
        )
    await _listed(plane, plane.b, [])
    await workspaces.DeleteWorkspace(delete, metadata=plane.operator, timeout=TIMEOUT_S)
    gone = await _refused(
        workspaces.GetWorkspace(
            gateway_pb2.GetWorkspaceRequest(name=w), metadata=plane.operator, timeout=TIMEOUT_S
        )
    )
    assert gone.code() == grpc.StatusCode.NOT_FOUND
