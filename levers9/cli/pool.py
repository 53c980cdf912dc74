"""`levers9 pool list|check|remove`: the pools the controlplane reconciles (from their
schedules), the GPU check on one, and removing one."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer
from temporalio.client import Client, WorkflowFailureError

from levers9.cli.gateway_api import GatewayRefused
from levers9.cli.output import Output, console, fail, render
from levers9.cli.pool_choice import chosen_pool
from levers9.cli.runtime import duration, settings_from_env
from levers9.cli.task import submit_and_follow
from levers9.config import ControlplaneSettings
from levers9.contract import DNS_LABEL
from levers9.models import TaskInput, TaskRecord, new_task_id
from levers9.operations import failure_message, start_pool_removal
from levers9.providers.gke import RemovePoolResult
from levers9.records.tasks import (
    PROBE_COMMAND,
    SIMULATED_NO_CARD,
    check_mismatch,
    check_report,
    saw_no_card,
)
from levers9.temporal import (
    connect,
    gpus_simulated,
    has_pool,
    list_reconcile_schedules,
    no_such_pool,
    pool_names,
)

app = typer.Typer(help="Pools as the controlplane runs them.", no_args_is_help=True)

COLUMNS = [
    ("pool", "POOL"),
    ("provider", "PROVIDER"),
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
    schedules, joined = asyncio.run(_pools(settings))
    rows: list[dict[str, Any]] = [
        {
            **row.model_dump(mode="json"),
            "provider": "kubernetes (joined)" if row.pool in joined else "kubernetes (values)",
        }
        for row in schedules
    ]
    render(rows, COLUMNS, output, title="pools")


async def _pools(settings: ControlplaneSettings) -> tuple[list[Any], set[str]]:
    """The reconcile schedules, and which of their pools `levers9 cluster join` made."""
    from levers9.records.clusters import joined_clusters

    schedules = await list_reconcile_schedules(settings)
    clusters = await joined_clusters(await connect(settings))
    return schedules, {state.spec.name for state in clusters}


@app.command()
def check(
    gpu: Annotated[str, typer.Option("--gpu", help="the GPU type the pool should have")],
    pool: Annotated[
        str | None, typer.Option("--pool", help="default: the only pool, if there is one")
    ] = None,
    timeout: Annotated[str, typer.Option("--timeout", help="e.g. 15m, 90s")] = "15m",
) -> None:
    """Run the GPU probe on one card; prints COMPLETE {json} (or FAILED {json}) from the
    task record, so a slow first start does not hide the result. A container that saw no card
    fails it, unless the pool's values say `simulatedGpus: true` (the sandbox)."""
    wait_s = duration(timeout, "--timeout")
    settings = settings_from_env()
    pool = chosen_pool(settings, pool)
    task = TaskInput(task_id=new_task_id(), pool_name=pool, command=PROBE_COMMAND, gpus=1)
    console.print(f"GPU check on pool {pool} ({gpu})", highlight=False)
    try:
        record, simulated = asyncio.run(_run_check(settings, task, wait_s))
    except GatewayRefused as exc:  # no such pool, say
        fail([str(exc)])
        raise typer.Exit(1) from None
    if record is None:
        missing = {"reason": f"no result within {timeout}", "task": task.task_id}
        fail([f"FAILED {json.dumps(missing)}"])
        raise typer.Exit(1)
    if not print_check(record, gpu, simulated=simulated):
        raise typer.Exit(1)


async def _run_check(
    settings: ControlplaneSettings, task: TaskInput, wait_s: float
) -> tuple[TaskRecord | None, bool]:
    """The check's record, and whether its pool's cards are simulated (its schedule's memo)."""
    record = await submit_and_follow(settings, task, wait_s, show_logs=False)
    return record, await gpus_simulated(await connect(settings), task.pool_name)


def print_check(record: TaskRecord, gpu: str, *, simulated: bool) -> bool:
    """Prints `COMPLETE {json}` (True) or `FAILED {json}` with the reason (False); on a
    simulated pool whose container saw no card, says so on the line before."""
    report = check_report(record)
    mismatch = (
        check_mismatch(report, gpu, simulated=simulated) if record.state == "succeeded" else None
    )
    if mismatch:
        report["reason"] = mismatch
    passed = record.state == "succeeded" and not mismatch
    if passed and simulated and saw_no_card(report):
        console.print(SIMULATED_NO_CARD, highlight=False)
    console.print(
        f"{'COMPLETE' if passed else 'FAILED'} {json.dumps(report, indent=2)}", highlight=False
    )
    return passed


@app.command()
def remove(
    pool: Annotated[str, typer.Option("--pool", help="the pool to remove")],
    delete_namespace: Annotated[
        bool, typer.Option("--delete-namespace", help="also delete its namespace on the cluster")
    ] = False,
) -> None:
    """Stop reconciling the pool: its schedule deleted, its workers' Jobs deleted and records
    ended, its machines ended. Delete its block from values too, or the next deploy brings it
    back."""
    try:
        result = asyncio.run(_remove(settings_from_env(), pool, delete_namespace))
    except WorkflowFailureError as exc:
        fail([f"removal failed: {failure_message(exc)}"])
        raise typer.Exit(1) from None
    except LookupError as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None
    console.print(
        f"pool {pool} removed: schedule {'deleted' if result.schedule_deleted else 'was gone'},"
        f" {len(result.workers_ended)} worker records ended, {len(result.machines_ended)}"
        f" machine records ended, {result.jobs_deleted} worker Jobs deleted"
        + (", namespace deleted" if result.namespace_deleted else ""),
        highlight=False,
    )
    if result.note:
        console.print(result.note, highlight=False)


async def _remove(
    settings: ControlplaneSettings, pool: str, delete_namespace: bool
) -> RemovePoolResult:
    client = await connect(settings)
    if not DNS_LABEL.fullmatch(pool) or not await _removable(client, settings, pool):
        raise LookupError(no_such_pool(pool, await pool_names(client, settings.task_queue)))
    handle = await start_pool_removal(
        client, settings, pool, delete_namespace=delete_namespace, reason="removed by levers9"
    )
    return await handle.result()


async def _removable(client: Client, settings: ControlplaneSettings, pool: str) -> bool:
    """The pool is reconciled here, or a removal of it left records running (rerun to finish):
    anything else names no pool, and removing it would say it removed one."""
    if await has_pool(client, settings.task_queue, pool):
        return True
    query = f"ExecutionStatus='Running' AND PoolName='{pool}' AND TaskQueue='{settings.task_queue}'"
    async for _ in client.list_workflows(query, limit=1):
        return True
    return False
