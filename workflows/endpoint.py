"""EndpointWorkflow (`endpoint:<name>`): an endpoint's replicas and its autoscaler.

    create (`levers9 endpoint create`) -> the replicas' environment (activity) -> loop:
    the gateways' `load` reports and the replicas' `replica` reports (from their records) ->
    `levers9.core.endpoints.EndpointState.decide` -> start replicas (TaskWorkflow children, left
    running across continue-as-new) / stop them (signal `cancel` to their records)

Signal `delete` stops every replica and ends the workflow once they have ended. Query `view`:
what `levers9 endpoint get` shows and what the gateways route by. Each decision is an event of
the state (`levers9 endpoint get`) and a workflow task of this history (the Temporal UI): a
cold start reads `cold start: 1 request(s) waiting and no replica: starting 1`.

The history grows with the reports (a gateway sends at most one a second while its numbers
change, and one every 10 s while it holds requests): past `max_history_events` the workflow
continues as new with its state. Nothing waits inside a handler.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import FailureError
from temporalio.workflow import ParentClosePolicy

from workflows.steps import step

with workflow.unsafe.imports_passed_through():
    from activities.endpoints import EndpointActivities
    from levers9.core.endpoints import (
        EndpointState,
        EndpointView,
        Load,
        ReplicaEnvironment,
    )
    from levers9.core.workspaces import DEFAULT_WORKSPACE
    from levers9.models import (
        ENDPOINT_WORKFLOW,
        TASK_WORKFLOW,
        EndpointInput,
        ReplicaReport,
        TaskInput,
        task_workflow_id,
    )
    from levers9.search_attributes import WORKSPACE

DELETE_WAIT = timedelta(minutes=2)
"""How long `delete` waits for the replicas' records to say they ended."""


@workflow.defn(name=ENDPOINT_WORKFLOW)
class EndpointWorkflow:
    @workflow.init
    def __init__(self, input: EndpointInput) -> None:
        self._state = input.state or EndpointState(spec=input.spec, created_at=workflow.now())
        self._env: dict[str, str] | None = input.env
        self._changed = True

    @workflow.query
    def view(self) -> EndpointView:
        return EndpointView.of(self._state, workflow.now())

    @workflow.signal
    def load(self, load: Load) -> None:
        self._state.take_load(load, workflow.now())
        self._changed = True

    @workflow.signal
    def replica(self, report: ReplicaReport) -> None:
        now = workflow.now()
        if report.state == "ready":
            self._state.replica_ready(report.task_id, now)
        else:
            self._state.replica_ended(report.task_id, report.state, report.reason, now)
        self._changed = True

    @workflow.signal
    def delete(self) -> None:
        self._state.deleted = True
        self._changed = True

    @workflow.run
    async def run(self, input: EndpointInput) -> EndpointView:
        state = self._state
        if self._env is None:
            self._env = await step(
                EndpointActivities.replica_environment,
                ReplicaEnvironment(pool_name=state.spec.pool_name, env=state.spec.env),
            )
        while not state.deleted:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._changed, timeout=state.next_wake(workflow.now())
                )
            self._changed = False
            if state.deleted:
                break
            await self._act()
            if workflow.info().get_current_history_length() > input.max_history_events:
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self._changed:
                    workflow.continue_as_new(
                        input.model_copy(update={"state": state, "env": self._env})
                    )
        return await self._delete()

    async def _act(self) -> None:
        state = self._state
        now = workflow.now()
        decision = state.decide(now)
        if not decision.kind:
            return
        state.note(now, decision.kind, decision.message)
        workflow.logger.info(
            "endpoint %s: %s: %s", state.spec.name, decision.kind, decision.message
        )
        if decision.kind == "cold start":
            state.cold_starts += 1
        for _ in range(decision.start):
            await self._start_replica()
        for task_id in decision.stop:
            state.stopping(task_id)
            await self._cancel(task_id, f"endpoint {state.spec.name}: {decision.message}")

    async def _start_replica(self) -> None:
        spec = self._state.spec
        task_id = f"{spec.name[:40]}-{workflow.uuid4().hex[:10]}"
        assert self._env is not None
        task = TaskInput(
            task_id=task_id,
            pool_name=spec.pool_name,
            command=spec.command,
            gpus=spec.gpus,
            image=spec.image,
            env=self._env,
            memory_bytes=spec.memory_bytes,
            cpu_millis=spec.cpu_millis,
            ports=(spec.port,),
            ready_path=spec.ready_path,
            endpoint=spec.name,
            workspace=spec.workspace,
            borrow=spec.borrow,
        )
        # A workspace's replica is listed under it (Levers9Workspace), as its tasks are.
        attributes = (
            TypedSearchAttributes([SearchAttributePair(WORKSPACE, spec.workspace)])
            if spec.workspace != DEFAULT_WORKSPACE
            else None
        )
        await workflow.start_child_workflow(
            TASK_WORKFLOW,
            task,
            id=task_workflow_id(task_id),
            task_queue=workflow.info().task_queue,
            parent_close_policy=ParentClosePolicy.ABANDON,
            static_summary=f"replica of endpoint {spec.name}",
            search_attributes=attributes,
        )
        self._state.started(task_id, workflow.now())

    async def _cancel(self, task_id: str, reason: str) -> None:
        handle = workflow.get_external_workflow_handle(task_workflow_id(task_id))
        with contextlib.suppress(FailureError):  # its record ended meanwhile
            await handle.signal("cancel", reason)

    async def _delete(self) -> EndpointView:
        state = self._state
        now = workflow.now()
        state.note(now, "delete", f"deleted: stopping {len(state.replicas)} replica(s)")
        for task_id in list(state.replicas):
            state.stopping(task_id)
            await self._cancel(task_id, f"endpoint {state.spec.name} deleted")
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(lambda: not state.replicas, timeout=DELETE_WAIT)
        await workflow.wait_condition(workflow.all_handlers_finished)
        return EndpointView.of(state, workflow.now())
