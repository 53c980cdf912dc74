"""The task records the gateway's Tasks service reads and starts: `TaskRecords`, what it needs,
and `TemporalTaskRecords`, the one the controlplane runs (levers9.records.tasks over its client),
which remembers for a few seconds that a pool is reconciled here so a burst of submits describes
its schedule once.
"""

from __future__ import annotations

import contextlib
import time
from typing import Protocol

from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from levers9.box_state import CheckpointOutcome
from levers9.models import (
    TaskInput,
    TaskRecord,
    WorkerRecord,
    pool_workflow_id,
    worker_workflow_id,
)
from levers9.records.found import NoQueryAnswer, or_none, query_within
from levers9.records.tasks import (
    cancel_task,
    checkpoint_task,
    start_task,
    submitted_as,
    task_ended,
    task_page,
    task_record,
)
from levers9.temporal import no_such_pool, pool_names, pool_runtimes, runtime_not_offered

KNOWN_POOL_TTL_S = 5.0
POOL_WAITING_TTL_S = 2.0
POOL_WAITING_WITHIN_S = 2.0


class TaskRecords(Protocol):
    async def get(self, task_id: str, where_queued: bool = False) -> TaskRecord | None:
        """The record now; with `where_queued`, a queued one says where it waits."""

    async def start(self, task: TaskInput) -> None:
        """Starts the task's record; a second start of the same id starts nothing."""

    async def refusal(self, pool_name: str, runtime: str) -> tuple[str, str] | None:
        """Why a task naming the pool and the runtime is refused: (the field, the problem): no
        such pool (naming those there are), a runtime it does not offer (naming those it does)."""

    async def waiting(self, pool_name: str, workspace: str) -> int:
        """How many of the workspace's tasks wait in the pool's queue."""

    async def pool_waiting(self, pool_name: str) -> int:
        """How many tasks wait in the pool's queue, every workspace's; at most POOL_WAITING_TTL_S
        old."""

    async def ended(self, task_id: str, timeout_s: float) -> TaskRecord | None:
        """The record once the task has ended, or as it is after `timeout_s`."""

    async def cancel(self, task_id: str, reason: str) -> bool:
        """Tells the task's record to cancel; False when no such task runs."""

    async def checkpoint(self, task_id: str, volume: str) -> CheckpointOutcome | None:
        """Asks the task's record for a checkpoint: its outcome; None when no such task runs."""

    async def submitted_as(self, task_id: str) -> TaskInput | None:
        """What the task was submitted as (None: unknown, or recorded by older code)."""

    async def worker(self, pool_name: str, worker_id: str) -> WorkerRecord | None:
        """The worker's record now (its route: address, replica queue and address)."""

    async def page(
        self,
        pool_name: str | None,
        page_size: int,
        page_token: bytes,
        workspace: str | None = None,
    ) -> tuple[list[TaskRecord], bytes]:
        """One page of task records (of one workspace when given) and the next page's token
        (empty: the last)."""


class TemporalTaskRecords:
    """Task records as the task workflows hold them."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self._client = client
        self._task_queue = task_queue
        self._known: dict[str, tuple[float, tuple[str, ...]]] = {}
        self._waiting: dict[str, tuple[float, int]] = {}

    async def get(self, task_id: str, where_queued: bool = False) -> TaskRecord | None:
        return await task_record(self._client, task_id, where_queued=where_queued)

    async def start(self, task: TaskInput) -> None:
        with contextlib.suppress(WorkflowAlreadyStartedError):
            await start_task(self._client, self._task_queue, task)

    async def refusal(self, pool_name: str, runtime: str) -> tuple[str, str] | None:
        """A burst of submits to one pool describes its schedule once per KNOWN_POOL_TTL_S;
        a refusal is always from a fresh read."""
        seen = self._known.get(pool_name)
        if (
            seen is None
            or time.monotonic() - seen[0] >= KNOWN_POOL_TTL_S
            or (runtime and runtime not in seen[1])
        ):
            offered = await pool_runtimes(self._client, self._task_queue, pool_name)
            if offered is None:
                pools = await pool_names(self._client, self._task_queue)
                return "pool_name", no_such_pool(pool_name, pools)
            seen = (time.monotonic(), offered)
            self._known[pool_name] = seen
        problem = runtime_not_offered(pool_name, runtime, seen[1])
        return None if problem is None else ("task.runtime", problem)

    async def waiting(self, pool_name: str, workspace: str) -> int:
        """0 when the pool does not answer within POOL_WAITING_WITHIN_S (see pool_waiting)."""
        return await self._count(pool_name, "waiting_count", workspace) or 0

    async def pool_waiting(self, pool_name: str) -> int:
        """A burst of submits to one pool asks its queue's length once per POOL_WAITING_TTL_S.
        0 while no task has asked the pool, or its Temporal worker is of the code before the
        query `waiting_total`. A pool that does not answer within POOL_WAITING_WITHIN_S (its
        workflow task failing, no worker polling) counts as it last did: the bound guards the
        pool's payload, and a pool that places nothing grows no run, so a submit is not held up
        or failed for it."""
        seen = self._waiting.get(pool_name)
        if seen is not None and time.monotonic() - seen[0] < POOL_WAITING_TTL_S:
            return seen[1]
        count = await self._count(pool_name, "waiting_total")
        if count is None:
            count = seen[1] if seen is not None else 0
        self._waiting[pool_name] = (time.monotonic(), count)
        return count

    async def _count(self, pool_name: str, query: str, *args: str) -> int | None:
        """The pool's answer to a count query (0 when no task has asked the pool yet); None
        when it gave none within POOL_WAITING_WITHIN_S, or failed it (a query its code lacks)."""
        handle = self._client.get_workflow_handle(pool_workflow_id(pool_name))
        try:
            asked = query_within(handle, query, POOL_WAITING_WITHIN_S, *args, result_type=int)
            return await or_none(asked) or 0
        except (NoQueryAnswer, WorkflowQueryFailedError, RPCError):
            return None

    async def ended(self, task_id: str, timeout_s: float) -> TaskRecord | None:
        return await task_ended(self._client, task_id, timeout_s)

    async def cancel(self, task_id: str, reason: str) -> bool:
        return await cancel_task(self._client, task_id, reason)

    async def checkpoint(self, task_id: str, volume: str) -> CheckpointOutcome | None:
        return await checkpoint_task(self._client, task_id, volume)

    async def submitted_as(self, task_id: str) -> TaskInput | None:
        return await submitted_as(self._client, task_id)

    async def page(
        self,
        pool_name: str | None,
        page_size: int,
        page_token: bytes,
        workspace: str | None = None,
    ) -> tuple[list[TaskRecord], bytes]:
        return await task_page(
            self._client, self._task_queue, pool_name, page_size, page_token, workspace
        )

    async def worker(self, pool_name: str, worker_id: str) -> WorkerRecord | None:
        handle = self._client.get_workflow_handle(worker_workflow_id(pool_name, worker_id))
        record: WorkerRecord | None = await or_none(
            handle.query("record", result_type=WorkerRecord)
        )
        return record
