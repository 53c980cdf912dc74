"""ReconcilePoolWorkflow on the time-skipping server, its activity mocked by name: the first pass
diffs against nothing and is not a full resync; the result carries the run that holds the
fingerprints and no credentials.
"""

from __future__ import annotations

import uuid

import pytest
from temporalio import activity
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.models import ObservePoolInput, ObservePoolResult, ReconcilePoolInput
from levers9.observation import fingerprints
from workflows.reconcile_pool import ReconcilePoolWorkflow

pytestmark = pytest.mark.integration

SEEN: list[ObservePoolInput] = []


@activity.defn(name="observe_pool")
async def observe_pool_mock(input: ObservePoolInput) -> ObservePoolResult:
    SEEN.append(input)
    return ObservePoolResult(
        fingerprints=fingerprints({}), nodes=4, machines=3, told=3, gone=0, api_calls=3
    )


async def test_first_pass(time_env: WorkflowEnvironment, task_queue: str) -> None:
    workflow_id = f"reconcile:gke-rtx6000-{uuid.uuid4()}"
    async with Worker(
        time_env.client,
        task_queue=task_queue,
        workflows=[ReconcilePoolWorkflow],
        activities=[observe_pool_mock],
    ):
        result = await time_env.client.execute_workflow(
            ReconcilePoolWorkflow.run,
            ReconcilePoolInput(pool_name="gke-rtx6000"),
            id=workflow_id,
            task_queue=task_queue,
        )
    assert result.pass_number == 1
    assert (result.nodes, result.machines, result.told) == (4, 3, 3)
    assert result.run.workflow_id == workflow_id
    [seen] = [s for s in SEEN if s.pool_name == "gke-rtx6000"]
    assert seen.previous is None
    assert seen.full_resync is False
    assert "credentials" not in result.model_dump_json()
