"""`levers9 run` and `levers9 task ...`: run a task on a pool's workers and read its record.

With an operator token (`levers9 dev up` writes one; LEVERS9_API_TOKEN[_FILE]) every call goes
to the controlplane's gateway (`levers9.cli.gateway_api`): the command loads no Temporal SDK,
and `run` waits for the task's end there instead of polling. Without a token, or when the
gateway cannot be reached, the record is read from Temporal directly, as before.

When the controlplane is down (its gateway does not answer, nor does its Temporal worker a
query within QUERY_WITHIN_S), a command says `controlplane unreachable at ...`, shows the task's
last recorded state (its workflow's memo, which Temporal holds without a worker) and exits 69.
That way to the record is `levers9.cli.task_access`'s; `levers9 exec` is `levers9.cli.task_exec`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Annotated, NoReturn, cast

import typer

from levers9.cli.gateway_api import GatewayUnavailable, stream_task_logs
from levers9.cli.output import Output, ago, console, errors, fail, render
from levers9.cli.pool_choice import chosen_pool
from levers9.cli.runtime import settings_from_env
from levers9.cli.task_access import Answer, answered, last_answer, print_last, tasks_for
from levers9.cli.unreachable import down
from levers9.config import ControlplaneSettings
from levers9.contract import DNS_LABEL, task_input_problem, task_runtime_problem
from levers9.core.placement import QUOTA
from levers9.core.storage import TaskMount, mounts_problem, parse_mount
from levers9.errors import ControlplaneUnreachable
from levers9.gateway.convert import MAX_GPUS
from levers9.models import (
    MAX_RETRIES,
    MAX_STOP_GRACE_S,
    ON_PREEMPT,
    TERMINAL,
    OnPreempt,
    TaskInput,
    TaskRecord,
    memory_floor_problem,
    new_task_id,
)

app = typer.Typer(help="Tasks: what users run on the workers, and their records.")

POLL_S = 0.5
"""How soon a record not yet known is asked for again."""
WAIT_STEP_S = 30.0
"""The longest one wait for a task's end lasts before the command asks again."""
DEADLINE_EXIT = 4
COLUMNS = [
    ("task_id", "TASK"),
    ("pool", "POOL"),
    ("state", "STATE"),
    ("gpus", "CARDS"),
    ("worker", "WORKER"),
    ("node", "NODE"),
    ("age", "AGE"),
    ("command", "COMMAND"),
]


class _LogFollower:
    """Relays the task's output from the gateway as the worker writes it. When no stream can be
    had (no operator token, gateway unreachable) it says so once and the caller prints the
    record's tail instead."""

    FINISH_S = 3.0
    """How long an ended task's stream may take to drain."""

    def __init__(self, settings: ControlplaneSettings, task_id: str) -> None:
        self.streamed = 0
        self.problem: str | None = None
        self._task = asyncio.create_task(self._relay(settings, task_id))

    async def _relay(self, settings: ControlplaneSettings, task_id: str) -> None:
        try:
            async for text in stream_task_logs(settings, task_id, follow=True):
                console.out(text, end="", highlight=False)
                self.streamed += len(text)
        except GatewayUnavailable as exc:
            self.problem = str(exc)
            lead = (
                "log stream ended" if self.streamed else "no log stream, showing the record's tail"
            )
            errors.print(f"{lead}: {exc}", highlight=False)

    @property
    def fell_back(self) -> bool:
        return self.problem is not None and self.streamed == 0

    async def finish(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._task), self.FINISH_S)
        self.cancel()

    def cancel(self) -> None:
        self._task.cancel()


async def submit_and_follow(
    settings: ControlplaneSettings,
    task: TaskInput,
    wait_s: float,
    show_logs: bool,
    submitted: list[str] | None = None,
) -> TaskRecord | None:
    """Starts the task, streams its output (the record's tail when no stream can be had) and
    waits for its end, at most `wait_s`; None when it is still running then. The task's id is
    appended to `submitted` once it is."""
    tasks = tasks_for(settings)
    await tasks.submit(task)
    if submitted is not None:
        submitted.append(task.task_id)
    image = task.image or "the pool's default (taskDefaults.image, else the worker's own)"
    console.print(
        f"task {task.task_id} submitted to pool {task.pool_name}, image {image}", highlight=False
    )
    follower = _LogFollower(settings, task.task_id) if show_logs else None
    deadline = time.monotonic() + wait_s
    shown = 0

    def show_tail(record: TaskRecord) -> None:
        nonlocal shown
        if follower is not None and follower.fell_back and len(record.log_tail) > shown:
            console.out(record.log_tail[shown:], end="", highlight=False)
            shown = len(record.log_tail)

    try:
        while True:
            remaining = deadline - time.monotonic()
            record = await tasks.record(task.task_id, min(max(remaining, 0), WAIT_STEP_S))
            if record is not None:
                show_tail(record)
            if record is not None and record.state in TERMINAL:
                if follower is not None:
                    await follower.finish()
                    show_tail(record)
                return record
            if time.monotonic() >= deadline:
                return None
            if record is None:
                await asyncio.sleep(POLL_S)
    finally:
        if follower is not None:
            follower.cancel()


def print_result(record: TaskRecord) -> None:
    console.print(
        f"task {record.task_id} {record.state}"
        + (
            f" exit_code={record.exit_code}"
            if record.exit_code is not None
            else " (never ran)"
            if record.state in TERMINAL
            else ""
        )
        + f" worker={record.worker_id} node={record.node_name}"
        + (" borrowed" if record.borrowed else ""),
        highlight=False,
    )
    if record.reason:
        console.print(f"reason: {record.reason}", highlight=False)
    if record.queue is not None and record.queue.reason == QUOTA:
        spot = record.queue
        console.print(
            f"queued: {spot.position} of {spot.waiting}, reason: quota (workspace"
            f" {spot.workspace} holds its GPU quota; it starts when its own tasks free cards)",
            highlight=False,
        )
    elif record.queue is not None and record.queue.reason:  # a disk's machine, say
        spot = record.queue
        console.print(
            f"queued: {spot.position} of {spot.waiting}, reason: {spot.reason}", highlight=False
        )
    elif record.queue is not None:
        spot = record.queue
        console.print(
            f"queued: {spot.position} of {spot.waiting}, waiting for one worker with"
            f" {spot.gpus} free cards (the most free on any of the pool's {spot.workers}"
            f" workers now: {spot.most_free})",
            highlight=False,
        )
    if record.on_preempt:
        console.print(f"on preempt: {record.on_preempt}", highlight=False)
    if record.attempts:
        number = len(record.attempts) + 1
        shown = (
            f"attempt {number} (preemptions requeue it; failures at most {record.retries}"
            " times); earlier:"
            if record.on_preempt
            else f"attempt {number} of at most {record.retries + 1}; earlier:"
        )
        console.print(shown, highlight=False)
        for number, attempt in enumerate(record.attempts, 1):
            exit_code = f" exit_code={attempt.exit_code}" if attempt.exit_code is not None else ""
            console.print(
                f"  {number}. {attempt.state}{exit_code} worker={attempt.worker_id}"
                f" node={attempt.node_name}: {attempt.reason}",
                highlight=False,
            )
    if record.image or record.host:
        digest = f" digest={record.image_digest}" if record.image_digest else ""
        image = record.image or "none (a process of the worker)"
        console.print(f"image={image}{digest} host={record.host or '-'}", highlight=False)
    if record.result_json:
        console.print(record.result_json, highlight=False, soft_wrap=True)


def _mounts(kind: str, given: list[str]) -> tuple[TaskMount, ...]:
    """`--volume` (or `--disk`) values as the task's mounts; BadParameter naming the option."""
    try:
        mounts = tuple(parse_mount(kind, one) for one in given)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=f"--{kind}") from None
    problem = mounts_problem(mounts)
    if problem is not None:
        raise typer.BadParameter(problem, param_hint=f"--{kind}")
    return mounts


def run(
    command: Annotated[list[str], typer.Argument(help="the command, after --")],
    pool: Annotated[
        str | None,
        typer.Option("--pool", help="the pool to run on (default: the only one, if one)"),
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option(
            "--gpus",
            min=0,
            max=MAX_GPUS,
            help="cards of one worker (default 1; 0 with --runtime runsc, which gives none)",
        ),
    ] = None,
    image: Annotated[str, typer.Option("--image", help="container image")] = "",
    wait: Annotated[float, typer.Option("--wait", min=0, help="seconds this command waits")] = 120,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="print the task id and return at once")
    ] = False,
    memory: Annotated[
        str, typer.Option("--memory", help="its container's memory limit, e.g. 8Gi (--image)")
    ] = "",
    cpus: Annotated[
        str, typer.Option("--cpus", help="its container's CPU limit, e.g. 4 or 500m (--image)")
    ] = "",
    port: Annotated[
        list[int] | None,
        typer.Option(
            "--port", min=1, max=65535, help="a container port to publish (levers9 port-forward)"
        ),
    ] = None,
    stop_grace: Annotated[
        int,
        typer.Option(
            "--stop-grace",
            min=0,
            max=MAX_STOP_GRACE_S,
            help="seconds from SIGTERM to SIGKILL when it is stopped (0: the worker's 10)",
        ),
    ] = 0,
    runtime: Annotated[
        str,
        typer.Option(
            "--runtime",
            help="runc, or runsc (gVisor) where the pool offers it (default: the pool's runtime)",
        ),
    ] = "",
    borrow: Annotated[
        bool,
        typer.Option(
            "--borrow",
            help="may run past the workspace's GPU quota on idle cards; taken back first",
        ),
    ] = False,
    retries: Annotated[
        int,
        typer.Option(
            "--retries",
            min=0,
            max=MAX_RETRIES,
            help="queue it again after a failed, lost or preempted attempt, up to N times",
        ),
    ] = 0,
    on_preempt: Annotated[
        str,
        typer.Option(
            "--on-preempt",
            help="requeue: queue it again when preempted (a drain, a reclaim), whatever"
            " --retries; checkpoint: checkpoint it to --checkpoints first and restore it where"
            " it runs next (runsc)",
        ),
    ] = "",
    checkpoints: Annotated[
        str,
        typer.Option(
            "--checkpoints",
            help="a volume of the workspace its checkpoints are kept in (restored on any"
            " machine of the pool)",
        ),
    ] = "",
    volume: Annotated[
        list[str] | None,
        typer.Option(
            "--volume",
            help="NAME:/path[:ro]: mount the workspace's volume there (repeatable)",
        ),
    ] = None,
    disk: Annotated[
        list[str] | None,
        typer.Option(
            "--disk",
            help="NAME:/path: mount the workspace's disk there; the task runs on its machine",
        ),
    ] = None,
) -> None:
    """Run CMD on a worker of the pool: prints the task id, its output, then its result."""
    refused = task_input_problem(command, {})
    if refused is not None:
        raise typer.BadParameter(refused, param_hint="CMD")
    refused = task_runtime_problem(runtime)
    if refused is not None:
        raise typer.BadParameter(refused, param_hint="--runtime")
    if on_preempt not in ("", *ON_PREEMPT):
        raise typer.BadParameter(
            f"{on_preempt!r} is not one of {', '.join(ON_PREEMPT)}", param_hint="--on-preempt"
        )
    if on_preempt == "checkpoint" and not checkpoints:
        raise typer.BadParameter(
            "checkpoint needs --checkpoints VOLUME (its image is restored on another machine)",
            param_hint="--on-preempt",
        )
    settings = settings_from_env()
    task = TaskInput(
        task_id=new_task_id(),
        pool_name=chosen_pool(settings, pool),
        command=tuple(command),
        gpus=gpus if gpus is not None else (0 if runtime == "runsc" else 1),
        image=image,
        memory_bytes=_quantity("--memory", memory, bytes_=True),
        cpu_millis=_quantity("--cpus", cpus, bytes_=False),
        ports=_ports(port or []),
        stop_grace_seconds=stop_grace,
        runtime=runtime,
        borrow=borrow,
        retries=retries,
        on_preempt=cast(OnPreempt, on_preempt),
        checkpoint_volume=checkpoints,
        mounts=_mounts("volume", volume or []) + _mounts("disk", disk or []),
    )
    if detach:
        answered(tasks_for(settings).submit(task))
        console.print(task.task_id, highlight=False)
        return
    submitted: list[str] = []
    try:
        record = answered(submit_and_follow(settings, task, wait, True, submitted))
        last = answered(_record(settings, task.task_id)) if record is None else None
    except KeyboardInterrupt:
        _interrupted(task.task_id, bool(submitted))
    except ControlplaneUnreachable as problem:
        console.print(
            f"task {task.task_id} is recorded and waits in Temporal: it is placed once the"
            f" controlplane is back; levers9 task cancel {task.task_id} withdraws it",
            highlight=False,
        )
        down(problem)
    if record is None:
        spot = last.queue if last is not None else None
        doing = (
            "is still running"
            if spot is None
            else f"is queued ({spot.position} of {spot.waiting}, reason: {spot.reason})"
            if spot.reason
            else f"is queued ({spot.position} of {spot.waiting}, waiting for one worker with"
            f" {spot.gpus} free cards)"
        )
        console.print(
            f"DEADLINE_EXCEEDED: task {task.task_id} {doing}; levers9 task get {task.task_id}",
            highlight=False,
        )
        raise typer.Exit(DEADLINE_EXIT)
    print_result(record)
    raise typer.Exit(0 if record.state == "succeeded" else 1)


def _interrupted(task_id: str, submitted: bool) -> NoReturn:
    """Ctrl-C stops this command, not the task (its record lives in Temporal): says so, and
    how to stop it; exit status 130, as a shell's for SIGINT."""
    if submitted:
        said = (
            f"interrupted: only this command stopped; task {task_id} goes on: levers9 task"
            f" cancel {task_id} stops it, levers9 task logs -f {task_id} follows it again"
        )
    else:
        said = (
            f"interrupted while submitting task {task_id}: levers9 task get {task_id} says"
            f" whether it was; levers9 task cancel {task_id} stops it if so"
        )
    errors.print(said, highlight=False)
    raise typer.Exit(130)


def _ports(ports: list[int]) -> tuple[int, ...]:
    if len(set(ports)) != len(ports):
        raise typer.BadParameter(f"{ports} names a port twice", param_hint="--port")
    return tuple(ports)


def _quantity(option: str, text: str, bytes_: bool) -> int:
    """A limit as Kubernetes writes it (`8Gi`, `4`, `500m`): bytes, or millicores; 0 unset."""
    if not text:
        return 0
    from levers9.core.quantity import millicores, whole

    try:
        value = whole(text) if bytes_ else millicores(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None
    if value <= 0:
        raise typer.BadParameter(f"{text!r} is not more than 0", param_hint=option)
    below = memory_floor_problem(value) if bytes_ else None
    if below is not None:
        raise typer.BadParameter(f"{text!r}: {below}", param_hint=option)
    return value


async def _record(settings: ControlplaneSettings, task_id: str) -> TaskRecord | None:
    return await tasks_for(settings).record(task_id)


async def _record_or_last(settings: ControlplaneSettings, task_id: str) -> Answer:
    tasks = tasks_for(settings)
    try:
        return Answer(await tasks.record(task_id))
    except ControlplaneUnreachable as problem:
        return await last_answer(tasks, task_id, problem)


async def _cancel(
    settings: ControlplaneSettings, task_id: str, reason: str, wait_s: float
) -> tuple[bool, Answer]:
    """Tells the task to cancel (a signal: Temporal keeps it while the controlplane is down),
    then its record: at once, and once it ended (at most `wait_s`)."""
    tasks = tasks_for(settings)
    told = await tasks.cancel(task_id, reason)
    try:
        record = await tasks.record(task_id)
        if told and record is not None and record.state not in TERMINAL and wait_s > 0:
            record = await tasks.record(task_id, wait_s)
    except ControlplaneUnreachable as problem:
        return told, await last_answer(tasks, task_id, problem)
    return told, Answer(record)


@app.command()
def cancel(
    task_id: str,
    reason: Annotated[str, typer.Option("--reason", help="kept in the record")] = "",
    wait: Annotated[
        float, typer.Option("--wait", min=0, help="seconds to wait for the container to go")
    ] = 60,
) -> None:
    """Cancel a task: its container gets SIGTERM, a grace, then SIGKILL; it ends cancelled."""
    told, answer = answered(_cancel(settings_from_env(), task_id, reason, wait))
    record = answer.record
    if answer.down is not None:
        print_last(answer)
        if record is not None and not told:
            console.print(f"task {task_id} had already ended: {record.state}", highlight=False)
        elif record is not None:
            console.print(
                f"task {task_id} is told to cancel (kept by Temporal) and was last recorded"
                f" {record.state}: it cancels once the controlplane is back",
                highlight=False,
            )
        if record is not None or answer.last is not None:
            down(answer.down)
    if record is None:
        fail([f"no task {task_id}"])
        raise typer.Exit(1)
    if not told:
        console.print(f"task {task_id} had already ended: {record.state}", highlight=False)
        raise typer.Exit(0 if record.state == "cancelled" else 1)
    if record.state not in TERMINAL:
        console.print(
            f"DEADLINE_EXCEEDED: task {task_id} is told to cancel and is {record.state};"
            f" levers9 task get {task_id}",
            highlight=False,
        )
        raise typer.Exit(DEADLINE_EXIT)
    print_result(record)
    raise typer.Exit(0 if record.state == "cancelled" else 1)


@app.command()
def get(
    task_id: str, output: Annotated[Output, typer.Option("-o", "--output")] = Output.table
) -> None:
    """The task record: state, worker, phases, exit code, result. With the controlplane down:
    its last recorded state, and exit status 69."""
    answer = answered(_record_or_last(settings_from_env(), task_id))
    if answer.record is None:
        if answer.down is not None and answer.last is not None:
            console.print(
                f"task {task_id}: its workflow is {answer.last.status} and holds no record yet"
                " (no Temporal worker has run it)",
                highlight=False,
            )
            down(answer.down)
        fail([f"no task {task_id}"])
        raise typer.Exit(1)
    record = answer.record
    if output is Output.json:
        console.print_json(record.model_dump_json())
    else:
        print_last(answer)
        print_result(record)
        for phase in record.phases:
            error = f" error={phase.error}" if phase.error else ""
            detail = f" {phase.detail}" if phase.detail else ""
            console.print(f"  {phase.at} {phase.name}{detail}{error}", highlight=False)
    if answer.down is not None:
        down(answer.down)


async def _print_logs(settings: ControlplaneSettings, task_id: str, follow: bool) -> bool:
    """The whole output from the worker, through the gateway; else the record's tail (the
    last recorded one, and exit status 69, with the controlplane down). False when there is
    no such task."""
    try:
        async for text in stream_task_logs(settings, task_id, follow=follow):
            console.out(text, end="", highlight=False)
        return True
    except GatewayUnavailable as exc:
        if str(exc).startswith("NOT_FOUND: no task"):
            return False
        errors.print(f"no log stream, showing the record's tail: {exc}", highlight=False)
    answer = await _record_or_last(settings, task_id)
    if answer.record is None:
        if answer.down is not None and answer.last is not None:
            down(answer.down)
        return False
    console.out(answer.record.log_tail, end="", highlight=False)
    if answer.down is not None:
        down(answer.down)
    return True


@app.command()
def logs(
    task_id: str,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="keep streaming until the task exits")
    ] = False,
) -> None:
    """The task's output, streamed from its worker (the record's tail once the worker is gone)."""
    if not answered(_print_logs(settings_from_env(), task_id, follow)):
        fail([f"no task {task_id}"])
        raise typer.Exit(1)


@app.command()
def checkpoint(
    task_id: str,
    checkpoints: Annotated[
        str,
        typer.Option(
            "--checkpoints",
            help="VOLUME: also keep the image in this volume of the workspace, so that task"
            " restore may run on any machine of the pool",
        ),
    ] = "",
) -> None:
    """Checkpoint a running task (runsc): its processes' memory, open files and writable layer
    go to an image on its node (and the volume); the task then ends, cancelled."""
    from levers9.cli.task_checkpoint import checkpoint_lines, checkpoint_task

    taken, store_seconds, record = checkpoint_task(task_id, checkpoints)
    for line in checkpoint_lines(task_id, taken, store_seconds, record):
        console.print(line, highlight=False, soft_wrap=True)


@app.command()
def restore(
    checkpoint: Annotated[
        str, typer.Argument(help="the name task checkpoint printed (or the task's id: its last)")
    ],
    pool: Annotated[
        str,
        typer.Option("--pool", help="another pool (only for a checkpoint kept in a volume)"),
    ] = "",
) -> None:
    """Start a new task from a checkpoint: its processes go on where they were. Prints its id,
    as run --detach does; it runs on the checkpoint's node unless the image is in a volume."""
    from levers9.cli.task_checkpoint import restore_task

    reply = restore_task(checkpoint, pool)
    where = f"pinned to node {reply.node}" if reply.node else "on any machine of the pool"
    errors.print(f"restoring {reply.restored_from} {where}", highlight=False)
    console.print(reply.task_id, highlight=False)


@app.command("list")
def list_(
    pool: Annotated[str | None, typer.Option("--pool")] = None,
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
) -> None:
    """Tasks, newest first. With the controlplane down: as last recorded, and exit status 69."""
    if pool is not None and not DNS_LABEL.fullmatch(pool):
        raise typer.BadParameter(
            f"{pool!r} is not a pool name (lowercase DNS label)", param_hint="--pool"
        )
    listed = answered(tasks_for(settings_from_env()).listing(pool))
    records = listed.records
    if output is Output.json:
        render([json.loads(r.model_dump_json()) for r in records], COLUMNS, output)
        if listed.down is not None:
            down(listed.down)
        return
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    rows = [
        {
            "task_id": r.task_id,
            "pool": r.pool_name,
            "state": r.state,
            "gpus": r.gpus,
            "worker": r.worker_id or "",
            "node": r.node_name or "",
            "age": ago(r.created_at, now),
            "command": " ".join(r.command)[:60],
        }
        for r in records
    ]
    if listed.down is None:
        render(rows, COLUMNS, output, title="tasks")
        return
    render(rows, COLUMNS, output, title="tasks as last recorded (the controlplane is down)")
    down(listed.down)
