"""Workspaces as Temporal holds them (WorkspaceWorkflow, `workspace:<name>`): create, read, list,
change, delete, and their tokens' records. The gateway's Workspaces service and its token check
read and tell them through `TemporalWorkspaceRecords`.

Reads never ask the workflow: the record is its memo (`record`), answered by the server alone,
so a token is checked even while no Temporal worker polls.
"""

from __future__ import annotations

import builtins
from typing import Any

from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import WorkflowAlreadyStartedError

from levers9.core.pool_usage import WorkspaceUsage
from levers9.core.workspaces import (
    WORKSPACE_WORKFLOW,
    WorkspaceLimits,
    WorkspaceState,
    WorkspaceToken,
    name_problem,
    workspace_workflow_id,
)
from levers9.models import TASK_WORKFLOW, WorkspaceInput
from levers9.records.found import delivered, or_none
from levers9.records.pools import TemporalPoolRecords
from levers9.search_attributes import WORKSPACE
from levers9.temporal import pool_names


class WorkspaceExists(Exception):
    """A workspace of that name runs already."""


def workspace_clause(workspace: str) -> str:
    """The visibility query's clause for one workspace; ValueError naming `workspace` unless the
    name is one (a DNS label), so no quote ever reaches the query."""
    problem = name_problem(workspace)
    if problem is not None:
        raise ValueError(f"workspace: {problem}")
    return f" AND Levers9Workspace='{workspace}'"


async def _recorded(execution: WorkflowExecution) -> WorkspaceState | None:
    memo = await execution.memo()
    if "record" not in memo:
        return None
    return WorkspaceState.model_validate(memo["record"])


class TemporalWorkspaceRecords:
    """The workspaces of one controlplane (its task queue) as their workflows hold them."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self._client = client
        self._task_queue = task_queue

    def _handle(self, name: str) -> WorkflowHandle[Any, Any]:
        return self._client.get_workflow_handle(workspace_workflow_id(name))

    async def create(self, state: WorkspaceState) -> None:
        """Starts the workspace's record; WorkspaceExists when one of that name runs."""
        try:
            await self._client.start_workflow(
                WORKSPACE_WORKFLOW,
                WorkspaceInput(state=state),
                id=workspace_workflow_id(state.name),
                task_queue=self._task_queue,
                memo={"record": state.model_dump(mode="json")},
                search_attributes=TypedSearchAttributes(
                    [SearchAttributePair(WORKSPACE, state.name)]
                ),
                static_summary=f"workspace {state.name}",
            )
        except WorkflowAlreadyStartedError:
            raise WorkspaceExists(f"workspace {state.name} exists already") from None

    async def get(self, name: str) -> WorkspaceState | None:
        """The running workspace's record (its memo); None when there is none, or it is being
        deleted."""
        description = await or_none(self._handle(name).describe())
        if description is None or description.status != WorkflowExecutionStatus.RUNNING:
            return None
        state = await _recorded(description)
        return None if state is None or state.deleting else state

    async def list(self) -> list[WorkspaceState]:
        query = (
            f"WorkflowType='{WORKSPACE_WORKFLOW}' AND ExecutionStatus='Running'"
            f" AND TaskQueue='{self._task_queue}'"
        )
        states = []
        async for execution in self._client.list_workflows(query):
            state = await _recorded(execution)
            if state is not None and not state.deleting:
                states.append(state)
        return sorted(states, key=lambda s: s.name)

    async def set_limits(self, name: str, limits: WorkspaceLimits) -> WorkspaceState | None:
        """The record with `limits` applied; None when no such workspace runs."""
        result: WorkspaceState | None = await or_none(
            self._handle(name).execute_update("set_limits", limits, result_type=WorkspaceState)
        )
        return result

    async def add_token(self, name: str, token: WorkspaceToken) -> str | None:
        """ "" when the token's record (its hash) is kept; why not; None: no such workspace."""
        refusal: str | None = await or_none(
            self._handle(name).execute_update("add_token", token, result_type=str)
        )
        return refusal

    async def revoke_token(self, name: str, token_id: str) -> str | None:
        """ "" when revoked; why not; None: no such workspace."""
        refusal: str | None = await or_none(
            self._handle(name).execute_update("revoke_token", token_id, result_type=str)
        )
        return refusal

    async def token_used(self, name: str, token_id: str) -> None:
        await delivered(self._handle(name).signal("token_used", token_id))

    async def running_tasks(self, name: str) -> int:
        """How many of the workspace's tasks are running (queued, placed or running)."""
        query = (
            f"WorkflowType='{TASK_WORKFLOW}' AND ExecutionStatus='Running'"
            f" AND TaskQueue='{self._task_queue}'" + workspace_clause(name)
        )
        return (await self._client.count_workflows(query)).count

    async def delete(self, name: str) -> bool:
        """Ends the workspace (its record says so when this returns); False when no such
        workspace runs."""
        return await delivered(self._handle(name).execute_update("delete"))

    async def pool_names(self) -> builtins.list[str]:
        """The pools a workspace's task may name: those this controlplane reconciles."""
        return await pool_names(self._client, self._task_queue)

    async def pool_usage(self, name: str) -> builtins.list[tuple[str, WorkspaceUsage]]:
        """The workspace's part of each pool it has work in (or whose placement knows its
        quota), by pool; a pool whose placement does not answer is left out."""
        pools = TemporalPoolRecords(self._client, self._task_queue)
        found: builtins.list[tuple[str, WorkspaceUsage]] = []
        for pool in await self.pool_names():
            usage = await pools.usage(pool)
            if isinstance(usage, str):
                continue
            found.extend((pool, row) for row in usage.workspaces if row.workspace == name)
        return found
