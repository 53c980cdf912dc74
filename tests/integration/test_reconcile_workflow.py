"""ReconcilePoolWorkflow on the time-skipping server, its activity mocked by name: a pass
returns what the Temporal worker holds for the pool, and carries no credentials.
"""

from __future__ import annotations

import uuid

import pytest
from temporalio import activity
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.models import DescribePoolInput, PoolSummary, ReconcilePoolInput
from workflows.reconcile_pool import ReconcilePoolWorkflow

pytestmark = pytest.mark.integration


@activity.defn(name="describe_pool")
async def describe_pool_mock(input: DescribePoolInput) -> PoolSummary:
    return PoolSummary(
        pool_name=input.pool_name,
        gpu_type="RTXPro6000",
        flavor="gke",
        endpoint="https://34.118.0.10",
        namespace="levers9",
        node_selector={"cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000"},
        worker_image="us-central1-docker.pkg.dev/demo/levers9/worker:latest",
        tunnel=False,
        host_network=True,
    )


async def test_first_pass(time_env: WorkflowEnvironment, task_queue: str) -> None:
    async with Worker(
        time_env.client,
        task_queue=task_queue,
        workflows=[ReconcilePoolWorkflow],
        activities=[describe_pool_mock],
    ):
        result = await time_env.client.execute_workflow(
            ReconcilePoolWorkflow.run,
            ReconcilePoolInput(pool_name="gke-rtx6000"),
            id=f"reconcile:gke-rtx6000-{uuid.uuid4()}",
            task_queue=task_queue,
        )
    assert result.pass_number == 1
    assert result.pool.pool_name == "gke-rtx6000"
    assert "credentials" not in result.pool.model_dump()
