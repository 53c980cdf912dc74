"""A workflow that stands in for WorkerWorkflow and TaskWorkflow: it records the gateway's
signals (`register`, `heartbeat`, `report`) and answers the query `seen` with them."""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from levers9.core.task_reports import TaskReport
    from levers9.models import WorkerHeartbeat, WorkerRegistration


class Seen(BaseModel):
    registrations: list[WorkerRegistration] = []
    heartbeats: list[WorkerHeartbeat] = []
    reports: list[TaskReport] = []

    @property
    def count(self) -> int:
        return len(self.registrations) + len(self.heartbeats) + len(self.reports)


@workflow.defn(name="GatewayRecorderWorkflow")
class RecorderWorkflow:
    def __init__(self) -> None:
        self._seen = Seen()

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.signal
    def register(self, registration: WorkerRegistration) -> None:
        self._seen.registrations.append(registration)

    @workflow.signal
    def heartbeat(self, heartbeat: WorkerHeartbeat) -> None:
        self._seen.heartbeats.append(heartbeat)

    @workflow.signal
    def report(self, report: TaskReport) -> None:
        self._seen.reports.append(report)

    @workflow.query
    def seen(self) -> Seen:
        return self._seen
