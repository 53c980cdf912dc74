"""WorkerWorkflow (`worker:<pool>:<worker-id>`): one worker Job and the worker record.

This issue's part of the lifecycle: create the Job (namespace, Job, token Secret, all
idempotent) and hold the record in state `pending`. A Job that cannot be created ends the record
as `failed` and tells the machine, which may then add another worker.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from activities.kube import KubeActivities
    from levers9.manifests import worker_job_name
    from levers9.models import (
        WORKER_STATE,
        WORKER_WORKFLOW,
        WorkerInput,
        WorkerJobInput,
        WorkerRecord,
        machine_workflow_id,
    )

KUBE_TIMEOUT = timedelta(seconds=60)
KUBE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=20,
)


@workflow.defn(name=WORKER_WORKFLOW)
class WorkerWorkflow:
    def __init__(self) -> None:
        self._record: WorkerRecord | None = None
        self._stop = False

    @workflow.query
    def record(self) -> WorkerRecord | None:
        return self._record

    @workflow.signal
    def stop(self) -> None:
        self._stop = True

    @workflow.run
    async def run(self, input: WorkerInput) -> WorkerRecord:
        self._set(input, "creating")
        job = WorkerJobInput(
            pool_name=input.pool_name,
            worker_id=input.worker_id,
            node_name=input.node_name,
            gpus=input.gpus,
            external_ip=input.external_ip,
        )
        try:
            await workflow.execute_activity_method(
                KubeActivities.create_worker_job,
                job,
                start_to_close_timeout=KUBE_TIMEOUT,
                retry_policy=KUBE_RETRY,
            )
        except ActivityError as exc:
            reason = str(exc.cause) if isinstance(exc.cause, ApplicationError) else str(exc)
            return await self._end(input, "failed", reason)
        self._set(input, "pending")
        await workflow.wait_condition(lambda: self._stop)
        await workflow.execute_activity_method(
            KubeActivities.delete_worker_job,
            job,
            start_to_close_timeout=KUBE_TIMEOUT,
            retry_policy=KUBE_RETRY,
        )
        return await self._end(input, "stopped", "stopped by the controlplane")

    def _set(self, input: WorkerInput, state: str, reason: str | None = None) -> None:
        self._record = WorkerRecord(
            pool_name=input.pool_name,
            node_name=input.node_name,
            worker_id=input.worker_id,
            job_name=worker_job_name(input.pool_name, input.worker_id),
            gpus=input.gpus,
            state=state,
            created_at=self._record.created_at if self._record else workflow.now(),
            reason=reason,
        )
        workflow.upsert_search_attributes([WORKER_STATE.value_set(state)])
        workflow.upsert_memo({"record": self._record.model_dump(mode="json")})

    async def _end(self, input: WorkerInput, state: str, reason: str) -> WorkerRecord:
        self._set(input, state, reason)
        machine = workflow.get_external_workflow_handle(
            machine_workflow_id(input.pool_name, input.node_name)
        )
        # The machine may be gone; its next incarnation counts workers from the cluster.
        with contextlib.suppress(FailureError):
            await machine.signal("worker_ended", input.worker_id)
        assert self._record is not None
        return self._record
