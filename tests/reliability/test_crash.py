"""kill -9 of the controlplane (worker_main: the Temporal worker and the gateway) at seeded
points of the worker lifecycle and the task flow, then a restart, as Kubernetes restarts a
crashed pod. After each, once the restarted process has run reconcile passes of its own: no
node has two worker Jobs, every task submitted ends `succeeded` having run exactly once (each
run leaves a line), and the worker records match the cluster (a running record for each live
Job and a live Job for each running record).

What a seed reproduces: its cluster change (add a node, remove an added one, a node NotReady
then Ready again once the controlplane logged the change), its tasks, how many kills, and where
each lands: right after the controlplane's Nth state line (`STATE_LINES`: a task reported, a
worker registered or available, a node's change seen, ...) since the seed began, N drawn from
the seed; a flow that writes fewer is killed once it has been quiet for QUIET_S, and the test
says so. What it cannot fix is the order in which concurrent events write those lines.

Six seeds (more with LEVERS9_PROPERTY_SCALE) share one world (dev server, sandbox, controlplane
process), so each starts from what the previous ones left: nodes added and removed, workers
winding up, tasks in flight.

Its tasks run as processes of the agents (world(process_tasks=True), the sandbox's knob no pool
value can express): its point is the controlplane under crash faults, each task's runs counted in a
host file (w.task_command), not the container a task runs in
(tests/integration/test_tasks_sandbox.py runs tasks as a user does, in containers).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from levers9.core.capacity import NODE_LABEL
from levers9.models import TERMINAL, TaskInput
from levers9.records.tasks import start_task, task_record
from tests.controlplane import POOL
from tests.factories import add_gpu_node
from tests.properties import scale
from tests.reliability.world import SETTLE_S, World, live, passes_after, settled, world
from tests.waiting import eventually

pytestmark = pytest.mark.integration

SEEDS = range(6 * scale())
"""Seeds of kill points: six in the suite (about three minutes of one test worker), six times
LEVERS9_PROPERTY_SCALE when it is set (`LEVERS9_PROPERTY_SCALE=5 pytest tests/reliability/
test_crash.py` draws thirty)."""
STATE_LINES = (
    "task reported",
    "worker registered",
    "worker available",
    "added new worker to occupy existing machine",
    "nodes changed: reconciling now",
    "machine gone",
    "worker record ended",
)
"""Log lines of the controlplane that say the flow changed state: the kill points."""
QUIET_S = 15.0


@pytest.fixture(scope="module")
async def crashy(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[World]:
    async with world(tmp_path_factory.mktemp("crash"), process_tasks=True) as started:
        await settled(started)
        yield started


async def _invariants(w: World) -> None:
    jobs = [j for j in await w.worker_jobs() if live(j)]
    twice = [
        n for n, c in Counter(j["metadata"]["labels"][NODE_LABEL] for j in jobs).items() if c > 1
    ]
    assert twice == [], f"nodes with two live worker Jobs: {twice}"


def _state_lines(w: World, since: int) -> list[str]:
    """The controlplane's state lines past byte `since` of its log (both runs, if restarted)."""
    with w.controlplane.log.open("rb") as log:
        log.seek(since)
        text = log.read().decode(errors="replace")
    return [line for line in text.splitlines() if any(m in line for m in STATE_LINES)]


async def _kill_point(w: World, since: int, nth: int) -> str:
    """Waits for the `nth` state line past byte `since`, or for QUIET_S without a new one
    (fewer came: the flow went quiet); says which."""
    count, quiet_since = 0, asyncio.get_running_loop().time()
    while True:
        lines = _state_lines(w, since)
        if len(lines) >= nth:
            return f"after state line {nth}: {lines[nth - 1]}"
        now = asyncio.get_running_loop().time()
        if len(lines) > count:
            count, quiet_since = len(lines), now
        elif now - quiet_since >= QUIET_S:
            return f"quiet after {count} of {nth} state lines"
        await asyncio.sleep(0.05)  # a bounded poll of a file another process writes


async def _chaos(w: World, rng: random.Random, seed: int, since: int) -> list[str]:
    """The seed's cluster changes and tasks, started before the kill lands; the task ids."""
    extra = f"gke-demo-gpu-extra-{seed}"
    action = rng.choice(["add-node", "remove-added", "not-ready", "tasks-only"])
    if action == "add-node":
        await add_gpu_node(
            w.sandbox.cluster,
            extra,
            rng.choice([1, 2]),
            f"127.0.11.{seed + 1}",
            f"127.0.21.{seed + 1}",
        )
    elif action == "remove-added":
        added = [s.name for s in w.sandbox.cluster.node_specs() if "-extra-" in s.name]
        if added:
            await w.sandbox.cluster.remove_node(rng.choice(added))
    elif action == "not-ready":
        name = rng.choice([s.name for s in w.sandbox.cluster.node_specs() if s.gpus.count])
        await w.sandbox.cluster.set_node_ready(name, False)

        async def seen() -> bool:
            return any("nodes changed" in line for line in _state_lines(w, since))

        try:
            # Held NotReady until the controlplane logged a change; a kill landing first means
            # the restarted process reads the node NotReady at its sync and logs no change, so
            # the flap then ends after the bound: it is chaos, not a claim.
            with contextlib.suppress(TimeoutError):
                await eventually(seen, within=20)
        finally:
            await w.sandbox.cluster.set_node_ready(name, True)
    assert w.client is not None
    tasks = []
    for i in range(rng.randint(1, 3)):
        task_id = f"s{seed}t{i}{rng.randrange(16**6):06x}"
        await start_task(
            w.client,
            w.settings.task_queue,
            TaskInput(task_id=task_id, pool_name=POOL, command=w.task_command(task_id)),
        )
        tasks.append(task_id)
    return tasks


@pytest.mark.parametrize("seed", SEEDS)
async def test_kill9_then_restart_loses_and_duplicates_nothing(crashy: World, seed: int) -> None:
    rng = random.Random(seed)
    kills = [rng.randint(1, 4) for _ in range(rng.choice([1, 1, 2]))]
    since = crashy.controlplane.log.stat().st_size
    chaos = asyncio.create_task(_chaos(crashy, random.Random(rng.random()), seed, since))
    points = []
    for nth in kills:
        points.append(await _kill_point(crashy, since, nth))
        crashy.controlplane.kill9()
        since = crashy.controlplane.log.stat().st_size
        crashy.controlplane.start()
        await crashy.controlplane_ready()
    tasks = await chaos
    print(f"seed {seed}: killed {points}")  # shown with -s, and in a failure's captured output
    await passes_after(crashy)  # the restarted process's own passes had their chance
    await _invariants(crashy)

    assert crashy.client is not None
    client = crashy.client

    async def all_ended() -> bool:
        records = [await task_record(client, t) for t in tasks]
        return all(r is not None and r.state in TERMINAL for r in records)

    await eventually(all_ended, within=SETTLE_S)
    for task_id in tasks:
        record = await task_record(client, task_id)
        assert record is not None
        assert (record.state, record.reason) == ("succeeded", ""), record
        assert crashy.runs(task_id) == 1, f"task {task_id} ran {crashy.runs(task_id)} times"
    await settled(crashy)
    await _invariants(crashy)
