"""`levers9 pool list`: the pools the controlplane reconciles, from their schedules."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer

from levers9.cli.output import Output, console, fail, render
from levers9.cli.runtime import settings_from_env
from levers9.cli.task import submit_and_follow
from levers9.config import ControlplaneSettings
from levers9.models import TaskInput
from levers9.tasks_client import PROBE_COMMAND, check_report, new_task_id
from levers9.temporal import list_reconcile_schedules

app = typer.Typer(help="Pools as the controlplane runs them.", no_args_is_help=True)

COLUMNS = [
    ("pool", "POOL"),
    ("schedule", "SCHEDULE"),
    ("every", "EVERY"),
    ("paused", "PAUSED"),
    ("passes", "PASSES"),
    ("last_pass", "LAST PASS"),
    ("next_pass", "NEXT PASS"),
]


@app.command("list")
def list_(output: Annotated[Output, typer.Option("-o", "--output")] = Output.table) -> None:
    """List pools with their reconcile schedule: how often, how many passes, what is next."""
    show_pools(settings_from_env(), output)


def show_pools(settings: ControlplaneSettings, output: Output) -> None:
    schedules = asyncio.run(list_reconcile_schedules(settings))
    rows: list[dict[str, Any]] = [row.model_dump(mode="json") for row in schedules]
    render(rows, COLUMNS, output, title="pools")


@app.command()
def check(
    pool: Annotated[str, typer.Option("--pool")],
    gpu: Annotated[str, typer.Option("--gpu", help="the GPU type the pool should have")],
    timeout: Annotated[str, typer.Option("--timeout", help="e.g. 15m, 90s")] = "15m",
) -> None:
    """Run the GPU probe on one card; prints COMPLETE {json} (or FAILED {json}) from the
    task record, so a slow first start does not hide the result."""
    settings = settings_from_env()
    task = TaskInput(task_id=new_task_id(), pool_name=pool, command=PROBE_COMMAND, gpus=1)
    console.print(f"GPU check on pool {pool} ({gpu})", highlight=False)
    record = asyncio.run(submit_and_follow(settings, task, _seconds(timeout), show_logs=False))
    if record is None:
        missing = {"reason": f"no result within {timeout}", "task": task.task_id}
        fail([f"FAILED {json.dumps(missing)}"])
        raise typer.Exit(1)
    word = "COMPLETE" if record.state == "succeeded" else "FAILED"
    console.print(f"{word} {json.dumps(check_report(record), indent=2)}", highlight=False)
    if record.state != "succeeded":
        raise typer.Exit(1)


def _seconds(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text[-1] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except (ValueError, IndexError):
        raise typer.BadParameter(f"{text!r}: a duration like 15m, 90s or 1h") from None
