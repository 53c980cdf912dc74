"""A node deleted between passes ends its machine record even when the next pass is a full
resync (or has no previous pass to diff against): vanished nodes are found against the running
machine records on every pass, not only by the last pass's fingerprints, which such a pass
does not read. Passes are driven by hand here (no schedule), on the sandbox and the dev server.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from activities.kube import KubeObserver
from activities.reconcile import ReconcileActivities
from levers9.models import ObservePoolInput, machine_workflow_id
from tests.controlplane import POOL, controlplane
from tests.waiting import eventually

pytestmark = pytest.mark.integration

NODE_1X = "gke-demo-gpu-1x-5d3a1f2b-x7k9"


async def _machines(client: Client, task_queue: str) -> set[str]:
    query = (
        f"WorkflowType='MachineWorkflow' AND TaskQueue='{task_queue}' AND ExecutionStatus='Running'"
    )
    return {listed.id async for listed in client.list_workflows(query)}


async def test_a_node_deleted_before_a_full_resync_ends_its_machine(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    client = dev_env.client
    task_queue = f"tq-gone-{uuid.uuid4().hex[:8]}"
    address = client.service_client.config.target_host
    async with controlplane(tmp_path, address, task_queue) as plane, plane.worker(client):
        reconcile = ReconcileActivities(KubeObserver(plane.clients), client, plane.settings)
        env = ActivityEnvironment()
        first = await env.run(reconcile.observe_pool, ObservePoolInput(pool_name=POOL))
        machine = machine_workflow_id(POOL, NODE_1X)

        async def listed() -> bool:
            return machine in await _machines(client, task_queue)

        await eventually(listed, within=30)
        await plane.sandbox.cluster.remove_node(NODE_1X)
        resync = await env.run(
            reconcile.observe_pool, ObservePoolInput(pool_name=POOL, full_resync=True)
        )
        assert (first.nodes - resync.nodes, resync.gone) == (1, 1)

        async def ended() -> bool:
            described = await client.get_workflow_handle(machine).describe()
            return described.status == WorkflowExecutionStatus.COMPLETED

        await eventually(ended, within=30)
        # A pass after it finds nothing more gone.
        again = await env.run(
            reconcile.observe_pool, ObservePoolInput(pool_name=POOL, full_resync=True)
        )
        assert again.gone == 0
