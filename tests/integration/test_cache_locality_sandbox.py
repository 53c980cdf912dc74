"""Cache locality on the sandbox with real agents and their image caches: a two-card task pulls an
image on a two-card machine; with the pool's `cache.enabled` that machine's heartbeats report it
and the next one-card task of the image goes there, not to the one-card machine that fits it
more tightly; with it off, the agents report nothing and the next task goes by the tightest fit
(the one-card machine) though the image sits in the other machine's cache.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from levers9.core.placement import PoolState, image_key
from levers9.devstack import values as devvalues
from levers9.models import TaskInput, TaskRecord, pool_workflow_id
from levers9.records.tasks import start_task, task_record
from levers9.temporal import connect
from sandbox import worker_image
from tests.controlplane import (
    POOL,
    WORKER_IMAGE_HOST,
    Controlplane,
    reconciling,
    workers_available,
)
from tests.waiting import eventually
from workflows.pool import PoolWorkflow

pytestmark = pytest.mark.integration

WITHIN = 90
NODE_1X = "gke-demo-gpu-1x-5d3a1f2b-x7k9"
IMAGE = f"{WORKER_IMAGE_HOST}/{devvalues.PROJECT}/{worker_image.REPOSITORY}:{worker_image.TAG}"


async def _run(cp: Controlplane, client: Client, gpus: int) -> TaskRecord:
    """A task of IMAGE, run to its end; its record."""
    task = TaskInput(
        task_id=uuid.uuid4().hex[:12], pool_name=POOL, command=("true",), gpus=gpus, image=IMAGE
    )
    await start_task(client, cp.settings.task_queue, task)

    async def ended() -> bool:
        record = await task_record(client, task.task_id)
        return record is not None and record.state in ("succeeded", "failed", "cancelled")

    await eventually(ended, within=WITHIN)
    record = await task_record(client, task.task_id)
    assert record is not None
    assert record.state == "succeeded", record.reason
    return record


async def _pool(client: Client) -> PoolState:
    handle = client.get_workflow_handle(pool_workflow_id(POOL))
    state: PoolState = await handle.query(PoolWorkflow.state)
    return state


@pytest.mark.parametrize("cache", [True, False], ids=["cache-on", "cache-off"])
async def test_the_next_task_of_an_image_goes_where_it_is_cached(
    dev_env: WorkflowEnvironment, tmp_path: Path, cache: bool
) -> None:
    async with reconciling(
        dev_env.client, tmp_path, containers=True, pool_settings={"cache": {"enabled": cache}}
    ) as cp:
        await eventually(lambda: workers_available(cp), within=WITHIN)
        client = await connect(cp.settings)
        first = await _run(cp, client, gpus=2)  # the 2x machine or the 4x (2 of its cards)
        assert first.node_name not in (None, NODE_1X)
        assert first.image_digest, "it ran in a container of the image, pulled into its cache"
        holder = first.worker_id
        assert holder is not None

        if cache:

            async def reported() -> bool:
                slot = (await _pool(client)).slots.get(holder)
                return slot is not None and image_key(IMAGE) in slot.images

            await eventually(reported, within=WITHIN)  # its next heartbeat says so
        second = await _run(cp, client, gpus=1)
        if cache:
            assert (second.worker_id, second.node_name) == (holder, first.node_name)
        else:
            # Placed by the tightest fit, as ever: the one-card machine, which never pulled it.
            assert second.node_name == NODE_1X
            assert all(slot.images == () for slot in (await _pool(client)).slots.values())
