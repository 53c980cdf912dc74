"""The task records the gateway's Tasks service reads and starts: `TaskRecords`, what it needs,
and `TemporalTaskRecords`, the one the controlplane runs (levers9.records.tasks over its client),
which remembers for a few seconds that a pool is reconciled here so a burst of submits describes
its schedule once.
"""

from __future__ import annotations

import contextlib
import time
from typing import Protocol

from temporalio.client import Client
from temporalio.exceptions import WorkflowAlreadyStartedError

from levers9.models import TaskInput, TaskRecord, WorkerRecord, worker_workflow_id
from levers9.records.found import or_none
from levers9.records.tasks import cancel_task, start_task, task_ended, task_page, task_record
from levers9.temporal import unknown_pool

KNOWN_POOL_TTL_S = 5.0


class TaskRecords(Protocol):
    async def get(self, task_id: str, where_queued: bool = False) -> TaskRecord | None:
        """The record now; with `where_queued`, a queued one says where it waits."""

    async def start(self, task: TaskInput) -> None:
        """Starts the task's record; a second start of the same id starts nothing."""

    async def unknown_pool(self, pool_name: str) -> str | None:
        """Why a task naming the pool is refused (no such pool, naming those there are)."""

    async def ended(self, task_id: str, timeout_s: float) -> TaskRecord | None:
        """The record once the task has ended, or as it is after `timeout_s`."""

    async def cancel(self, task_id: str, reason: str) -> bool:
        """Tells the task's record to cancel; False when no such task runs."""

    async def worker(self, pool_name: str, worker_id: str) -> WorkerRecord | None:
        """The worker's record now (its route: address, replica queue and address)."""

    async def page(
        self, pool_name: str | None, page_size: int, page_token: bytes
    ) -> tuple[list[TaskRecord], bytes]:
        """One page of task records and the next page's token (empty: the last)."""


class TemporalTaskRecords:
    """Task records as the task workflows hold them."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self._client = client
        self._task_queue = task_queue
        self._known: dict[str, float] = {}

    async def get(self, task_id: str, where_queued: bool = False) -> TaskRecord | None:
        return await task_record(self._client, task_id, where_queued=where_queued)

    async def start(self, task: TaskInput) -> None:
        with contextlib.suppress(WorkflowAlreadyStartedError):
            await start_task(self._client, self._task_queue, task)

    async def unknown_pool(self, pool_name: str) -> str | None:
        """A burst of submits to one pool describes its schedule once per KNOWN_POOL_TTL_S;
        a refusal is always from a fresh read."""
        seen = self._known.get(pool_name)
        if seen is not None and time.monotonic() - seen < KNOWN_POOL_TTL_S:
            return None
        problem = await unknown_pool(self._client, self._task_queue, pool_name)
        if problem is None:
            self._known[pool_name] = time.monotonic()
        return problem

    async def ended(self, task_id: str, timeout_s: float) -> TaskRecord | None:
        return await task_ended(self._client, task_id, timeout_s)

    async def cancel(self, task_id: str, reason: str) -> bool:
        return await cancel_task(self._client, task_id, reason)

    async def page(
        self, pool_name: str | None, page_size: int, page_token: bytes
    ) -> tuple[list[TaskRecord], bytes]:
        return await task_page(self._client, self._task_queue, pool_name, page_size, page_token)

    async def worker(self, pool_name: str, worker_id: str) -> WorkerRecord | None:
        handle = self._client.get_workflow_handle(worker_workflow_id(pool_name, worker_id))
        record: WorkerRecord | None = await or_none(
            handle.query("record", result_type=WorkerRecord)
        )
        return record
