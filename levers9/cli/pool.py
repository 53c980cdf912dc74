"""`levers9 pool list`: the pools the controlplane reconciles, from their schedules."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from levers9.cli.output import Output, render
from levers9.cli.runtime import settings_from_env
from levers9.config import ControlplaneSettings
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
