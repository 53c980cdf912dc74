"""`levers9 pool check --pool P --all` through the CLI, on the sandbox's pool with containers and
the dev pool's runtimes (runc, the default, and runsc, whose boxes checkpoint), as the dev stack
runs it: five lines (the GPU check, a GPU endpoint's cold start and request, a box's port through
its URL, a counting runsc box stopped and started going on from its count, a task on all the
cards a machine offers), each ok with its time, exit 0, under the pool's checkpoint capability
as its workers report it (runsc); nothing the checks made is left (no
endpoint, no box, no task of theirs running), nor after a Ctrl-C in the middle (exit 130).
`--all` on a pool that does not exist names it and the pools there are. On a pool offering runc
only, the checkpoint restore line FAILS with the worker's reason (CRIU's check fails on this
kernel) and the exit status is 1, the other four ok.

The tests of this module share one sandbox and one controlplane and run in order.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
from collections.abc import AsyncIterator

import pytest
from temporalio.testing import WorkflowEnvironment

from levers9.cli.pool_checks import NAMES
from levers9.temporal import sync_reconcile_schedules
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.factories import LEVERS9
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
    # What the workers' agents reported: runsc's checkpoint works on this machine.
    assert "checkpoint capability: runsc (3 workers)" in shown
    by_name = {re.split(r"\s{2,}", line)[1]: line for line in lines}
    assert "cold start and first answer" in by_name["gpu endpoint"]
    assert "answered 200" in by_name["box port"]
    count = re.search(r"count (\d+) at stop, (\d+) after start", by_name["checkpoint restore"])
    assert count is not None, by_name
    assert int(count[2]) >= int(count[1]) >= 3, by_name
    assert "its URL answered before the stop and after the start" in by_name["checkpoint restore"]
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


async def _nothing_left(cp: Controlplane) -> None:
    assert json.loads(_ok(await cp.cli("box", "list", "-o", "json"))) == []
    assert json.loads(_ok(await cp.cli("endpoint", "list", "-o", "json"))) == []


async def test_ctrl_c_deletes_what_the_checks_made(cp: Controlplane) -> None:
    process = await asyncio.create_subprocess_exec(
        str(LEVERS9),
        *("pool", "check", "--pool", POOL, "--all"),
        env=cp.cli_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        # As from a terminal: a child of a background job would ignore SIGINT.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stderr is not None
    said: list[str] = []
    async with asyncio.timeout(WITHIN):
        while "created (runtime runsc)" not in (line := (await process.stderr.readline()).decode()):
            assert line, "".join(said)
            said.append(line)
    # The endpoint and the web box were made and deleted; the counting box is up now.
    boxes = json.loads(_ok(await cp.cli("box", "list", "-o", "json")))
    assert [b["name"] for b in boxes if b["name"].endswith("-count")], boxes
    process.send_signal(signal.SIGINT)
    stdout, stderr = await asyncio.wait_for(process.communicate(), WITHIN)
    assert process.returncode == 130, stdout.decode() + stderr.decode()
    assert "interrupted: what the checks made" in stderr.decode()
    assert "checkpoint restore" not in stdout.decode()
    await _nothing_left(cp)


async def test_without_runsc_the_checkpoint_line_fails_with_the_reason(
    dev_env: WorkflowEnvironment, cp: Controlplane
) -> None:
    async def offered(runtimes: tuple[str, ...]) -> None:
        await sync_reconcile_schedules(
            dev_env.client, [POOL], cp.settings, simulated_gpus=[POOL], runtimes={POOL: runtimes}
        )

    await offered(("runc",))
    try:
        # Proof the gateway reads the pool's runtimes anew (it keeps them a few seconds).
        async def refused() -> bool:
            run = ("run", "--pool", POOL, "--gpus", "0", "--runtime", "runsc", "--", "true")
            return (await cp.cli(*run)).returncode != 0

        await eventually(refused, within=WITHIN)
        done = await cp.cli("pool", "check", "--pool", POOL, "--all")
    finally:
        await offered(cp.pool.offered_runtimes)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = {re.split(r"\s{2,}", x)[1]: x for x in done.stdout.splitlines() if "  " in x}
    line = lines["checkpoint restore"]
    assert line.startswith("FAILED"), done.stdout
    assert "offers no runsc" in line, line
    assert "criu" in line.lower(), line
    assert [n for n in NAMES if lines[n].startswith("ok")] == [
        n for n in NAMES if n != "checkpoint restore"
    ], done.stdout
    assert "1 of 5 checks failed (checkpoint restore)" in done.stdout
    await _nothing_left(cp)
