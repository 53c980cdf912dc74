"""The CLI with the controlplane down (worker_main, its gateway and its Temporal worker, killed
with -9; the Temporal server still up), driven as a user runs it: the `levers9` command in its
own process.

- `task get` answers the task's last recorded state (its workflow's memo, which the server
  holds without a worker), says `controlplane unreachable at <gateway>` and exits 69; `task
  list` the same, for every task;
- a task no Temporal worker ever ran (no memo: an older CLI's) is said to hold no record yet;
- a gateway that accepts and never speaks counts as one that did not answer;
- `run --wait 5` says so within its wait (no traceback) and leaves its task recorded, queued;
- `task logs` shows the recorded tail, `task cancel` says the cancel is kept, `endpoint list`
  and `endpoint get` show the endpoints as created: each with the notice and 69;
- once the controlplane is back, what was told meanwhile happens: the task `run` left queued
  runs, the cancelled one ends cancelled.

Its tasks run as processes of the agents (world(process_tasks=True), the sandbox's knob no pool
value can express): its point is the controlplane going down and coming back, tasks queued and run
meanwhile, not the container a task runs in (tests/integration/test_tasks_sandbox.py runs tasks as
a user does, in containers).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from levers9.errors import CONTROLPLANE_UNREACHABLE_EXIT
from levers9.models import TASK_WORKFLOW, TaskInput, task_workflow_id
from tests.controlplane import POOL
from tests.factories import run_levers9
from tests.reliability.world import World, settled, world
from tests.waiting import eventually

pytestmark = pytest.mark.integration

REPLICA = "crashy"
"""The one replica world() starts."""
SLACK_S = 30
"""A command's subprocess timeout past its own wait: it returned, not how fast."""


@dataclass
class Down:
    world: World
    done: str
    """A task that ran to its end (printed "hello from the task") before the controlplane died."""
    running: str
    """A task that was running when it died."""


async def _cli(
    w: World, *args: str, wait: float = 0, gateway: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = w.cli_env(REPLICA)
    if gateway is not None:
        env["LEVERS9_GATEWAY_ADDRESS"] = gateway
    return await run_levers9(env, *args, within_s=wait + SLACK_S)


def _said_unreachable(
    w: World, done: subprocess.CompletedProcess[str], gateway: str | None = None
) -> None:
    assert done.returncode == CONTROLPLANE_UNREACHABLE_EXIT, (done.stdout, done.stderr)
    at = gateway or w.gateways[REPLICA]
    assert f"controlplane unreachable at {at}" in done.stderr, done.stderr
    assert "levers9 dev status" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr


async def _state(w: World, task_id: str) -> str:
    done = await _cli(w, "task", "get", task_id, "-o", "json")
    return str(json.loads(done.stdout)["state"]) if done.returncode == 0 else ""


@pytest.fixture(scope="module")
async def down(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Down]:
    async with world(tmp_path_factory.mktemp("down"), process_tasks=True) as w:
        await settled(w)
        ran = await _cli(
            w, "run", "--pool", POOL, "--wait", "60", "--", "echo", "hello from the task", wait=60
        )
        assert ran.returncode == 0, (ran.stdout, ran.stderr)
        done = ran.stdout.split()[1]
        started = await _cli(w, "run", "--pool", POOL, "--detach", "--", "sleep", "600")
        running = started.stdout.strip()

        async def is_running() -> bool:
            return await _state(w, running) == "running"

        await eventually(is_running, within=60)
        created = await _cli(
            w, "endpoint", "create", "downed", "--pool", POOL, "--port", "8080", "--", "true"
        )
        assert created.returncode == 0, created.stderr
        w.controlplane.kill9()
        yield Down(w, done, running)


async def test_task_get_answers_the_last_recorded_state(down: Down) -> None:
    w = down.world
    done = await _cli(w, "task", "get", down.done)
    _said_unreachable(w, done)
    assert "last recorded state (the controlplane is down)" in done.stdout
    assert f"PoolName={POOL}" in done.stdout
    assert f"task {down.done} succeeded exit_code=0" in done.stdout

    running = await _cli(w, "task", "get", down.running)
    _said_unreachable(w, running)
    assert "from the memo of its workflow (Running, " in running.stdout
    assert f"PoolName={POOL}" in running.stdout
    assert "Levers9Workspace=default" in running.stdout
    assert f"task {down.running} running worker=" in running.stdout


async def test_task_list_answers_the_last_recorded_states(down: Down) -> None:
    """As `task get`: the gateway did not answer, Temporal lists the memos (no worker needed),
    the newest one's query goes unanswered; the list as recorded, the notice and 69."""
    w = down.world
    listed = await _cli(w, "task", "list", "-o", "json")
    _said_unreachable(w, listed)
    assert "asking Temporal directly: the gateway at" in listed.stderr
    states = {row["task_id"]: row["state"] for row in json.loads(listed.stdout)}
    assert (states[down.done], states[down.running]) == ("succeeded", "running")

    table = await _cli(w, "task", "list", "--pool", POOL)
    _said_unreachable(w, table)
    assert "tasks as last recorded (the controlplane is down)" in table.stdout


async def test_a_task_no_temporal_worker_ever_ran_is_said_to_hold_no_record_yet(
    down: Down,
) -> None:
    w = down.world
    assert w.client is not None
    task = TaskInput(task_id=f"bare{uuid.uuid4().hex[:8]}", pool_name=POOL, command=("true",))
    # As an older CLI started it: no memo.
    await w.client.start_workflow(
        TASK_WORKFLOW, task, id=task_workflow_id(task.task_id), task_queue=w.settings.task_queue
    )
    got = await _cli(w, "task", "get", task.task_id)
    _said_unreachable(w, got)
    assert f"task {task.task_id}: its workflow is Running and holds no record yet" in got.stdout
    await w.client.get_workflow_handle(task_workflow_id(task.task_id)).terminate("test done")


async def test_a_gateway_that_never_connects_counts_as_unanswered(down: Down) -> None:
    """A listener that accepts and never speaks (a balancer without backends): the gateway
    call ends at its deadline without a connection, and that is not a refusal."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # kept open, never written to

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    gateway = f"127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    try:
        got = await _cli(w := down.world, "task", "get", down.done, gateway=gateway)
    finally:
        silent.close()
    _said_unreachable(w, got, gateway)
    assert f"the gateway at {gateway} did not answer (no connection before" in got.stderr
    assert f"task {down.done} succeeded" in got.stdout


async def test_run_says_unreachable_within_its_wait_and_leaves_its_task_queued(
    down: Down,
) -> None:
    w = down.world
    ran = await _cli(w, "run", "--pool", POOL, "--wait", "5", "--", "true", wait=5)
    _said_unreachable(w, ran)
    task_id = ran.stdout.split()[1]
    assert f"task {task_id} is recorded and waits in Temporal" in ran.stdout
    got = await _cli(w, "task", "get", task_id, "-o", "json")
    _said_unreachable(w, got)
    assert json.loads(got.stdout)["state"] == "queued"  # the memo it was started with


async def test_logs_cancel_and_endpoints_answer_what_temporal_holds(down: Down) -> None:
    w = down.world
    logs = await _cli(w, "task", "logs", down.done)
    _said_unreachable(w, logs)
    assert "hello from the task" in logs.stdout

    cancel = await _cli(w, "task", "cancel", down.running, "--wait", "5", wait=5)
    _said_unreachable(w, cancel)
    assert f"task {down.running} is told to cancel" in cancel.stdout

    for args in (("endpoint", "list"), ("endpoint", "get", "downed")):
        shown = await _cli(w, *args)
        _said_unreachable(w, shown)
        assert "downed" in shown.stdout
        assert "the controlplane is down" in shown.stdout


async def test_what_was_told_meanwhile_happens_once_it_is_back(down: Down) -> None:
    w = down.world
    ran = await _cli(w, "run", "--pool", POOL, "--wait", "1", "--", "echo", "queued", wait=1)
    _said_unreachable(w, ran)
    queued = ran.stdout.split()[1]
    cancel = await _cli(w, "task", "cancel", down.running, "--wait", "1", wait=1)
    _said_unreachable(w, cancel)
    w.controlplane.start()
    await w.controlplane_ready()

    async def ended() -> bool:
        states = (await _state(w, queued), await _state(w, down.running))
        return states == ("succeeded", "cancelled")

    await eventually(ended, within=90)
    back = await _cli(w, "task", "get", down.done)
    assert back.returncode == 0, back.stderr
    assert "controlplane unreachable" not in back.stderr
