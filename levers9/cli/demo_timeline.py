"""The end of `make demo`: the first jobs (the GPU check cold, `true` warm), then the spec's
timeline with the times this run took, each line read from the log that printed it."""

from __future__ import annotations

import asyncio
import json
import subprocess
from datetime import datetime

from levers9.cli.output import Output, render
from levers9.cli.pool import print_check
from levers9.cli.task import submit_and_follow
from levers9.config import ControlplaneSettings
from levers9.devstack.stack import DevStack
from levers9.models import TaskInput, TaskRecord, new_task_id
from levers9.records.tasks import PROBE_COMMAND
from levers9.temporal import connect, gpus_simulated
from levers9.timeline import Row, first, since

POOL = "gke-rtx6000"
GPU = "RTXPro6000"
JOB_WAIT_S = 900.0


async def first_jobs(settings: ControlplaneSettings) -> tuple[TaskRecord | None, TaskRecord | None]:
    check = TaskInput(task_id=new_task_id(), pool_name=POOL, command=PROBE_COMMAND, gpus=1)
    cold = await submit_and_follow(settings, check, JOB_WAIT_S, show_logs=False)
    true = TaskInput(task_id=new_task_id(), pool_name=POOL, command=("true",), gpus=1)
    warm = await submit_and_follow(settings, true, JOB_WAIT_S, show_logs=False)
    return cold, warm


def _kubectl(*args: str) -> str:
    done = subprocess.run(["kubectl", *args], capture_output=True, text=True, check=False)
    return done.stdout


def _pod_running_row() -> Row:
    pods = json.loads(_kubectl("-n", "levers9", "get", "pods", "-o", "json") or '{"items": []}')
    started = [
        datetime.fromisoformat(status["state"]["running"]["startedAt"].replace("Z", "+00:00"))
        for pod in pods["items"]
        for status in pod.get("status", {}).get("containerStatuses") or ()
        if "running" in status.get("state", {})
    ]
    return Row(
        "GKE (kubectl)",
        "kubectl -n levers9 get pods: worker-gke-rtx6000-... Running",
        min(started, default=None),
    )


def _job_row(label: str, record: TaskRecord | None) -> Row:
    if record is None:
        return Row("first job", f"{label}: still running", None)
    took = (record.finished_at - record.created_at).total_seconds() if record.finished_at else 0
    return Row("first job", f"{label}: {record.state} in {took:.1f} s", record.finished_at)


def show(
    stack: DevStack, start: datetime, cold: TaskRecord | None, warm: TaskRecord | None
) -> None:
    controlplane = (stack.dir / "logs" / "worker.log").read_text().splitlines()
    workers = _kubectl(
        "-n", "levers9", "logs", "-l", "app.kubernetes.io/managed-by=levers9", "--tail=-1"
    ).splitlines()
    rows = [
        first("controlplane log", controlplane, "loaded controller", start),
        first("controlplane log", controlplane, "using existing machine", start),
        first(
            "controlplane log", controlplane, "added new worker to occupy existing machine", start
        ),
        _pod_running_row(),
        first("worker log", workers, "host driver libraries registered with the loader", start),
        first("worker log", workers, "resolved NVIDIA_VISIBLE_DEVICES for GPU filtering", start),
        first("levers9 worker list", controlplane, "worker available", start),
        _job_row("the GPU check (cold)", cold),
        _job_row("`true` (warm)", warm),
    ]
    render(
        [{"where": r.where, "line": r.line, "when": since(r, start)} for r in rows],
        [("where", "WHERE"), ("line", "LINE"), ("when", "WHEN (since make demo)")],
        Output.table,
        title="what you see along the way, measured on this run",
    )
    if cold is not None:
        print_check(cold, GPU, simulated=asyncio.run(_simulated(stack.settings())))


async def _simulated(settings: ControlplaneSettings) -> bool:
    return await gpus_simulated(await connect(settings), POOL)
