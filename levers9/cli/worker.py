"""`levers9 worker list`: worker records, pending -> available -> stopped or expired."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated

import typer

from levers9.cli.output import Output, ago, render
from levers9.cli.runtime import settings_from_env
from levers9.contract import DNS_LABEL
from levers9.records.listing import list_worker_records

app = typer.Typer(help="Workers: the privileged Jobs that took every free card of a machine.")

COLUMNS = [
    ("worker_id", "ID"),
    ("pool", "POOL"),
    ("node", "NODE"),
    ("gpus", "CARDS"),
    ("state", "STATE"),
    ("age", "AGE"),
    ("last_heartbeat", "LAST HEARTBEAT"),
    ("address", "ADDRESS"),
    ("note", "CONDITION / REASON"),
]


@app.command("list")
def list_(
    pool: Annotated[str | None, typer.Option("--pool", help="only this pool")] = None,
    all_: Annotated[bool, typer.Option("--all", help="ended records too")] = False,
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
) -> None:
    """List workers: id, pool, node, cards, state, age, last heartbeat, address."""
    if pool is not None and not DNS_LABEL.fullmatch(pool):
        raise typer.BadParameter(
            f"{pool!r} is not a pool name (lowercase DNS label)", param_hint="--pool"
        )
    records = asyncio.run(list_worker_records(settings_from_env(), pool, all_))
    if output is Output.json:
        render([r.model_dump(mode="json") for r in records], COLUMNS, output)
        return
    now = datetime.now(UTC)
    rows = [
        {
            "worker_id": r.worker_id,
            "pool": r.pool_name,
            "node": r.node_name,
            "gpus": r.gpus,
            "state": r.state,
            "age": ago(r.created_at, now),
            "last_heartbeat": ago(r.last_heartbeat, now) + (" ago" if r.last_heartbeat else ""),
            "address": r.address or "",
            "note": r.condition or r.reason or "",
        }
        for r in records
    ]
    render(rows, COLUMNS, output, title="workers")
