"""What the Temporal dev server spends per workflow, for the smallest workflows a task record
could be: the floor under issue 37's "at most 10 ms of dev-server CPU per placed task".

Each shape runs `--count` workflows (20 in flight at once) on one dev server started here (the
project's `temporal`, in memory, as benchmarks/placement.py starts it), and reports the server's
CPU seconds (from /proc) per workflow and its history events:

- `bare`: started, and completed by its first workflow task;
- `bare, eager`: the same, started eagerly (the start's answer carries the first workflow task
  to this process's worker: one round trip fewer; `start_task` asks for it);
- `one signal`: started, waits for one signal from the client, completes;
- `one activity`: started, runs one activity, completes;
- `task, smallest`: the least a task's record does with the pool placing it: started eagerly,
  waits for `placed` (a signal), runs the task (one activity: RunTask on the worker), waits for
  its end (a signal: the worker's report), completes. No memo, no timer, no release;
- `task, smallest, local activity`: the same with RunTask as a local activity.

    python -m benchmarks.temporal_floor [--count 500] [--rounds 2]

The workflows run unsandboxed: the sandbox costs this process's CPU, not the server's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from benchmarks.dev_server import server_cpu

BIN = Path(sys.executable).parent
IN_FLIGHT = 20


@activity.defn
async def run_task(task_id: str) -> str:
    return task_id


@workflow.defn
class Bare:
    @workflow.run
    async def run(self, task_id: str) -> str:
        return task_id


@workflow.defn
class OneSignal:
    def __init__(self) -> None:
        self.signals = 0

    @workflow.run
    async def run(self, task_id: str) -> str:
        await workflow.wait_condition(lambda: self.signals >= 1)
        return task_id

    @workflow.signal
    def tell(self) -> None:
        self.signals += 1


@workflow.defn
class OneActivity:
    @workflow.run
    async def run(self, task_id: str) -> str:
        return await workflow.execute_activity(
            run_task, task_id, start_to_close_timeout=timedelta(seconds=30)
        )


@workflow.defn
class SmallestTask:
    """Queued until `placed`, runs the task (RunTask), running until its end is reported."""

    def __init__(self) -> None:
        self.signals = 0

    @workflow.run
    async def run(self, args: tuple[str, bool]) -> str:
        task_id, local = args
        await workflow.wait_condition(lambda: self.signals >= 1)
        if local:
            await workflow.execute_local_activity(
                run_task, task_id, start_to_close_timeout=timedelta(seconds=30)
            )
        else:
            await workflow.execute_activity(
                run_task, task_id, start_to_close_timeout=timedelta(seconds=30)
            )
        await workflow.wait_condition(lambda: self.signals >= 2)
        return task_id

    @workflow.signal
    def tell(self) -> None:
        self.signals += 1


@dataclass(frozen=True)
class Shape:
    name: str
    workflow: str
    local: bool | None  # SmallestTask's RunTask as a local activity; None: no such argument
    eager: bool
    signals: int

    async def start(self, client: Client, queue: str, task_id: str) -> WorkflowHandle[Any, Any]:
        return await client.start_workflow(
            self.workflow,
            task_id if self.local is None else (task_id, self.local),
            id=f"floor-{uuid.uuid4().hex[:10]}",
            task_queue=queue,
            request_eager_start=self.eager,
        )


SHAPES = (
    Shape("bare", "Bare", None, eager=False, signals=0),
    Shape("bare, eager", "Bare", None, eager=True, signals=0),
    Shape("one signal", "OneSignal", None, eager=False, signals=1),
    Shape("one activity", "OneActivity", None, eager=False, signals=0),
    Shape("task, smallest", "SmallestTask", False, eager=True, signals=2),
    Shape("task, smallest, local activity", "SmallestTask", True, eager=True, signals=2),
)


async def _one(client: Client, queue: str, shape: Shape, n: int, gate: asyncio.Semaphore) -> int:
    async with gate:
        handle = await shape.start(client, queue, f"t{n}")
        for _ in range(shape.signals):
            await handle.signal("tell")
        await handle.result()
        return len((await handle.fetch_history()).events) if n == 0 else 0


async def _measure(client: Client, queue: str, shape: Shape, count: int) -> tuple[float, int]:
    """Server CPU ms per workflow over `count` of them, and one history's length."""
    gate = asyncio.Semaphore(IN_FLIGHT)
    began = server_cpu()
    events = await asyncio.gather(*(_one(client, queue, shape, n, gate) for n in range(count)))
    # fetch_history of the first is one read more; it is 1 of `count`.
    return (server_cpu() - began) / count * 1000, max(events)


async def main(count: int, rounds: int) -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"), dev_server_extra_args=["--headless"]
    )
    async with env:
        queue = f"floor-{uuid.uuid4().hex[:6]}"
        async with Worker(
            env.client,
            task_queue=queue,
            workflows=[Bare, OneSignal, OneActivity, SmallestTask],
            activities=[run_task],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            await asyncio.sleep(2)  # the server's start settles
            figures: dict[str, list[float]] = {s.name: [] for s in SHAPES}
            events: dict[str, int] = {}
            for _ in range(rounds):  # interleaved, so that drift hits every shape alike
                for shape in SHAPES:
                    ms, events[shape.name] = await _measure(env.client, queue, shape, count)
                    figures[shape.name].append(ms)
    print(
        f"nproc={os.cpu_count()} {platform.machine()}, Temporal dev server (in memory),"
        f" {count} workflows per shape per round, {IN_FLIGHT} in flight, {rounds} rounds"
    )
    print(f"{'shape':34s} {'server CPU per workflow':>26s} {'events':>7s}")
    for name, values in figures.items():
        each = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name:34s} {statistics.median(values):8.1f} ms ({each}) {events[name]:>7d}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    asyncio.run(main(options.count, options.rounds))
