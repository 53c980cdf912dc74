"""Boxes as Temporal holds them (BoxWorkflow, `box:<workspace>:<name>`): create, read, list,
stop, start, delete, and the uses and task ends the gateway tells a box's record.

Reads never ask the workflow: the record is its memo (`record`), answered by the server alone,
so whose a box is is known even while no Temporal worker polls.
"""

from __future__ import annotations

import asyncio
import builtins
from typing import Any

from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import WorkflowAlreadyStartedError

from levers9.box_state import BoxInput, BoxState
from levers9.core.boxes import BOX_WORKFLOW, DELETING, box_workflow_id
from levers9.records.found import delivered, or_none
from levers9.records.workspaces import workspace_clause
from levers9.search_attributes import POOL_NAME, WORKSPACE

OUTCOME_WAIT_S = 15 * 60.0
"""How long `stop` and `delete` wait for the record's outcome: a checkpoint (two tries of six
minutes at most) or the removal of the box's images."""
OUTCOME_POLL_S = 0.5


class BoxExists(Exception):
    """A box of that name runs already in the workspace."""


async def _recorded(execution: WorkflowExecution) -> BoxState | None:
    memo = await execution.memo()
    if "record" not in memo:
        return None
    return BoxState.model_validate(memo["record"])


class TemporalBoxRecords:
    """The boxes of one controlplane (its task queue) as their workflows hold them."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self._client = client
        self._task_queue = task_queue

    def _handle(self, workspace: str, name: str) -> WorkflowHandle[Any, Any]:
        return self._client.get_workflow_handle(box_workflow_id(workspace, name))

    async def create(self, state: BoxState) -> None:
        """Starts the box's record (which starts its task); BoxExists when one of that name
        runs in the workspace."""
        try:
            await self._client.start_workflow(
                BOX_WORKFLOW,
                BoxInput(state=state),
                id=box_workflow_id(state.workspace, state.name),
                task_queue=self._task_queue,
                memo={"record": state.model_dump(mode="json")},
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(WORKSPACE, state.workspace),
                        SearchAttributePair(POOL_NAME, state.task.pool_name),
                    ]
                ),
                static_summary=f"box {state.name} of workspace {state.workspace}",
            )
        except WorkflowAlreadyStartedError:
            raise BoxExists(
                f"box {state.name} exists already in workspace {state.workspace}"
                f" (levers9 box get {state.name})"
            ) from None

    async def get(self, workspace: str, name: str) -> BoxState | None:
        """The running box's record (its memo); None when there is none, or it is being
        deleted."""
        description = await or_none(self._handle(workspace, name).describe())
        if description is None or description.status != WorkflowExecutionStatus.RUNNING:
            return None
        state = await _recorded(description)
        if state is None or state.state == DELETING or state.workspace != workspace:
            return None
        return state

    async def list(self, workspace: str | None = None) -> builtins.list[BoxState]:
        """The boxes (of one workspace, when given), by workspace and name."""
        query = (
            f"WorkflowType='{BOX_WORKFLOW}' AND ExecutionStatus='Running'"
            f" AND TaskQueue='{self._task_queue}'"
        )
        if workspace is not None:
            query += workspace_clause(workspace)
        states = []
        async for execution in self._client.list_workflows(query):
            state = await _recorded(execution)
            if state is not None and state.state != DELETING:
                states.append(state)
        return sorted(states, key=lambda s: (s.workspace, s.name))

    async def _update(self, box: BoxState, name: str, *args: object) -> BoxState | None:
        state: BoxState | None = await or_none(
            self._handle(box.workspace, box.name).execute_update(
                name, args=list(args), result_type=BoxState
            )
        )
        return state

    async def stop(
        self, box: BoxState, reason: str, within_s: float = OUTCOME_WAIT_S
    ) -> BoxState | None:
        """`box stop`: the record once stopped, or with why not (a `stop-refused` event). The
        Update answers at once while a checkpoint is taken (`stopping`): its outcome is read
        here from the record (query `box`) every OUTCOME_POLL_S, never waited for inside the
        Update; past `within_s`, the record as it is then (still `stopping`)."""
        state = await self._update(box, "stop", reason)
        if state is None or not state.stopping:
            return state
        asked = state.stopping
        handle = self._handle(box.workspace, box.name)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while loop.time() < deadline:
            await asyncio.sleep(OUTCOME_POLL_S)
            now: BoxState | None = await or_none(handle.query("box", result_type=BoxState))
            if now is None:
                return None
            state = now
            if now.stopping != asked:
                break
        return state

    async def start(self, box: BoxState, elsewhere: bool = False) -> BoxState | None:
        """`box start` (`elsewhere`: its stored checkpoint restored on another machine)."""
        if elsewhere:
            return await self._update(box, "start", True)
        return await self._update(box, "start")

    async def delete(self, box: BoxState, within_s: float = OUTCOME_WAIT_S) -> BoxState | None:
        """`box delete`: the record once its checkpoint images are removed (an event each saying
        where), read from the workflow's result: the Update answers at once. Past `within_s`,
        the Update's answer."""
        state = await self._update(box, "delete")
        if state is None:
            return None
        handle = self._client.get_workflow_handle(
            box_workflow_id(box.workspace, box.name), result_type=BoxState
        )
        try:
            async with asyncio.timeout(within_s):
                ended: BoxState = await handle.result()
                return ended
        except (TimeoutError, WorkflowFailureError):
            return state

    async def used(self, box: BoxState) -> bool:
        """Tells the box's record it was used now (its idle deadline moves)."""
        return await delivered(self._handle(box.workspace, box.name).signal("used"))

    async def task_ended(self, box: BoxState, state: str, reason: str) -> bool:
        """Tells the box's record its task ended (its record read so)."""
        return await delivered(
            self._handle(box.workspace, box.name).signal(
                "task_ended", args=[box.task_id, state, reason]
            )
        )
