"""`kubectl drain` of a sandbox node running a `--retries 1` task, end to end on the sandbox's
real agents: the drain cordons the node and evicts the worker's pod (the Eviction API), the
agent stops the task within its grace and reports it lost, the task's record keeps that attempt
(on the drained node) and queues it again, and the second attempt succeeds on another node."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from levers9.models import TERMINAL, TaskRecord
from levers9.records.tasks import task_record
from levers9.temporal import connect
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.waiting import eventually

pytestmark = pytest.mark.integration

WITHIN = 90


@pytest.fixture(scope="module")
async def plane(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Controlplane, Client]]:
    async with reconciling(dev_env.client, tmp_path_factory.mktemp("drain"), containers=True) as cp:
        await eventually(lambda: workers_available(cp), within=WITHIN)
        yield cp, await connect(cp.settings)


async def _record(client: Client, task_id: str) -> TaskRecord:
    record = await task_record(client, task_id)
    assert record is not None, task_id
    return record


async def test_a_drained_task_with_a_retry_succeeds_on_another_node(
    plane: tuple[Controlplane, Client],
) -> None:
    cp, client = plane
    done = await cp.cli(
        "run", "--pool", POOL, "--gpus", "1", "--detach", "--retries", "1", "--", "sleep", "6"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    task_id = done.stdout.strip()

    seen: list[TaskRecord] = []

    async def running() -> bool:
        seen.append(await _record(client, task_id))
        return seen[-1].state == "running"

    await eventually(running, within=WITHIN)
    node = seen[-1].node_name
    assert node

    async def started() -> bool:  # its container runs (not still unpacking its image)
        return (await cp.cli("exec", task_id, "--", "true")).returncode == 0

    await eventually(started, within=WITHIN)
    drained = await cp.kubectl(
        "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=60s"
    )
    assert f"node/{node} drained" in drained

    async def ended() -> bool:
        seen.append(await _record(client, task_id))
        return seen[-1].state in TERMINAL

    await eventually(ended, within=WITHIN)
    record = seen[-1]
    assert record.state == "succeeded", (record.state, record.reason, record.attempts)
    [first] = record.attempts
    assert (first.state, first.node_name) == ("lost", node), first
    assert record.node_name != node
    assert first.reason == "worker shut down", first
