"""`levers9 disk ...`: a workspace's durable disks, size-limited filesystems on one machine's
`durableDisksPath` (`levers9 run --disk NAME:/data` mounts one; the task runs on its machine),
through the gateway's Disks service with the command's token.

`disk create` takes its size as `--memory` does (`64Mi`, `50Gi`) and says which machine the
controlplane chose and why; `disk list` shows each disk's machine, size, use (once its agent
reports it) and state (`lost` once its node has left the pool).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from levers9.cli.gateway_api import (
    CALL_TIMEOUT_S,
    GatewayRefused,
    GatewayUnavailable,
    gateway_stub,
)
from levers9.cli.output import Output, ago, console, fail, render
from levers9.cli.pool_choice import chosen_pool
from levers9.cli.runtime import settings_from_env
from levers9.core.disks import DiskView, disk_name_problem, parse_disk_size
from levers9.core.quantity import binary_text
from levers9.disk_wire import disk_from_message
from levers9.proto import disks_pb2, disks_pb2_grpc

if TYPE_CHECKING:
    from levers9.proto.disks_pb2_grpc import DisksAsyncStub as Stub

app = typer.Typer(
    help="Disks: a workspace's durable filesystems on one machine, which pin its tasks there.",
    no_args_is_help=True,
)

T = TypeVar("T")
COLUMNS = [
    ("name", "NAME"),
    ("workspace", "WORKSPACE"),
    ("pool", "POOL"),
    ("machine", "MACHINE"),
    ("size", "SIZE"),
    ("used", "USED"),
    ("state", "STATE"),
    ("age", "AGE"),
]
WorkspaceOption = Annotated[
    str,
    typer.Option(
        "--workspace", help="the operator's: the workspace (default: default; a token's own)"
    ),
]


def _call(call: Callable[[Stub, tuple[tuple[str, str]]], Awaitable[T]]) -> T:
    """One call to the gateway's Disks service; its refusal printed, exit status 1."""

    async def run() -> T:
        async with gateway_stub(settings_from_env(), disks_pb2_grpc.DisksStub) as (
            stub,
            metadata,
        ):
            return await call(stub, metadata)

    try:
        return asyncio.run(run())
    except (GatewayRefused, GatewayUnavailable) as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None


def _name(name: str) -> str:
    problem = disk_name_problem(name)
    if problem is not None:
        raise typer.BadParameter(problem, param_hint="NAME")
    return name


def _row(view: DiskView, now: datetime) -> dict[str, object]:
    disk = view.disk
    return {
        "name": disk.name,
        "workspace": disk.workspace,
        "pool": disk.pool_name,
        "machine": disk.node_name,
        "disk_id": disk.disk_id,
        "size": binary_text(disk.size_bytes),
        "size_bytes": disk.size_bytes,
        "used": binary_text(disk.used_bytes) if disk.used_bytes is not None else "-",
        "used_bytes": disk.used_bytes,
        "state": view.state,
        "reason": view.reason or None,
        "created_at": disk.created_at.isoformat(),
        "age": ago(disk.created_at, now),
    }


def _show(views: list[DiskView], output: Output, title: str) -> None:
    now = datetime.now(UTC)
    rows = [_row(v, now) for v in views]
    if output is Output.json:
        for row in rows:
            row.pop("age")
    render(rows, COLUMNS, output, title=title)


@app.command()
def create(
    name: str,
    size: Annotated[str, typer.Option("--size", help="its size, e.g. 64Mi or 50Gi")],
    pool: Annotated[
        str | None,
        typer.Option("--pool", help="the pool whose machine holds it (default: as levers9 run)"),
    ] = None,
    workspace: WorkspaceOption = "",
) -> None:
    """Create a disk on a machine of the pool (the controlplane chooses it and says why)."""
    try:
        size_bytes = parse_disk_size(size)
    except ValueError as exc:
        said = str(exc).removeprefix("--size: ").removeprefix("--size ")
        raise typer.BadParameter(said, param_hint="--size") from None
    request = disks_pb2.CreateDiskRequest(
        name=_name(name),
        size_bytes=size_bytes,
        pool_name=chosen_pool(settings_from_env(), pool),
        workspace=workspace,
    )
    reply = _call(lambda stub, md: stub.CreateDisk(request, metadata=md, timeout=CALL_TIMEOUT_S))
    made = disk_from_message(reply.disk).disk
    console.print(
        f"disk {made.name} created in workspace {made.workspace}: {binary_text(made.size_bytes)}"
        f" on machine {made.node_name} of pool {made.pool_name} ({made.chosen}); mount it with"
        f" levers9 run --pool {made.pool_name} --disk {made.name}:/data -- ...",
        highlight=False,
    )


@app.command("list")
def list_(
    workspace: WorkspaceOption = "",
    pool: Annotated[str, typer.Option("--pool", help="only this pool's disks")] = "",
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
) -> None:
    """The workspace's disks (the operator's: every workspace's unless it names one)."""
    request = disks_pb2.ListDisksRequest(workspace=workspace, pool_name=pool)
    reply = _call(lambda stub, md: stub.ListDisks(request, metadata=md, timeout=CALL_TIMEOUT_S))
    _show([disk_from_message(d) for d in reply.disks], output, "disks")


@app.command()
def get(
    name: str,
    workspace: WorkspaceOption = "",
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
) -> None:
    """One disk: its machine, size, use and state (and why, when lost)."""
    request = disks_pb2.GetDiskRequest(name=_name(name), workspace=workspace)
    reply = _call(lambda stub, md: stub.GetDisk(request, metadata=md, timeout=CALL_TIMEOUT_S))
    view = disk_from_message(reply.disk)
    if output is Output.json:
        row = _row(view, datetime.now(UTC))
        row.pop("age")
        console.print_json(json.dumps(row))
        return
    _show([view], output, f"disk {name}")
    if view.reason:
        console.print(f"reason: {view.reason}", highlight=False)
    if view.disk.chosen:
        console.print(f"machine chosen: {view.disk.chosen}", highlight=False)


@app.command()
def delete(name: str, workspace: WorkspaceOption = "") -> None:
    """Delete a disk: its record, and its file on its node (refused while a task uses it)."""
    request = disks_pb2.DeleteDiskRequest(name=_name(name), workspace=workspace)
    reply = _call(lambda stub, md: stub.DeleteDisk(request, metadata=md, timeout=CALL_TIMEOUT_S))
    said = reply.file or ("its file removed" if reply.file_removed else "its file stays")
    console.print(f"disk {name} deleted: {said}", highlight=False)
