"""Boxes (`levers9 box ...`): a workspace's long-lived task with a shell, published ports and a
home on a disk or a volume, that stops and starts again under its name.

A box is a record (BoxWorkflow, `box:<workspace>:<name>`) that holds the task it runs as a
template (`BoxState.task`) and starts it as a task (TaskWorkflow, `task:<box>-<n>`) whenever
the box should run and no task of it does. `box stop` cancels that task, `box start` starts a
new one from the template with the same home (its disk or volume): what the processes held in
memory is lost (the record says so in its `stopped` reason), except for a `--runtime runsc` box,
whose task `box stop` checkpoints and whose next start restores it (`BoxState.checkpoint`).
`--idle-stop`: a box nobody has used (exec, shell, ports, ssh) for that long is stopped by its
record's timer; the gateway tells the record of each use.
"""

from __future__ import annotations

from levers9.core.workspaces import name_problem

BOX_WORKFLOW = "BoxWorkflow"
MAX_BOX_NAME_CHARS = 40
KEEP_ALIVE = ("sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done")
"""A box's command when it names none: keeps the container up until it is stopped (and stops
at once on SIGTERM, which plain `sleep` as PID 1 ignores)."""
MAX_IDLE_STOP_S = 30 * 24 * 3600
MIN_IDLE_STOP_S = 60
MAX_EVENTS = 20
"""The record keeps its last this many events (`box get` shows them)."""

RUNNING = "running"
STOPPED = "stopped"
DELETING = "deleting"
NO_CHECKPOINT = (
    "no checkpoint: the box's processes were stopped and start fresh; its home ({home}) keeps"
    " its files"
)


def box_workflow_id(workspace: str, name: str) -> str:
    return f"box:{workspace}:{name}"


def box_name_problem(name: str) -> str | None:
    """Why `name` cannot name a box (None: it can): a DNS label of at most 40 characters."""
    problem = name_problem(name)
    if problem is not None:
        return problem.replace("a workspace is named", "a box is named").replace("team-a", "dev")
    if len(name) > MAX_BOX_NAME_CHARS:
        return f"{name!r} is longer than {MAX_BOX_NAME_CHARS} characters"
    return None


def idle_stop_problem(seconds: int) -> str | None:
    """Why `--idle-stop` cannot be this many seconds (0: never)."""
    if seconds == 0 or MIN_IDLE_STOP_S <= seconds <= MAX_IDLE_STOP_S:
        return None
    return f"{seconds} s is not between {MIN_IDLE_STOP_S} s and 30 days (0: never)"


def parse_duration(text: str) -> int:
    """`90s`, `30m`, `2h`, `1d` (or plain seconds) as seconds; ValueError naming the form."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip()
    unit = units.get(text[-1:]) if text else None
    number = text[:-1] if unit is not None else text
    if not number.isdigit():
        raise ValueError(f"{text!r} is not a duration: give e.g. 90s, 30m, 2h or 1d")
    return int(number) * (unit or 1)


def box_task_id(name: str, start: int, unique: str) -> str:
    """The id of a box's `start`-th task: `<box>-<n>-<hex>`, so its tasks read as its own."""
    return f"{name}-{start}-{unique}"


def box_of_task_id(task_id: str) -> str:
    """The box name a task id reads as (`box_task_id`'s `<box>-<n>-<hex>`), "" when it does
    not read as one; whether that box's task it is, the box's record says."""
    rest, dash, unique = task_id.rpartition("-")
    name, _, start = rest.rpartition("-")
    return name if dash and name and start.isdigit() and unique else ""
