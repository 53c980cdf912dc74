"""`levers9 pool list|get|check|remove`: the pools the controlplane reconciles (from their
schedules), one pool's usage by workspace, the GPU check on one, and removing one.

Reads and the removal go through the gateway's Pools service with the CLI's token (a
workspace's reads pools, never changes them), else to Temporal as the operator
(levers9.cli.pool_reads)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer

from levers9.cli.gateway_api import GatewayRefused, GatewayUnavailable
from levers9.cli.output import Output, console, errors, fail, render
from levers9.cli.pool_checks import (
    CheckResult,
    PoolChecks,
    check_line,
    checkpoint_capability,
    results_json,
    summary_line,
)
from levers9.cli.pool_choice import chosen_pool
from levers9.cli.pool_reads import PoolView, get_pool, list_pools, remove_pool
from levers9.cli.runtime import duration, settings_from_env
from levers9.cli.task import submit_and_follow
from levers9.config import ControlplaneSettings
from levers9.contract import DNS_LABEL
from levers9.core.pool_usage import PoolUsage
from levers9.errors import Unreachable
from levers9.models import TaskInput, TaskRecord, new_task_id
from levers9.records.pools import NoSuchPool, RemovalFailed
from levers9.records.tasks import (
    PROBE_COMMAND,
    SIMULATED_NO_CARD,
    check_mismatch,
    check_report,
    saw_no_card,
)
from levers9.temporal import connect, gpus_simulated

app = typer.Typer(help="Pools as the controlplane runs them.", no_args_is_help=True)

USAGE_COLUMNS = [
    ("workspace", "WORKSPACE"),
    ("gpus", "GPUS"),
    ("borrowed", "BORROWED"),
    ("placed", "PLACED"),
    ("waiting", "WAITING"),
    ("quota", "QUOTA"),
    ("weight", "WEIGHT"),
]
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


def _pool_row(view: PoolView) -> dict[str, Any]:
    return {
        **view.schedule.model_dump(mode="json"),
        "provider": "kubernetes (joined)" if view.joined else "kubernetes (values)",
    }


def show_pools(settings: ControlplaneSettings, output: Output) -> None:
    try:
        views = asyncio.run(list_pools(settings))
    except GatewayUnavailable as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None
    render([_pool_row(view) for view in views], COLUMNS, output, title="pools")


def _usage_rows(usage: PoolUsage) -> list[dict[str, Any]]:
    return [
        {
            "workspace": row.workspace,
            "gpus": row.gpus,
            "borrowed": row.borrowed_gpus,
            "placed": row.placed,
            "waiting": row.waiting,
            "quota": "none" if row.gpu_quota is None else row.gpu_quota,
            "weight": f"{row.weight:g}",
        }
        for row in usage.workspaces
    ]


@app.command()
def get(
    name: Annotated[str, typer.Argument(help="the pool")],
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
) -> None:
    """One pool: its schedule, its cards, and per workspace the GPUs it holds, how many of its
    tasks wait, its quota and weight (a workspace token sees its own workspace only)."""
    if not DNS_LABEL.fullmatch(name):
        raise typer.BadParameter(f"{name!r} is not a pool name (lowercase DNS label)")
    try:
        detail = asyncio.run(get_pool(settings_from_env(), name))
    except (GatewayRefused, GatewayUnavailable, NoSuchPool) as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None
    if output is Output.json:
        shown = {
            **_pool_row(detail.pool),
            "usage": detail.usage.model_dump(mode="json") if detail.usage else None,
        }
        if detail.usage_note:
            shown["usage_note"] = detail.usage_note
        console.print_json(json.dumps(shown))
        return
    render([_pool_row(detail.pool)], COLUMNS, output, title=f"pool {name}")
    usage = detail.usage
    if usage is None:
        console.print(f"usage: unknown, {detail.usage_note}", highlight=False)
        return
    console.print(
        f"{usage.workers} workers, {usage.gpus} GPUs ({usage.free_gpus} free),"
        f" {usage.placed} tasks placed, {usage.waiting} waiting",
        highlight=False,
    )
    render(_usage_rows(usage), USAGE_COLUMNS, output, title="usage by workspace")


@app.command()
def check(
    gpu: Annotated[
        str | None,
        typer.Option("--gpu", help="the GPU type the pool should have (with --all: optional)"),
    ] = None,
    pool: Annotated[
        str | None, typer.Option("--pool", help="default: the only pool, if there is one")
    ] = None,
    timeout: Annotated[str, typer.Option("--timeout", help="e.g. 15m, 90s (each check's)")] = "15m",
    all_: Annotated[
        bool,
        typer.Option(
            "--all",
            help="also a GPU endpoint, a box port, a checkpoint restore and a multi-card job:"
            " one line per check, with its time",
        ),
    ] = False,
    output: Annotated[Output, typer.Option("-o", "--output", help="with --all")] = Output.table,
    checkpoints: Annotated[
        str,
        typer.Option(
            "--checkpoints",
            help="with --all: a volume of the workspace for the checkpoint restore's image, so"
            " that it is restored on another machine than the one that took it",
        ),
    ] = "",
) -> None:
    """Run the GPU probe on one card; prints COMPLETE {json} (or FAILED {json}) from the
    task record, so a slow first start does not hide the result. A container that saw no card
    fails it, unless the pool's values say `simulatedGpus: true` (the sandbox). With --all, the
    product page's checks, one line each: ok or FAILED, its time, what it saw."""
    wait_s = duration(timeout, "--timeout")
    if gpu is None and not all_:
        raise typer.BadParameter(
            "give the GPU type the pool should have, e.g. --gpu H200", param_hint="--gpu"
        )
    if checkpoints and not all_:
        raise typer.BadParameter("only with --all", param_hint="--checkpoints")
    settings = settings_from_env()
    pool = chosen_pool(settings, pool)
    if all_:
        check_all(settings, pool, gpu or "", wait_s, output, checkpoints)
        return
    assert gpu is not None
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
    capability = asyncio.run(checkpoint_capability(settings, pool))
    if capability is not None:
        console.print(f"checkpoint capability: {capability}", highlight=False)
    if not print_check(record, gpu, simulated=simulated):
        raise typer.Exit(1)


def check_all(
    settings: ControlplaneSettings,
    pool: str,
    gpu: str,
    wait_s: float,
    output: Output,
    checkpoints: str = "",
) -> None:
    """`pool check --all`: the five checks (levers9.cli.pool_checks), one line each as it ends
    (progress on stderr meanwhile); exit status 1 when one failed, 130 on Ctrl-C once what the
    checks made is deleted."""
    try:
        simulated = asyncio.run(_pool_simulated(settings, pool))
    except (GatewayRefused, GatewayUnavailable, NoSuchPool) as exc:
        fail([f"pool check --all: {exc}"])
        raise typer.Exit(1) from None
    capability = asyncio.run(checkpoint_capability(settings, pool))

    def progress(line: str) -> None:
        errors.print(line, highlight=False, style="dim", soft_wrap=True)

    def shown(result: CheckResult) -> None:
        if output is Output.table:
            console.print(check_line(result), highlight=False, soft_wrap=True)

    checks = PoolChecks(
        settings, pool, gpu=gpu, simulated=simulated, wait_s=wait_s, progress=progress,
        done=shown, checkpoints=checkpoints,
    )  # fmt: skip
    if output is Output.table:
        console.print(
            f"checking pool {pool} (what it makes is named {checks.prefix}-...)", highlight=False
        )
        if capability is not None:
            console.print(f"checkpoint capability: {capability}", highlight=False)
    try:
        results = asyncio.run(checks.run())
    except KeyboardInterrupt:
        fail([f"interrupted: what the checks made ({checks.prefix}-...) was deleted"])
        raise typer.Exit(130) from None
    if output is Output.json:
        console.print_json(results_json(pool, results, capability))
    else:
        console.print(summary_line(results, pool), highlight=False)
    if not all(r.ok for r in results):
        raise typer.Exit(1)


async def _pool_simulated(settings: ControlplaneSettings, pool: str) -> bool:
    """Whether the pool's cards are simulated; NoSuchPool (naming the pools there are) when the
    controlplane has no such pool."""
    await get_pool(settings, pool)
    try:
        return await gpus_simulated(await connect(settings), pool)
    except Unreachable:  # a workspace's CLI may not reach Temporal: real cards, then
        return False


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
    back. The operator's: a workspace token is refused."""
    try:
        result = asyncio.run(
            remove_pool(settings_from_env(), pool, delete_namespace=delete_namespace)
        )
    except (GatewayRefused, GatewayUnavailable, NoSuchPool, RemovalFailed) as exc:
        fail([f"removal failed: {exc}" if isinstance(exc, RemovalFailed) else str(exc)])
        raise typer.Exit(1) from None
    if result is None:
        console.print(
            f"the removal of pool {pool} goes on: run levers9 pool remove --pool {pool} again"
            " to see its result",
            highlight=False,
        )
        return
    console.print(
        f"pool {pool} removed: schedule {'deleted' if result.schedule_deleted else 'was gone'},"
        f" {len(result.workers_ended)} worker records ended, {len(result.machines_ended)}"
        f" machine records ended, {result.jobs_deleted} worker Jobs deleted"
        + (", namespace deleted" if result.namespace_deleted else ""),
        highlight=False,
    )
    if result.note:
        console.print(result.note, highlight=False)
