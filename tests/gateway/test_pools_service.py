"""The gateway's Pools service on the dev server, with a Temporal worker hosting WorkspaceWorkflow
and PoolWorkflow: any valid token lists the pools (their reconcile schedules) and the machines
(their records), as the operator reads them from Temporal; GetPool shows per workspace the GPUs
it holds, its waiting tasks, its quota and weight from the pool's placement state, a workspace
token its own row only (no other workspace's name in the answer); a pool change (RemovePool)
is PERMISSION_DENIED to a workspace token naming the operator, and starts nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import grpc
import pytest
from pydantic import SecretStr
from temporalio import workflow
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.config import ControlplaneSettings
from levers9.core.placement import Placement, PoolState, Share, Slot, Waiting
from levers9.gateway import task_service
from levers9.gateway.server import Gateway
from levers9.gateway.task_records import TemporalTaskRecords
from levers9.models import (
    MACHINE_WORKFLOW,
    POOL_WORKFLOW,
    MachineRecord,
    PoolInput,
    pool_workflow_id,
    task_workflow_id,
)
from levers9.proto import gateway_pb2, gateway_pb2_grpc, pools_pb2, pools_pb2_grpc, worker_pb2
from levers9.providers.gke import remove_pool_workflow_id
from levers9.records.listing import machine_records
from levers9.records.pools import TemporalPoolRecords
from levers9.records.workers import TemporalWorkerRecords
from levers9.records.workspaces import TemporalWorkspaceRecords
from levers9.rpc import bearer
from levers9.search_attributes import POOL_NAME
from levers9.task_wire import from_message
from levers9.temporal import pool_names, sync_reconcile_schedules
from levers9.tokens import operator_token
from tests.gateway.conftest import LOOPBACK
from tests.waiting import eventually
from workflows import RUNNER
from workflows.pool import PoolWorkflow
from workflows.workspace import WorkspaceWorkflow

if TYPE_CHECKING:
    from levers9.proto.gateway_pb2_grpc import WorkspacesAsyncStub
    from levers9.proto.pools_pb2_grpc import PoolsAsyncStub

Metadata = tuple[tuple[str, str], ...]
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@workflow.defn(name=MACHINE_WORKFLOW)
class StandingMachine:
    """A machine's record as MachineWorkflow keeps it (its memo, given at start), standing."""

    @workflow.run
    async def run(self, _: object) -> None:
        await workflow.wait_condition(lambda: False)


@dataclass(frozen=True)
class Plane:
    client: Client
    pools: PoolsAsyncStub
    workspaces: WorkspacesAsyncStub
    operator: Metadata
    task_queue: str
    settings: ControlplaneSettings
    address: str
    """The gateway's, on loopback."""

    async def token(self, workspace: str) -> Metadata:
        await self.workspaces.CreateWorkspace(
            gateway_pb2.CreateWorkspaceRequest(name=workspace), metadata=self.operator
        )
        reply = await self.workspaces.CreateWorkspaceToken(
            gateway_pb2.CreateWorkspaceTokenRequest(workspace=workspace), metadata=self.operator
        )
        return bearer.metadata(reply.token)


@pytest.fixture
async def plane(
    dev_env: WorkflowEnvironment, secret: SecretStr, task_queue: str
) -> AsyncIterator[Plane]:
    client = dev_env.client
    settings = ControlplaneSettings.model_validate(
        {"taskQueue": task_queue, "reconcileIntervalSeconds": 3600}  # no pass starts here
    )
    gateway = Gateway(
        TemporalWorkerRecords(client),
        secret,
        tasks=TemporalTaskRecords(client, task_queue),
        workspaces=TemporalWorkspaceRecords(client, task_queue),
        pools=TemporalPoolRecords(client, task_queue),
    )
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(
            Worker(
                client,
                task_queue=task_queue,
                workflows=[WorkspaceWorkflow, PoolWorkflow, StandingMachine],
                workflow_runner=RUNNER,
            )
        )
        port = await gateway.start(LOOPBACK)
        stack.push_async_callback(gateway.stop, 0)
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
        yield Plane(
            client,
            pools_pb2_grpc.PoolsStub(channel),
            gateway_pb2_grpc.WorkspacesStub(channel),
            bearer.metadata(operator_token(secret.get_secret_value())),
            task_queue,
            settings,
            f"127.0.0.1:{port}",
        )
        await sync_reconcile_schedules(client, [], settings)


async def _listed(ids: Awaitable[list[str]], wanted: list[str]) -> bool:
    return await ids == wanted


async def _submit(plane: Plane, pool: str, deadline_s: float = 10) -> str:
    """The operator submits `true` to `pool` through the gateway: its task id."""
    spec = worker_pb2.TaskSpec(task_id=f"t-{_suffix()}", command=["true"])
    async with grpc.aio.insecure_channel(plane.address) as channel:
        await gateway_pb2_grpc.TasksStub(channel).SubmitTask(
            gateway_pb2.SubmitTaskRequest(pool_name=pool, task=spec),
            metadata=plane.operator,
            timeout=deadline_s,
        )
    return spec.task_id


def _suffix() -> str:
    return uuid.uuid4().hex[:8]


async def _pools_listed(plane: Plane, wanted: list[str]) -> None:
    async def listed() -> bool:
        return await pool_names(plane.client, plane.task_queue) == wanted

    await eventually(listed, within=30)


async def test_a_workspace_token_lists_the_pools_and_machines_the_operator_sees(
    plane: Plane,
) -> None:
    suffix = _suffix()
    first, second = f"a-{suffix}", f"b-{suffix}"
    await sync_reconcile_schedules(plane.client, [first, second], plane.settings)
    await _pools_listed(plane, [first, second])
    node = MachineRecord(
        pool_name=first,
        node_name=f"gpu-{suffix}",
        machine_id="m-1",
        status="available",
        machine=True,
        gpu_type="nvidia-l4",
        total_gpus=4,
        free_gpus=3,
        free_cpu_millis=7500,
        free_memory_bytes=2**34,
        workers=("w-1",),
        observed_at=NOW,
        total_memory_bytes=2**35,
    )
    await plane.client.start_workflow(
        MACHINE_WORKFLOW,
        None,
        id=f"machine:{first}:{node.node_name}",
        task_queue=plane.task_queue,
        memo={"record": node.model_dump(mode="json")},
        search_attributes=TypedSearchAttributes([SearchAttributePair(POOL_NAME, first)]),
    )

    async def machine_listed() -> bool:
        return len(await machine_records(plane.client, plane.task_queue, first)) == 1

    await eventually(machine_listed, within=30)
    mine = await plane.token(f"team-{suffix}")
    for metadata in (mine, plane.operator):
        pools = await plane.pools.ListPools(pools_pb2.ListPoolsRequest(), metadata=metadata)
        assert [(p.name, p.schedule, p.every) for p in pools.pools] == [
            (first, f"reconcile:{first}", "3600s"),
            (second, f"reconcile:{second}", "3600s"),
        ]
        machines = await plane.pools.ListMachines(
            pools_pb2.ListMachinesRequest(pool_name=first), metadata=metadata
        )
        assert [from_message(m, MachineRecord) for m in machines.machines] == [node]
        none = await plane.pools.ListMachines(
            pools_pb2.ListMachinesRequest(pool_name=second), metadata=metadata
        )
        assert list(none.machines) == []
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await plane.pools.ListPools(
            pools_pb2.ListPoolsRequest(), metadata=bearer.metadata("not-a-token")
        )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.aio.AioRpcError) as bad:
        await plane.pools.ListMachines(
            pools_pb2.ListMachinesRequest(pool_name="Bad'Name"), metadata=mine
        )
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "pool_name" in (bad.value.details() or "")


def _placed(
    task_id: str, workspace: str, cards: tuple[int, ...], borrowed: bool = False
) -> Placement:
    return Placement(
        task_id=task_id,
        worker_id="w-1",
        node_name="gpu-1",
        address="192.0.2.1:7000",
        gpu_indices=cards,
        workspace=workspace,
        borrowed=borrowed,
        since=NOW,
    )


async def test_get_pool_shows_each_workspace_its_own_usage_only(plane: Plane) -> None:
    suffix = _suffix()
    pool, ours, theirs = f"p-{suffix}", f"ours-{suffix}", f"theirs-{suffix}"
    await sync_reconcile_schedules(plane.client, [pool], plane.settings)
    await _pools_listed(plane, [pool])
    # Every card held, so the placement's own passes change nothing while the test reads.
    state = PoolState(
        slots={
            "w-1": Slot(
                worker_id="w-1",
                node_name="gpu-1",
                address="192.0.2.1:7000",
                devices=(0, 1, 2, 3),
                busy={"t1": (0,), "t2": (1, 2), "t3": (3,)},
            )
        },
        placed={
            "t1": _placed("t1", ours, (0,)),
            "t2": _placed("t2", theirs, (1, 2)),
            "t3": _placed("t3", theirs, (3,), borrowed=True),
        },
        waiting=[
            Waiting(task_id="t4", gpus=1, since=NOW, workspace=ours),
            Waiting(task_id="t5", gpus=1, since=NOW, workspace=ours),
            Waiting(task_id="t6", gpus=2, since=NOW, workspace=theirs),
        ],
        shares={ours: Share(quota=1), theirs: Share(quota=2, weight=2.0)},
    )
    await plane.client.start_workflow(
        POOL_WORKFLOW,
        PoolInput(pool_name=pool, state=state),
        id=pool_workflow_id(pool),
        task_queue=plane.task_queue,
    )
    mine = await plane.token(ours)
    request = pools_pb2.GetPoolRequest(name=pool)

    operator = await plane.pools.GetPool(request, metadata=plane.operator)
    assert operator.pool.name == pool
    usage = operator.usage
    assert (usage.workers, usage.gpus, usage.free_gpus, usage.placed, usage.waiting) == (
        1,
        4,
        0,
        3,
        3,
    )
    rows = {
        r.workspace: (r.gpus, r.borrowed_gpus, r.waiting, r.gpu_quota, r.weight)
        for r in usage.workspaces
    }
    assert rows == {ours: (1, 0, 2, 1, 1.0), theirs: (3, 1, 1, 2, 2.0)}

    own = await plane.pools.GetPool(request, metadata=mine)
    assert [(r.workspace, r.gpus, r.waiting, r.gpu_quota) for r in own.usage.workspaces] == [
        (ours, 1, 2, 1)
    ]
    assert theirs.encode() not in own.SerializeToString()
    # `workspace get`: its own part of each pool it has work in.
    got = await plane.workspaces.GetWorkspace(
        gateway_pb2.GetWorkspaceRequest(name=ours), metadata=mine
    )
    assert [(p.pool_name, p.usage.gpus, p.usage.waiting, p.usage.gpu_quota) for p in got.pools] == [
        (pool, 1, 2, 1)
    ]

    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await plane.pools.GetPool(pools_pb2.GetPoolRequest(name=f"gone-{suffix}"), metadata=mine)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    assert pool in (missing.value.details() or "")  # names the pools there are


async def test_a_workspace_token_may_not_remove_a_pool_and_nothing_starts(plane: Plane) -> None:
    suffix = _suffix()
    pool = f"p-{suffix}"
    await sync_reconcile_schedules(plane.client, [pool], plane.settings)
    await _pools_listed(plane, [pool])
    mine = await plane.token(f"team-{suffix}")
    request = pools_pb2.RemovePoolRequest(name=pool, wait_seconds=0)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await plane.pools.RemovePool(request, metadata=mine)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "operator" in (refused.value.details() or "")
    removal = plane.client.get_workflow_handle(remove_pool_workflow_id(pool))
    with pytest.raises(RPCError) as absent:
        await removal.describe()
    assert absent.value.status == RPCStatusCode.NOT_FOUND
    assert await pool_names(plane.client, plane.task_queue) == [pool]
    # The same call with the operator's token starts the removal: the refusal above stopped it.
    started = await plane.pools.RemovePool(request, metadata=plane.operator)
    assert not started.done  # no Temporal worker here hosts the removal
    try:
        assert (await removal.describe()).id == remove_pool_workflow_id(pool)
    finally:
        await removal.terminate("test over")


async def test_a_submit_to_a_pool_keeping_its_most_waiting_is_refused_and_starts_nothing(
    plane: Plane, secret: SecretStr, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past POOL_MAX_WAITING (3 here) the pool's queue would outgrow the payload it is carried
    in: the submit is RESOURCE_EXHAUSTED naming the pool and the fix, and no record starts;
    the same submit to a pool one below it is taken."""
    monkeypatch.setattr(task_service, "POOL_MAX_WAITING", 3)
    suffix = _suffix()
    full, room = f"full-{suffix}", f"room-{suffix}"
    await sync_reconcile_schedules(plane.client, [full, room], plane.settings)
    await _pools_listed(plane, sorted([full, room]))
    for pool, waiting in ((full, 3), (room, 2)):
        queue = PoolState(
            waiting=[Waiting(task_id=f"{pool}-{n}", gpus=1, since=NOW) for n in range(waiting)]
        )
        await plane.client.start_workflow(
            POOL_WORKFLOW,
            PoolInput(pool_name=pool).carrying(queue),
            id=pool_workflow_id(pool),
            task_queue=plane.task_queue,
        )
    taken = await _submit(plane, room)
    assert await plane.client.get_workflow_handle(task_workflow_id(taken)).describe()
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await _submit(plane, full)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.value.details() == (
        f"pool {full} has 3 tasks waiting, the most one pool keeps (3): submit again once some"
        " start, or give each workspace a max-queued (levers9 workspace set NAME --max-queued N)"
    )

    async def started(pool: str) -> list[str]:
        query = f"WorkflowType='TaskWorkflow' AND PoolName='{pool}'"
        return [e.id async for e in plane.client.list_workflows(query)]

    # The taken one is listed (visibility has caught up with the starts), the refused none.
    await eventually(
        lambda: _listed(started(room), [task_workflow_id(taken)]), within=30, what="listed"
    )
    assert await started(full) == []
    for pool in (full, room):
        await plane.client.get_workflow_handle(pool_workflow_id(pool)).terminate("test done")


async def test_a_submit_to_a_pool_that_does_not_answer_its_count_is_taken(
    plane: Plane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool's workflow has no worker to answer `waiting_total` (its task queue unpolled,
    as a pool whose workflow task keeps failing): the bound is not read, and the submit is
    taken, not failed."""
    monkeypatch.setattr(task_service, "POOL_MAX_WAITING", 1)
    pool = f"mute-{_suffix()}"
    await sync_reconcile_schedules(plane.client, [pool], plane.settings)
    await _pools_listed(plane, [pool])
    await plane.client.start_workflow(
        POOL_WORKFLOW,
        PoolInput(pool_name=pool),
        id=pool_workflow_id(pool),
        task_queue=f"{plane.task_queue}-nobody-polls",
    )
    taken = await _submit(plane, pool, deadline_s=20)
    assert await plane.client.get_workflow_handle(task_workflow_id(taken)).describe()
    await plane.client.get_workflow_handle(pool_workflow_id(pool)).terminate("test done")
