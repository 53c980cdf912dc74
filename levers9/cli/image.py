"""`levers9 image recopy --pool P`: copy the worker image's `latest` into the pool's project
registry and restart the pool's workers at once (ImageRecopyWorkflow)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from temporalio.client import WorkflowFailureError

from levers9.cli.output import console, fail
from levers9.cli.runtime import settings_from_env
from levers9.config import ControlplaneSettings
from levers9.operations import failure_message, start_recopy
from levers9.providers.gke import RecopyResult
from levers9.temporal import connect

app = typer.Typer(help="The worker image in the pools' registries.", no_args_is_help=True)


@app.command()
def recopy(pool: Annotated[str, typer.Option("--pool", help="the pool")]) -> None:
    """Copy `latest` again, then stop the pool's workers so fresh ones start at the next
    reconcile (instead of after their records expire)."""
    try:
        result = asyncio.run(_recopy(settings_from_env(), pool))
    except WorkflowFailureError as exc:
        fail([f"recopy failed: {failure_message(exc)}"])
        raise typer.Exit(1) from None
    workers = ", ".join(result.workers_restarted) or "none running"
    console.print(f"worker image {result.digest} copied for pool {pool}", highlight=False)
    console.print(
        f"workers stopped: {workers}; fresh ones start at the next reconcile", highlight=False
    )


async def _recopy(settings: ControlplaneSettings, pool: str) -> RecopyResult:
    client = await connect(settings)
    handle = await start_recopy(client, settings, pool)
    console.print(f"started {handle.id}", highlight=False)
    return await handle.result()
