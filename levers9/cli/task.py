"""`levers9 run` and `levers9 task ...`: run a task on a pool's workers and read its record."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Annotated

import typer

from levers9.cli.log_stream import LogStreamUnavailable, stream_task_logs
from levers9.cli.output import Output, console, errors, fail, render
from levers9.cli.runtime import settings_from_env
from levers9.cli.worker import ago
from levers9.config import ControlplaneSettings
from levers9.models import TERMINAL, TaskInput, TaskRecord
from levers9.task_records import list_tasks, new_task_id, start_task, task_record
from levers9.temporal import connect

app = typer.Typer(help="Tasks: what users run on the workers, and their records.")

POLL_S = 0.5
DEADLINE_EXIT = 4
COLUMNS = [
    ("task_id", "TASK"),
    ("pool", "POOL"),
    ("state", "STATE"),
    ("gpus", "CARDS"),
    ("worker", "WORKER"),
    ("node", "NODE"),
    ("age", "AGE"),
    ("command", "COMMAND"),
]


class _LogFollower:
    """Relays the task's output from the gateway as the worker writes it. When no stream can be
    had (no operator token, gateway unreachable) it says so once and the caller prints the
    record's tail instead."""

    FINISH_S = 3.0
    """How long an ended task's stream may take to drain."""

    def __init__(self, settings: ControlplaneSettings, task_id: str) -> None:
        self.streamed = 0
        self.problem: str | None = None
        self._task = asyncio.create_task(self._relay(settings, task_id))

    async def _relay(self, settings: ControlplaneSettings, task_id: str) -> None:
        try:
            async for text in stream_task_logs(settings, task_id, follow=True):
                console.out(text, end="", highlight=False)
                self.streamed += len(text)
        except LogStreamUnavailable as exc:
            self.problem = str(exc)
            lead = (
                "log stream ended" if self.streamed else "no log stream, showing the record's tail"
            )
            errors.print(f"{lead}: {exc}", highlight=False)

    @property
    def fell_back(self) -> bool:
        return self.problem is not None and self.streamed == 0

    async def finish(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), self.FINISH_S)
        self.cancel()

    def cancel(self) -> None:
        self._task.cancel()


async def submit_and_follow(
    settings: ControlplaneSettings, task: TaskInput, wait_s: float, show_logs: bool
) -> TaskRecord | None:
    """Starts the task, streams its output (the record's tail when no stream can be had) and
    polls its record until it ends or `wait_s` passes; None when it is still running."""
    client = await connect(settings)
    await start_task(client, settings, task)
    console.print(f"task {task.task_id} submitted to pool {task.pool_name}", highlight=False)
    follower = _LogFollower(settings, task.task_id) if show_logs else None
    deadline = time.monotonic() + wait_s
    shown = 0

    def show_tail(record: TaskRecord) -> None:
        nonlocal shown
        if follower is not None and follower.fell_back and len(record.log_tail) > shown:
            console.out(record.log_tail[shown:], end="", highlight=False)
            shown = len(record.log_tail)

    try:
        while True:
            record = await task_record(client, task.task_id)
            if record is not None:
                show_tail(record)
            if record is not None and record.state in TERMINAL:
                if follower is not None:
                    await follower.finish()
                    show_tail(record)
                return record
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(POLL_S)
    finally:
        if follower is not None:
            follower.cancel()


def print_result(record: TaskRecord) -> None:
    console.print(
        f"task {record.task_id} {record.state} exit_code={record.exit_code}"
        f" worker={record.worker_id} node={record.node_name}",
        highlight=False,
    )
    if record.reason:
        console.print(f"reason: {record.reason}", highlight=False)
    if record.result_json:
        console.print(record.result_json, highlight=False, soft_wrap=True)


def run(
    command: Annotated[list[str], typer.Argument(help="the command, after --")],
    pool: Annotated[str, typer.Option("--pool", help="the pool to run on")],
    gpus: Annotated[int, typer.Option("--gpus", min=0, help="cards of one worker")] = 1,
    image: Annotated[str, typer.Option("--image", help="container image")] = "",
    wait: Annotated[float, typer.Option("--wait", min=0, help="seconds this command waits")] = 120,
) -> None:
    """Run CMD on a worker of the pool: prints the task id, its output, then its result."""
    settings = settings_from_env()
    task = TaskInput(
        task_id=new_task_id(), pool_name=pool, command=tuple(command), gpus=gpus, image=image
    )
    record = asyncio.run(submit_and_follow(settings, task, wait, show_logs=True))
    if record is None:
        console.print(
            f"DEADLINE_EXCEEDED: task {task.task_id} is still running;"
            f" levers9 task get {task.task_id}",
            highlight=False,
        )
        raise typer.Exit(DEADLINE_EXIT)
    print_result(record)
    raise typer.Exit(0 if record.state == "succeeded" else 1)


async def _record(settings: ControlplaneSettings, task_id: str) -> TaskRecord | None:
    return await task_record(await connect(settings), task_id)


@app.command()
def get(
    task_id: str, output: Annotated[Output, typer.Option("-o", "--output")] = Output.table
) -> None:
    """The task record: state, worker, phases, exit code, result."""
    record = asyncio.run(_record(settings_from_env(), task_id))
    if record is None:
        fail([f"no task {task_id}"])
        raise typer.Exit(1)
    if output is Output.json:
        console.print_json(record.model_dump_json())
        return
    print_result(record)
    for phase in record.phases:
        error = f" error={phase.error}" if phase.error else ""
        console.print(f"  {phase.at} {phase.name}{error}", highlight=False)


async def _print_logs(settings: ControlplaneSettings, task_id: str, follow: bool) -> bool:
    """The whole output from the worker, through the gateway; else the record's tail.
    False when there is no such task."""
    try:
        async for text in stream_task_logs(settings, task_id, follow=follow):
            console.out(text, end="", highlight=False)
        return True
    except LogStreamUnavailable as exc:
        if str(exc).startswith("NOT_FOUND: no task"):
            return False
        errors.print(f"no log stream, showing the record's tail: {exc}", highlight=False)
    record = await _record(settings, task_id)
    if record is None:
        return False
    console.out(record.log_tail, end="", highlight=False)
    return True


@app.command()
def logs(
    task_id: str,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep streaming until the task exits")
    ] = False,
) -> None:
    """The task's output, streamed from its worker (the record's tail once the worker is gone)."""
    if not asyncio.run(_print_logs(settings_from_env(), task_id, follow)):
        fail([f"no task {task_id}"])
        raise typer.Exit(1)


@app.command("list")
def list_(
    pool: Annotated[str | None, typer.Option("--pool")] = None,
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
) -> None:
    """Tasks, newest first."""
    records = asyncio.run(list_tasks(settings_from_env(), pool))
    if output is Output.json:
        render([json.loads(r.model_dump_json()) for r in records], COLUMNS, output)
        return
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    rows = [
        {
            "task_id": r.task_id,
            "pool": r.pool_name,
            "state": r.state,
            "gpus": r.gpus,
            "worker": r.worker_id or "",
            "node": r.node_name or "",
            "age": ago(r.created_at, now),
            "command": " ".join(r.command)[:60],
        }
        for r in records
    ]
    render(rows, COLUMNS, output, title="tasks")
