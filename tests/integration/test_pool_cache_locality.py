"""PoolWorkflow on the dev server with cache locality: two one-card workers, the second ("w2")
reporting that its node holds the image. A task of the image (signal `request`, as records ask)
goes to w2, though w1 wins the tie without it; a task of another image goes by the tie-break
(w1); a worker announced again with what its cache holds now is placed on by that; and the
reports are carried across continue-as-new.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.core.placement import Placement, PoolState, image_key
from levers9.models import (
    PlaceRequest,
    PoolInput,
    WorkerSlotInput,
    pool_workflow_id,
    task_workflow_id,
)
from tests.integration.test_pool_workflow import TaskStandIn
from workflows.pool import PoolWorkflow

pytestmark = pytest.mark.integration

POOL = "cache"
TRAIN = "registry.example.com/ml/train:v1"


def _slot(worker_id: str, *images: str) -> WorkerSlotInput:
    return WorkerSlotInput(
        worker_id=worker_id,
        node_name=f"node-{worker_id}",
        address="127.0.20.1:40000",
        devices=(0,),
        node_gpus=1,
        images=tuple(image_key(i) for i in images),
    )


async def _placed(
    client: Client, pool: WorkflowHandle[PoolWorkflow, None], task_queue: str, image: str
) -> Placement:
    """A task of `image` asks by signal and is told its placement; its cards given back."""
    task_id = uuid.uuid4().hex[:12]
    record = await client.start_workflow(
        TaskStandIn.run, id=task_workflow_id(task_id), task_queue=task_queue
    )
    request = PlaceRequest(pool_name=POOL, task_id=task_id, gpus=1, image=image)
    await pool.signal(PoolWorkflow.request, request)
    placement = await asyncio.wait_for(record.result(), timeout=30)
    await pool.signal(PoolWorkflow.release, task_id)
    return placement


async def test_a_task_goes_to_the_worker_that_holds_its_image(
    dev_env: WorkflowEnvironment, task_queue: str
) -> None:
    client = dev_env.client
    pool_id = f"{pool_workflow_id(POOL)}-{uuid.uuid4().hex[:8]}"
    async with Worker(client, task_queue=task_queue, workflows=[PoolWorkflow, TaskStandIn]):
        pool = await client.start_workflow(
            PoolWorkflow.run,
            PoolInput(pool_name=POOL, max_history_events=40),
            id=pool_id,
            task_queue=task_queue,
        )
        await pool.signal(PoolWorkflow.worker_available, _slot("w1"))
        await pool.signal(PoolWorkflow.worker_available, _slot("w2", TRAIN))
        # Placements happen, and the tie-break (w1) holds for what no worker holds.
        assert (await _placed(client, pool, task_queue, "other/image:1")).worker_id == "w1"
        assert (await _placed(client, pool, task_queue, "")).worker_id == "w1"
        for _ in range(3):
            assert (await _placed(client, pool, task_queue, TRAIN)).worker_id == "w2"
        # w2's node evicted it and w1's pulled it: announced again, placement follows.
        await pool.signal(PoolWorkflow.worker_available, _slot("w2"))
        await pool.signal(PoolWorkflow.worker_available, _slot("w1", TRAIN))
        assert (await _placed(client, pool, task_queue, TRAIN)).worker_id == "w1"
        await pool.signal(PoolWorkflow.worker_available, _slot("w1"))
        await pool.signal(PoolWorkflow.worker_available, _slot("w2", TRAIN))
        # Past its history cap it continues as new: the reports go with its state.
        for _ in range(6):
            assert (await _placed(client, pool, task_queue, TRAIN)).worker_id == "w2"
        runs = [e.run_id async for e in client.list_workflows(f"WorkflowId = '{pool_id}'")]
        assert len(runs) > 1, "it continued as new"
        state: PoolState = await client.get_workflow_handle(pool_id).query(PoolWorkflow.state)
        assert state.slots["w2"].images == (image_key(TRAIN),)
        assert (await _placed(client, pool, task_queue, TRAIN)).worker_id == "w2"
        await client.get_workflow_handle(pool_id).terminate("test done")
