"""Two controlplane replicas (worker_main `a` and `b`) against one Temporal server, behind a
balancer that plays the gateway's Service, with tunnelled workers (each holds its one session
with whichever replica its connection reached).

- Whichever replica the CLI reaches, a task runs, `levers9 exec` reaches its container and
  `levers9 task logs -f` streams its output live: the replica that does not hold the worker's
  tunnel relays the call to the one that does (its log says so), never dialing the other's
  loopback end of the session.
- kill -9 of the replica holding a busy worker's tunnel: the worker reconnects through the
  balancer to the other, the other carries every workflow (the task running there ends
  `succeeded`, having run once; tasks queued behind it run once each), and new tasks run.

Its tasks run as processes of the agents (world(process_tasks=True), the sandbox's knob no pool
value can express): its point is two replicas and the kill of one, each task's runs counted in a
host file (w.task_command), not the container a task runs in
(tests/integration/test_tasks_sandbox.py runs tasks as a user does, in containers).
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator

import pytest

from levers9.models import TERMINAL, TaskInput, WorkerRecord
from levers9.records.listing import list_worker_records
from levers9.records.tasks import start_task, task_record
from tests.controlplane import POOL
from tests.factories import run_levers9
from tests.reliability.world import SETTLE_S, World, settled, world
from tests.waiting import eventually

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
async def pair(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    async with world(
        tmp_path_factory.mktemp("replicas"), tunnel=True, replicas=2, process_tasks=True
    ) as started:
        await settled(started)
        yield started


async def _cli(w: World, replica: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await run_levers9(w.cli_env(replica), *args, within_s=120)


async def _workers(w: World) -> list[WorkerRecord]:
    return await list_worker_records(w.settings, POOL, include_ended=False)


def _holder(w: World, record: WorkerRecord) -> str:
    """The replica holding this worker's tunnel session."""
    [replica] = [r for r in w.replicas if w.replica_queue(r) == record.task_queue]
    return replica


async def _both_hold_tunnels(w: World) -> bool:
    held = {r.task_queue for r in await _workers(w)}
    return held == {w.replica_queue(r) for r in w.replicas}


async def _running_on(w: World, task_id: str) -> WorkerRecord:
    assert w.client is not None
    client = w.client

    async def running() -> bool:
        record = await task_record(client, task_id)
        return record is not None and record.state == "running"

    await eventually(running, within=60)
    record = await task_record(client, task_id)
    assert record is not None
    [worker] = [r for r in await _workers(w) if r.worker_id == record.worker_id]
    return worker


async def test_exec_and_live_logs_through_either_replica(pair: World) -> None:
    await eventually(lambda: _both_hold_tunnels(pair), within=30)
    submitted = await _cli(
        pair,
        "a",
        "run",
        "--detach",
        "--pool",
        POOL,
        "--",
        "sh",
        "-c",
        "echo start; sleep 8; echo end",
    )
    assert submitted.returncode == 0, submitted.stderr
    task_id = submitted.stdout.strip()
    worker = await _running_on(pair, task_id)
    holder = _holder(pair, worker)
    other = next(r for r in pair.replicas if r != holder)
    for replica in (holder, other):
        inside = await _cli(pair, replica, "exec", task_id, "--", "echo", f"exec via {replica}")
        assert (inside.returncode, inside.stdout) == (0, f"exec via {replica}\n"), inside.stderr
    followed = await asyncio.gather(
        *(_cli(pair, replica, "task", "logs", "-f", task_id) for replica in (holder, other))
    )
    for replica, logs in zip((holder, other), followed, strict=True):
        assert logs.returncode == 0, (replica, logs.stderr)
        assert logs.stdout == "start\nend\n", (replica, logs.stdout)
        assert "no log stream" not in logs.stderr, (replica, logs.stderr)
    relaying = "relaying to the replica holding the worker's tunnel"
    other_log = pair.replicas[other].log.read_text()
    assert relaying in other_log, "the replica without the session relayed"
    assert f"replica={pair.gateways[holder]}" in other_log
    assert relaying not in pair.replicas[holder].log.read_text()


async def test_kill9_of_a_replica_the_other_carries_every_workflow(pair: World) -> None:
    await eventually(lambda: _both_hold_tunnels(pair), within=30)
    assert pair.client is not None
    client = pair.client
    long_id = f"long{uuid.uuid4().hex[:8]}"
    runs = pair.task_runs / long_id
    await start_task(
        client,
        pair.settings.task_queue,
        TaskInput(
            task_id=long_id,
            pool_name=POOL,
            command=("sh", "-c", f"echo run >> {runs}; sleep 6; echo done"),
        ),
    )
    worker = await _running_on(pair, long_id)
    victim = _holder(pair, worker)
    survivor = next(r for r in pair.replicas if r != victim)
    queued = [f"q{n}{uuid.uuid4().hex[:8]}" for n in range(4)]
    for task_id in queued:
        await start_task(
            client,
            pair.settings.task_queue,
            TaskInput(task_id=task_id, pool_name=POOL, command=pair.task_command(task_id)),
        )
    pair.replicas[victim].kill9()

    async def ended() -> bool:
        records = [await task_record(client, t) for t in (long_id, *queued)]
        return all(r is not None and r.state in TERMINAL for r in records)

    await eventually(ended, within=SETTLE_S)
    for task_id in (long_id, *queued):
        record = await task_record(client, task_id)
        assert record is not None
        assert (record.state, record.reason) == ("succeeded", ""), record
    assert pair.runs(long_id) == 1
    assert [pair.runs(t) for t in queued] == [1] * len(queued), "each queued task ran once"

    # Every tunnel is now held by the survivor, and the pool serves on.
    async def all_on_survivor() -> bool:
        workers = await _workers(pair)
        return bool(workers) and all(_holder(pair, r) == survivor for r in workers)

    await eventually(all_on_survivor, within=SETTLE_S)
    await settled(pair)
    after = await _cli(pair, survivor, "run", "--pool", POOL, "--", "echo", "after the kill")
    assert after.returncode == 0, after.stderr
    assert "after the kill" in after.stdout
    pair.replicas[victim].start()
    await pair.controlplane_ready(pair.replicas[victim])
