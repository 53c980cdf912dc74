"""Placement under a standing queue: N tasks submitted at once over M workers, on the Temporal
dev server, with the real PoolWorkflow and TaskWorkflow and the real `request_placement`
activity (signal-with-start); the worker side is mocked (RunTask succeeds at once and the
"worker" reports the task's end, as the gateway would signal it). Reports the time to place
and finish them all, PoolWorkflow history events per placed task (over every run of its
continue-as-new chain), and the longest history of each workflow type.

    python benchmarks/placement.py [--tasks 1000] [--workers 20] [--gpus 1]

With `--workspaces K` (issue 37): the tasks belong to K workspaces whose records exist (their
WorkspaceWorkflows run beside the pool's), with quotas in four groups (4, 8, 16 and 40 cards for
K = 20 on 200 one-card workers: 340 in all, the pool oversubscribed; a record gives no weight, so
every weight is 1), each workspace's task count in proportion to what fair share entitles it to,
submitted one workspace after another (first in, first out would not share); the mocked worker
holds each task `--hold MIN,MAX` seconds (uniform, seeded). It reports from the task records:
each workspace's most cards held at one instant against its quota, each one's GPU-seconds share
while all had work waiting against its entitlement (worst deviation), submit-to-placed p50/p99,
how long a freed card stayed idle, and the events by type of the pool's history and of sampled
task histories.

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
import random
import resource
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.dispatch import TaskActivities
from benchmarks import placement_records as records
from benchmarks.dev_server import server_cpu as dev_server_cpu
from levers9.config import ControlplaneSettings
from levers9.core.task_reports import TaskReport
from levers9.core.workspaces import WorkspaceState
from levers9.models import (
    PoolInput,
    TaskInput,
    TaskRecord,
    WorkerSlotInput,
    WorkerTaskInput,
    pool_workflow_id,
)
from levers9.records.listing import list_worker_records
from levers9.records.tasks import start_task
from levers9.records.workspaces import TemporalWorkspaceRecords
from levers9.temporal import connect, ensure_search_attributes
from workflows import RUNNER
from workflows.pool import PoolWorkflow
from workflows.task import TaskWorkflow
from workflows.workspace import WorkspaceWorkflow

BIN = Path(sys.executable).parent
POOL = "bench"


QUOTA_GROUPS = (4, 8, 16, 40)
"""Workspace i's quota is QUOTA_GROUPS[i % 4] times the pool's cards over 200."""
SAMPLED_HISTORIES = 20


class MockWorkers:
    """The workers' side: RunTask succeeds, and the task ends (the gateway's `report` signal)
    at once, or after a seeded uniform `hold` of seconds."""

    def __init__(self, hold: tuple[float, float], seed: int) -> None:
        self._hold = hold
        self._rng = random.Random(seed)
        self._ending: set[asyncio.Task[None]] = set()

    @activity.defn(name="run_task")
    async def run_task(self, input: WorkerTaskInput) -> bool:
        record = activity.client().get_workflow_handle(activity.info().workflow_id or "")
        report = TaskReport(
            pool_name=input.pool_name,
            worker_id=input.worker_id,
            task_id=input.task.task_id,
            state="succeeded",
        )
        low, high = self._hold
        if high <= 0:
            await record.signal("report", report)
            return False
        ending = asyncio.create_task(self._end(record, report, self._rng.uniform(low, high)))
        self._ending.add(ending)
        ending.add_done_callback(self._ending.discard)
        return False

    @activity.defn(name="get_task")
    async def get_task(self, input: WorkerTaskInput) -> TaskReport:
        """GetTask, which a record calls when no report came within its liveness interval (a
        hold past 60 s): the task still runs (its end is reported when its hold is over)."""
        return TaskReport(
            pool_name=input.pool_name,
            worker_id=input.worker_id,
            task_id=input.task.task_id,
            state="running",
        )

    @staticmethod
    async def _end(record: Any, report: TaskReport, after_s: float) -> None:
        await asyncio.sleep(after_s)
        await record.signal("report", report)


async def _run_all(
    client: Client, task_queue: str, inputs: list[TaskInput], ended: list[TaskRecord] | None = None
) -> tuple[float, dict[str, int]]:
    """Submits every task at once (100 starts in flight), then waits for each to end: the
    seconds the submission took, and how many ended in each state; `ended` gets the records."""
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
            handle = client.get_workflow_handle(f"task:{task.task_id}", result_type=TaskRecord)
            record: TaskRecord = await handle.result()
            states[record.state] += 1
            if ended is not None:
                ended.append(record)
            done = sum(states.values())
            if done % 100 == 0:
                print(f"ended: {done} of {len(inputs)}", file=sys.stderr)

    await asyncio.gather(*(result(t) for t in inputs))
    return submitted, states


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _history_lengths(client: Client, workflow_type: str, since: str = "") -> list[int]:
    lengths = []
    query = f"WorkflowType='{workflow_type}'" + (f" AND StartTime >= '{since}'" if since else "")
    async for listed in client.list_workflows(query):
        handle = client.get_workflow_handle(listed.id, run_id=listed.run_id)
        lengths.append(len((await handle.fetch_history()).events))
    return lengths


async def _event_types(
    client: Client, workflow_type: str, limit: int | None = None
) -> Counter[str]:
    """Events by type over the histories of `workflow_type` (the first `limit` listed)."""
    counted: Counter[str] = Counter()
    seen = 0
    async for listed in client.list_workflows(f"WorkflowType='{workflow_type}'"):
        if limit is not None and seen >= limit:
            break
        seen += 1
        history = await client.get_workflow_handle(listed.id, run_id=listed.run_id).fetch_history()
        counted.update(
            EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in history.events
        )
    return counted


def _workspace_inputs(
    tasks: int, workspaces: int, cards: int, gpus: int
) -> tuple[dict[str, int], list[TaskInput]]:
    """The workspaces' quotas and their tasks: each workspace's count in proportion to its
    entitlement, submitted one workspace after another (first in, first out would give the
    cards to the first workspaces up to their quotas; fair share must give each its own)."""
    names = [f"team-{n:02d}" for n in range(workspaces)]
    quotas = {w: max(1, QUOTA_GROUPS[n % 4] * cards // 200) for n, w in enumerate(names)}
    entitled = records.entitled({w: q for w, q in quotas.items()}, cards)
    total = sum(entitled.values())
    counts = {w: round(tasks * e / total) for w, e in entitled.items()}
    owners = [w for w in names for _ in range(counts[w])]
    inputs = [
        TaskInput(
            task_id=f"b{n:06d}{uuid.uuid4().hex[:5]}",
            pool_name=POOL,
            command=("true",),
            gpus=gpus,
            workspace=owner,
        )
        for n, owner in enumerate(owners)
    ]
    return quotas, inputs


async def main(
    tasks: int,
    workers: int,
    gpus: int,
    workspaces: int = 0,
    hold: tuple[float, float] = (0.0, 0.0),
    seed: int = 37,
) -> None:
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
        mocked = MockWorkers(hold, seed)
        quotas: dict[str, int] = {}
        inputs = [
            TaskInput(
                task_id=f"b{n:06d}{uuid.uuid4().hex[:5]}",
                pool_name=POOL,
                command=("true",),
                gpus=gpus,
            )
            for n in range(tasks)
        ]
        if workspaces:
            quotas, inputs = _workspace_inputs(tasks, workspaces, workers * gpus, gpus)
        ended: list[TaskRecord] = []
        async with Worker(
            client,
            task_queue=task_queue,
            workflows=[PoolWorkflow, TaskWorkflow, WorkspaceWorkflow],
            workflow_runner=RUNNER,
            activities=[real.request_placement, mocked.run_task, mocked.get_task],
            max_concurrent_activities=1000,
        ):
            for name, quota in quotas.items():
                await TemporalWorkspaceRecords(client, task_queue).create(
                    WorkspaceState(name=name, gpu_quota=quota, created_at=datetime.now(UTC))
                )
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
            began, began_at = time.perf_counter(), datetime.now(UTC)
            cpu_began = _cpu()
            server_began = dev_server_cpu()
            submitted, states = await _run_all(client, task_queue, inputs, ended)
            all_submitted = began_at + timedelta(seconds=submitted)
            took = time.perf_counter() - began
            cpu = _cpu() - cpu_began
            server_cpu = dev_server_cpu() - server_began
        pool_lengths = await _history_lengths(client, "PoolWorkflow")
        task_lengths = await _history_lengths(client, "TaskWorkflow")
        pool_types = await _event_types(client, "PoolWorkflow")
        task_types = await _event_types(client, "TaskWorkflow", SAMPLED_HISTORIES)
    tasks = len(inputs)
    print(
        f"nproc={os.cpu_count()} {platform.machine()}, Temporal dev server, {tasks} tasks"
        f" of {gpus} card(s) over {workers} workers"
        + (
            f", {workspaces} workspaces, each task held {hold[0]:g}-{hold[1]:g} s"
            if workspaces
            else ""
        )
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
    _print_types("PoolWorkflow, every run", pool_types, tasks)
    _print_types(f"TaskWorkflow, {SAMPLED_HISTORIES} histories", task_types, SAMPLED_HISTORIES)
    if workspaces:
        _report_workspaces(ended, quotas, workers * gpus, all_submitted, hold[1])


def _print_types(what: str, types: Counter[str], per: int) -> None:
    print(f"{what}: events per task by type:")
    for kind, n in types.most_common():
        print(f"  {kind}: {n / per:.2f}")


def _report_workspaces(
    ended: Sequence[TaskRecord],
    quotas: dict[str, int],
    cards: int,
    since: datetime,
    settle_s: float,
) -> None:
    """What the records show: quotas held at every instant, shares (from the last submit, and
    from `settle_s` later: once every task placed in arrival order before the queue formed has
    ended, as fair share never takes a card back from a task within its quota), times."""
    held = records.holds(ended)
    peaks = records.most_held(held)
    broken = {w: (peaks[w], q) for w, q in quotas.items() if peaks.get(w, 0) > q}
    shown = ", ".join(f"{w} {peaks.get(w, 0)}/{q}" for w, q in quotas.items())
    kept = "yes" if not broken else f"NO: {broken}"
    print(f"quotas held at every instant: {kept} (most held / quota: {shown})")
    window = records.contended(held, since)
    entitled = records.entitled(quotas, cards)
    for begin, what in (
        (window[0], "from the last submit"),
        (window[0] + timedelta(seconds=settle_s), f"from {settle_s:g} s after it"),
    ):
        used = records.gpu_seconds(held, (begin, window[1]))
        total_used, total_entitled = sum(used.values()), sum(entitled.values())
        deviations = {
            w: (used.get(w, 0.0) / total_used) / (entitled[w] / total_entitled) - 1 for w in quotas
        }
        worst = max(deviations, key=lambda w: abs(deviations[w]))
        seconds = (window[1] - begin).total_seconds()
        print(
            f"while every workspace waited, {what} ({seconds:.0f} s,"
            f" {total_used / seconds / cards:.0%} of the cards busy): GPU-seconds share vs"
            f" entitlement, worst {worst} {deviations[worst]:+.1%}; by workspace: "
            + ", ".join(f"{w} {d:+.1%}" for w, d in deviations.items())
        )
    waits = [(h.placed - h.created).total_seconds() for h in held]
    gaps = records.idle_gaps(held, window[1])
    print(
        f"submit to placed: p50 {records.percentile(waits, 0.5):.1f} s,"
        f" p99 {records.percentile(waits, 0.99):.1f} s; a freed card idle until its next task"
        f" (while all waited): p50 {records.percentile(gaps, 0.5):.2f} s,"
        f" p99 {records.percentile(gaps, 0.99):.2f} s"
    )


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
    parser.add_argument("--workspaces", type=int, default=0, help="K workspaces with quotas")
    parser.add_argument(
        "--hold", default="0,0", help="MIN,MAX seconds a mocked worker holds each task"
    )
    parser.add_argument("--seed", type=int, default=37)
    arguments = parser.parse_args()
    low, _, high = arguments.hold.partition(",")
    if arguments.sandbox:
        asyncio.run(on_sandbox(arguments.tasks, arguments.workers))
    else:
        asyncio.run(
            main(
                arguments.tasks,
                arguments.workers,
                arguments.gpus,
                arguments.workspaces,
                (float(low), float(high or low)),
                arguments.seed,
            )
        )
