"""A multi-card task on the sandbox, as the spec's sharing section says: a 4-card task waits for
one worker with 4 cards free at once; when the model server scales to 0, the 2-card worker on the
4-GPU node winds down after its idle minutes (seconds here), the next worker takes all 4 cards,
and the task runs there; and a stream of 1-card tasks that would keep that worker busy forever
does not starve it (the big task reserves the worker after waiting, small ones stop taking it).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from temporalio.testing import WorkflowEnvironment

from levers9.core.placement import PoolState
from levers9.models import TaskInput, pool_workflow_id
from levers9.records.listing import list_worker_records
from levers9.records.tasks import start_task, task_record
from levers9.temporal import connect
from sandbox.scenario import Scenario
from tests.controlplane import POOL, Controlplane, quick_scenario, reconciling
from tests.waiting import eventually
from workflows.pool import RESERVE_AFTER

pytestmark = pytest.mark.integration

NODE_4X = "gke-demo-gpu-4x-2f7c9e1a-m5p2"


@pytest.fixture
async def cp(dev_env: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Controlplane]:
    async with reconciling(
        dev_env.client, tmp_path, containers=True, workerIdleMinutes=0.1
    ) as plane:
        yield plane


async def test_four_card_task_waits_for_one_worker_with_four(cp: Controlplane) -> None:
    task = TaskInput(task_id=uuid.uuid4().hex[:12], pool_name=POOL, command=("true",), gpus=4)
    await start_task(await connect(cp.settings), cp.settings.task_queue, task)

    async def placed() -> bool:
        record = await task_record(await connect(cp.settings), task.task_id)
        return record is not None and record.state != "queued"

    with pytest.raises(TimeoutError):
        await eventually(placed, within=8)  # no worker has 4 cards: the model server holds 2
    await cp.admin(
        lambda api: k8s.AppsV1Api(api).patch_namespaced_deployment_scale(
            "model-server", "default", {"spec": {"replicas": 0}}
        )
    )

    async def succeeded() -> bool:
        record = await task_record(await connect(cp.settings), task.task_id)
        return record is not None and record.state == "succeeded"

    await eventually(succeeded, within=90)
    record = await task_record(await connect(cp.settings), task.task_id)
    assert record is not None
    assert record.node_name == NODE_4X
    assert record.gpu_indices == (0, 1, 2, 3)


def _four_card_node_only() -> Scenario:
    """The default cluster with only its 4-GPU node, so small tasks have nowhere else to go."""
    base = quick_scenario()
    return base.model_copy(update={"nodes": tuple(n for n in base.nodes if n.name == NODE_4X)})


async def test_four_card_task_is_not_starved_by_a_stream_of_one_card_tasks(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    async with reconciling(
        dev_env.client,
        tmp_path,
        scenario=_four_card_node_only(),
        containers=True,
        workerIdleMinutes=0.1,
    ) as cp:
        client = await connect(cp.settings)

        async def two_card_worker() -> bool:
            records = await list_worker_records(cp.settings, POOL, include_ended=False)
            return [(r.state, r.gpus) for r in records] == [("available", 2)]

        await eventually(two_card_worker, within=60)  # the model server holds the other two
        big = TaskInput(task_id=uuid.uuid4().hex[:12], pool_name=POOL, command=("true",), gpus=4)
        stream_stop = asyncio.Event()
        sent: list[str] = []

        async def stream() -> None:
            while not stream_stop.is_set():
                small = TaskInput(
                    task_id=uuid.uuid4().hex[:12],
                    pool_name=POOL,
                    command=("sleep", "2"),
                    gpus=1,
                )
                await start_task(client, cp.settings.task_queue, small)
                sent.append(small.task_id)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stream_stop.wait(), timeout=1)

        # The small tasks keep the 2-card worker busy; once the model server is gone only the
        # reservation lets that worker idle, wind down and make room for a 4-card one.
        streaming = asyncio.create_task(stream())

        async def a_small_task_runs() -> bool:
            records = [await task_record(client, task_id) for task_id in sent]
            return any(r is not None and r.state == "running" for r in records)

        pool = client.get_workflow_handle(pool_workflow_id(POOL))

        async def big_reserved_a_worker() -> bool:
            state = await pool.query("state", result_type=PoolState)
            return big.task_id in state.reservations.values()

        async def succeeded() -> bool:
            record = await task_record(client, big.task_id)
            return record is not None and record.state == "succeeded"

        try:
            await eventually(a_small_task_runs, within=60)
            await start_task(client, cp.settings.task_queue, big)
            await cp.admin(
                lambda api: k8s.AppsV1Api(api).patch_namespaced_deployment_scale(
                    "model-server", "default", {"spec": {"replicas": 0}}
                )
            )
            # Placed only by the reservation: seen held against the stream of small tasks
            # (RESERVE_AFTER of waiting), the stream still going when it was taken.
            await eventually(big_reserved_a_worker, within=RESERVE_AFTER.total_seconds() + 60)
            sent_when_reserved = len(sent)
            await eventually(succeeded, within=100)
        finally:
            stream_stop.set()
            await streaming
        record = await task_record(client, big.task_id)
        assert record is not None
        assert record.gpu_indices == (0, 1, 2, 3)
        assert len(sent) > sent_when_reserved, "small tasks kept coming while it was reserved"
