"""A pool moved from the older way (a key in the values) to `levers9 cluster join` without losing
the task that runs on it, as docs/join.md says: join under a new name, let the old pool's task
finish, then `levers9 pool remove` the old pool; the joined pool then gets the cards."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from levers9.records.listing import list_worker_records
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.waiting import eventually

pytestmark = pytest.mark.integration

MOVED = "moved"
WITHIN = 90
SELECTOR = "cloud.google.com/gke-accelerator=nvidia-rtx-pro-6000"
IMAGE = "us-central1-docker.pkg.dev/demo/levers9/worker:latest"


@pytest.fixture(scope="module")
async def cp(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Controlplane]:
    async with reconciling(
        dev_env.client, tmp_path_factory.mktemp("move"), containers=True
    ) as plane:
        await eventually(lambda: workers_available(plane), within=WITHIN)
        yield plane


async def _available(cp: Controlplane, pool: str) -> int:
    records = await list_worker_records(cp.settings, pool, include_ended=False)
    return len([r for r in records if r.state == "available"])


async def test_a_pool_moves_to_join_without_losing_its_running_task(cp: Controlplane) -> None:
    script = "import time; time.sleep(12); print('finished on the old pool')"
    run = await cp.cli(
        "run", "--pool", POOL, "--gpus", "1", "--detach", "--", "python", "-c", script
    )
    assert run.returncode == 0, run.stderr
    task_id = run.stdout.strip()
    join = await cp.cli(
        "cluster", "join", "--name", MOVED, "--gpu-type", "RTXPro6000",
        "--node-selector", SELECTOR, "--worker-image", IMAGE,
        "--gateway", cp.settings.gateway_advertised_address,
    )  # fmt: skip
    assert join.returncode == 0, join.stderr
    kubeconfig = str(cp.sandbox.state.dir / "kubeconfig")
    applied = await asyncio.to_thread(
        subprocess.run,
        ["kubectl", "--kubeconfig", kubeconfig, "apply", "-f", "-"],
        input=join.stdout,
        capture_output=True,
        text=True,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    hub = cp.gateway.clusters if cp.gateway is not None else None
    assert hub is not None

    async def connected() -> bool:
        return hub.connected(MOVED)

    await eventually(connected, within=WITHIN)

    async def machines() -> bool:
        listed = await cp.cli("machine", "list", "--pool", MOVED, "-o", "json")
        return listed.returncode == 0 and len(json.loads(listed.stdout)) == 3

    # Its passes ran (its 3 machines), and the old pool's workers hold every card: no worker.
    await eventually(machines, within=WITHIN)
    assert await _available(cp, MOVED) == 0
    ended = await cp.cli("task", "get", task_id, "-o", "json")
    record = json.loads(ended.stdout)
    assert record["state"] in ("running", "placed"), record

    async def finished() -> bool:
        done = await cp.cli("task", "get", task_id, "-o", "json")
        return bool(json.loads(done.stdout)["state"] == "succeeded")

    await eventually(finished, within=WITHIN)
    logs = await cp.cli("task", "logs", task_id)
    assert "finished on the old pool" in logs.stdout
    removed = await cp.cli("pool", "remove", "--pool", POOL)
    assert removed.returncode == 0, removed.stdout + removed.stderr

    async def moved() -> bool:
        return await _available(cp, MOVED) == 3

    await eventually(moved, within=WITHIN)
    after = await cp.cli("run", "--pool", MOVED, "--gpus", "1", "--", "echo", "on the joined pool")
    assert after.returncode == 0, after.stdout + after.stderr
    assert "on the joined pool" in after.stdout
