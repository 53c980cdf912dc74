"""Where a joined cluster's agent session is held (ClusterSessionWorkflow, read and written as the
gateways do, levers9.gateway.cluster_relay.TemporalClusterRoutes), on the dev server: one route
per replica, the latest first; a stale release (an older session of a replica) changes nothing;
the record ends when no route is left, and the next session starts it again.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.gateway.cluster_relay import TemporalClusterRoutes
from levers9.providers.joined import ClusterRoute, cluster_session_workflow_id
from tests.waiting import eventually
from workflows import RUNNER
from workflows.cluster_session import ClusterSessionWorkflow

pytestmark = pytest.mark.integration


@pytest.fixture
async def routes(dev_env: WorkflowEnvironment) -> AsyncIterator[TemporalClusterRoutes]:
    queue = f"tq-{uuid.uuid4()}"
    async with Worker(
        dev_env.client, task_queue=queue, workflows=[ClusterSessionWorkflow], workflow_runner=RUNNER
    ):
        yield TemporalClusterRoutes(dev_env.client, queue)


def _route(replica: str, session: str) -> ClusterRoute:
    return ClusterRoute(
        task_queue=f"q-replica-{replica}", replica_address=f"{replica}:7443", session_id=session
    )


async def _until(routes: TemporalClusterRoutes, name: str, expected: list[ClusterRoute]) -> None:
    async def recorded() -> bool:
        return await routes.routes(name) == expected

    await eventually(recorded, within=10)


async def test_routes_latest_first_one_per_replica(routes: TemporalClusterRoutes) -> None:
    name = f"c{uuid.uuid4().hex[:8]}"
    assert await routes.routes(name) == []
    a1, b1, a2 = _route("a", "s1"), _route("b", "s2"), _route("a", "s3")
    await routes.held(name, a1)
    assert await routes.routes(name) == [a1], "readable at once (the start's memo)"
    await routes.held(name, b1)
    await _until(routes, name, [b1, a1])
    await routes.held(name, a2)  # replica a took a new session: its old route goes
    await _until(routes, name, [a2, b1])
    await routes.released(name, a1)  # a late release of a's old session
    await routes.released(name, b1)
    await _until(routes, name, [a2])


async def test_the_record_ends_with_its_last_route_and_starts_again(
    routes: TemporalClusterRoutes, dev_env: WorkflowEnvironment
) -> None:
    name = f"c{uuid.uuid4().hex[:8]}"
    first, second = _route("a", "s1"), _route("b", "s2")
    await routes.held(name, first)
    await routes.released(name, first)
    handle = dev_env.client.get_workflow_handle(cluster_session_workflow_id(name))
    await handle.result()
    assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED
    assert await routes.routes(name) == []
    await routes.released(name, first)  # nothing runs: nothing to do
    await routes.held(name, second)
    assert await routes.routes(name) == [second]
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
