"""The queue on the dev pool (its two two-card workers, a one-card one): 40 two-card tasks
submitted at once all succeed, placed in the order their records were created (Temporal allows
10 in-flight Updates per workflow: the queue holds none); a task more cards than the largest
machine has fails at once, saying what the largest has, and so does a memory limit larger than
any machine's allocatable; a task cancelled while it waits leaves
the queue at once, `cancelled`.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from levers9.models import TaskInput, TaskRecord, task_workflow_id
from levers9.records.tasks import start_task, task_ended, task_record
from tests.controlplane import POOL, Controlplane, reconciling, workers_available
from tests.waiting import eventually

pytestmark = pytest.mark.integration

WITHIN = 60


@pytest.fixture(scope="module")
async def cp(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Controlplane]:
    async with reconciling(
        dev_env.client, tmp_path_factory.mktemp("queue"), containers=True
    ) as plane:
        await eventually(lambda: workers_available(plane), within=WITHIN)
        yield plane


async def test_forty_two_card_tasks_at_once_all_succeed_in_order(
    cp: Controlplane, dev_env: WorkflowEnvironment
) -> None:
    client = dev_env.client
    # Both two-card workers busy first, so that all 40 wait in the queue together (a task
    # that finds free cards is placed on arrival, whenever it was created).
    blockers = [
        TaskInput(
            task_id=f"b{uuid.uuid4().hex[:11]}", pool_name=POOL, command=("sleep", "3"), gpus=2
        )
        for _ in range(2)
    ]
    for blocker in blockers:
        await start_task(client, cp.settings.task_queue, blocker)
    await eventually(lambda: _all_running(client, blockers), within=WITHIN)
    tasks = [
        TaskInput(
            task_id=f"q{uuid.uuid4().hex[:11]}", pool_name=POOL, command=("sleep", "0.2"), gpus=2
        )
        for _ in range(40)
    ]
    await asyncio.gather(*(start_task(client, cp.settings.task_queue, t) for t in tasks))
    ended = await asyncio.gather(*(task_ended(client, t.task_id, 300) for t in tasks))
    records = [r for r in ended if r is not None]
    assert [r.state for r in records] == ["succeeded"] * 40, [
        (r.task_id, r.state, r.reason) for r in records
    ]
    by_creation = sorted(records, key=lambda r: r.created_at)
    placed_at = [_placed(r) for r in by_creation]
    # Two two-card workers: of two tasks placed together either may be told first, never
    # one created two places later.
    late = [
        (a.task_id, b.task_id)
        for i, a in enumerate(by_creation)
        for b in by_creation[i + 2 :]
        if placed_at[by_creation.index(b)] < placed_at[i]
    ]
    assert late == [], "placed out of the order the tasks were created"
    assert {r.gpus for r in records} == {2}


async def _all_running(client: Client, tasks: list[TaskInput]) -> bool:
    records = [await task_record(client, t.task_id) for t in tasks]
    return all(r is not None and r.state == "running" for r in records)


def _placed(record: TaskRecord) -> float:
    [placement] = [p for p in record.phases if p.name == "placement"]
    assert placement.at is not None
    return placement.at.timestamp()


async def test_a_task_no_machine_can_hold_fails_at_once(
    cp: Controlplane, dev_env: WorkflowEnvironment
) -> None:
    done = await cp.cli("run", "--pool", POOL, "--gpus", "8", "--", "true")
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"no machine of pool {POOL} can hold 8 cards: the largest has 4" in done.stdout
    assert " failed (never ran) " in done.stdout
    # At once: its one request for a place was refused; it never waited in the pool's queue
    # (no timer to ask again, no placement).
    task_id = done.stdout.split()[1]
    history = await dev_env.client.get_workflow_handle(task_workflow_id(task_id)).fetch_history()
    activities = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert activities == ["request_placement"], activities
    assert not [e for e in history.events if e.HasField("timer_started_event_attributes")]


async def test_a_memory_limit_no_machine_has_fails_at_once(cp: Controlplane) -> None:
    """As a card count no machine has: `--memory 1Ti` on nodes of far less allocatable fails at
    once, naming what the largest has, instead of waiting for a place or failing late."""
    done = await cp.cli("run", "--pool", POOL, "--memory", "1Ti", "--", "true")
    assert done.returncode == 1, done.stdout + done.stderr
    said = f"no machine of pool {POOL} can hold a memory limit of 1Ti: the largest has "
    assert said in done.stdout, done.stdout
    assert done.stdout.split(said)[1].split()[1] == "allocatable", done.stdout
    assert " failed (never ran) " in done.stdout
    fits = await cp.cli("run", "--pool", POOL, "--memory", "64Mi", "--", "true")
    assert fits.returncode == 0, fits.stdout + fits.stderr


async def test_a_task_cancelled_while_queued_leaves_the_queue(cp: Controlplane) -> None:
    # Four cards fit the largest node, but no worker has four free (the model server holds two).
    started = await cp.cli("run", "--pool", POOL, "--gpus", "4", "--detach", "--", "true")
    assert started.returncode == 0, started.stderr
    task_id = started.stdout.strip()
    queued = await cp.cli("task", "get", task_id, "-o", "json")
    assert '"state": "queued"' in queued.stdout

    async def says_where_it_waits() -> bool:
        shown = await cp.cli("task", "get", task_id)
        return (
            "queued: 1 of 1, waiting for one worker with 4 free cards (the most free on any"
            " of the pool's 3 workers now: 2)" in shown.stdout
        )

    await eventually(says_where_it_waits, within=WITHIN)
    listed = await cp.cli("task", "list", "--pool", POOL, "-o", "json")
    assert {"task_id": task_id, "state": "queued"}.items() <= next(
        row for row in json.loads(listed.stdout) if row["task_id"] == task_id
    ).items(), "task list shows the queued task"
    cancelled = await cp.cli("task", "cancel", task_id, "--reason", "not needed")
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert f"task {task_id} cancelled (never ran)" in cancelled.stdout
    assert "reason: not needed while queued" in cancelled.stdout
    # `levers9 run` that stops waiting says where its task waits.
    waited = await cp.cli("run", "--pool", POOL, "--gpus", "4", "--wait", "2", "--", "true")
    waiting_id = waited.stdout.split()[1]
    assert (
        f"DEADLINE_EXCEEDED: task {waiting_id} is queued (1 of 1, waiting for one worker with"
        f" 4 free cards); levers9 task get {waiting_id}"
    ) in waited.stdout
    gone = await cp.cli("task", "cancel", waiting_id)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    # The queue is empty again: a two-card task is placed at once.
    after = await cp.cli("run", "--pool", POOL, "--gpus", "2", "--", "true")
    assert after.returncode == 0, after.stdout + after.stderr
