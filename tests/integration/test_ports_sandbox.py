"""A task's published port, reached with `levers9 port-forward` as a user runs it: the real CLI
(its own process) listens here and carries each connection through the gateway to the task's
worker, directly over TLS and through the worker's tunnel. A port the task did not publish is
refused with the fix; the session ends saying so when the task ends.

The tests of this module share one sandbox and one controlplane per mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from levers9.records.tasks import task_record
from levers9.temporal import connect
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.factories import HTTP_TASK as SERVE
from tests.waiting import eventually

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
WITHIN = 60


@pytest.fixture(scope="module", params=[False, True], ids=["direct", "tunnel"])
async def cp(
    request: pytest.FixtureRequest,
    dev_env: WorkflowEnvironment,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Controlplane]:
    tunnel: bool = request.param
    async with reconciling(
        dev_env.client, tmp_path_factory.mktemp("ports"), tunnel=tunnel, containers=True
    ) as plane:
        await eventually(lambda: workers_available(plane), within=WITHIN)
        yield plane


async def _serving_task(cp: Controlplane, port: int) -> str:
    done = await cp.cli(
        "run", "--pool", POOL, "--gpus", "0", "--detach", "--port", str(port),
        "--", "python", "-c", SERVE,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    task_id = done.stdout.strip()
    client = await connect(cp.settings)

    async def ready() -> bool:
        record = await task_record(client, task_id)
        return record is not None and record.ready

    await eventually(ready, within=WITHIN)
    return task_id


@contextlib.asynccontextmanager
async def _port_forward(
    cp: Controlplane, *args: str
) -> AsyncIterator[tuple[subprocess.Popen[str], int]]:
    """The CLI in its own process (this one's loop serves the gateway: never block it)."""
    process = await asyncio.to_thread(
        subprocess.Popen,
        [str(BIN / "levers9"), "port-forward", *args],
        env=cp.cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.to_thread(process.stdout.readline)
        match = re.fullmatch(r"Forwarding from 127\.0\.0\.1:(\d+) -> \d+\n", line)
        if not match:
            process.kill()
            assert process.stderr is not None
            raise AssertionError(line + await asyncio.to_thread(process.stderr.read))
        yield process, int(match.group(1))
    finally:
        if process.poll() is None:
            process.terminate()
            await asyncio.to_thread(process.wait, 30)


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
        return str(response.read().decode())


async def test_port_forward_reaches_the_tasks_port(cp: Controlplane) -> None:
    task_id = await _serving_task(cp, 8080)
    record = await task_record(await connect(cp.settings), task_id)
    assert record is not None
    assert record.ports == (8080,)
    assert "container.ready" in [p.name for p in record.phases]
    async with _port_forward(cp, task_id, ":8080") as (process, local):
        answers = await asyncio.gather(
            *(asyncio.to_thread(_get, local, f"/n{i}") for i in range(8))
        )
        assert answers == [f"hello from {task_id} /n{i}" for i in range(8)]
        assert process.poll() is None
        await cp.cli("task", "cancel", task_id)
        # The session notices the task's end, says so and exits 1.
        code = await asyncio.to_thread(process.wait, 30)
        assert code == 1
        assert process.stderr is not None
        assert f"task {task_id} ended" in await asyncio.to_thread(process.stderr.read)


async def test_a_port_the_task_did_not_publish_is_refused_with_the_fix(cp: Controlplane) -> None:
    task_id = await _serving_task(cp, 8081)
    done = await cp.cli("port-forward", task_id, "9999")
    assert done.returncode == 1
    assert f"task {task_id} did not publish port 9999 (published: 8081)" in done.stderr
    assert "--port 9999" in done.stderr
    await cp.cli("task", "cancel", task_id)
    refused = await cp.cli("port-forward", "nosuchtask", "8080")
    assert refused.returncode == 1
    assert "no task nosuchtask" in refused.stderr
