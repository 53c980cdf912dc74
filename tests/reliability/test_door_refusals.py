"""Wrong input to the CLI is refused at the door, the real `levers9` driven as a user drives it:
- against the Temporal dev server and a real gateway: a pool this controlplane does not
  reconcile is refused at submit (through the gateway, and straight through Temporal without a
  token), naming the pools there are, and nothing is started; `pool remove` of such a pool
  removes nothing and says so; a runtime the pool does not offer is refused at submit the same
  two ways, naming those it offers, and one it offers is taken; Ctrl-C on a foreground `run`
  says the task goes on and how to cancel it, and leaves it as it was;
- with nothing to reach: an argument that is not UTF-8, a --runtime that is none, an
  --on-preempt that is none or a checkpoint without a volume, a --gpus
  past the gateway's bound, a
  --memory below the 6 MiB floor or with an exponent no node has, a bad --log-level, a command
  and environment over the one 128 KiB limit, an environment variable that is no variable
  name: each a message and exit status 2, never a traceback, and refused before anything is
  dialled;
- `task get` of a task not ended never reads `(never ran)`.

The controlplane here is its gateway and two reconcile schedules (paused: nothing polls its
task queue; one pool offers runc only, the other runc and runsc), which is all the refusals read.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from levers9.config import ControlplaneSettings
from levers9.gateway.server import Gateway
from levers9.gateway.task_records import TemporalTaskRecords
from levers9.models import reconcile_schedule_id
from levers9.records.workers import TemporalWorkerRecords
from levers9.temporal import VALUES, ensure_reconcile_schedule
from levers9.tokens import operator_token
from tests.waiting import eventually

pytestmark = pytest.mark.integration

SECRET = "door-refusals-secret-0123456789"
POOL = "door-pool"
GVISOR_POOL = "door-gvisor"
"""Offers runc and runsc (`runtimes: [runc, runsc]`)."""
LEVERS9 = Path(sys.executable).parent / "levers9"


@dataclass(frozen=True)
class Plane:
    env: dict[str, str]
    task_queue: str
    env_without_token: dict[str, str]

    async def cli(self, *args: str, token: bool = True) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run,
            [str(LEVERS9), *args],
            env=self.env if token else self.env_without_token,
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.fixture(scope="module")
async def plane(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Plane]:
    client = dev_env.client
    task_queue = f"tq-door-{uuid.uuid4().hex[:8]}"
    address = client.service_client.config.target_host
    settings = ControlplaneSettings.model_validate(
        {"temporalAddress": address, "taskQueue": task_queue}
    )
    await ensure_reconcile_schedule(client, POOL, settings, source=VALUES)
    await ensure_reconcile_schedule(
        client, GVISOR_POOL, settings, source=VALUES, runtimes=("runc", "runsc")
    )
    schedules = [client.get_schedule_handle(reconcile_schedule_id(p)) for p in (POOL, GVISOR_POOL)]
    for schedule in schedules:
        await schedule.pause()
    gateway = Gateway(
        TemporalWorkerRecords(client),
        SecretStr(SECRET),
        tasks=TemporalTaskRecords(client, task_queue),
    )
    port = await gateway.start("127.0.0.1:0")
    home = tmp_path_factory.mktemp("door")
    base = {
        **os.environ,
        "TEMPORAL_ADDRESS": address,
        "LEVERS9_TASK_QUEUE": task_queue,
        "LEVERS9_HOME": str(home / "no-dev-stack"),
        "COLUMNS": "400",  # click's usage errors in one line, as the assertions read them
    }
    base.pop("LEVERS9_API_TOKEN", None)
    base.pop("LEVERS9_API_TOKEN_FILE", None)
    with_token = {
        **base,
        "LEVERS9_GATEWAY_ADDRESS": f"127.0.0.1:{port}",
        "LEVERS9_API_TOKEN": operator_token(SECRET),
    }
    try:
        yield Plane(with_token, task_queue, base)
    finally:
        await gateway.stop(grace=0)
        for schedule in schedules:
            await schedule.delete()


async def _tasks(dev_env: WorkflowEnvironment, task_queue: str, pool: str) -> list[str]:
    query = f"TaskQueue='{task_queue}' AND WorkflowType='TaskWorkflow' AND PoolName='{pool}'"
    return [w.id async for w in dev_env.client.list_workflows(query)]


@pytest.mark.parametrize("token", [True, False], ids=["gateway", "temporal"])
async def test_run_on_a_pool_that_is_not_there_is_refused_naming_the_pools(
    plane: Plane, dev_env: WorkflowEnvironment, token: bool
) -> None:
    done = await plane.cli("run", "--pool", "nosuchpool", "--wait", "5", "--", "true", token=token)
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert "Traceback" not in said
    assert (
        "no pool nosuchpool on this controlplane (`levers9 pool list` shows door-gvisor, door-pool)"
        in said
    ), said
    assert "submitted" not in said
    # The pool that is there is taken (the check refuses by name, not everything).
    taken = await plane.cli("run", "--pool", POOL, "--detach", "--", "true", token=token)
    assert taken.returncode == 0, taken.stdout + taken.stderr
    task_id = taken.stdout.strip().splitlines()[-1]

    async def listed() -> bool:
        return f"task:{task_id}" in await _tasks(dev_env, plane.task_queue, POOL)

    await eventually(listed)  # what was started is listed by now; the refused one never was
    assert await _tasks(dev_env, plane.task_queue, "nosuchpool") == []
    await dev_env.client.get_workflow_handle(f"task:{task_id}").terminate("test done")


@pytest.mark.parametrize("token", [True, False], ids=["gateway", "temporal"])
async def test_a_runtime_the_pool_does_not_offer_is_refused_naming_those_it_does(
    plane: Plane, dev_env: WorkflowEnvironment, token: bool
) -> None:
    args = ("--runtime", "runsc", "--wait", "5", "--", "dmesg")
    before = await _tasks(dev_env, plane.task_queue, POOL)
    done = await plane.cli("run", "--pool", POOL, *args, token=token)
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert "Traceback" not in said
    assert (
        "pool door-pool does not offer runtime runsc: it offers runc"
        " (config.worker.pools.door-pool.runtimes lists what its tasks may name)"
    ) in " ".join(said.split()), said
    assert "submitted" not in said
    taken = await plane.cli("run", "--pool", GVISOR_POOL, "--detach", *args[:2], "--", "dmesg")
    assert taken.returncode == 0, taken.stdout + taken.stderr
    task_id = taken.stdout.strip().splitlines()[-1]

    async def listed() -> bool:
        return f"task:{task_id}" in await _tasks(dev_env, plane.task_queue, GVISOR_POOL)

    await eventually(listed)  # what was started is listed by now; the refused one never was
    assert await _tasks(dev_env, plane.task_queue, POOL) == before
    await dev_env.client.get_workflow_handle(f"task:{task_id}").terminate("test done")


async def test_pool_remove_of_a_pool_that_is_not_there_removes_nothing(
    plane: Plane, dev_env: WorkflowEnvironment
) -> None:
    done = await plane.cli("pool", "remove", "--pool", "nosuchpool")
    said = done.stdout + done.stderr
    assert done.returncode == 1, said
    assert (
        "no pool nosuchpool on this controlplane (`levers9 pool list` shows door-gvisor, door-pool)"
        in said
    )
    assert "removed" not in said
    assert "kubectl delete namespace" not in said
    assert "Traceback" not in said
    query = f"TaskQueue='{plane.task_queue}' AND WorkflowType='RemovePoolWorkflow'"
    assert [w.id async for w in dev_env.client.list_workflows(query)] == []
    bad = await plane.cli("pool", "remove", "--pool", "Not'A'Pool")
    assert bad.returncode == 1
    assert "no pool Not'A'Pool" in bad.stdout + bad.stderr


def _levers9(*args: str | bytes) -> subprocess.CompletedProcess[str]:
    """The CLI with no controlplane to reach: what it refuses, it refuses before dialling."""
    return subprocess.run(
        [str(LEVERS9), *args],
        env={**os.environ, "COLUMNS": "400", "TEMPORAL_ADDRESS": "127.0.0.1:1"},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ("run", "--pool", "p", "--gpus", "99999999999999999999999", "--", "true"),
            "Invalid value for '--gpus': Input should be less than or equal to 64",
        ),
        (
            ("endpoint", "create", "e1", "--pool", "p", "--port", "80", "--gpus", "65", "--"),
            "Invalid value for '--gpus': Input should be less than or equal to 64",
        ),
        (
            ("run", "--pool", "p", "--", "echo", b"\xff\xfe"),
            "error: argument 6 (b'\\xff\\xfe') is not UTF-8 text: levers9 takes UTF-8 arguments",
        ),
        (
            ("endpoint", "create", "e1", "--pool", "p", "--port", "80", "-e", b"K=\xff", "--"),
            "error: argument 9 (b'K=\\xff') is not UTF-8 text",
        ),
        (("task", "get", b"\xff"), "error: argument 3 (b'\\xff') is not UTF-8 text"),
        (
            ("run", "--pool", "p", "--runtime", "bogus", "--", "true"),
            "Invalid value for --runtime: unknown runtime 'bogus': use one of runc, runsc",
        ),
        (
            ("run", "--pool", "p", "--on-preempt", "migrate", "--", "true"),
            "Invalid value for --on-preempt: 'migrate' is not one of requeue, checkpoint",
        ),
        (
            ("run", "--pool", "p", "--on-preempt", "checkpoint", "--", "true"),
            "Invalid value for --on-preempt: checkpoint needs --checkpoints VOLUME",
        ),
        (
            ("run", "--pool", "p", "--memory", "1", "--", "true"),
            "Invalid value for --memory: '1': 1 bytes is below the 6Mi a container needs to"
            " start (a bare number is bytes): write a unit, e.g. 512Mi or 8Gi",
        ),
        (
            ("run", "--pool", "p", "--memory", "1e999999999", "--", "true"),
            "Invalid value for --memory: '1e999999999': an exponent past e30 is no resource any"
            " node has",
        ),
        (
            (
                *("endpoint", "create", "e1", "--pool", "p", "--port", "80"),
                *("--ready-path", "/health check", "--", "true"),
            ),
            "Invalid value for --ready-path: '/health check' must be printable ASCII without"
            " spaces (percent-encode the rest)",
        ),
        (
            ("--log-level", "BOGUS", "pool", "list"),
            "Invalid value for --log-level: 'BOGUS' is not one of debug, info, warning, error,"
            " critical",
        ),
    ],
)
def test_a_wrong_argument_is_a_message_and_exit_2_never_a_traceback(
    args: tuple[str | bytes, ...], said: str
) -> None:
    done = _levers9(*args)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out
    assert said in out
    assert "Traceback" not in out
    assert "cannot reach Temporal" not in out  # refused before anything was dialled


CHUNK = "x" * 100_000  # one argument under the kernel's own 128 KiB per argument


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            (
                *("endpoint", "create", "e1", "--pool", "p", "--port", "80"),
                *(arg for i in range(17) for arg in ("-e", f"V{i}={CHUNK}")),
                *("--", "true"),
            ),
            # 10 of 100,004 (V0-V9, '=', NUL), 7 of 100,005 (V10-V16), 5 (true, NUL)
            "Invalid value for CMD and --env: the command and environment hold 1700080 bytes,"
            " more than 131072 (128 KiB): pass large data in a file, a volume or the image",
        ),
        (
            (
                *("endpoint", "create", "e1", "--pool", "p", "--port", "80", "-e", f"A={CHUNK}"),
                *("--", "echo", CHUNK),
            ),
            "Invalid value for CMD and --env: the command and environment hold 200009 bytes",
        ),
        (
            ("run", "--pool", "p", "--", "echo", CHUNK, CHUNK),
            "Invalid value for CMD: the command and environment hold 200007 bytes, more than"
            " 131072 (128 KiB)",
        ),
        (
            (
                *("endpoint", "create", "e1", "--pool", "p", "--port", "80"),
                *("-e", "1BAD-KEY=x", "--", "true"),
            ),
            "Invalid value for --env: '1BAD-KEY' is not a variable name: letters, digits and _,"
            " not starting with a digit",
        ),
    ],
    ids=["env-1.7MB", "env-and-command", "run-command", "env-name"],
)
def test_one_limit_for_a_tasks_command_and_environment(args: tuple[str, ...], said: str) -> None:
    done = _levers9(*args)
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-2000:]
    assert said in out, out[-2000:]
    assert "Traceback" not in out
    assert "cannot reach Temporal" not in out


def test_the_limit_counts_each_argument_and_variable_with_its_terminator() -> None:
    from levers9.contract import MAX_TASK_INPUT_BYTES, task_input_problem

    exactly = ["x" * (MAX_TASK_INPUT_BYTES - 1)]
    assert task_input_problem(exactly, {}) is None
    assert task_input_problem([*exactly, ""], {}) is not None
    assert task_input_problem(["true"], {"K": "x" * (MAX_TASK_INPUT_BYTES - 5 - 3)}) is None
    assert task_input_problem(["true"], {"K": "x" * (MAX_TASK_INPUT_BYTES - 5 - 2)}) is not None
    assert task_input_problem(["true"], {"_ok9": ""}) is None
    assert task_input_problem(["true"], {"a.b": ""}) == (
        "'a.b' is not a variable name: letters, digits and _, not starting with a digit"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"memory_bytes": 1},
            "task.memory_bytes: 1 bytes is below the 6Mi a container needs to start (a bare number"
            " is bytes): write a unit, e.g. 512Mi or 8Gi",
        ),
        (
            {"command": ["echo", "x" * 70_000, "y" * 70_000]},
            "task.command: the command and environment hold 140007 bytes, more than 131072",
        ),
    ],
)
def test_the_gateway_refuses_the_same_at_submit(fields: dict[str, Any], message: str) -> None:
    """For a client other than the CLI: SubmitTask holds the same floor and limit."""
    from levers9.gateway.convert import submitted_task
    from levers9.gateway.errors import InvalidRequest
    from levers9.proto import gateway_pb2, worker_pb2

    spec = worker_pb2.TaskSpec(**{"task_id": "t1", "command": ["true"], **fields})
    request = gateway_pb2.SubmitTaskRequest(pool_name=POOL, task=spec)
    with pytest.raises(InvalidRequest) as refused:
        submitted_task(request)
    assert str(refused.value.message).startswith(message), refused.value.message


async def test_ctrl_c_on_a_foreground_run_says_the_task_goes_on_and_how_to_cancel_it(
    plane: Plane, dev_env: WorkflowEnvironment
) -> None:
    process = await asyncio.create_subprocess_exec(
        str(LEVERS9),
        *("run", "--pool", POOL, "--wait", "600", "--", "sleep", "600"),
        env={**plane.env, "PYTHONUNBUFFERED": "1"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    async with asyncio.timeout(60):
        line = (await process.stdout.readline()).decode()
    assert " submitted to pool " in line, line
    task_id = line.split()[1]
    process.send_signal(signal.SIGINT)
    async with asyncio.timeout(60):
        out, err = await process.communicate()
    said = line + out.decode() + err.decode()
    assert process.returncode == 130, said
    assert (
        f"interrupted: only this command stopped; task {task_id} goes on: levers9 task cancel"
        f" {task_id} stops it, levers9 task logs -f {task_id} follows it again"
    ) in said
    assert "Traceback" not in said
    assert "Aborted" not in said
    described = await dev_env.client.get_workflow_handle(f"task:{task_id}").describe()
    assert described.status == WorkflowExecutionStatus.RUNNING  # the task was left as it was
    await dev_env.client.get_workflow_handle(f"task:{task_id}").terminate("test done")


@pytest.mark.parametrize(
    ("update", "line"),
    [
        ({"state": "running", "worker_id": "w-1"}, "task t1 running worker=w-1 node=n-1"),
        ({"state": "queued"}, "task t1 queued worker=None node=n-1"),
        ({"state": "succeeded", "exit_code": 0}, "task t1 succeeded exit_code=0 worker=None"),
        ({"state": "failed"}, "task t1 failed (never ran) worker=None"),
    ],
)
def test_a_task_not_ended_never_reads_never_ran(
    update: dict[str, Any], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`(never ran)` is said of an ended task without an exit code, never of one running."""
    from datetime import UTC, datetime

    from levers9.cli.task import print_result
    from levers9.models import TaskInput, TaskRecord

    task = TaskInput(task_id="t1", pool_name=POOL, command=("true",))
    record = TaskRecord.queued(task, datetime.now(UTC)).model_copy(
        update={"node_name": "n-1", **update}
    )
    print_result(record)
    printed = capsys.readouterr().out
    assert printed.startswith(line), printed
    assert ("(never ran)" in printed) == (line.endswith("(never ran) worker=None"))
