"""PoolWorkflow (`pool:<pool>`): placement. Which available worker has how many free cards, and
which task waits for what (levers9/placement.py decides).

Workers announce themselves (signal `worker_available`, from WorkerWorkflow) and leave
(`worker_gone`); a task asks with the Update `place`, which completes when one worker has that
many cards free at once, and gives them back with the signal `release`. It continues as new with
its state once its history grows, when no placement is waiting on it.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from levers9.models import POOL_WORKFLOW, PlaceRequest, PoolInput, WorkerSlotInput
    from levers9.placement import Placement, PoolState, Slot

RESERVE_AFTER = timedelta(seconds=30)
"""How long a task waits before it reserves a worker against smaller tasks."""


@workflow.defn(name=POOL_WORKFLOW)
class PoolWorkflow:
    @workflow.init
    def __init__(self, input: PoolInput) -> None:
        # The state is set here, not in run: an Update or signal that arrives with the first
        # workflow task of a continued run is handled before run starts, and must see it.
        self._state = input.state or PoolState()
        self._changed = False

    @workflow.signal
    def worker_available(self, slot: WorkerSlotInput) -> None:
        self._state.add_worker(
            Slot(
                worker_id=slot.worker_id,
                node_name=slot.node_name,
                address=slot.address,
                task_queue=slot.task_queue,
                tls=slot.tls,
                devices=slot.devices,
                node_gpus=slot.node_gpus,
            )
        )
        self._changed = True

    @workflow.signal
    def worker_gone(self, worker_id: str) -> None:
        self._state.remove_worker(worker_id)
        self._changed = True

    @workflow.signal
    def release(self, task_id: str) -> None:
        self._state.release(task_id)
        self._changed = True

    @workflow.update
    async def place(self, request: PlaceRequest) -> Placement:
        self._state.request(request.task_id, request.gpus, workflow.now())
        self._assign()
        await workflow.wait_condition(lambda: request.task_id in self._state.placed)
        return self._state.placed[request.task_id]

    @workflow.query
    def state(self) -> PoolState:
        return self._state

    @workflow.run
    async def run(self, input: PoolInput) -> None:
        while True:
            # Re-evaluate on every change, and at the reservation threshold for waiting tasks.
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(lambda: self._changed, timeout=RESERVE_AFTER)
            self._changed = False
            self._assign()
            info = workflow.info()
            long = (
                info.get_current_history_length() > input.max_history_events
                or info.is_continue_as_new_suggested()
            )
            if long and not self._state.waiting and workflow.all_handlers_finished():
                workflow.continue_as_new(input.model_copy(update={"state": self._state}))

    def _assign(self) -> None:
        self._state.assign(workflow.now(), RESERVE_AFTER)
