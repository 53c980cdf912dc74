"""DiskWorkflow (`disk:<workspace>:<name>`): a durable disk's record (`levers9 disk create`).

It holds where the disk is (pool, node), its size and its id (the image file's name under the
node's `durableDisksPath`), and what it held when a task of it last ended (signal `task_ended`,
from its pool: it reads the use from a worker of its node, ListNodeDisks). The Update `delete`
marks it deleting; the gateway refuses a delete while a task uses the disk, before it
asks. Deleting, it has a worker of the disk's node remove the file (DeleteNodeDisk, on the
replica queue of a tunnelled worker) and ends, its record saying what became of the file (it
stays when the node has no worker now, or the agent could not remove it). Query `disk`.

The record is also its memo (`record`), so the gateway reads a disk, and whose it is, without a
Temporal worker. It waits on messages only, and continues as new with its record past
`max_history_events`.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows.steps import failure_reason

with workflow.unsafe.imports_passed_through():
    from activities.dispatch import TaskActivities
    from levers9.core.disks import DISK_WORKFLOW, DiskFile, DiskInput, DiskState

FILE_TIMEOUT = timedelta(seconds=60)
"""Bounds each step of a file's removal, from the schedule (a replica queue nobody polls)."""
FILE_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=5), maximum_attempts=3)


@workflow.defn(name=DISK_WORKFLOW)
class DiskWorkflow:
    @workflow.init
    def __init__(self, input: DiskInput) -> None:
        self._state: DiskState = input.state
        self._stale = False

    @workflow.query
    def disk(self) -> DiskState:
        return self._state

    @workflow.signal
    def task_ended(self, task_id: str) -> None:
        """A task that mounted the disk ended (its pool says so): its use is read again."""
        self._stale = True

    @workflow.update
    def delete(self) -> DiskState:
        self._state.deleting = True
        self._publish()
        return self._state

    def _publish(self) -> None:
        workflow.upsert_memo(self._memo())

    def _memo(self) -> dict[str, object]:
        return {"record": self._state.model_dump(mode="json")}

    @workflow.run
    async def run(self, input: DiskInput) -> DiskState:
        def long() -> bool:
            return workflow.info().get_current_history_length() > input.max_history_events

        while not self._state.deleting:
            await workflow.wait_condition(lambda: self._state.deleting or self._stale or long())
            if self._stale and not self._state.deleting:
                self._stale = False
                await self._read_use()
            elif long() and not self._state.deleting:
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self._state.deleting:
                    workflow.continue_as_new(
                        input.model_copy(update={"state": self._state}), memo=self._memo()
                    )
        await workflow.wait_condition(workflow.all_handlers_finished)
        await self._remove_file()
        return self._state

    async def _read_use(self) -> None:
        """What the disk's filesystem holds now, from a worker of its node (kept as it was when
        the node has no worker, or it does not answer)."""
        state = self._state
        file = DiskFile(pool_name=state.pool_name, node_name=state.node_name, disk_id=state.disk_id)
        try:
            worker: DiskFile | None = await workflow.execute_activity_method(
                TaskActivities.disk_worker,
                file,
                schedule_to_close_timeout=FILE_TIMEOUT,
                retry_policy=FILE_RETRY,
            )
            if worker is None:
                return
            used: int | None = await workflow.execute_activity_method(
                TaskActivities.node_disk_use,
                worker,
                task_queue=worker.task_queue or workflow.info().task_queue,
                schedule_to_close_timeout=FILE_TIMEOUT,
                retry_policy=FILE_RETRY,
                summary=f"ListNodeDisks on worker {worker.worker_id} ({state.node_name})",
            )
        except ActivityError as exc:
            workflow.logger.warning("disk use not read: %s", failure_reason(exc))
            return
        if used is not None and used != state.used_bytes:
            state.used_bytes = used
            self._publish()

    async def _remove_file(self) -> None:
        """Has a worker of the disk's node remove its file; the record says what became of it."""
        state = self._state
        kept = (
            f"its file {state.disk_id}.ext4 stays under durableDisksPath on node {state.node_name}"
        )
        file = DiskFile(pool_name=state.pool_name, node_name=state.node_name, disk_id=state.disk_id)
        try:
            worker: DiskFile | None = await workflow.execute_activity_method(
                TaskActivities.disk_worker,
                file,
                schedule_to_close_timeout=FILE_TIMEOUT,
                retry_policy=FILE_RETRY,
            )
            if worker is None:
                state.file = f"{kept} (the node has no worker now): remove it there"
            else:
                removed: bool = await workflow.execute_activity_method(
                    TaskActivities.delete_node_disk,
                    worker,
                    task_queue=worker.task_queue or workflow.info().task_queue,
                    schedule_to_close_timeout=FILE_TIMEOUT,
                    retry_policy=FILE_RETRY,
                    summary=f"DeleteNodeDisk on worker {worker.worker_id} ({state.node_name})",
                )
                state.file_removed = removed
                state.file = (
                    f"its file removed from node {state.node_name}"
                    if removed
                    else f"node {state.node_name} held no file of it (no task had used it)"
                )
        except ActivityError as exc:
            state.file = f"{kept} ({failure_reason(exc)}): remove it there"
        self._publish()
