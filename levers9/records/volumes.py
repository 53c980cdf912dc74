"""Workspace volumes as Temporal holds them (VolumeWorkflow, `volume:<workspace>:<name>`): create,
read, list, delete. The gateway's Volumes service, its submit check and the run_task activity
read them here. Reads never ask the workflow: the record is its memo (`record`), which the
server answers alone, so a volume is found (or not) even while no Temporal worker polls.

A volume's id holds its workspace: another workspace's volume of the same name is another
record, and is never read in this workspace's name.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import WorkflowAlreadyStartedError

from levers9.core.volumes import VOLUME_WORKFLOW, VolumeRecord, volume_workflow_id
from levers9.records.found import delivered, or_none
from levers9.records.workspaces import workspace_clause
from levers9.search_attributes import WORKSPACE


class VolumeExists(Exception):
    """A volume of that name runs already in the workspace."""


async def _recorded(execution: WorkflowExecution) -> VolumeRecord | None:
    memo = await execution.memo()
    if "record" not in memo:
        return None
    record = VolumeRecord.model_validate(memo["record"])
    return None if record.deleting else record


class TemporalVolumeRecords:
    """The volumes of one controlplane (its task queue), by workspace."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self._client = client
        self._task_queue = task_queue

    def _handle(self, workspace: str, name: str) -> WorkflowHandle[Any, Any]:
        return self._client.get_workflow_handle(volume_workflow_id(workspace, name))

    async def create(self, record: VolumeRecord) -> None:
        """Starts the volume's record; VolumeExists when the workspace has one of that name."""
        spec = record.spec
        try:
            await self._client.start_workflow(
                VOLUME_WORKFLOW,
                record,
                id=volume_workflow_id(spec.workspace, spec.name),
                task_queue=self._task_queue,
                memo={"record": record.model_dump(mode="json")},
                search_attributes=TypedSearchAttributes(
                    [SearchAttributePair(WORKSPACE, spec.workspace)]
                ),
                static_summary=f"volume {spec.name} of workspace {spec.workspace}: {spec.bucket}",
            )
        except WorkflowAlreadyStartedError:
            raise VolumeExists(
                f"volume {spec.name} exists in workspace {spec.workspace}:"
                f" `levers9 volume delete {spec.name}` first"
            ) from None

    async def get(self, workspace: str, name: str) -> VolumeRecord | None:
        """The workspace's volume `name` (its memo); None when it has none (or it is being
        deleted)."""
        description = await or_none(self._handle(workspace, name).describe())
        if description is None or description.status != WorkflowExecutionStatus.RUNNING:
            return None
        return await _recorded(description)

    async def list(self, workspace: str | None) -> list[VolumeRecord]:
        """The volumes of `workspace`, or of every workspace (None), by workspace and name."""
        query = (
            f"WorkflowType='{VOLUME_WORKFLOW}' AND ExecutionStatus='Running'"
            f" AND TaskQueue='{self._task_queue}'"
        )
        if workspace is not None:
            query += workspace_clause(workspace)
        records = []
        async for execution in self._client.list_workflows(query):
            record = await _recorded(execution)
            if record is not None and (workspace is None or record.spec.workspace == workspace):
                records.append(record)
        return sorted(records, key=lambda r: (r.spec.workspace, r.spec.name))

    async def count(self, workspace: str) -> int:
        """How many volumes `workspace` has (Temporal's visibility: a create is counted once
        it is indexed, within a second or so)."""
        query = (
            f"WorkflowType='{VOLUME_WORKFLOW}' AND ExecutionStatus='Running'"
            f" AND TaskQueue='{self._task_queue}'" + workspace_clause(workspace)
        )
        return (await self._client.count_workflows(query)).count

    async def delete(self, workspace: str, name: str) -> bool:
        """Ends the volume's record; False when the workspace has no such volume."""
        return await delivered(self._handle(workspace, name).execute_update("delete"))
