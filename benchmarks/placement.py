"""Placement under a standing queue: N tasks submitted at once over M workers, on the Temporal
dev server, with the real PoolWorkflow and TaskWorkflow and the real `request_placement`
activity (signal-with-start); the worker side is mocked (RunTask succeeds at once and the
"worker" reports the task's end, as the gateway would signal it). Reports the time to place
and finish them all, PoolWorkflow history events per placed task (over every run of its
continue-as-new chain), and the longest history of each workflow type.

    python benchmarks/placement.py [--tasks 1000] [--workers 20] [--gpus 1]

With `--sandbox`, on the running dev stack (`levers9 dev up`) instead: `--workers` sandbox nodes
of one card are added with `levers9 sandbox node add`, each gets its real worker (a Job, the
agent, its runc runtime), and `--tasks` tasks of `true` run on them through the whole
controlplane (in the pool's default image); the nodes are removed afterwards.

Targets (issue 17): no refusal at any N (every task succeeds), at most 10 pool history events
per placed task, at least 50 tasks placed per second.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import resource
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.dispatch import TaskActivities
from levers9.config import ControlplaneSettings
from levers9.core.task_reports import TaskReport
from levers9.models import (
    PoolInput,
    TaskInput,
    WorkerSlotInput,
    WorkerTaskInput,
    pool_workflow_id,
)
from levers9.records.listing import list_worker_records
from levers9.records.tasks import start_task
from levers9.temporal import connect, ensure_search_attributes
from workflows import RUNNER
from workflows.pool import PoolWorkflow
from workflows.task import TaskWorkflow

BIN = Path(sys.executable).parent
POOL = "bench"


@activity.defn(name="run_task")
async def run_task(input: WorkerTaskInput) -> bool:
    """The worker takes the task and, at once, reports it ended (the gateway's signal)."""
    record = activity.client().get_workflow_handle(activity.info().workflow_id or "")
    report = TaskReport(
        pool_name=input.pool_name,
        worker_id=input.worker_id,
        task_id=input.task.task_id,
        state="succeeded",
    )
    await record.signal("report", report)
    return False


async def _run_all(
    client: Client, task_queue: str, inputs: list[TaskInput]
) -> tuple[float, dict[str, int]]:
    """Submits every task at once (100 starts in flight), then waits for each to end: the
    seconds the submission took, and how many ended in each state."""
    began = time.perf_counter()
    starting, waiting = asyncio.Semaphore(100), asyncio.Semaphore(200)

    async def submit(task: TaskInput) -> None:
        async with starting:
            await start_task(client, task_queue, task)

    await asyncio.gather(*(submit(t) for t in inputs))
    submitted = time.perf_counter() - began
    states: dict[str, int] = defaultdict(int)

    async def result(task: TaskInput) -> None:
        async with waiting:
            record = await client.get_workflow_handle(f"task:{task.task_id}").result()
            states[record["state"] if isinstance(record, dict) else record.state] += 1
            done = sum(states.values())
            if done % 100 == 0:
                print(f"ended: {done} of {len(inputs)}", file=sys.stderr)

    await asyncio.gather(*(result(t) for t in inputs))
    return submitted, states


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _server_cpu() -> float:
    """CPU seconds of the dev server (this process's child `temporal`), from /proc."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        if name == "temporal" and int(fields[1]) == os.getpid():
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def _history_lengths(client: Client, workflow_type: str, since: str = "") -> list[int]:
    lengths = []
    query = f"WorkflowType='{workflow_type}'" + (f" AND StartTime >= '{since}'" if since else "")
    async for listed in client.list_workflows(query):
        handle = client.get_workflow_handle(listed.id, run_id=listed.run_id)
        lengths.append(len((await handle.fetch_history()).events))
    return lengths


async def main(tasks: int, workers: int, gpus: int) -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(BIN / "temporal"),
        data_converter=pydantic_data_converter,
        dev_server_extra_args=["--headless"],
    )
    async with env:
        client = env.client
        await ensure_search_attributes(client, "default")
        task_queue = f"bench-{uuid.uuid4().hex[:6]}"
        settings = ControlplaneSettings.model_validate(
            {"temporalAddress": client.service_client.config.target_host, "taskQueue": task_queue}
        )
        real = TaskActivities(client, settings)
        async with Worker(
            client,
            task_queue=task_queue,
            workflows=[PoolWorkflow, TaskWorkflow],
            workflow_runner=RUNNER,
            activities=[real.request_placement, run_task],
        ):
            pool = await client.start_workflow(
                PoolWorkflow.run,
                PoolInput(pool_name=POOL),
                id=pool_workflow_id(POOL),
                task_queue=task_queue,
            )
            for n in range(workers):
                slot = WorkerSlotInput(
                    worker_id=f"w{n}",
                    node_name=f"node-{n}",
                    address=f"127.0.20.{n % 250 + 1}:40000",
                    devices=tuple(range(gpus)),
                    node_gpus=gpus,
                )
                await pool.signal(PoolWorkflow.worker_available, slot)
            inputs = [
                TaskInput(
                    task_id=f"b{n:06d}{uuid.uuid4().hex[:5]}",
                    pool_name=POOL,
                    command=("true",),
                    gpus=gpus,
                )
                for n in range(tasks)
            ]
            began = time.perf_counter()
            cpu_began = _cpu()
            server_began = _server_cpu()
            submitted, states = await _run_all(client, task_queue, inputs)
            took = time.perf_counter() - began
            cpu = _cpu() - cpu_began
            server_cpu = _server_cpu() - server_began
        pool_lengths = await _history_lengths(client, "PoolWorkflow")
        task_lengths = await _history_lengths(client, "TaskWorkflow")
    print(
        f"nproc={os.cpu_count()} {platform.machine()}, Temporal dev server, {tasks} tasks"
        f" of {gpus} card(s) over {workers} workers"
    )
    print(f"submitted in {submitted:.1f} s; all ended in {took:.1f} s: {dict(states)}")
    print(f"placed per second: {tasks / took:.0f}")
    print(
        f"CPU of this process (the Temporal worker: workflows, activities, the client):"
        f" {cpu:.1f} s, {cpu / tasks * 1000:.0f} ms per task"
    )
    print(
        f"CPU of the Temporal dev server: {server_cpu:.1f} s, {server_cpu / tasks * 1000:.0f} ms"
        f" per task; both: {(cpu + server_cpu) / took:.2f} cores busy on average"
    )
    print(
        f"PoolWorkflow: {len(pool_lengths)} runs, {sum(pool_lengths)} events,"
        f" {sum(pool_lengths) / tasks:.1f} per placed task, longest run {max(pool_lengths)}"
    )
    print(f"TaskWorkflow: longest history {max(task_lengths)} events")


async def on_sandbox(tasks: int, nodes: int) -> None:
    """The same figures with real workers on sandbox nodes of the running dev stack."""
    from datetime import UTC, datetime

    from levers9.cli.runtime import settings_from_env
    from levers9.devstack.values import POOL_NAME

    settings = settings_from_env()
    client = await connect(settings)
    levers9 = str(BIN / "levers9")
    names = [f"gke-bench-{uuid.uuid4().hex[:4]}-{n}" for n in range(nodes)]
    before = len(await list_worker_records(settings, POOL_NAME, include_ended=False))
    for name in names:
        await asyncio.to_thread(
            subprocess.run, [levers9, "sandbox", "node", "add", name, "--gpus", "1"], check=True
        )
    try:
        while True:
            records = await list_worker_records(settings, POOL_NAME, include_ended=False)
            available = [r for r in records if r.state == "available"]
            print(f"\rworkers available: {len(available)} of {before + nodes}", end="")
            if len(available) >= before + nodes:
                break
            await asyncio.sleep(2)
        print()
        pool_before = sum(await _history_lengths(client, "PoolWorkflow"))
        since = datetime.now(UTC).isoformat()
        inputs = [
            TaskInput(
                task_id=f"s{n:05d}{uuid.uuid4().hex[:6]}", pool_name=POOL_NAME, command=("true",)
            )
            for n in range(tasks)
        ]
        began = time.perf_counter()
        _, states = await _run_all(client, settings.task_queue, inputs)
        took = time.perf_counter() - began
        print()
        pool_events = sum(await _history_lengths(client, "PoolWorkflow")) - pool_before
        task_lengths = await _history_lengths(client, "TaskWorkflow", since)
        longest = {
            kind: max(await _history_lengths(client, kind), default=0)
            for kind in ("PoolWorkflow", "WorkerWorkflow", "MachineWorkflow")
        }
    finally:
        for name in names:
            await asyncio.to_thread(
                subprocess.run, [levers9, "sandbox", "node", "remove", name], check=False
            )
    print(
        f"nproc={os.cpu_count()} {platform.machine()}, the dev stack, {tasks} tasks of `true`"
        f" over {before + nodes} real workers ({nodes} sandbox nodes added)"
    )
    print(f"all ended in {took:.1f} s: {dict(states)}; placed per second: {tasks / took:.1f}")
    print(f"PoolWorkflow: {pool_events} events meanwhile, {pool_events / tasks:.1f} per task")
    print(
        f"longest history: TaskWorkflow {max(task_lengths)}, "
        + ", ".join(f"{kind} {n}" for kind, n in longest.items())
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--sandbox", action="store_true", help="real workers on the dev stack")
    arguments = parser.parse_args()
    if arguments.sandbox:
        asyncio.run(on_sandbox(arguments.tasks, arguments.workers))
    else:
        asyncio.run(main(arguments.tasks, arguments.workers, arguments.gpus))
