"""A multi-card task on the sandbox, as the spec's sharing section says: a 4-card task waits for
one worker with 4 cards free at once; when the model server scales to 0, the 2-card worker on the
4-GPU node winds down after its idle minutes (seconds here), the next worker takes all 4 cards,
and the task runs there.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes import client as k8s
from temporalio.testing import WorkflowEnvironment

from levers9.models import TaskInput
from levers9.tasks_client import start_task, task_record
from levers9.temporal import connect
from tests.controlplane import POOL, Controlplane, reconciling
from tests.waiting import eventually

pytestmark = pytest.mark.integration

NODE_4X = "gke-sandbox-gpu-4x-2f7c9e1a-m5p2"


@pytest.fixture
async def cp(dev_env: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Controlplane]:
    async with reconciling(dev_env.client, tmp_path, workerIdleMinutes=0.1) as plane:
        yield plane


async def test_four_card_task_waits_for_one_worker_with_four(cp: Controlplane) -> None:
    task = TaskInput(task_id=uuid.uuid4().hex[:12], pool_name=POOL, command=("true",), gpus=4)
    await start_task(await connect(cp.settings), cp.settings, task)

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
