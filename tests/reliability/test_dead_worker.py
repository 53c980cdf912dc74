"""A dead worker stops getting work: its agent killed with SIGKILL (as a crash or the OOM killer
would), on a controlplane run as its own process with the record TTL at its default (10
minutes), so that nothing here is the TTL's doing (each bound is a minute at most):

- its record ends `failed` with the agent's exit (`its Job failed: ...`), a fresh worker's Job
  runs on that node and becomes available, and a task sent right after the kill, which only
  that node can hold, succeeds there and runs once;
- a task placed on a worker whose agent dies before RunTask reached it (the agent stopped, then
  killed) is placed again, on the node's next worker, and runs once;
- a worker whose Job is deleted (`kubectl delete job`) falls silent: its record reads the Job
  after the liveness window (30 s) and ends `expired` (`its Job was deleted`), and the node
  gets a fresh worker.

A blocker task holds the other two-card worker throughout, so that a two-card task can only go
to the node under test (the one-card node cannot hold it).

Its tasks run as processes of the agents (world(process_tasks=True), the sandbox's knob no pool
value can express): its point is a worker's death and its tasks' fates, each run counted in a host
file (w.task_command), not the container a task runs in (tests/integration/test_tasks_sandbox.py
runs tasks as a user does, in containers).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from kubernetes import client as k8s

from levers9.models import TERMINAL, TaskInput, TaskRecord, WorkerRecord
from levers9.records.listing import list_worker_records
from levers9.records.tasks import start_task, task_record
from tests.controlplane import POOL, admin_api
from tests.reliability.world import World, agent_pid, settled, world
from tests.waiting import eventually

pytestmark = pytest.mark.integration

WITHIN = 60
"""Far below the 10-minute record TTL: what happens within it is the Job's or liveness's."""
CARDS = 2


@pytest.fixture(scope="module")
async def plane(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    async with world(tmp_path_factory.mktemp("dead-worker"), process_tasks=True) as started:
        await settled(started)
        yield started


@pytest.fixture(scope="module")
async def busy_node(plane: World) -> AsyncIterator[str]:
    """One two-card worker held by a long task; its node."""
    task_id = f"blocker-{uuid.uuid4().hex[:6]}"
    await _start(plane, task_id, ("sleep", "600"))
    record = await _until(plane, task_id, lambda r: r.state == "running")
    assert record.node_name is not None
    yield record.node_name
    assert plane.client is not None
    await plane.client.get_workflow_handle(f"task:{task_id}").signal("cancel", "test over")


async def _start(plane: World, task_id: str, command: tuple[str, ...]) -> None:
    assert plane.client is not None
    task = TaskInput(task_id=task_id, pool_name=POOL, command=command, gpus=CARDS)
    await start_task(plane.client, plane.settings.task_queue, task)


async def _until(plane: World, task_id: str, check: Callable[[TaskRecord], bool]) -> TaskRecord:
    """The task's record once `check(record)` holds."""
    seen: list[TaskRecord] = []

    async def holds() -> bool:
        assert plane.client is not None
        record = await task_record(plane.client, task_id)
        if record is not None:
            seen[:] = [record]
        return record is not None and check(record)

    try:
        await eventually(holds, within=WITHIN)
    except TimeoutError:
        raise AssertionError(f"task {task_id}: {seen}") from None
    return seen[0]


async def _records(plane: World) -> list[WorkerRecord]:
    return await list_worker_records(plane.settings, POOL, include_ended=True)


async def _worker_on(plane: World, node: str) -> WorkerRecord:
    """The available worker of `node`."""
    found: list[WorkerRecord] = []

    async def available() -> bool:
        found[:] = [
            r for r in await _records(plane) if r.node_name == node and r.state == "available"
        ]
        return len(found) == 1

    await eventually(available, within=WITHIN)
    return found[0]


async def _other_two_card_node(plane: World, busy: str) -> str:
    nodes = {
        r.node_name for r in await _records(plane) if r.gpus == CARDS and r.state == "available"
    }
    [node] = nodes - {busy}
    return node


async def _ended(plane: World, worker_id: str) -> WorkerRecord:
    found: list[WorkerRecord] = []

    async def ended() -> bool:
        found[:] = [r for r in await _records(plane) if r.worker_id == worker_id]
        return bool(found) and found[0].state in ("failed", "expired", "stopped")

    await eventually(ended, within=WITHIN)
    return found[0]


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


async def test_a_killed_agent_is_replaced_and_a_task_sent_right_after_runs_once(
    plane: World, busy_node: str
) -> None:
    node = await _other_two_card_node(plane, busy_node)
    dead = await _worker_on(plane, node)
    _kill(await asyncio.to_thread(agent_pid, dead.worker_id))
    task_id = f"after-kill-{uuid.uuid4().hex[:6]}"
    await _start(plane, task_id, plane.task_command(task_id))

    ended = await _ended(plane, dead.worker_id)
    assert ended.state == "failed"
    assert ended.reason is not None
    assert ended.reason.startswith("its Job failed: "), ended.reason
    fresh = await _worker_on(plane, node)
    assert fresh.worker_id != dead.worker_id
    jobs = [j for j in await plane.worker_jobs() if j["metadata"]["name"] == fresh.job_name]
    assert len(jobs) == 1

    record = await _until(plane, task_id, lambda r: r.state in TERMINAL)
    assert (record.state, record.reason) == ("succeeded", "")
    assert (record.node_name, record.worker_id) == (node, fresh.worker_id)
    assert plane.runs(task_id) == 1


async def test_a_task_placed_on_a_worker_that_dies_before_it_started_is_placed_again(
    plane: World, busy_node: str
) -> None:
    node = await _other_two_card_node(plane, busy_node)
    doomed = await _worker_on(plane, node)
    pid = await asyncio.to_thread(agent_pid, doomed.worker_id)
    os.kill(pid, signal.SIGSTOP)  # RunTask reaches its socket, never the agent
    try:
        task_id = f"placed-on-dead-{uuid.uuid4().hex[:6]}"
        await _start(plane, task_id, plane.task_command(task_id))
        placed = await _until(plane, task_id, lambda r: r.state == "placed")
        assert placed.worker_id == doomed.worker_id
    finally:
        _kill(pid)

    record = await _until(plane, task_id, lambda r: r.state in TERMINAL)
    assert (record.state, record.reason) == ("succeeded", "")
    assert record.node_name == node
    assert record.worker_id != doomed.worker_id
    assert plane.runs(task_id) == 1
    assert (await _ended(plane, doomed.worker_id)).state == "failed"
    await settled(plane)


async def test_a_deleted_job_ends_its_record_after_the_liveness_window(plane: World) -> None:
    [node] = {r.node_name for r in await _records(plane) if r.gpus == 1}
    gone = await _worker_on(plane, node)
    await asyncio.to_thread(
        k8s.BatchV1Api(admin_api(plane.sandbox)).delete_namespaced_job,
        gone.job_name,
        "levers9",
        propagation_policy="Background",
    )
    ended = await _ended(plane, gone.worker_id)
    assert (ended.state, ended.reason) == ("expired", "its Job was deleted")
    fresh = await _worker_on(plane, node)
    assert fresh.worker_id != gone.worker_id
