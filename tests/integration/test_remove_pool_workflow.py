"""RemovePoolWorkflow when the pool's block has left the values (the controlplane restarted
without it): the schedule is deleted and the records ended, the cluster is out of reach (no
credentials), and the result says to delete the namespace there. Activities mocked by name,
on the time-skipping server (its settle rounds pass in no time)."""

from __future__ import annotations

import uuid

import pytest
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.pools import PoolRecords
from levers9.providers.gke import RemovePoolInput, RemovePoolResult
from workflows.pool_ops import RemovePoolWorkflow

pytestmark = pytest.mark.integration


async def test_a_pool_gone_from_the_values_is_ended_and_the_namespace_left_to_the_user(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    listings = [
        PoolRecords(workers=["w1"], machines=["node-a"]),
        PoolRecords(workers=[], machines=[]),
    ]
    calls: list[str] = []

    @activity.defn(name="delete_reconcile_schedule")
    async def delete_reconcile_schedule(pool_name: str) -> bool:
        calls.append("schedule")
        return True

    @activity.defn(name="pool_records")
    async def pool_records(pool_name: str) -> PoolRecords:
        calls.append("records")
        return listings.pop(0) if listings else PoolRecords(workers=[], machines=[])

    @activity.defn(name="delete_pool_jobs")
    async def delete_pool_jobs(pool_name: str) -> list[str]:
        calls.append("jobs")
        raise ApplicationError("pool p is not loaded", type="PoolNotLoaded", non_retryable=True)

    async with Worker(
        time_env.client,
        task_queue=task_queue,
        workflows=[RemovePoolWorkflow],
        activities=[delete_reconcile_schedule, pool_records, delete_pool_jobs],
    ):
        result: RemovePoolResult = await time_env.client.execute_workflow(
            RemovePoolWorkflow.run,
            RemovePoolInput(pool_name="p", delete_namespace=True),
            id=f"remove:p-{uuid.uuid4().hex[:6]}",
            task_queue=task_queue,
        )
    assert result.schedule_deleted
    assert result.machines_ended == ["node-a"]
    assert result.jobs_deleted == 0
    assert not result.namespace_deleted  # out of reach: never attempted
    assert "kubectl delete namespace levers9" in result.note
    # Schedule first (nothing new starts), then listed until nothing runs; the cluster is
    # tried once only.
    assert calls == ["schedule", "records", "jobs", "records"]
