"""`levers9 machine list`: the nodes of each pool and what they offer (through the gateway with
any token, else from Temporal: levers9.cli.pool_reads)."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from levers9.cli.gateway_api import GatewayRefused, GatewayUnavailable
from levers9.cli.output import Output, fail, render
from levers9.cli.pool_reads import list_machines
from levers9.cli.runtime import settings_from_env
from levers9.contract import DNS_LABEL

app = typer.Typer(help="Machines: the pool's nodes, sized by what their neighbours leave.")

COLUMNS = [
    ("pool", "POOL"),
    ("node", "NODE"),
    ("gpu_type", "GPU TYPE"),
    ("gpus", "GPUS FREE/TOTAL"),
    ("cpu", "CPU FREE"),
    ("memory", "MEMORY FREE"),
    ("workers", "WORKERS"),
    ("status", "STATUS"),
]


def _gib(amount: int) -> str:
    return f"{amount / 2**30:.1f}Gi"


@app.command("list")
def list_(
    pool: Annotated[str | None, typer.Option("--pool", help="only this pool")] = None,
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
) -> None:
    """List machines: cards total and free, CPU and memory free, workers, status."""
    if pool is not None and not DNS_LABEL.fullmatch(pool):
        raise typer.BadParameter(
            f"{pool!r} is not a pool name (lowercase DNS label)", param_hint="--pool"
        )
    try:
        records = asyncio.run(list_machines(settings_from_env(), pool))
    except (GatewayRefused, GatewayUnavailable) as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None
    if output is Output.json:
        render([r.model_dump(mode="json") for r in records], COLUMNS, output)
        return
    rows = [
        {
            "pool": r.pool_name,
            "node": r.node_name,
            "gpu_type": r.gpu_type or "",
            "gpus": f"{r.free_gpus}/{r.total_gpus}",
            "cpu": f"{r.free_cpu_millis / 1000:g}",
            "memory": _gib(r.free_memory_bytes),
            "workers": ",".join(r.workers),
            "status": r.status,
        }
        for r in records
    ]
    render(rows, COLUMNS, output, title="machines")
