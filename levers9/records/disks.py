"""Durable disks as Temporal holds them (DiskWorkflow, `disk:<workspace>:<name>`): create, read,
list, delete; where a new disk goes (the pool's machine records and the disks already there);
whether a disk is lost (its node is no machine of its pool now); which tasks use one (the pool's
placement state). The gateway's Disks service and the task activities read them through
`TemporalDiskRecords`.

Reads of a disk never ask its workflow: the record is its memo (`record`), answered by the
server alone, so whose a disk is is known even while no Temporal worker polls.
"""

from __future__ import annotations

import asyncio
import builtins
from typing import Any

from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import WorkflowAlreadyStartedError

from levers9.core.disks import (
    DISK_WORKFLOW,
    DiskInput,
    DiskState,
    DiskView,
    MachineRoom,
    disk_view,
    disk_workflow_id,
)
from levers9.models import pool_workflow_id
from levers9.records.found import QUERY_WITHIN_S, or_none, query_within
from levers9.records.listing import machine_records, pool_clause
from levers9.records.workspaces import workspace_clause
from levers9.search_attributes import NODE_NAME, POOL_NAME, WORKSPACE
from levers9.temporal import pool_names


class DiskExists(Exception):
    """A disk of that name runs already in the workspace."""


async def _recorded(execution: WorkflowExecution) -> DiskState | None:
    memo = await execution.memo()
    if "record" not in memo:
        return None
    return DiskState.model_validate(memo["record"])


class TemporalDiskRecords:
    """The disks of one controlplane (its task queue) as their workflows hold them."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self._client = client
        self._task_queue = task_queue

    def _handle(self, workspace: str, name: str) -> WorkflowHandle[Any, Any]:
        return self._client.get_workflow_handle(disk_workflow_id(workspace, name))

    async def create(self, state: DiskState) -> None:
        """Starts the disk's record; DiskExists when one of that name runs in the workspace."""
        try:
            await self._client.start_workflow(
                DISK_WORKFLOW,
                DiskInput(state=state),
                id=disk_workflow_id(state.workspace, state.name),
                task_queue=self._task_queue,
                memo={"record": state.model_dump(mode="json")},
                search_attributes=TypedSearchAttributes(
                    [
                        SearchAttributePair(WORKSPACE, state.workspace),
                        SearchAttributePair(POOL_NAME, state.pool_name),
                        SearchAttributePair(NODE_NAME, state.node_name),
                    ]
                ),
                static_summary=f"disk {state.name} of workspace {state.workspace}",
            )
        except WorkflowAlreadyStartedError:
            raise DiskExists(
                f"disk {state.name} exists already in workspace {state.workspace}"
            ) from None

    async def get(self, workspace: str, name: str) -> DiskState | None:
        """The running disk's record (its memo); None when there is none, or it is being
        deleted."""
        description = await or_none(self._handle(workspace, name).describe())
        if description is None or description.status != WorkflowExecutionStatus.RUNNING:
            return None
        state = await _recorded(description)
        if state is None or state.deleting or state.workspace != workspace:
            return None
        return state

    async def list(
        self, workspace: str | None = None, pool_name: str | None = None
    ) -> builtins.list[DiskState]:
        """The disks (of one workspace, of one pool, when given), by workspace and name;
        ValueError naming the field for a name that is not a DNS label."""
        query = (
            f"WorkflowType='{DISK_WORKFLOW}' AND ExecutionStatus='Running'"
            f" AND TaskQueue='{self._task_queue}'"
        )
        if workspace is not None:
            query += workspace_clause(workspace)
        query += pool_clause(pool_name)
        states = []
        async for execution in self._client.list_workflows(query):
            state = await _recorded(execution)
            if state is not None and not state.deleting:
                states.append(state)
        return sorted(states, key=lambda s: (s.workspace, s.name))

    async def delete(self, workspace: str, name: str) -> DiskState | None:
        """Ends the disk's record (it says deleting when this returns); None when no such disk
        runs."""
        state: DiskState | None = await or_none(
            self._handle(workspace, name).execute_update("delete", result_type=DiskState)
        )
        return state

    async def ended(self, disk: DiskState, within: float) -> DiskState | None:
        """The disk's record once its workflow ended (its file removed, or why not), or None
        after `within` seconds."""
        handle = self._client.get_workflow_handle(
            disk_workflow_id(disk.workspace, disk.name), result_type=DiskState
        )
        try:
            async with asyncio.timeout(within):
                ended: DiskState = await handle.result()
        except TimeoutError:
            return None
        return ended

    async def pool_names(self) -> builtins.list[str]:
        """The pools a disk may go to: those this controlplane reconciles."""
        return await pool_names(self._client, self._task_queue)

    async def machine_nodes(self, pool_name: str) -> set[str]:
        """The nodes that are machines of the pool now (their records run)."""
        return {
            r.node_name for r in await machine_records(self._client, self._task_queue, pool_name)
        }

    async def rooms(self, pool_name: str) -> builtins.list[MachineRoom]:
        """The pool's machines, each with the bytes of disks its node holds already."""
        taken: dict[str, int] = {}
        for disk in await self.list(pool_name=pool_name):
            taken[disk.node_name] = taken.get(disk.node_name, 0) + disk.size_bytes
        return [
            MachineRoom(
                node_name=record.node_name,
                ready=record.machine,
                disk_bytes=taken.get(record.node_name, 0),
            )
            for record in await machine_records(self._client, self._task_queue, pool_name)
        ]

    async def view(self, disk: DiskState) -> DiskView:
        """The disk with its state now: lost when its node is no machine of its pool."""
        return disk_view(disk, await self.machine_nodes(disk.pool_name))

    async def views(self, disks: builtins.list[DiskState]) -> builtins.list[DiskView]:
        """`view` of each, reading each pool's machines once."""
        nodes: dict[str, set[str]] = {}
        for pool in {d.pool_name for d in disks}:
            nodes[pool] = await self.machine_nodes(pool)
        return [disk_view(d, nodes[d.pool_name]) for d in disks]

    async def users(self, disk: DiskState) -> builtins.list[str]:
        """The tasks placed or waiting in its pool that mount the disk (NoQueryAnswer when
        the pool's placement does not answer)."""
        handle = self._client.get_workflow_handle(pool_workflow_id(disk.pool_name))
        users: builtins.list[str] | None = await or_none(
            query_within(
                handle, "disk_users", QUERY_WITHIN_S, disk.disk_id, result_type=builtins.list[str]
            )
        )
        return users or []
