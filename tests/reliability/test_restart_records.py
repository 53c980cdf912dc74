"""kill -9 of the controlplane (one replica) with every kind of live state present: a joined
cluster with a task running on it, running and queued tasks, an endpoint with a replica, a paused
pool (tests/reliability/restart_state.py makes them). It starts again (the same process, as
Kubernetes restarts a crashed pod), and each comes back and keeps working: the start needs no
workflow to answer (the joined cluster is read from its record's memo, not by a query only a
polling Temporal worker could answer).

Then: `cluster join` under the name of a pool of the values is refused, naming it, and records
nothing; a join recorded under such a name before that refusal existed is left without taking
the values' pool (its schedule, workers and namespace stay, no removal starts).

Its tasks run as processes of the agents (world(process_tasks=True), the sandbox's knob no pool
value can express): its point is records that survive a restart (restart_state.py counts runs in
host files), not the container a task runs in (tests/integration/test_tasks_sandbox.py runs tasks
as a user does, in containers).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from levers9.models import CLUSTER_WORKFLOW, ClusterInput, reconcile_schedule_id
from levers9.providers.gke import remove_pool_workflow_id
from levers9.providers.joined import ClusterState, JoinedCluster, cluster_workflow_id
from levers9.temporal import list_reconcile_schedules
from tests.controlplane import POOL
from tests.reliability.restart_state import IMAGE, available, came_back, cli, made
from tests.reliability.world import World, settled, world
from tests.waiting import eventually

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def plane(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    async with world(tmp_path_factory.mktemp("restart-records"), process_tasks=True) as started:
        await settled(started)
        yield started


async def test_every_kind_of_record_comes_back_after_kill9(plane: World) -> None:
    before = await made(plane)
    plane.controlplane.kill9()
    plane.controlplane.start()
    await plane.controlplane_ready()
    assert plane.controlplane.alive(), plane.controlplane.log.read_text()[-3000:]
    await came_back(plane, before)
    log = plane.controlplane.log.read_text().split("--- start 2 ---")[1]
    assert "temporal worker started" in log, log[-3000:]
    assert plane.controlplane.alive(), "it stayed up"
    loaded = [line for line in log.splitlines() if "loaded controller" in line]
    assert any("pool_name=joined" in line for line in loaded), loaded


async def _passes(plane: World, pool: str) -> int:
    rows = await list_reconcile_schedules(plane.settings)
    return next(row.passes for row in rows if row.pool == pool)


async def test_a_join_never_takes_a_pool_of_the_values(plane: World) -> None:
    assert plane.client is not None
    client = plane.client
    refused = await cli(
        plane, "cluster", "join", "--name", POOL, "--gpu-type", "RTXPro6000",
        "--worker-image", IMAGE,
    )  # fmt: skip
    assert refused.returncode == 1, refused.stdout
    assert f"pool {POOL} is defined by the controlplane's values" in refused.stderr
    assert "join under another --name" in refused.stderr
    with pytest.raises(RPCError) as missing:
        await client.get_workflow_handle(cluster_workflow_id(POOL)).describe()
    assert missing.value.status == RPCStatusCode.NOT_FOUND, "nothing recorded"

    # A join recorded before the refusal existed (as start_join records one, past the refusal),
    # then left: its record ends, and the values' pool keeps its schedule, workers and namespace.
    spec = JoinedCluster(name=POOL, gpu_type="RTXPro6000", worker_image=IMAGE)
    state = ClusterState(
        spec=spec, join_digest="0" * 64, expires_at=datetime.now(UTC) + timedelta(hours=1)
    )
    await client.start_workflow(
        CLUSTER_WORKFLOW,
        ClusterInput(state=state),
        id=cluster_workflow_id(POOL),
        task_queue=plane.settings.task_queue,
        memo={"record": state.model_dump(mode="json")},
    )
    listed = await cli(plane, "cluster", "list", "-o", "json")
    assert POOL in [row["spec"]["name"] for row in json.loads(listed.stdout)], listed.stderr
    await client.get_schedule_handle(reconcile_schedule_id(POOL)).unpause()
    workers = sorted(await available(plane, POOL))
    assert len(workers) == 3
    left = await cli(plane, "cluster", "leave", POOL)
    assert left.returncode == 0, left.stderr
    assert f"pool {POOL} is the values' (not the join's)" in left.stdout
    assert "delete namespace" not in left.stdout
    assert "kubectl delete -n levers9 deployment levers9-agent" in left.stdout
    passes = await _passes(plane, POOL)

    async def passed() -> bool:
        return await _passes(plane, POOL) >= passes + 2

    await eventually(passed, within=60)
    assert sorted(await available(plane, POOL)) == workers, "the values' workers kept"
    description = await client.get_workflow_handle(cluster_workflow_id(POOL)).describe()
    assert description.status == WorkflowExecutionStatus.COMPLETED
    with pytest.raises(RPCError) as removal:
        await client.get_workflow_handle(remove_pool_workflow_id(POOL)).describe()
    assert removal.value.status == RPCStatusCode.NOT_FOUND, "no removal of the values' pool"
