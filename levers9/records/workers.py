"""The records the gateway feeds for the agents: signals to the worker's and the task's workflows.

`WorkerRecords` is what the gRPC layer needs; `TemporalWorkerRecords` is the one the controlplane
runs. Temporal's errors become two outcomes the agent acts on: the record is gone (stop, or drop
the report) or Temporal cannot be reached now (retry).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Protocol

from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from levers9.core.task_reports import TaskReport
from levers9.models import (
    WorkerHeartbeat,
    WorkerRegistration,
    task_workflow_id,
    worker_workflow_id,
)

REGISTER_SIGNAL = "register"
HEARTBEAT_SIGNAL = "heartbeat"
REPORT_SIGNAL = "report"
# The client retries an unavailable server for about ten seconds, each attempt under its own
# timeout; this bounds the whole signal below the agent's call deadline, so the agent hears
# UNAVAILABLE and retries rather than timing out blind.
SIGNAL_DEADLINE = timedelta(seconds=5)
PLACED_KEPT = 10_000


class RecordNotFound(Exception):
    """No running workflow with this id: the record expired, ended or never existed."""

    def __init__(self, workflow_id: str) -> None:
        super().__init__(f"no running workflow {workflow_id}")
        self.workflow_id = workflow_id


class RecordsUnavailable(Exception):
    """Temporal did not take the signal now; the same call may succeed later."""


class NotPlacedHere(Exception):
    """The task's record does not say it was placed on the reporting worker: a report is taken
    only from the worker the task runs on (any other worker's token could fill the task's
    history with reports)."""

    def __init__(self, task_id: str, worker_id: str) -> None:
        super().__init__(f"task {task_id} is not placed on worker {worker_id}")


class WorkerRecords(Protocol):
    async def register(self, pool_name: str, registration: WorkerRegistration) -> None: ...

    async def heartbeat(self, pool_name: str, heartbeat: WorkerHeartbeat) -> None: ...

    async def report(self, report: TaskReport) -> None: ...


class TemporalWorkerRecords:
    """Signals `worker:<pool>:<worker-id>` and `task:<task-id>` through a Temporal client."""

    def __init__(self, client: Client, signal_deadline: timedelta = SIGNAL_DEADLINE) -> None:
        self._client = client
        self._signal_deadline = signal_deadline
        self._placed: OrderedDict[str, tuple[str, str]] = OrderedDict()
        """Task id -> (pool, worker) its record named: the next report needs no describe."""

    async def register(self, pool_name: str, registration: WorkerRegistration) -> None:
        workflow_id = worker_workflow_id(pool_name, registration.worker_id)
        await self._signal(workflow_id, REGISTER_SIGNAL, registration)

    async def heartbeat(self, pool_name: str, heartbeat: WorkerHeartbeat) -> None:
        workflow_id = worker_workflow_id(pool_name, heartbeat.worker_id)
        await self._signal(workflow_id, HEARTBEAT_SIGNAL, heartbeat)

    async def report(self, report: TaskReport) -> None:
        workflow_id = task_workflow_id(report.task_id)
        await self._check_placed(workflow_id, report)
        await self._signal(workflow_id, REPORT_SIGNAL, report)

    async def _check_placed(self, workflow_id: str, report: TaskReport) -> None:
        """The task's record (its memo, written when it was placed) names this worker."""
        where = (report.pool_name, report.worker_id)
        if self._placed.get(report.task_id) == where:
            self._placed.move_to_end(report.task_id)
            return
        handle = self._client.get_workflow_handle(workflow_id)
        async with self._bounded(workflow_id, f"describe {workflow_id}"):
            described = await handle.describe()
            record = await described.memo_value("record", None)
        if described.status != WorkflowExecutionStatus.RUNNING:
            raise RecordNotFound(workflow_id)
        named = (
            (record.get("pool_name"), record.get("worker_id"))
            if isinstance(record, dict)
            else (None, None)
        )
        if named != where:
            raise NotPlacedHere(report.task_id, report.worker_id)
        self._placed[report.task_id] = where
        while len(self._placed) > PLACED_KEPT:
            self._placed.popitem(last=False)

    async def _signal(self, workflow_id: str, signal: str, arg: BaseModel) -> None:
        handle = self._client.get_workflow_handle(workflow_id)
        # The signal may still land after a timeout; every signal here is safe to repeat.
        async with self._bounded(workflow_id, f"take signal {signal} to {workflow_id}"):
            await handle.signal(signal, arg)

    @contextlib.asynccontextmanager
    async def _bounded(self, workflow_id: str, doing: str) -> AsyncIterator[None]:
        """One call to Temporal within the deadline: a timeout or an unavailable server is
        `RecordsUnavailable` ("Temporal did not <doing> ..."), NOT_FOUND `RecordNotFound` (a
        completed workflow answers it too: its record is over either way)."""
        try:
            async with asyncio.timeout(self._signal_deadline.total_seconds()):
                yield
        except TimeoutError:
            raise RecordsUnavailable(
                f"Temporal did not {doing} within {self._signal_deadline.total_seconds():g}s"
            ) from None
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise RecordNotFound(workflow_id) from None
            raise RecordsUnavailable(
                f"Temporal did not {doing}: {exc.status.name} {exc.message}"
            ) from exc
