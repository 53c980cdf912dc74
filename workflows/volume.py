"""VolumeWorkflow (`volume:<workspace>:<name>`): a workspace volume's record (`levers9 volume
create`): its bucket, endpoint and region, and its credentials sealed under the controlplane's
key (levers9.sealed): never the credentials themselves. The record is its memo (`record`), read
by the gateway and the run_task activity without a Temporal worker. Update `delete` ends it;
nothing else changes a volume (create another to change its bucket or key), so its history
stays a handful of events.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from levers9.core.volumes import VOLUME_WORKFLOW, VolumeRecord


@workflow.defn(name=VOLUME_WORKFLOW)
class VolumeWorkflow:
    @workflow.init
    def __init__(self, input: VolumeRecord) -> None:
        self._record = input

    @workflow.query
    def volume(self) -> VolumeRecord:
        return self._record

    @workflow.update
    def delete(self) -> None:
        self._record.deleting = True
        workflow.upsert_memo({"record": self._record.model_dump(mode="json")})

    @workflow.run
    async def run(self, input: VolumeRecord) -> None:
        await workflow.wait_condition(lambda: self._record.deleting)
        await workflow.wait_condition(workflow.all_handlers_finished)
