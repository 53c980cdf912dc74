"""Tasks as Temporal holds them: start one, read its record, list them (a page for the gateway's
ListTasks; every memo for the CLI when the gateway does not answer). The CLI never holds a
worker's token or the cluster's key.

A command does all its Temporal calls with one client on one event loop: the SDK's runtime does
not survive clients left behind on loops that `asyncio.run` already closed.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from temporalio.client import Client, WorkflowFailureError, WorkflowQueryFailedError
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from levers9.box_state import CheckpointOutcome
from levers9.core.placement import QueueSpot
from levers9.models import (
    TASK_WORKFLOW,
    TERMINAL,
    TaskInput,
    TaskRecord,
    pool_workflow_id,
    task_workflow_id,
)
from levers9.records.found import NoQueryAnswer, delivered, or_none, query_within
from levers9.records.listing import memo_records, pool_clause
from levers9.records.workspaces import workspace_clause
from levers9.search_attributes import POOL_NAME, SEARCH_ATTRIBUTES, WORKSPACE

OURS = frozenset(key.name for key in SEARCH_ATTRIBUTES)
"""The search attributes a last recorded state shows (not Temporal's own: BuildIds, ...)."""


async def start_task(client: Client, task_queue: str, task: TaskInput) -> None:
    """Starts the task's record (TaskWorkflow) on the controlplane's task queue, its memo
    the queued record (what `task get` shows should no Temporal worker ever run it)."""
    queued = TaskRecord.queued(task, datetime.now(UTC))
    await client.start_workflow(
        TASK_WORKFLOW,
        task,
        id=task_workflow_id(task.task_id),
        task_queue=task_queue,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(POOL_NAME, task.pool_name),
                SearchAttributePair(WORKSPACE, task.workspace),
            ]
        ),
        memo={"record": queued.model_dump(mode="json")},
    )


async def task_ended(
    client: Client, task_id: str, timeout_s: float, *, within: float | None = None
) -> TaskRecord | None:
    """The record once the task has ended, or as it is after `timeout_s` (the workflow's
    result is long-polled: no polling here); None if unknown. `within`: as task_record's."""
    handle = client.get_workflow_handle(task_workflow_id(task_id), result_type=TaskRecord)
    try:
        async with asyncio.timeout(timeout_s):
            result: TaskRecord = await handle.result()
            return result
    except (TimeoutError, WorkflowFailureError):
        return await task_record(client, task_id, within=within)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def cancel_task(client: Client, task_id: str, reason: str = "") -> bool:
    """Signals `cancel` to the task's record; False when no such task runs (unknown, or ended)."""
    return await delivered(
        client.get_workflow_handle(task_workflow_id(task_id)).signal("cancel", reason)
    )


CHECKPOINT_WAIT_S = 15 * 60.0
"""How long `checkpoint_task` reads the record for its outcome (two tries of six minutes at
most)."""
CHECKPOINT_POLL_S = 0.5


async def checkpoint_task(
    client: Client, task_id: str, volume: str, within_s: float = CHECKPOINT_WAIT_S
) -> CheckpointOutcome | None:
    """Asks the task's record for a checkpoint (Update `checkpoint`: its worker checkpoints it
    and it ends, or the refusal); None when no such task runs (unknown, or ended). The Update
    answers at once with the ask's number; the outcome is read from the record (query `record`)
    here, every CHECKPOINT_POLL_S for `within_s` at most."""
    handle = client.get_workflow_handle(task_workflow_id(task_id))
    outcome: CheckpointOutcome | None = await or_none(
        handle.execute_update("checkpoint", volume, result_type=CheckpointOutcome)
    )
    if outcome is None or not outcome.asked:
        return outcome  # refused at once (or answered by a record of older code)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while loop.time() < deadline:
        await asyncio.sleep(CHECKPOINT_POLL_S)
        record = await task_record(client, task_id)
        if record is None:
            return None
        answer = _checkpoint_outcome(record, outcome)
        if answer is not None:
            return answer
    return CheckpointOutcome(
        refused=f"checkpoint {outcome.name} not answered in {within_s:.0f} s: levers9 task get"
        f" {task_id} shows whether it was taken"
    )


def _checkpoint_outcome(record: TaskRecord, asked: CheckpointOutcome) -> CheckpointOutcome | None:
    """What the record says of the ask (None: nothing yet)."""
    for taken in record.checkpoints:
        if taken.name == asked.name:
            return CheckpointOutcome(
                name=taken.name,
                node=taken.node,
                size_bytes=taken.size_bytes,
                seconds=taken.seconds,
                stored=taken.stored,
                store_error=taken.store_error,
                store_seconds=taken.store_seconds,
                stored_sha256=taken.sha256,
            )
    for refusal in record.checkpoint_refusals:
        if refusal.ask == asked.asked:
            return CheckpointOutcome(refused=refusal.reason, not_running=refusal.not_running)
    if record.state in TERMINAL:
        return CheckpointOutcome(
            refused=f"task {record.task_id} ended {record.state} first", not_running=True
        )
    return None


async def submitted_as(client: Client, task_id: str) -> TaskInput | None:
    """What the task was submitted as (query `task`; a record of older code has none: None),
    for `task restore`; None if unknown."""
    handle = client.get_workflow_handle(task_workflow_id(task_id))
    try:
        task: TaskInput | None = await or_none(handle.query("task", result_type=TaskInput))
    except WorkflowQueryFailedError:
        return None
    return task


async def task_record(
    client: Client, task_id: str, *, where_queued: bool = False, within: float | None = None
) -> TaskRecord | None:
    """The record as the task workflow holds it now (running or ended); None if unknown.
    With `where_queued`, a queued task's record says where it waits (one query of its pool:
    for a reader who shows it, not for a poll). With `within`, a query no Temporal worker
    answers in that many seconds is NoQueryAnswer (the CLI's: `last_recorded` says then)."""
    handle = client.get_workflow_handle(task_workflow_id(task_id))
    if within is None:
        record = await or_none(handle.query("record", result_type=TaskRecord))
    else:
        record = await or_none(query_within(handle, "record", within, result_type=TaskRecord))
    if where_queued and record is not None and record.state == "queued":
        record = record.model_copy(update={"queue": await _queue_spot(client, record, within)})
    return record


async def _queue_spot(client: Client, record: TaskRecord, within: float | None) -> QueueSpot | None:
    """Where the queued task stands, from its pool (None when the pool cannot say now)."""
    pool = client.get_workflow_handle(pool_workflow_id(record.pool_name))
    try:
        if within is None:
            spot: QueueSpot | None = await pool.query(
                "queue_spot", record.task_id, result_type=QueueSpot
            )
        else:
            spot = await query_within(
                pool, "queue_spot", within, record.task_id, result_type=QueueSpot
            )
    except (RPCError, NoQueryAnswer):
        return None
    return spot


@dataclass(frozen=True)
class LastRecorded:
    """What Temporal holds of a task without any Temporal worker (describe): the record its
    workflow last put in its memo (None: none yet), the workflow's status (`Running`,
    `Completed`, ...) and its search attributes."""

    record: TaskRecord | None
    status: str
    search_attributes: dict[str, str]
    started_at: datetime | None


async def last_recorded(client: Client, task_id: str) -> LastRecorded | None:
    """The task as Temporal recorded it last, read without a Temporal worker; None if
    unknown."""
    handle = client.get_workflow_handle(task_workflow_id(task_id))
    description = await or_none(handle.describe())
    if description is None:
        return None
    memo = await description.memo()
    status = description.status.name.title() if description.status is not None else "Unknown"
    return LastRecorded(
        record=TaskRecord.model_validate(memo["record"]) if "record" in memo else None,
        status=status.replace("_", ""),
        search_attributes={
            pair.key.name: str(pair.value)
            for pair in description.typed_search_attributes
            if pair.key.name in OURS
        },
        started_at=description.start_time,
    )


def _tasks_query(pool_name: str | None) -> str:
    return f"WorkflowType='{TASK_WORKFLOW}'" + pool_clause(pool_name)


async def list_tasks(client: Client, task_queue: str, pool_name: str | None) -> list[TaskRecord]:
    """Every task record (the workflows' memos: Temporal answers them without a worker)."""
    return await memo_records(client, task_queue, _tasks_query(pool_name), TaskRecord)


async def task_page(
    client: Client,
    task_queue: str,
    pool_name: str | None,
    page_size: int,
    page_token: bytes,
    workspace: str | None = None,
) -> tuple[list[TaskRecord], bytes]:
    """One visibility page of task records (`page_token` empty: the first) and the token of
    the next (empty: this was the last), of one workspace's tasks when it is given. A pool or
    workspace name that is not a DNS label is ValueError naming it (`pool_clause`,
    `workspace_clause`): the gateway refuses it first."""
    where = workspace_clause(workspace) if workspace is not None else ""
    listed = client.list_workflows(
        f"{_tasks_query(pool_name)}{where} AND TaskQueue='{task_queue}'",
        page_size=page_size,
        next_page_token=page_token or None,
    )
    await listed.fetch_next_page()
    records = []
    for execution in listed.current_page or ():
        memo = await execution.memo()
        if "record" in memo:
            records.append(TaskRecord.model_validate(memo["record"]))
    return records, listed.next_page_token or b""


PROBE_COMMAND = ("levers9-probe",)
CHECK_KEYS = ("host", "nvidia_smi", "cuda", "device", "matmul_ok")


def check_report(record: TaskRecord) -> dict[str, object]:
    """The GPU check's JSON, in the spec's key order: what the probe saw, and the runtime; what
    it printed, as `unparsed`, when that is not a JSON object."""
    try:
        seen = json.loads(record.result_json) if record.result_json else {}
    except ValueError:
        seen = None
    result = {"host": record.host or None, **(seen if isinstance(seen, dict) else {})}
    report: dict[str, object] = {key: result.get(key) for key in CHECK_KEYS}
    if not isinstance(seen, dict):
        report["unparsed"] = record.result_json
    if record.state != "succeeded":
        report["reason"] = record.reason or f"task {record.state}"
    return report


NO_CARD = "the container saw no GPU: check the node's driver and the device plugin"
SIMULATED_NO_CARD = "simulated cards: no GPU was visible, as expected"
NOT_AN_OBJECT = (
    "the probe's result is not a JSON object (under `unparsed`):"
    " check that the pool's image runs levers9's levers9-probe"
)


def saw_no_card(report: dict[str, object]) -> bool:
    """The probe found no card at all: no device, no nvidia-smi line, CUDA not up."""
    return not any(report.get(k) for k in ("device", "nvidia_smi", "cuda"))


def check_mismatch(report: dict[str, object], gpu: str, *, simulated: bool = False) -> str | None:
    """Why a check whose task completed still failed: the container saw no card (on a pool not
    marked `simulatedGpus`), the card it saw is not the `--gpu` asked for, or the matmul on it
    disagreed with the CPU. None when it passed (a simulated pool's container sees none).
    A probe whose output is not a JSON object fails, simulated or not."""
    if "unparsed" in report:
        return NOT_AN_OBJECT
    if saw_no_card(report):
        return None if simulated else NO_CARD
    seen = [str(report[k]) for k in ("device", "nvidia_smi") if report.get(k)]
    if seen and not any(gpu_type_matches(gpu, name) for name in seen):
        return f"the container saw {seen[0]!r}, not a {gpu}: check --gpu and the pool's selector"
    if report.get("matmul_ok") is False:
        return "the matmul on the GPU disagreed with the CPU's"
    return None


def gpu_type_matches(gpu: str, name: str) -> bool:
    """`RTXPro6000` names "NVIDIA RTX PRO 6000 Blackwell Server Edition", `L4` "NVIDIA L4"
    (not "NVIDIA L40S"): letters and digits alike, the model number not run on into another."""
    wanted = _squash(gpu)
    text = _squash(name)
    return bool(wanted) and any(
        not (text[end : end + 1].isdigit() or text[start - 1 : start].isdigit())
        for start, end in ((m.start(), m.end()) for m in re.finditer(re.escape(wanted), text))
    )


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())
