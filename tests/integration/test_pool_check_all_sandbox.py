"""`levers9 pool check --pool P --all` through the CLI, on the sandbox's pool with containers and
the dev pool's runtimes (runc, the default, and runsc, whose boxes checkpoint), as the dev stack
runs it: five lines (the GPU check, a GPU endpoint's cold start and request, a box's port through
its URL, a counting runsc box stopped and started going on from its count, a task on all the
cards a machine offers), each ok with its time, exit 0; nothing the checks made is left (no
endpoint, no box, no task of theirs running). `--all` on a pool that does not exist names it and
the pools there are.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from levers9.cli.pool_checks import NAMES
from levers9.temporal import sync_reconcile_schedules
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.waiting import eventually

pytestmark = pytest.mark.integration

WITHIN = 90


@pytest.fixture(scope="module")
async def cp(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Controlplane]:
    runtimes = {"runtimes": ["runc", "runsc"]}  # as the dev pool offers them
    async with reconciling(
        dev_env.client, tmp_path_factory.mktemp("check"), pool_settings=runtimes, containers=True
    ) as plane:
        await sync_reconcile_schedules(
            dev_env.client,
            [POOL],
            plane.settings,
            simulated_gpus=[POOL] if plane.pool.simulated_gpus else [],
            runtimes={POOL: plane.pool.offered_runtimes},
        )
        await eventually(lambda: workers_available(plane), within=WITHIN)
        yield plane


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def test_all_prints_five_ok_lines_and_leaves_nothing_behind(cp: Controlplane) -> None:
    done = await cp.cli("pool", "check", "--pool", POOL, "--all", "--timeout", "5m")
    shown = _ok(done)
    lines = [line for line in shown.splitlines() if re.match(r"(ok|FAILED)\s", line)]
    assert [line.split("  ")[0] for line in lines] == ["ok"] * 5, shown + done.stderr
    assert [re.split(r"\s{2,}", line)[1] for line in lines] == list(NAMES)
    assert all(re.search(r"\s\d+\.\ds\s", line) for line in lines), shown
    assert "pool gke-rtx6000: all 5 checks passed" in shown
    by_name = {re.split(r"\s{2,}", line)[1]: line for line in lines}
    assert "cold start and first answer" in by_name["gpu endpoint"]
    assert "answered 200" in by_name["box port"]
    count = re.search(r"count (\d+) at stop, (\d+) after start", by_name["checkpoint restore"])
    assert count is not None, by_name
    assert int(count[2]) >= int(count[1]) >= 3, by_name
    assert "2 cards on" in by_name["multi-card job"], by_name
    # Progress went to stderr while the checks ran.
    assert "checkpoint restore: starting" in done.stderr
    prefix = re.search(r"named (check-[0-9a-f]{6})-", shown)
    assert prefix is not None, shown
    assert json.loads(_ok(await cp.cli("box", "list", "-o", "json"))) == []
    assert json.loads(_ok(await cp.cli("endpoint", "list", "-o", "json"))) == []
    tasks = json.loads(_ok(await cp.cli("task", "list", "--pool", POOL, "-o", "json")))
    theirs = [t for t in tasks if t["task_id"].startswith(prefix[1])]
    assert theirs, tasks
    assert [t for t in theirs if t["state"] in ("queued", "placed", "running")] == []


async def test_all_on_a_pool_that_does_not_exist_names_it_and_the_fix(cp: Controlplane) -> None:
    done = await cp.cli("pool", "check", "--pool", "nosuch", "--all")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "no pool nosuch" in done.stderr, done.stderr
    assert "levers9 pool list" in done.stderr
    assert "gke-rtx6000" in done.stderr
    assert "checking pool" not in done.stdout
