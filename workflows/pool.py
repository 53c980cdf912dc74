"""PoolWorkflow (`pool:<pool>`): placement. Which available worker has how many free cards, and
which task waits for what (levers9/core/placement.py decides).

Workers announce themselves (signal `worker_available`, from WorkerWorkflow), leave
(`worker_gone`), step out of placement while silent (`worker_silent`; back on their next
`worker_available`, their card ledger kept), and for good while their node is drained
(`worker_draining`: what runs on them is preempted). A task asks with the signal `request`
(`requests`: a batch of them, as the controlplane sends a burst) and is told with the signal
`placed` to its record once one worker has that many cards free at once; it gives them back with
`release` (which also withdraws a task still waiting). Nothing waits inside an Update, so any
number of tasks can wait, and the workflow continues as new with its queue and card ledger whatever
is waiting, once its history grows. (The Update `place`, which waits for the placement, is what
task records asked through before the signals; no record asks so now, and while one is open the
workflow does not continue as new.)
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    from levers9.core.disks import disk_record_id
    from levers9.core.placement import Placement, PoolState, QueueSpot, Slot, image_key
    from levers9.core.pool_usage import PoolUsage, pool_usage
    from levers9.models import (
        POOL_WORKFLOW,
        DrainWorker,
        PlaceRequest,
        PoolInput,
        WorkerSlotInput,
        task_workflow_id,
    )

PREEMPT_SIGNAL = "reclaim-by-preempt-signal"
DISK_TASK_ENDED = "disk-task-ended-signal"
RESERVE_AFTER = timedelta(seconds=30)
"""How long a task waits before it reserves a worker against smaller tasks."""


@workflow.defn(name=POOL_WORKFLOW)
class PoolWorkflow:
    @workflow.init
    def __init__(self, input: PoolInput) -> None:
        # The state is set here, not in run: an Update or signal that arrives with the first
        # workflow task of a continued run is handled before run starts, and must see it.
        self._state = input.carried() or PoolState()
        self._changed = False
        self._telling = 0
        self._tellers: set[asyncio.Task[None]] = set()

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
                images=slot.images,
            )
        )
        self._changed = True

    @workflow.signal
    def worker_gone(self, worker_id: str) -> None:
        self._state.remove_worker(worker_id)
        self._changed = True

    @workflow.signal
    def worker_silent(self, worker_id: str) -> None:
        """No heartbeat for the liveness window: nothing more is placed on it until it is
        heard again (`worker_available`) or leaves (`worker_gone`)."""
        self._state.silence(worker_id)
        self._changed = True

    @workflow.signal
    def worker_draining(self, drain: DrainWorker) -> None:
        """The worker's node is being drained (WorkerWorkflow, told by its machine): nothing is
        placed on it again, and each task on it but those `spare`d (boxes' tasks, stopped with a
        checkpoint first) is preempted with the drain's reason (its record queues it again with
        a retry left, else ends it cancelled so)."""
        for placement in self._state.drain(drain.worker_id):
            if placement.task_id in drain.spare:
                continue
            self._telling += 1
            taker = asyncio.create_task(self._take_back(placement, drain.reason))
            self._tellers.add(taker)
            taker.add_done_callback(self._tellers.discard)
        self._changed = True

    @workflow.signal
    def release(self, task_id: str) -> None:
        placement = self._state.placed.get(task_id)
        self._state.release(task_id)
        self._changed = True
        if placement is not None and placement.disk_ids and workflow.patched(DISK_TASK_ENDED):
            for disk_id in placement.disk_ids:
                self._telling += 1
                teller = asyncio.create_task(self._disk_task_ended(disk_id, task_id))
                self._tellers.add(teller)
                teller.add_done_callback(self._tellers.discard)

    async def _disk_task_ended(self, disk_id: str, task_id: str) -> None:
        """Tells the disk's record a task of it ended (it reads the disk's use then)."""
        try:
            record = disk_record_id(disk_id)
            if record is not None:
                handle = workflow.get_external_workflow_handle(record)
                with contextlib.suppress(FailureError):  # the disk was deleted since
                    await handle.signal("task_ended", task_id)
        finally:
            self._telling -= 1
            if self._telling == 0:
                self._changed = True

    @workflow.signal
    def request(self, request: PlaceRequest) -> None:
        self.requests([request])

    @workflow.signal
    def requests(self, requests: list[PlaceRequest]) -> None:
        """Many tasks at once (the controlplane batches the requests of a burst: one signal,
        not 10,000, so that the pool's history and its continue-as-new keep up)."""
        for request in requests:
            since = request.created_at or workflow.now()
            if request.share is not None:
                self._state.set_share(request.workspace, request.share.quota, request.share.weight)
            self._state.request(
                request.task_id,
                request.gpus,
                since,
                notify=True,
                ports=request.ports,
                workspace=request.workspace,
                borrow=request.borrow,
                node=request.node,
                pinned_by=request.pinned_by,
                disk_ids=request.disk_ids,
                image=image_key(request.image) if request.image else "",
                avoid_node=request.avoid_node,
            )
        self._changed = True

    @workflow.update
    async def place(self, request: PlaceRequest) -> Placement:
        self._state.request(request.task_id, request.gpus, workflow.now())
        self._assign()
        self._tell()  # tasks that asked by signal and were placed just now (no wake-up: replay)
        await workflow.wait_condition(lambda: request.task_id in self._state.placed)
        return self._state.placed[request.task_id]

    @workflow.query
    def state(self) -> PoolState:
        """The whole state: past Temporal's 2 MB answer with a long queue (about 11,000 waiting
        tasks). `pool get` and `workspace get` ask `usage`, whose answer stays small."""
        return self._state

    @workflow.query
    def usage(self) -> PoolUsage:
        """The pool's cards and queue, and each workspace's part of them (counts, not tasks)."""
        return pool_usage(self._state)

    @workflow.query
    def queue_spot(self, task_id: str) -> QueueSpot | None:
        return self._state.spot(task_id)

    @workflow.query
    def node_workers(self, node_name: str) -> list[Slot]:
        """The workers of the node that can be called now (not silent), by id."""
        slots = [s for s in self._state.placeable() if s.node_name == node_name]
        return sorted(slots, key=lambda s: s.worker_id)

    @workflow.query
    def disk_users(self, disk_id: str) -> list[str]:
        """The tasks placed or waiting that mount the disk (a disk in use is not deleted)."""
        return self._state.disk_users(disk_id)

    @workflow.query
    def waiting_total(self) -> int:
        """How many tasks wait, every workspace's (a submit is refused past POOL_MAX_WAITING)."""
        return len(self._state.waiting)

    @workflow.query
    def waiting_count(self, workspace: str) -> int:
        """How many of the workspace's tasks wait (a workspace's max-queued is checked
        against it at submit)."""
        return self._state.waiting_in(workspace)

    @workflow.run
    async def run(self, input: PoolInput) -> None:
        untold = any(task_id in self._state.placed for task_id in self._state.notify)
        if untold:
            self._tell()  # placed by the run before, after it stopped telling
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
            # Long, it tells no new placement (they stay in the carried state's `notify`, told
            # by the next run), so that the ones being told drain and it can continue: under a
            # standing queue some were always in flight, and the run grew past 19,000 events
            # of its 5,000 (Temporal ends a run at 51,200, and the pool would start empty).
            if not long:
                self._tell()
            # Once no placement is being told (those signals are commands of this run) and no
            # Update is open; a signal arriving meanwhile lands in the state carried over.
            if long and self._telling == 0 and workflow.all_handlers_finished():
                workflow.continue_as_new(input.carrying(self._state))

    def _assign(self) -> None:
        self._state.assign(workflow.now(), RESERVE_AFTER)
        for placement, workspace in self._state.reclaim():
            # Its record stops it and queues it again (`--retries`) or ends it cancelled, with
            # this reason; its cards come back by `release` once nothing runs on them, and go
            # to the task within quota.
            self._telling += 1
            reclaimer = asyncio.create_task(
                self._take_back(placement, f"preempted: reclaimed by workspace {workspace}")
            )
            self._tellers.add(reclaimer)
            reclaimer.add_done_callback(self._tellers.discard)

    async def _take_back(self, placement: Placement, reason: str) -> None:
        """Tells the task's record its cards are taken back (`reason` names the workspace)."""
        handle = workflow.get_external_workflow_handle(task_workflow_id(placement.task_id))
        # `preempt`: a task with retries left queues again, one without ends cancelled (runs
        # of older code sent `cancel`, which ends it whatever its retries).
        signal = "preempt" if workflow.patched(PREEMPT_SIGNAL) else "cancel"
        try:
            await handle.signal(signal, reason)
        except FailureError:
            self._state.release(placement.task_id)  # its record ended already
            self._changed = True
        finally:
            self._telling -= 1
            if self._telling == 0:
                self._changed = True

    def _tell(self) -> None:
        """Signals `placed` to each task that asked by signal and has been placed since."""
        notify, placed = self._state.notify, self._state.placed
        told = [t for t in notify if t in placed]
        if told:
            self._state.notify = [t for t in notify if t not in placed]
        for task_id in told:
            self._telling += 1
            teller = asyncio.create_task(self._tell_one(self._state.placed[task_id]))
            self._tellers.add(teller)
            teller.add_done_callback(self._tellers.discard)

    async def _tell_one(self, placement: Placement) -> None:
        handle = workflow.get_external_workflow_handle(task_workflow_id(placement.task_id))
        try:
            await handle.signal("placed", placement)
        except FailureError:
            # Its record has ended (cancelled while queued, say): nothing will use the cards.
            self._state.release(placement.task_id)
            self._changed = True
        finally:
            self._telling -= 1
            if self._telling == 0:
                self._changed = True  # the loop looks again (continue as new, say)
