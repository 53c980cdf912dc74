"""`levers9 disk ...`: a workspace's durable disks, size-limited filesystems on one machine's
`durableDisksPath` (`levers9 run --disk NAME:/data` mounts one; the task runs on its machine),
through the gateway's Disks service with the command's token.

`disk create` takes its size as `--memory` does (`64Mi`, `50Gi`) and says which machine the
controlplane chose and why; `disk list` shows each disk's machine, size, use (once its agent
reports it) and state (`lost` once its node has left the pool).

`disk snapshot NAME --to VOLUME[/PATH]` copies a disk into a workspace volume, and `disk create
NAME --from VOLUME/PATH` makes a disk and copies that back into it (so that a node lost is not
data lost). Each copy is a task of the caller's workspace on the disk's machine, submitted with
the command's token like `levers9 run` (`copy_script` is what it runs: tar from one
mount to the other), followed to its end with its output shown as it goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, TypeVar

import grpc
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
from levers9.cli.service_call import call_service
from levers9.cli.task import DEADLINE_EXIT, submit_and_follow
from levers9.cli.task_access import answered, tasks_for
from levers9.config import ControlplaneSettings
from levers9.core import volumes as volume_names
from levers9.core.disks import DiskView, disk_name_problem, parse_disk_size
from levers9.core.quantity import binary_text
from levers9.core.storage import TaskMount
from levers9.disk_wire import disk_from_message
from levers9.models import TERMINAL, TaskInput, TaskRecord, new_task_id
from levers9.proto import disks_pb2, disks_pb2_grpc, volumes_pb2, volumes_pb2_grpc

if TYPE_CHECKING:
    from levers9.proto.disks_pb2_grpc import DisksAsyncStub as Stub
    from levers9.proto.volumes_pb2_grpc import VolumesAsyncStub

app = typer.Typer(
    help="Disks: a workspace's durable filesystems on one machine, which pin its tasks there.",
    no_args_is_help=True,
)

T = TypeVar("T")
COPY_WAIT_S = 3600.0
"""How long `disk snapshot` and `disk create --from` follow their copy by default."""
WATCH_S = 2.0
"""How often a copy's record is read for why it waits (a disk another task holds, say)."""
RELEASE_TRIES = 15
"""How often a failed `create --from` asks to delete its disk while the copy still holds it."""
_SEGMENT = re.compile(r"[A-Za-z0-9._@+=-]{1,255}")
_DONE = re.compile(r"^levers9-copy: done files=(\d+) bytes=(\d+)$", re.MULTILINE)
_SAID = re.compile(r"^levers9-copy: (?:failed|refused): (.+)$", re.MULTILINE)
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
    return call_service(disks_pb2_grpc.DisksStub, call)


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
    from_: Annotated[
        str,
        typer.Option(
            "--from",
            help="VOLUME/PATH: fill it with what `disk snapshot` copied there (a task on its"
            " machine)",
        ),
    ] = "",
    wait: Annotated[
        float, typer.Option("--wait", min=0, help="seconds to follow the copy (--from)")
    ] = COPY_WAIT_S,
) -> None:
    """Create a disk on a machine of the pool (the controlplane chooses it and says why).

    With --from, a copy of the volume's PATH into it follows (a task on its machine); if that
    fails, the disk is deleted again."""
    try:
        size_bytes = parse_disk_size(size)
    except ValueError as exc:
        said = str(exc).removeprefix("--size: ").removeprefix("--size ")
        raise typer.BadParameter(said, param_hint="--size") from None
    source: tuple[str, str] | None = None
    bucket = ""
    if from_:
        if workspace:
            raise typer.BadParameter(
                "the copy is a task of the token's own workspace: use that workspace's token",
                param_hint="--workspace",
            )
        source = _volume_path(from_, "--from", required=True)
        bucket = _volume_bucket(source[0])  # a missing volume: said before a disk is made
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
    if source is not None:
        _restore(made.name, made.pool_name, source, bucket, wait, size)


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


def _volume_path(given: str, option: str, *, required: bool) -> tuple[str, str]:
    """`VOLUME[/PATH]` as (volume, path), the path relative and normalized ("" none);
    BadParameter naming `option` for a bad name, a path with . or .., or none when required."""
    volume, _, path = given.partition("/")
    problem = volume_names.name_problem(volume)
    if problem is not None:
        raise typer.BadParameter(f"{given!r}: the volume's name: {problem}", param_hint=option)
    parts = [part for part in path.split("/") if part]
    for part in parts:
        if part in (".", "..") or not _SEGMENT.fullmatch(part):
            raise typer.BadParameter(
                f"{given!r}: the path's parts are letters, digits and . _ @ + = -, never . or ..",
                param_hint=option,
            )
    if required and not parts:
        raise typer.BadParameter(
            f"{given!r}: give VOLUME/PATH, the path `disk snapshot` copied to", param_hint=option
        )
    return volume, "/".join(parts)


def _volume_bucket(volume: str) -> str:
    """The volume's `s3://BUCKET[/PREFIX]` (the caller's workspace's); its refusal (no such
    volume) printed, exit status 1."""

    async def bucket(stub: VolumesAsyncStub, metadata: tuple[tuple[str, str]]) -> str:
        request = volumes_pb2.GetVolumeRequest(name=volume)
        reply = await stub.GetVolume(request, metadata=metadata, timeout=CALL_TIMEOUT_S)
        return str(reply.volume.bucket)

    return call_service(volumes_pb2_grpc.VolumesStub, bucket)


def _objects(bucket: str, path: str) -> str:
    """Where a volume's `path` is in its bucket: `s3://BUCKET/PREFIX/PATH/`."""
    return "/".join(p for p in (bucket.rstrip("/"), path) if p) + "/"


def copy_script(source: str, target: str, what: str, *, fresh_target: bool) -> str:
    """The shell a copy task runs: counts the source's files (`lost+found` aside), copies
    them with tar (its progress every 25 MiB), counts what arrived, and ends with one line the
    command reads: `levers9-copy: done files=N bytes=B`, or `levers9-copy: failed: WHY` (or
    `refused:`) with a non-zero status. `fresh_target`: refuse a target that holds files (a
    snapshot never mixes with an earlier one). Needs sh, GNU tar and GNU find, as Debian's and
    Ubuntu's images have them."""
    src, dst = shlex.quote(source), shlex.quote(target)
    said = shlex.quote(what)
    fresh = (
        f'if [ -n "$(ls -A {dst} 2>/dev/null)" ]; then'
        f' echo "levers9-copy: refused: "{said}" already holds files: choose another path";'
        " exit 3; fi\n"
        if fresh_target
        else ""
    )
    return (
        "set -u\n"
        f'if [ ! -d {src} ] || [ -z "$(ls -A {src} 2>/dev/null)" ]; then'
        f' echo "levers9-copy: failed: nothing to copy at "{said}; exit 3; fi\n'
        + fresh
        + f'mkdir -p {dst} || {{ echo "levers9-copy: failed: cannot make the target of "{said};'
        " exit 4; }\n"
        "count() { find . -path ./lost+found -prune -o -type f -printf '%s\\n' |"
        ' { n=0; b=0; while read -r s; do n=$((n+1)); b=$((b+s)); done; echo "$n $b"; }; }\n'
        f"set -- $(cd {src} && count)\n"
        'echo "levers9-copy: copying $1 files, $2 bytes: "' + said + "\n"
        "status=/tmp/levers9-copy.$$\n"
        f"{{ tar -C {src} --exclude=./lost+found -cf - --checkpoint=2560"
        " --checkpoint-action='echo=copied %{}T' .; echo $? > \"$status\"; } |"
        f" tar -C {dst} --no-same-owner -xf -\n"
        'unpacked=$?; packed=$(cat "$status"); rm -f "$status"\n'
        'if [ "$packed" != 0 ] || [ "$unpacked" != 0 ]; then'
        ' echo "levers9-copy: failed: tar ended with status $packed reading, $unpacked writing'
        ' (its errors above)"; exit 5; fi\n'
        f"set -- $1 $2 $(cd {dst} && count)\n"
        'if [ "$3" -lt "$1" ]; then echo "levers9-copy: failed: $1 files read, $3 found after'
        ' the copy"; exit 6; fi\n'
        'echo "levers9-copy: done files=$1 bytes=$2"\n'
    )


async def _follow(
    settings: ControlplaneSettings, task: TaskInput, wait_s: float
) -> TaskRecord | None:
    """Submits the copy and follows it as `levers9 run` does (its output streamed), saying
    why it waits while it is queued (the disk held by another task, say)."""
    said = ""

    async def watch() -> None:
        nonlocal said
        tasks = tasks_for(settings)
        while True:
            await asyncio.sleep(WATCH_S)
            with contextlib.suppress(Exception):  # the follow itself says what fails
                record = await tasks.record(task.task_id)
                if record is None or record.state in TERMINAL:
                    continue
                spot = record.queue
                reason = spot.reason if spot is not None and record.state == "queued" else ""
                if reason and reason != said:
                    console.print(f"the copy waits: {reason}", highlight=False)
                said = reason

    watcher = asyncio.create_task(watch())
    try:
        return await submit_and_follow(settings, task, wait_s, True)
    finally:
        watcher.cancel()


def _copy(
    task: TaskInput, what: str, wait_s: float, on_failure: Callable[[str, bool], None]
) -> tuple[int, int]:
    """Runs the copy task to its end: (files, bytes) once it succeeded; `on_failure(why,
    started)` else (`started`: it may have copied part), then exit status 1 (still running
    at the deadline: said, DEADLINE_EXIT)."""
    settings = settings_from_env()
    try:
        record = answered(_follow(settings, task, wait_s))
    except KeyboardInterrupt:
        console.print(
            f"{what} goes on as task {task.task_id}: levers9 task logs {task.task_id} follows"
            f" it, levers9 task cancel {task.task_id} stops it",
            highlight=False,
        )
        raise typer.Exit(130) from None
    if record is None:
        console.print(
            f"DEADLINE_EXCEEDED: {what} goes on as task {task.task_id}: levers9 task get"
            f" {task.task_id} says how it ended, levers9 task cancel {task.task_id} stops it",
            highlight=False,
        )
        raise typer.Exit(DEADLINE_EXIT)
    done = _DONE.search(record.log_tail)
    if record.state == "succeeded" and done is not None:
        return int(done[1]), int(done[2])
    reasons = _SAID.findall(record.log_tail)
    why = (
        reasons[-1]
        if reasons
        else record.reason
        or (f"exit code {record.exit_code}" if record.exit_code is not None else record.state)
    )
    # It never ran (a volume refused at its start), or stopped at a check before the copy.
    before = ("nothing to copy at", "cannot make the target of", "already holds files")
    started = record.exit_code is not None and not (
        reasons and any(said in reasons[-1] for said in before)
    )
    on_failure(f"{why} (task {task.task_id} {record.state})", started)
    raise typer.Exit(1)


def _copy_task(
    pool_name: str, disk: str, volume: str, script: str, *, to_volume: bool
) -> TaskInput:
    """The copy's task: no cards, the disk at /disk, the volume at /volume (read-only when the
    copy reads it), `script` (`copy_script`) run by sh."""
    return TaskInput(
        task_id=new_task_id(),
        pool_name=pool_name,
        command=("sh", "-c", script),
        gpus=0,
        mounts=(
            TaskMount(kind="disk", name=disk, path="/disk"),
            TaskMount(kind="volume", name=volume, path="/volume", read_only=not to_volume),
        ),
    )


@app.command()
def snapshot(
    name: str,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="VOLUME/PATH: the workspace's volume and a new path there (VOLUME alone:"
            " snapshots/NAME/<UTC time>)",
        ),
    ],
    wait: Annotated[
        float, typer.Option("--wait", min=0, help="seconds this command follows the copy")
    ] = COPY_WAIT_S,
) -> None:
    """Copy a disk's files into a volume's bucket (a task on the disk's machine, which waits
    while another task has the disk); `disk create --from` brings them back."""
    volume, path = _volume_path(to, "--to", required=False)
    if not path:
        path = f"snapshots/{name}/{datetime.now(UTC):%Y%m%dT%H%M%SZ}"
    request = disks_pb2.GetDiskRequest(name=_name(name))
    view = disk_from_message(
        _call(lambda stub, md: stub.GetDisk(request, metadata=md, timeout=CALL_TIMEOUT_S)).disk
    )
    if view.state == "lost":
        fail([f"disk {name} is lost ({view.reason}): there is nothing left to copy"])
        raise typer.Exit(1)
    bucket = _volume_bucket(volume)
    objects = _objects(bucket, path)
    where = f"volume {volume}/{path}"
    script = copy_script("/disk", f"/volume/{path}", where, fresh_target=True)
    task = _copy_task(view.disk.pool_name, name, volume, script, to_volume=True)
    console.print(
        f"snapshot of disk {name} (machine {view.disk.node_name}) to {where} ({objects})",
        highlight=False,
    )

    def failed(why: str, started: bool) -> None:
        left = (
            f"what it copied before stays under {objects}: delete it there, or snapshot to"
            " another path"
            if started
            else "nothing was copied"
        )
        fail([f"snapshot of disk {name} failed: {why}; {left}"])

    files, size = _copy(task, f"the snapshot of disk {name}", wait, failed)
    console.print(
        f"disk {name} snapshotted to {where}: {files} files, {size} bytes"
        f" ({binary_text(size)}) under {objects}; make a disk of it with levers9 disk create"
        f" NEW --size {binary_text(view.disk.size_bytes)} --from {volume}/{path}",
        highlight=False,
    )


def _restore(
    name: str, pool_name: str, source: tuple[str, str], bucket: str, wait_s: float, size: str
) -> None:
    """The copy of `create --from` into the disk just made; on its failure the disk is
    deleted again (nothing half filled is left), and said."""
    volume, path = source
    where = f"volume {volume}/{path}"
    script = copy_script(f"/volume/{path}", "/disk", where, fresh_target=False)
    task = _copy_task(pool_name, name, volume, script, to_volume=False)
    console.print(f"copying {where} ({_objects(bucket, path)}) into disk {name}", highlight=False)

    def failed(why: str, started: bool) -> None:
        del started  # the disk goes either way
        request = disks_pb2.DeleteDiskRequest(name=name)
        try:
            asyncio.run(_delete(request))
            kept = f"disk {name} was deleted again"
        except (GatewayRefused, GatewayUnavailable) as exc:
            kept = (
                f"disk {name} stays, partly filled, as its delete failed ({exc}): delete it with"
                f" levers9 disk delete {name}"
            )
        fail(
            [
                f"the copy from {where} into disk {name} failed: {why}; {kept}; fix that, then"
                f" run levers9 disk create {name} --size {size} --pool {pool_name}"
                f" --from {volume}/{path} again"
            ]
        )

    files, copied = _copy(task, f"the copy into disk {name}", wait_s, failed)
    console.print(
        f"disk {name} filled from {where}: {files} files, {copied} bytes ({binary_text(copied)})",
        highlight=False,
    )


async def _delete(request: disks_pb2.DeleteDiskRequest) -> None:
    """Deletes the disk, asking again while the failed copy's task still holds it (its pool
    releases the disk a moment after the task's end)."""
    async with gateway_stub(settings_from_env(), disks_pb2_grpc.DisksStub) as (stub, metadata):
        disks: Stub = stub
        for _ in range(RELEASE_TRIES - 1):
            try:
                await disks.DeleteDisk(request, metadata=metadata, timeout=CALL_TIMEOUT_S)
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise
            await asyncio.sleep(WATCH_S)
        await disks.DeleteDisk(request, metadata=metadata, timeout=CALL_TIMEOUT_S)
