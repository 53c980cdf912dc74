"""A joined cluster's record (ClusterWorkflow) as the CLI and a starting controlplane read it
(levers9.records.clusters, from the memo alone), on the dev server: the agent's exchange shows
at once, and still after the record continues as new (a continued run starts with its first
run's start memo unless it is handed the record).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.models import CLUSTER_WORKFLOW, ClusterInput
from levers9.providers.joined import ClusterState, JoinedCluster, cluster_workflow_id
from levers9.records.clusters import cluster_state
from levers9.tokens import join_digest
from tests.waiting import eventually
from workflows import RUNNER
from workflows.cluster import ClusterWorkflow

pytestmark = pytest.mark.integration

TOKEN = "join-token-of-the-test"


@pytest.fixture
async def client(dev_env: WorkflowEnvironment) -> AsyncIterator[tuple[Client, str]]:
    queue = f"tq-{uuid.uuid4()}"
    async with Worker(
        dev_env.client, task_queue=queue, workflows=[ClusterWorkflow], workflow_runner=RUNNER
    ):
        yield dev_env.client, queue


async def _joined(client: Client, queue: str, name: str) -> WorkflowHandle[Any, ClusterState]:
    """Started as levers9.records.clusters.start_join starts it, with a short history cap."""
    state = ClusterState(
        spec=JoinedCluster(name=name, gpu_type="RTXPro6000", worker_image="img"),
        join_digest=join_digest(TOKEN),
        expires_at=datetime.now(UTC) + timedelta(hours=1),
    )
    return await client.start_workflow(
        CLUSTER_WORKFLOW,
        ClusterInput(state=state, max_history_events=20),
        id=cluster_workflow_id(name),
        task_queue=queue,
        memo={"record": state.model_dump(mode="json")},
        result_type=ClusterState,
    )


async def test_the_exchange_stays_in_the_record_across_continue_as_new(
    client: tuple[Client, str],
) -> None:
    temporal, queue = client
    name = f"c{uuid.uuid4().hex[:8]}"
    await _joined(temporal, queue, name)
    latest = temporal.get_workflow_handle(cluster_workflow_id(name))
    assert await latest.execute_update(ClusterWorkflow.exchange, join_digest(TOKEN)) == ""
    state = await cluster_state(temporal, name)
    assert state is not None
    assert state.joined_at is not None
    first_run = (await latest.describe()).run_id
    # Refused exchanges change nothing but the history's length, past its cap of 20.
    for _ in range(20):
        refusal = await latest.execute_update(ClusterWorkflow.exchange, join_digest("another"))
        assert "is not the one of cluster" in refusal
        if (await latest.describe()).run_id != first_run:
            break
    assert (await latest.describe()).run_id != first_run, "it continued as new"

    async def continued_with_the_record() -> bool:
        again = await cluster_state(temporal, name)
        return again is not None and again.joined_at == state.joined_at

    await eventually(continued_with_the_record, within=10, what="the continued run's memo")
    await latest.signal(ClusterWorkflow.leave)
