"""DiskWorkflow (`disk:<workspace>:<name>`): a durable disk's record (`levers9 disk create`).

It holds where the disk is (pool, node), its size and its id (the image file's name under the
node's `durableDisksPath`), and what the agent last said it uses (signal `usage`). The Update
`delete` marks it deleting and ends it; the gateway refuses a delete while a task uses the disk,
before it asks. Query `disk`. The record is also its memo (`record`), so the gateway reads a
disk, and whose it is, without a Temporal worker. It waits on messages only, and continues as
new with its record past `max_history_events`.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from levers9.core.disks import DISK_WORKFLOW, DiskInput, DiskState


@workflow.defn(name=DISK_WORKFLOW)
class DiskWorkflow:
    @workflow.init
    def __init__(self, input: DiskInput) -> None:
        self._state: DiskState = input.state

    @workflow.query
    def disk(self) -> DiskState:
        return self._state

    @workflow.signal
    def usage(self, used_bytes: int) -> None:
        if used_bytes != self._state.used_bytes:
            self._state.used_bytes = used_bytes
            self._publish()

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
        await workflow.wait_condition(
            lambda: (
                self._state.deleting
                or workflow.info().get_current_history_length() > input.max_history_events
            )
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        if not self._state.deleting:
            workflow.continue_as_new(
                input.model_copy(update={"state": self._state}), memo=self._memo()
            )
        return self._state
