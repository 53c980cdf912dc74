"""`levers9 box ...`: a workspace's boxes, long-lived tasks with a shell, published ports and a
home on a disk or a volume, through the gateway's Boxes service with the command's token.

`box exec` and `box shell` are `levers9 exec` (without and with a terminal) on the box's running
task; `box ports` prints each published port's URL on the endpoints' front and the
`levers9 port-forward` line; `box ssh-proxy` carries stdin and stdout to the box's port 22
(OpenSSH's `ProxyCommand`). Each of them tells the box of a use (`--idle-stop`).

`box stop` checkpoints the box's task where its worker can (`--runtime runsc`) and `box start`
restores its processes; elsewhere the processes start fresh and the home's files are kept. With
`--checkpoints VOLUME` the image is kept in that volume of the workspace and the restore runs on
any machine of the pool; without, on the node that took it (docs/checkpoint.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from levers9.cli.gateway_api import (
    CALL_TIMEOUT_S,
    GatewayRefused,
    GatewayUnavailable,
)
from levers9.cli.output import Output, ago, console, fail, render
from levers9.cli.pool_choice import chosen_pool
from levers9.cli.runtime import identity_from_env, settings_from_env
from levers9.cli.service_call import call_service
from levers9.contract import task_input_problem, task_runtime_problem
from levers9.core.boxes import box_name_problem, idle_stop_problem, parse_duration
from levers9.core.storage import TaskMount
from levers9.gateway.convert import MAX_GPUS
from levers9.models import TaskInput
from levers9.proto import boxes_pb2, boxes_pb2_grpc
from levers9.task_wire import submit_request

if TYPE_CHECKING:
    from levers9.proto.boxes_pb2_grpc import BoxesAsyncStub as Stub

app = typer.Typer(
    help="Boxes: a workspace's long-lived machines with a shell, ports and a home that stays.",
    no_args_is_help=True,
)

T = TypeVar("T")
COLUMNS = [
    ("name", "NAME"),
    ("workspace", "WORKSPACE"),
    ("state", "STATE"),
    ("task", "TASK"),
    ("task_state", "TASK STATE"),
    ("node", "MACHINE"),
    ("gpus", "CARDS"),
    ("ports", "PORTS"),
    ("age", "AGE"),
]
SHELL = ("sh", "-c", "if command -v bash >/dev/null; then exec bash -l; else exec sh -l; fi")
WorkspaceOption = Annotated[
    str,
    typer.Option(
        "--workspace", help="the operator's: the workspace (default: default; a token's own)"
    ),
]


def _call(call: Callable[[Stub, tuple[tuple[str, str]]], Awaitable[T]]) -> T:
    """One call to the gateway's Boxes service; its refusal printed, exit status 1."""
    return call_service(boxes_pb2_grpc.BoxesStub, call)


def _name(name: str) -> str:
    problem = box_name_problem(name)
    if problem is not None:
        raise typer.BadParameter(problem, param_hint="NAME")
    return name


def _ports(box: boxes_pb2.Box) -> list[int]:
    return list(box.task.task.ports)


def _row(box: boxes_pb2.Box, now: datetime) -> dict[str, object]:
    created = box.created_at.ToDatetime(tzinfo=UTC)
    used = box.last_used_at.ToDatetime(tzinfo=UTC) if box.HasField("last_used_at") else None
    return {
        "name": box.name,
        "workspace": box.workspace,
        "state": box.state,
        "reason": box.reason or None,
        "task": box.task_id or "-",
        "task_state": box.task_state or "-",
        "node": box.node_name or "-",
        "pool": box.task.pool_name,
        "gpus": box.task.gpus,
        "image": box.task.task.image,
        "command": list(box.task.task.command),
        "ports": ",".join(map(str, _ports(box))) or "-",
        "mounts": [f"{m.kind} {m.name}:{m.path}" for m in box.task.task.mounts],
        "runtime": box.task.task.runtime,
        "checkpoints": box.task.task.checkpoint_volume or None,
        "idle_stop_seconds": box.idle_stop_seconds,
        "starts": box.starts,
        "created_at": created.isoformat(),
        "last_used_at": used.isoformat() if used is not None else None,
        "age": ago(created, now),
    }


def _mounts(kind: str, given: list[str]) -> tuple[TaskMount, ...]:
    from levers9.cli.task import _mounts as mounts

    return mounts(kind, given)


@app.command()
def create(
    name: str,
    command: Annotated[
        list[str] | None,
        typer.Argument(help="its command, after -- (default: one that keeps it up)"),
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option("--gpus", min=0, max=MAX_GPUS, help="cards (default 1; 0 with runsc)"),
    ] = None,
    image: Annotated[str, typer.Option("--image", help="container image")] = "",
    port: Annotated[
        list[int] | None,
        typer.Option("--port", min=1, max=65535, help="a port to publish (box ports)"),
    ] = None,
    disk: Annotated[
        list[str] | None, typer.Option("--disk", help="NAME:/home: its home on a disk")
    ] = None,
    volume: Annotated[
        list[str] | None, typer.Option("--volume", help="NAME:/home: its home on a volume")
    ] = None,
    idle_stop: Annotated[
        str, typer.Option("--idle-stop", help="stop it after this long unused, e.g. 2h")
    ] = "",
    checkpoints: Annotated[
        str,
        typer.Option(
            "--checkpoints",
            help="a volume of the workspace to keep its checkpoints in: box start then"
            " restores it on any machine of the pool (default: on the one that took it)",
        ),
    ] = "",
    runtime: Annotated[str, typer.Option("--runtime", help="runc, or runsc (gVisor)")] = "",
    pool: Annotated[str | None, typer.Option("--pool", help="its pool (default: as run)")] = None,
    memory: Annotated[str, typer.Option("--memory", help="memory limit, e.g. 8Gi")] = "",
    cpus: Annotated[str, typer.Option("--cpus", help="CPU limit, e.g. 4")] = "",
    workspace: WorkspaceOption = "",
) -> None:
    """Create a box: its task starts at once and runs until box stop (or --idle-stop)."""
    from levers9.cli.task import _ports as ports_of
    from levers9.cli.task import _quantity

    if command:
        refused = task_input_problem(command, {})
        if refused is not None:
            raise typer.BadParameter(refused, param_hint="COMMAND")
    refused = task_runtime_problem(runtime)
    if refused is not None:
        raise typer.BadParameter(refused, param_hint="--runtime")
    idle_s = 0
    if idle_stop:
        try:
            idle_s = parse_duration(idle_stop)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--idle-stop") from None
        problem = idle_stop_problem(idle_s)
        if problem is not None:
            raise typer.BadParameter(problem, param_hint="--idle-stop")
    settings = settings_from_env()
    task = TaskInput(
        task_id=f"{_name(name)}-0",
        pool_name=chosen_pool(settings, pool),
        command=tuple(command or ()),
        gpus=gpus if gpus is not None else (0 if runtime == "runsc" else 1),
        image=image,
        memory_bytes=_quantity("--memory", memory, bytes_=True),
        cpu_millis=_quantity("--cpus", cpus, bytes_=False),
        ports=ports_of(port or []),
        runtime=runtime,
        mounts=_mounts("volume", volume or []) + _mounts("disk", disk or []),
        checkpoint_volume=checkpoints,
    )
    request = boxes_pb2.CreateBoxRequest(
        name=name, workspace=workspace, task=submit_request(task), idle_stop_seconds=idle_s
    )
    reply = _call(lambda stub, md: stub.CreateBox(request, metadata=md, timeout=CALL_TIMEOUT_S))
    box = reply.box
    home = ", ".join(f"{m.kind} {m.name} at {m.path}" for m in box.task.task.mounts) or "none"
    console.print(
        f"box {box.name} created in workspace {box.workspace} on pool {box.task.pool_name}"
        f" (home: {home}); levers9 box get {box.name} follows its task, levers9 box shell"
        f" {box.name} opens a shell once it runs",
        highlight=False,
    )


@app.command("list")
def list_(
    output: Annotated[Output, typer.Option("--output", "-o")] = Output.table,
    workspace: WorkspaceOption = "",
) -> None:
    """The boxes (a workspace token's: its own)."""
    request = boxes_pb2.ListBoxesRequest(workspace=workspace)
    reply = _call(lambda stub, md: stub.ListBoxes(request, metadata=md, timeout=CALL_TIMEOUT_S))
    now = datetime.now(UTC)
    rows = [_row(b, now) for b in reply.boxes]
    if output is Output.json:
        for row in rows:
            row.pop("age")
    render(rows, COLUMNS, output, title="boxes")


def _get(name: str, workspace: str) -> boxes_pb2.Box:
    request = boxes_pb2.GetBoxRequest(name=_name(name), workspace=workspace)
    reply = _call(lambda stub, md: stub.GetBox(request, metadata=md, timeout=CALL_TIMEOUT_S))
    return reply.box


@app.command()
def get(
    name: str,
    output: Annotated[Output, typer.Option("--output", "-o")] = Output.table,
    workspace: WorkspaceOption = "",
) -> None:
    """One box: its state, its task, its ports, its home and its events."""
    box = _get(name, workspace)
    row = _row(box, datetime.now(UTC))
    row["events"] = [
        {"at": e.at.ToDatetime(tzinfo=UTC).isoformat(), "kind": e.kind, "message": e.message}
        for e in box.events
    ]
    if output is Output.json:
        row.pop("age")
        console.print(json.dumps(row, indent=2), highlight=False, soft_wrap=True)
        return
    for key in ("name", "workspace", "state", "reason", "task", "task_state", "node", "pool"):
        if row[key] is not None:
            console.print(f"{key}: {row[key]}", highlight=False, soft_wrap=True)
    console.print(
        f"gpus: {row['gpus']}  ports: {row['ports']}  image: {row['image'] or '(pool default)'}"
        f"  runtime: {row['runtime'] or '(pool default)'}",
        highlight=False,
    )
    console.print(f"home: {', '.join(box_mounts(box)) or 'none'}", highlight=False)
    volume = box.task.task.checkpoint_volume
    console.print(
        f"checkpoints: volume {volume} (restored on any machine of the pool)"
        if volume
        else "checkpoints: on the node that takes them (restored there; --checkpoints VOLUME"
        " at create keeps them in a volume)",
        highlight=False,
    )
    if box.idle_stop_seconds:
        console.print(
            f"idle-stop: {box.idle_stop_seconds} s (last used: {row['last_used_at'] or 'never'})",
            highlight=False,
        )
    for event in row["events"]:  # type: ignore[attr-defined]
        console.print(f"  {event['at']} {event['kind']}: {event['message']}", highlight=False)


def box_mounts(box: boxes_pb2.Box) -> list[str]:
    return [f"{m.kind} {m.name} at {m.path}" for m in box.task.task.mounts]


@app.command()
def delete(name: str, workspace: WorkspaceOption = "") -> None:
    """Delete a box: its task is stopped and its checkpoint images removed (its disk or volume
    stays)."""
    request = boxes_pb2.DeleteBoxRequest(name=_name(name), workspace=workspace)
    # The box's record removes its checkpoint images (from their node and volume) first.
    reply = _call(
        lambda stub, md: stub.DeleteBox(request, metadata=md, timeout=CALL_TIMEOUT_S * 12)
    )
    console.print(
        f"box {reply.box.name} deleted: its task {reply.box.task_id or '-'} is stopped",
        highlight=False,
    )
    for event in reply.box.events:
        if event.kind == "delete-checkpoint":
            console.print(f"  {event.message}", highlight=False, soft_wrap=True)


@app.command()
def stop(name: str, workspace: WorkspaceOption = "") -> None:
    """Stop a box's task; box start starts it again with the same home."""
    request = boxes_pb2.StopBoxRequest(name=_name(name), workspace=workspace)
    reply = _call(lambda stub, md: stub.StopBox(request, metadata=md, timeout=CALL_TIMEOUT_S * 2))
    console.print(f"box {reply.box.name} stopped ({reply.box.reason})", highlight=False)


@app.command()
def start(
    name: str,
    workspace: WorkspaceOption = "",
    elsewhere: Annotated[
        bool,
        typer.Option(
            "--elsewhere",
            help="restore its checkpoint (kept in its --checkpoints volume) on another machine"
            " than the one that took it",
        ),
    ] = False,
) -> None:
    """Start a stopped box: a new task with the same command, ports and home."""
    request = boxes_pb2.StartBoxRequest(name=_name(name), workspace=workspace, elsewhere=elsewhere)
    reply = _call(lambda stub, md: stub.StartBox(request, metadata=md, timeout=CALL_TIMEOUT_S * 2))
    started = [e.message for e in reply.box.events if e.kind == "start"]
    fresh = not started or "restored from checkpoint" not in started[-1]
    processes = "its processes start fresh: no checkpoint" if fresh else started[-1]
    console.print(
        f"box {reply.box.name} starting: task {reply.box.task_id} ({processes};"
        f" home: {', '.join(box_mounts(reply.box)) or 'none'})",
        highlight=False,
    )


def _use(name: str, workspace: str, use: str) -> boxes_pb2.Box:
    """The box, running, told of a use; its refusal printed, exit status 1."""
    request = boxes_pb2.UseBoxRequest(name=_name(name), workspace=workspace, use=use)
    return _call(lambda stub, md: stub.UseBox(request, metadata=md, timeout=CALL_TIMEOUT_S)).box


@app.command("exec")
def exec_(
    name: str,
    command: Annotated[list[str], typer.Argument(help="the command, after --")],
    interactive: Annotated[
        bool, typer.Option("--interactive", "-i", help="pass this command's stdin on")
    ] = False,
    tty: Annotated[bool, typer.Option("--tty", "-t", help="give it a terminal")] = False,
    workspace: WorkspaceOption = "",
) -> None:
    """Run CMD in the box: its output, then its exit code as ours."""
    from levers9.cli.task_exec import exec_ as task_exec

    box = _use(name, workspace, "exec")
    task_exec(box.task_id, command, interactive, tty)


@app.command()
def shell(
    name: str,
    workspace: WorkspaceOption = "",
) -> None:
    """An interactive shell in the box (bash when it has one), with its exit status."""
    from levers9.cli.task_exec import exec_ as task_exec

    box = _use(name, workspace, "shell")
    task_exec(box.task_id, list(SHELL), True, True)


@app.command()
def ports(name: str, workspace: WorkspaceOption = "") -> None:
    """Each published port's URL on the endpoints' front, and the port-forward line."""
    from levers9.cli.endpoint import curl_lines
    from levers9.gateway.box_front import box_url

    identity = identity_from_env()
    box = _use(name, workspace, "ports")
    if not _ports(box):
        console.print(
            f"box {box.name} publishes no port: create it with --port 8888", highlight=False
        )
        return
    for port in _ports(box):
        url = box_url(identity.settings.endpoints_base_url(), box.workspace, box.name, port)
        console.print(f"{port}: {url}", highlight=False)
        for line in curl_lines(identity, url, public=False, wait_s=60):
            console.print(f"  {line}", highlight=False, soft_wrap=True)
        console.print(f"  levers9 port-forward {box.task_id} :{port}", highlight=False)


@app.command("ssh-proxy")
def ssh_proxy(
    name: str,
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="the box's sshd")] = 22,
    workspace: WorkspaceOption = "",
) -> None:
    """Carry stdin/stdout to the box's sshd: ProxyCommand levers9 box ssh-proxy %h."""
    box = _use(name, workspace, "ssh")
    if port not in _ports(box):
        fail([f"box {box.name} does not publish port {port}: create it with --port {port}"])
        raise typer.Exit(1)
    try:
        asyncio.run(_bridge(box.task_id, port))
    except (GatewayRefused, GatewayUnavailable) as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None


async def _bridge(task_id: str, port: int) -> None:
    """stdin to the box's port and its answer to stdout, until either side ends."""
    from levers9.cli import gateway_api

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(sys.stdin.fileno(), "rb", 0)
    )
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(sys.stdout.fileno(), "wb", 0)
    )
    writer = asyncio.StreamWriter(transport, protocol, None, loop)
    async with gateway_api.port_forwarder(settings_from_env(), task_id, port) as forward:
        await forward(reader, writer)
    writer.close()
