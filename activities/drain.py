"""A drain's Temporal side, besides Kubernetes: the boxes whose task runs on the drained worker
are stopped as `levers9 box stop` stops them (a `--runtime runsc` box's task checkpointed first,
another's stopped saying why not), before the worker's other tasks are preempted, so that a
box's processes survive the drain. A box whose image went to its checkpoint volume
(`--checkpoints`) is started again at once, restored on another machine of the pool (the
drained worker is out of placement already); one whose image is on the drained node only stays
stopped: `levers9 box start` restores it there once the node is back."""

from __future__ import annotations

from temporalio import activity
from temporalio.client import Client

from activities.heartbeat import heartbeating
from levers9.config import ControlplaneSettings
from levers9.core.boxes import RUNNING, STOPPED
from levers9.logs import get_logger
from levers9.models import TERMINAL, BoxOnWorker, StopBoxes, WorkerBoxes
from levers9.records.boxes import TemporalBoxRecords
from levers9.records.tasks import task_record

log = get_logger("levers9.drain")


class DrainActivities:
    """The boxes of a drained worker; the Temporal client injected."""

    def __init__(self, client: Client, settings: ControlplaneSettings) -> None:
        self._client = client
        self._boxes = TemporalBoxRecords(client, settings.task_queue)

    @activity.defn
    async def boxes_on_worker(self, input: WorkerBoxes) -> list[BoxOnWorker]:
        """The running boxes of the pool whose task runs (or is placed) on the worker."""
        found = []
        for box in await self._boxes.list():
            if box.state != RUNNING or not box.task_id or box.task.pool_name != input.pool_name:
                continue
            record = await task_record(self._client, box.task_id)
            if record is None or record.state in TERMINAL or record.worker_id != input.worker_id:
                continue
            found.append(BoxOnWorker(workspace=box.workspace, name=box.name, task_id=box.task_id))
        return found

    @activity.defn
    async def stop_boxes(self, input: StopBoxes) -> list[str]:
        """`box stop` of each (its `stop` Update, which checkpoints a runsc box's task); returns
        what each box says now. A box stopped or restarted since is left alone."""
        said = []
        async with heartbeating():
            for ref in input.boxes:
                box = await self._boxes.get(ref.workspace, ref.name)
                if box is None or box.task_id != ref.task_id or box.state != RUNNING:
                    continue
                state = await self._boxes.stop(box, input.reason)
                reason = state.reason if state is not None else "gone"
                log.info(
                    "box stopped for a drain",
                    workspace=ref.workspace,
                    box=ref.name,
                    task_id=ref.task_id,
                    state=state.state if state is not None else "gone",
                    reason=reason,
                )
                if state is not None and state.state == STOPPED and state.checkpoint_stored:
                    started = await self._boxes.start(state)
                    if started is not None:
                        reason = f"{reason}; started again: {started.reason}"
                        log.info(
                            "box started again after a drain",
                            workspace=ref.workspace,
                            box=ref.name,
                            task_id=started.task_id,
                            checkpoint=state.checkpoint,
                        )
                said.append(f"{ref.workspace}/{ref.name}: {reason}")
        return said
