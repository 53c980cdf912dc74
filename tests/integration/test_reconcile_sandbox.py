"""Reconcile end to end on the sandbox, as the spec's "Sharing nodes with other workloads" says:
within two passes each GPU node has exactly one worker Job taking every free card (1, 2 and 2:
the model server holds two of the 4-GPU node's cards), the CPU-only node is not a machine; the
model server scaled to 0 shows its freed cards within a pass and no second worker is added while
the first is pending; cordon makes a node not a machine, uncordon brings it back; a node added
becomes a machine with a worker; workers go pending -> available as their agents register
through the gateway (with the cards the kubelet assigned and the node's external IP); a 403
stops reconcile with the actionable line and leaves the records alone, and the next pass
repairs once cleared; two passes at once never add two workers.

The tests of this module share one sandbox and one controlplane and run in order.
"""

from __future__ import annotations

import asyncio
import io
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.testing import WorkflowEnvironment

from levers9 import logs
from levers9.contract import GPU
from levers9.core.capacity import NODE_LABEL
from levers9.models import MachineRecord, ReconcilePoolInput, WorkerRecord
from levers9.records.listing import list_machine_records, list_worker_records
from tests.controlplane import POOL, Controlplane, passes_completed, reconciling
from tests.factories import add_gpu_node
from tests.waiting import eventually
from workflows.reconcile_pool import ReconcilePoolWorkflow

pytestmark = pytest.mark.integration

NODE_1X = "gke-demo-gpu-1x-5d3a1f2b-x7k9"
NODE_2X = "gke-demo-gpu-2x-8e4b2c6d-q3n8"
NODE_4X = "gke-demo-gpu-4x-2f7c9e1a-m5p2"
CPU_NODE = "gke-demo-default-pool-9b1d4e7f-w2c6"
WITHIN = 30


@pytest.fixture(scope="module")
async def cp(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Controlplane]:
    async with reconciling(dev_env.client, tmp_path_factory.mktemp("reconcile")) as plane:
        yield plane


@pytest.fixture
def log_lines() -> io.StringIO:
    stream = io.StringIO()
    logs.setup("INFO", stream)
    return stream


def _cards_by_node(jobs: list[dict[str, Any]]) -> dict[str, list[int]]:
    cards: dict[str, list[int]] = {}
    for job in jobs:
        node = job["metadata"]["labels"][NODE_LABEL]
        limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        cards.setdefault(node, []).append(int(limits[GPU]))
    return cards


async def _cordon(cp: Controlplane, node: str, patch: dict[str, Any]) -> None:
    """`kubectl cordon|uncordon`, as the admin (the pool's key may not change nodes)."""
    await cp.admin(lambda api: k8s.CoreV1Api(api).patch_node(node, patch))


def _unable_lines(log_lines: io.StringIO) -> int:
    return log_lines.getvalue().count("unable to reconcile cluster nodes pool_name=gke-rtx6000")


async def _records(cp: Controlplane) -> dict[str, MachineRecord]:
    return {r.node_name: r for r in await list_machine_records(cp.settings, POOL)}


async def test_one_worker_per_machine_taking_every_free_card(cp: Controlplane) -> None:
    async def three_jobs() -> bool:
        return len(await cp.worker_jobs()) == 3

    await eventually(three_jobs, within=WITHIN)
    assert _cards_by_node(await cp.worker_jobs()) == {NODE_1X: [1], NODE_2X: [2], NODE_4X: [2]}

    async def three_records() -> bool:
        return len(await _records(cp)) == 3

    await eventually(three_records, within=WITHIN)
    records = await _records(cp)
    assert CPU_NODE not in records, "the CPU-only node does not match the pool's selector"
    assert all(record.machine for record in records.values())
    assert records[NODE_4X].total_gpus == 4


async def test_workers_go_pending_to_available(
    dev_env: WorkflowEnvironment, cp: Controlplane
) -> None:
    async def three_available() -> bool:
        records = await list_worker_records(cp.settings, POOL, include_ended=False)
        return [r.state for r in records] == ["available"] * 3

    await eventually(three_available, within=WITHIN)
    records = await list_worker_records(cp.settings, POOL, include_ended=False)
    by_node = {r.node_name: r for r in records}
    assert by_node[NODE_4X].visible_devices == (2, 3), "the model server holds cards 0 and 1"
    assert (by_node[NODE_2X].address or "").startswith("127.0.20.2:"), "the node's external IP"
    query = (
        f"WorkflowType='WorkerWorkflow' AND PoolName='{POOL}' AND WorkerState='available'"
        f" AND ExecutionStatus='Running' AND TaskQueue='{cp.settings.task_queue}'"
    )

    async def searchable() -> bool:
        return len([w async for w in dev_env.client.list_workflows(query)]) == 3

    await eventually(searchable, within=WITHIN)


async def test_scaled_down_neighbour_frees_cards_without_a_second_worker(
    dev_env: WorkflowEnvironment, cp: Controlplane
) -> None:
    await cp.admin(
        lambda api: k8s.AppsV1Api(api).patch_namespaced_deployment_scale(
            "model-server", "default", {"spec": {"replicas": 0}}
        )
    )

    async def freed() -> bool:
        record = (await _records(cp)).get(NODE_4X)
        return record is not None and record.free_gpus == 2 and record.free_cpu_millis > 180_000

    await eventually(freed, within=WITHIN)
    # Passes that saw the freed cards, each of which could have added a second worker.
    await passes_completed(dev_env.client, cp, datetime.now(UTC), count=3)
    assert _cards_by_node(await cp.worker_jobs())[NODE_4X] == [2], (
        "the 2-card worker keeps its cards"
    )


async def test_cordon_and_uncordon(cp: Controlplane) -> None:
    await _cordon(cp, NODE_2X, {"spec": {"unschedulable": True}})

    async def cordoned() -> bool:
        record = (await _records(cp)).get(NODE_2X)
        return record is not None and record.status == "Cordoned" and not record.machine

    await eventually(cordoned, within=WITHIN)
    await _cordon(cp, NODE_2X, {"spec": {"unschedulable": False}})

    async def healthy() -> bool:
        record = (await _records(cp)).get(NODE_2X)
        return record is not None and record.status == "Healthy"

    await eventually(healthy, within=WITHIN)


async def test_added_node_becomes_a_machine(cp: Controlplane) -> None:
    await add_gpu_node(cp.sandbox.cluster, "gke-demo-gpu-extra-1", 2, "127.0.11.1", "127.0.21.1")

    async def worker_added() -> bool:
        return _cards_by_node(await cp.worker_jobs()).get("gke-demo-gpu-extra-1") == [2]

    await eventually(worker_added, within=WITHIN)


async def test_removed_node_ends_its_machine_and_worker(cp: Controlplane) -> None:
    """Follows the added node: gone from the cluster, its machine ends and stops its worker
    (the record ends `stopped`, not `available` until its TTL)."""
    node = "gke-demo-gpu-extra-1"

    async def its_worker() -> list[WorkerRecord]:
        records = await list_worker_records(cp.settings, POOL, include_ended=False)
        return [r for r in records if r.node_name == node]

    async def listed() -> bool:  # visibility lags the Job the previous test saw
        return len(await its_worker()) == 1

    await eventually(listed, within=WITHIN)
    [record] = await its_worker()
    await cp.sandbox.cluster.remove_node(node)

    async def ended() -> bool:
        records = await list_worker_records(cp.settings, POOL, include_ended=True)
        mine = [r for r in records if r.worker_id == record.worker_id]
        return bool(mine) and mine[0].state == "stopped"

    async def machine_ended() -> bool:
        return node not in await _records(cp)

    # The machine (told by reconcile) or the worker (its Job failed by pod GC) may see it first:
    # either way the record says why.
    await eventually(ended, within=WITHIN)
    await eventually(machine_ended, within=WITHIN)
    records = await list_worker_records(cp.settings, POOL, include_ended=True)
    [stopped] = [r for r in records if r.worker_id == record.worker_id]
    assert stopped.reason == f"its node {node} is gone"


async def test_403_stops_reconcile_with_the_fix_and_repairs(
    cp: Controlplane, log_lines: io.StringIO
) -> None:
    before = await _records(cp)
    cp.sandbox.sandbox.policy.update({"egressIp": "127.0.0.9"})
    try:

        async def reported() -> bool:
            return "unable to reconcile cluster nodes pool_name=gke-rtx6000" in log_lines.getvalue()

        await eventually(reported, within=WITHIN)
        line = next(ln for ln in log_lines.getvalue().splitlines() if "unable to reconcile" in ln)
        assert 'error="403 Forbidden' in line
        assert "rerun deploy/gke/attach-gke-pool.sh" in line
        # A change the controlplane cannot see while it gets 403s: a pass tried after it (its
        # 403 logged again) and left the record as it was.
        await _cordon(cp, NODE_1X, {"spec": {"unschedulable": True}})
        seen = _unable_lines(log_lines)

        async def tried_again() -> bool:
            return _unable_lines(log_lines) > seen

        await eventually(tried_again, within=WITHIN)
        assert (await _records(cp))[NODE_1X].status == before[NODE_1X].status
    finally:
        cp.sandbox.sandbox.policy.update({"egressIp": "127.0.0.1"})

    async def repaired() -> bool:
        return (await _records(cp))[NODE_1X].status == "Cordoned"

    await eventually(repaired, within=WITHIN)
    await _cordon(cp, NODE_1X, {"spec": {"unschedulable": False}})


async def test_two_passes_at_once_add_one_worker(
    dev_env: WorkflowEnvironment, cp: Controlplane
) -> None:
    await add_gpu_node(cp.sandbox.cluster, "gke-demo-gpu-race-1", 1, "127.0.11.2", "127.0.21.2")
    await asyncio.gather(
        *(
            dev_env.client.execute_workflow(
                ReconcilePoolWorkflow.run,
                ReconcilePoolInput(pool_name=POOL),
                id=f"reconcile:{POOL}-race-{i}-{uuid.uuid4()}",
                task_queue=cp.settings.task_queue,
            )
            for i in range(2)
        )
    )

    async def worker_added() -> bool:
        return "gke-demo-gpu-race-1" in _cards_by_node(await cp.worker_jobs())

    await eventually(worker_added, within=WITHIN)
    # Scheduled passes after both racing ones: none of them adds a second worker either.
    await passes_completed(dev_env.client, cp, datetime.now(UTC), count=2)
    assert _cards_by_node(await cp.worker_jobs())["gke-demo-gpu-race-1"] == [1]
