"""Day two on the sandbox, driven by the CLI: `levers9 image recopy` copies `latest` into the
project's registry and restarts every worker at once (the old records end `stopped` with the
reason, fresh workers are available within a reconcile or two, not after the record TTL);
`levers9 pool remove --delete-namespace` leaves no schedule, no running record, no worker Job
and no namespace, and a node event afterwards (acted on by the pool cache's trigger) brings none
back.

The tests of this module share one controlplane and run in order.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from levers9.models import MACHINE_WORKFLOW, RECONCILE_POOL_WORKFLOW, WorkerRecord
from levers9.records.listing import list_machine_records, list_worker_records
from levers9.temporal import list_reconcile_schedules
from sandbox import aws, registries, worker_image
from tests.controlplane import POOL, Controlplane, environment, reconciling, workers_available
from tests.waiting import eventually

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
WITHIN = 60
GAR_HOST = "us-central1-docker.pkg.dev"


@pytest.fixture(scope="module")
async def cp(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Controlplane]:
    directory = tmp_path_factory.mktemp("pool-ops")
    with (
        registries.LocalRegistry(directory / "ecr") as ecr,
        registries.LocalRegistry(directory / "gar") as gar,
        aws.LocalMoto(directory / "moto.log") as moto,
    ):
        image = await asyncio.to_thread(worker_image.build, directory / "image")
        await asyncio.to_thread(worker_image.push, image, ecr.address)
        await asyncio.to_thread(aws.seed, moto.endpoint)
        settings: dict[str, Any] = {
            "sourceImage": f"{ecr.address}/levers9/worker:latest",
            "registryMirrors": f"{GAR_HOST}={gar.address}",
            "insecureRegistries": f"{ecr.address},{gar.address}",
        }
        key = directory / "sandbox" / "operator-key.json"
        with environment(
            {**aws.client_env(moto.endpoint), "GOOGLE_APPLICATION_CREDENTIALS": str(key)}
        ):
            async with reconciling(dev_env.client, directory, None, False, **settings) as plane:
                plane.gar = gar  # type: ignore[attr-defined]

                await eventually(lambda: workers_available(plane), within=WITHIN)
                yield plane


async def _settled(dev_env: WorkflowEnvironment, cp: Controlplane, before: datetime) -> bool:
    """No pass nor machine of this controlplane runs, and passes ran here before the removal."""
    queue = f"TaskQueue='{cp.settings.task_queue}'"
    types = f"(WorkflowType='{RECONCILE_POOL_WORKFLOW}' OR WorkflowType='{MACHINE_WORKFLOW}')"
    running = f"{queue} AND {types} AND ExecutionStatus='Running'"
    ran = (
        f"{queue} AND WorkflowType='{RECONCILE_POOL_WORKFLOW}'"
        f" AND ExecutionStatus='Completed' AND StartTime < '{before.isoformat()}'"
    )
    client = dev_env.client
    return not [w async for w in client.list_workflows(running)] and bool(
        [w async for w in client.list_workflows(ran)]
    )


async def _workers(cp: Controlplane, include_ended: bool = False) -> list[WorkerRecord]:
    return await list_worker_records(cp.settings, POOL, include_ended=include_ended)


async def test_recopy_copies_latest_and_restarts_every_worker_at_once(cp: Controlplane) -> None:
    old = {r.worker_id for r in await _workers(cp)}
    assert len(old) == 3
    done = await cp.cli("image", "recopy", "--pool", POOL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"copied for pool {POOL}" in done.stdout
    gar = cp.gar  # type: ignore[attr-defined]
    project = cp.pool.kubernetes.worker_image.split("/")[1]
    digest = await asyncio.to_thread(
        registries.manifest_digest, gar.address, f"{project}/levers9/worker", "latest"
    )
    assert digest is not None
    assert digest in done.stdout
    for worker_id in old:
        assert worker_id in done.stdout

    ended = {r.worker_id: r for r in await _workers(cp, include_ended=True) if r.worker_id in old}
    assert {r.state for r in ended.values()} == {"stopped"}
    assert {r.reason for r in ended.values()} == {"image recopied"}
    jobs = {j["metadata"]["name"] for j in await cp.worker_jobs()}
    assert not any(worker_id in name for name in jobs for worker_id in old)

    async def fresh() -> bool:
        records = await _workers(cp)
        ids = {r.worker_id for r in records}
        return len(records) == 3 and not ids & old and all(r.state == "available" for r in records)

    # Within reconciles (every second here), not after the ten-minute record TTL.
    await eventually(fresh, within=WITHIN)


async def test_pool_remove_leaves_nothing_running(
    dev_env: WorkflowEnvironment, cp: Controlplane
) -> None:
    before = datetime.now(UTC)
    done = await cp.cli("pool", "remove", "--pool", POOL, "--delete-namespace")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"pool {POOL} removed: schedule deleted, 3 worker records ended" in done.stdout
    assert "namespace deleted" in done.stdout
    assert await list_reconcile_schedules(cp.settings) == []
    assert await _workers(cp) == []
    assert await list_machine_records(cp.settings, POOL) == []
    assert await cp.worker_jobs() == []
    namespaces = await cp.kubectl("get", "namespaces", "-o", "name")
    assert "namespace/levers9" not in namespaces.split()
    # Nothing comes back: no schedule, so no reconcile creates workers again. What could have
    # (a pass, or a machine, still running when the removal began) has ended by now.
    await eventually(lambda: _settled(dev_env, cp, before), within=WITHIN)
    # A node event, which would start a pass of a pool still here, reaches the pool cache's
    # trigger: it acts on it (its trigger finds no schedule), and still nothing comes back.
    assert cp.caches is not None
    trigger = cp.caches.triggers[POOL]
    taken = trigger.changes_taken
    node = next(spec.name for spec in cp.sandbox.cluster.node_specs() if spec.gpus.count)
    await cp.sandbox.cluster.set_node_ready(node, False)

    async def acted_on() -> bool:
        return trigger.changes_taken > taken

    await eventually(acted_on, within=WITHIN)
    await eventually(lambda: _settled(dev_env, cp, before), within=WITHIN)
    assert await list_reconcile_schedules(cp.settings) == []
    assert await _workers(cp) == []
    assert await list_machine_records(cp.settings, POOL) == []
    assert await cp.worker_jobs() == []
