"""TaskWorkflow (`task:<id>`): one task and its record.

    request (PoolWorkflow's signal `request`, through an activity that refuses a task no
    machine of the pool can hold) -> wait for the pool's signal `placed` -> RunTask on the worker
    (retried) -> the worker's ReportTask (signal `report`), with a GetTask poll as the fallback
    -> release

While it waits it asks the pool again now and then (`TaskInput.ask_again_seconds`, doubling to
an hour). A task cancelled while it waits leaves the queue at once (`release` withdraws it) and
ends `cancelled`.

While the task runs, a record whose history passes `max_history_events` (a worker that reports
progress and never its end, say) continues as new with its record, placement, route and
cancellation, and goes on waiting for the end; its cards stay held across it and are released
once, by the run that sees the end.

A task whose RunTask never got through, on a worker whose record has since ended (its node
removed, say), never ran there: its cards are released and it is placed again (at most
`PLACEMENTS` times). A task that did start is never started again: a worker lost mid-task
ends it `lost`.

Unless it has retries (`TaskInput.retries`, `levers9 run --retries N`): an attempt that ended
failed or lost, or was taken back by the pool for a workspace within its quota (signal
`preempt`: stopped as on cancel), goes into the record's `attempts` and the task queues again,
after a back-off for a failure (`RETRY_BACKOFF`, doubling) and at once for a preemption. A
cancel or a success is never retried; a preempted task without a retry left ends `cancelled`
with the pool's reason.

`levers9 task checkpoint` (Update `checkpoint`): a running task's worker checkpoints it
(activity `checkpoint_task`, on the queue of the replica holding a tunnelled worker's session,
as its other calls) and the task ends as the worker reports it, cancelled with "checkpointed to
NAME"; the record keeps the checkpoint (`checkpoints`) for `task restore`, which reads what the
task was submitted as from query `task`. A refusal (a runc task, a GPU task on a machine without
CUDA checkpointing) is the Update's answer, and the task runs on. Behind patch
`updates-return-at-once` the Update answers at once with the ask's number (nothing waits in an
open Update): the record then says the outcome, the checkpoint in `checkpoints` or the refusal
in `checkpoint_refusals` (or the task's end), and the caller reads it there.

Phases carry timestamps (placement, the worker's `worker.gpu_assignment`, container start and
exit); failures keep the worker's reason verbatim (`not enough GPUs available ...`). A worker
that stops answering fails the task with that reason, never silently.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    FailureError,
    TimeoutType,
)
from temporalio.exceptions import TimeoutError as ActivityTimeout

from workflows.steps import failure_reason

with workflow.unsafe.imports_passed_through():
    from activities.dispatch import TUNNEL_RECONNECTING, TaskActivities
    from levers9.box_state import BoxCheckpoint, CheckpointOutcome
    from levers9.core.placement import Placement
    from levers9.core.task_reports import TaskPhase, TaskReport
    from levers9.models import (
        PREEMPTED,
        TASK_WORKFLOW,
        TERMINAL,
        CheckpointRefusal,
        PlaceRequest,
        ReplicaReport,
        TaskAttempt,
        TaskCheckpoint,
        TaskInput,
        TaskRecord,
        TaskResume,
        WorkerTaskInput,
        endpoint_workflow_id,
        pool_workflow_id,
        task_checkpoint_name,
    )

T = TypeVar("T")
WORKER_TIMEOUT = timedelta(seconds=30)
RUN_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=5), maximum_attempts=10)
POLL_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=5), maximum_attempts=6)
LIVENESS = (timedelta(seconds=60), timedelta(minutes=15))
"""Without a report, GetTask asks the worker after the first, then doubling up to the second:
the worker reports the task's start and end itself, so a task's history grows with the log of
its running time (a 72-hour task: under 300 checks), not linearly with it."""
PLACEMENTS = 3
ENDED_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=5), maximum_attempts=5)
REPLICA_PICKUP = timedelta(seconds=20)
"""A call on a replica's queue that no replica picks up within this (the replica that held the
worker's tunnel is gone) is routed again from the worker's record."""
REROUTES = 10
"""How many times one call is routed again after no replica picked it up; a tunnel's waits
(TUNNEL_WAIT) are counted apart."""
REROUTES_APART_PATCH = "reroutes-counted-apart-from-tunnel-waits"
"""Histories before it counted each tunnel wait as a reroute, and compared with `==`: after more
than REROUTES waits, calls no replica picked up were routed again without end."""
TUNNEL_WAIT = timedelta(minutes=3)
"""How long a call waits for a tunnelled worker to reconnect (its backoff's ceiling is 30 s,
after a controlplane restart) before the task is lost with the worker."""
TUNNEL_POLL = timedelta(seconds=5)
CHECKPOINT_TIMEOUT = timedelta(minutes=6)
"""A checkpoint writes the sandbox's memory and writable layer, and may upload it."""
CHECKPOINT_RETRY = RetryPolicy(maximum_attempts=2)
AT_ONCE_PATCH = "updates-return-at-once"
"""Update `checkpoint` answers at once with the ask's number; the run takes the checkpoint and
the record says the outcome (`checkpoints`, `checkpoint_refusals`), which the caller reads
(levers9.records.tasks). Histories before it held the Update open meanwhile."""
KEPT_REFUSALS = 10
REQUEST_TIMEOUT = timedelta(seconds=30)
REQUEST_RETRY = RetryPolicy(maximum_interval=timedelta(seconds=10))
RETRY_BACKOFF = (timedelta(seconds=10), timedelta(minutes=5))
"""Before a failed or lost attempt's task queues again: the first, doubling up to the second
(as a Job's backoffLimit does); a preempted one queues again at once."""
ASK_AGAIN_AT_MOST = timedelta(hours=1)
"""A queued task asks the pool again after TaskInput.ask_again_seconds, doubling to this."""
MOUNT_REFUSALS = ("VolumeNotFound", "VolumeUnsealable", "NoSuchDisk")
"""run_task's refusals of a task's volume or disk (activities/dispatch.py): the reason is the
refusal itself (`volume data: ...`), not a lost worker."""


class _NeverStarted(Exception):
    """RunTask did not get through and the worker is gone: the task may go elsewhere."""


@workflow.defn(name=TASK_WORKFLOW)
class TaskWorkflow:
    @workflow.init
    def __init__(self, input: TaskInput) -> None:
        self._record: TaskRecord | None = None
        self._placement: Placement | None = None
        self._reports: list[TaskReport] = []
        self._route: WorkerTaskInput | None = None
        self._cancel: str | None = None
        self._cancel_sent = False
        self._preempt: str | None = None
        self._queued = False
        self._offered: Placement | None = None
        self._continuing = False
        self._task = input
        self._checkpoint: BoxCheckpoint | None = None
        """`task checkpoint` asked for this one; `_follow` takes it."""
        self._checkpointed: CheckpointOutcome | None = None
        self._ask = 0
        """The record's ask number of `_checkpoint` when its Update answered at once (0: the
        Update waits for `_checkpointed`)."""
        self._preempt_checkpoint = False
        """`_checkpoint` is a preemption's (`--on-preempt checkpoint`): the task is stopped by
        it, not by CancelTask, unless it is refused or fails."""
        self._restore_after: TaskCheckpoint | None = None
        """What that checkpoint took (stored in its volume): the next attempt restores it."""
        self._preempt_note = ""
        """What the preemption's checkpoint did, for the ended attempt's reason."""
        resume = input.resume
        if resume is not None:
            # Here, not in run: a report or cancel that arrives with the continued run's first
            # workflow task is handled before run starts, and must find the placement.
            self._record = resume.record
            self._placement = resume.placement
            self._route = resume.route
            self._cancel = resume.cancel
            self._cancel_sent = resume.cancel_sent
            self._preempt = resume.preempt
            self._restore_after = resume.restore_after

    @workflow.query
    def record(self) -> TaskRecord | None:
        return self._record

    @workflow.query
    def task(self) -> TaskInput:
        """What it was submitted as (`task restore` starts a restore from it)."""
        return self._task.model_copy(update={"resume": None})

    @workflow.update
    async def checkpoint(self, volume: str = "") -> CheckpointOutcome:
        """`levers9 task checkpoint`: its worker checkpoints it (uploading the image to the
        workspace's `volume` when one is named) and it ends; or the refusal, and it runs on."""
        record = self._record
        stopping = self._cancel is not None or self._preempt is not None
        if record is None or record.state != "running" or stopping:
            state = "unknown" if record is None else "stopping" if stopping else record.state
            task_id = self._task.task_id
            return CheckpointOutcome(
                refused=f"task {task_id} is {state}, not running: nothing to checkpoint",
                not_running=True,
            )
        if self._checkpoint is not None:
            return CheckpointOutcome(
                refused=f"checkpoint {self._checkpoint.name} of task {record.task_id} is being"
                " taken: wait for it"
            )
        self._checkpoint = _next_checkpoint(record, volume)
        self._checkpointed = None
        if workflow.patched(AT_ONCE_PATCH):
            # Accepted: the run takes it; the caller reads the outcome in the record.
            self._ask = record.checkpoint_asks + 1
            self._update(checkpoint_asks=self._ask)
            return CheckpointOutcome(name=self._checkpoint.name, asked=self._ask)
        await workflow.wait_condition(lambda: self._checkpointed is not None)
        outcome = self._checkpointed
        assert outcome is not None
        self._checkpoint = None
        self._checkpointed = None
        return outcome

    def _checkpoint_due(self) -> bool:
        return self._checkpoint is not None and self._checkpointed is None

    @workflow.signal
    def report(self, report: TaskReport) -> None:
        # Any valid worker token may report any task id: take only our worker's word, about
        # this attempt (an earlier attempt's late report, on the same worker, is not news).
        ours = self._placement is not None and report.worker_id == self._placement.worker_id
        if ours and report.attempt in (0, self._attempt_number()):
            self._reports.append(report)

    @workflow.signal
    def cancel(self, reason: str = "") -> None:
        """`levers9 task cancel`: a running task's container is stopped (SIGTERM, a grace,
        SIGKILL) and the task ends `cancelled`; a queued one leaves the queue and ends so at
        once, without running (its cards go back to the pool either way once nothing runs on
        them)."""
        if self._cancel is None:
            self._cancel = reason or "cancelled"

    @workflow.signal
    def preempt(self, reason: str) -> None:
        """The pool takes this task's cards back (for a workspace within its quota, or its
        node is drained; `reason` says which): the task is stopped as on cancel; with a retry
        left, or `--on-preempt requeue`, it queues again, else it ends `cancelled` with
        `reason`. With `--on-preempt checkpoint` a running task is checkpointed to its volume
        instead of stopped, and its next attempt restores it (refused or failed: as requeue)."""
        placed = self._placement is not None or self._offered is not None
        if self._preempt is not None or not placed:
            return
        self._preempt = reason
        record = self._record
        task = self._task
        if (
            task.on_preempt == "checkpoint"
            and record is not None
            and record.state == "running"
            and self._cancel is None
            and self._checkpoint is None
        ):
            self._preempt_checkpoint = True
            self._checkpoint = _next_checkpoint(record, task.checkpoint_volume)

    @workflow.signal
    def placed(self, placement: Placement) -> None:
        """The pool placed this task (the answer to its `request`)."""
        record = self._record
        if self._queued and self._offered is None and record is not None:
            self._offered = placement if placement.task_id == record.task_id else None

    @workflow.run
    async def run(self, input: TaskInput) -> TaskRecord:
        record = await self._run(input)
        if input.endpoint:  # (a run that continues as new never gets here)
            await self._tell_endpoint(input)
        if self._checkpoint_due():  # asked as it ended: nothing left to checkpoint
            self._checkpointed = CheckpointOutcome(
                refused=f"task {record.task_id} ended {record.state} first", not_running=True
            )
        await workflow.wait_condition(workflow.all_handlers_finished)
        return record

    async def _run(self, input: TaskInput) -> TaskRecord:
        if input.resume is not None:
            record = await self._resume(input, input.resume)
        else:
            self._record = TaskRecord.queued(input, workflow.now())
            # `levers9 task list` shows it while it waits.
            workflow.upsert_memo({"record": self._record.model_dump(mode="json")})
            record = await self._attempt(input)
        while self._retry_due(input):
            if not await self._queue_again():
                break
            record = await self._attempt(self._restoring(input))
        return record

    def _restoring(self, input: TaskInput) -> TaskInput:
        """The next attempt's task: restored from the checkpoint its preemption took, if any."""
        taken = self._restore_after
        if taken is None:
            return input
        return input.model_copy(
            update={
                "restore_from": taken.name,
                "restore_sha256": taken.sha256,
                "checkpoint_volume": taken.volume,
            }
        )

    def _retry_due(self, input: TaskInput) -> bool:
        """The attempt that just ended ran (or was placed) and failed, was lost or preempted,
        and the task has a retry left; never after a cancel."""
        record = self._record
        if record is None or self._cancel is not None:
            return False
        if record.worker_id is None:  # refused, or never started anywhere: as good as ended
            return False
        preempted = record.state == "cancelled" and self._preempt is not None
        if preempted and input.on_preempt:  # requeue, or checkpoint (taken or not)
            return True
        if len(record.attempts) >= input.retries:
            return False
        return preempted or record.state in ("failed", "lost")

    async def _queue_again(self) -> bool:
        """Keeps the ended attempt in the record and sets it queued again, after the back-off
        of a failure; False when it was cancelled meanwhile (the record then ends so)."""
        record = self._record
        assert record is not None
        preempted = self._preempt is not None and record.state == "cancelled"
        placed_at = [p.at for p in record.phases if p.name == "placement"]
        note, self._preempt_note = self._preempt_note, ""
        attempt = TaskAttempt(
            state=PREEMPTED if preempted else record.state,
            reason=f"{record.reason}; {note}" if note else record.reason,
            exit_code=record.exit_code,
            worker_id=record.worker_id,
            node_name=record.node_name,
            gpu_indices=record.gpu_indices,
            placed_at=placed_at[0] if placed_at else None,
            finished_at=record.finished_at,
        )
        self._update(
            state="queued",
            attempts=(*record.attempts, attempt),
            worker_id=None,
            node_name=None,
            address=None,
            tls=False,
            gpu_indices=(),
            phases=(),
            exit_code=None,
            result_json="",
            reason="",
            log_tail="",
            host="",
            image_digest="",
            ready=False,
            borrowed=False,
            finished_at=None,
        )
        self._preempt = None
        self._offered = None
        self._cancel_sent = False
        self._reports.clear()
        self._placement = None
        self._route = None
        if preempted:
            return True
        failures = sum(1 for a in record.attempts if a.state != PREEMPTED)
        backoff = min(RETRY_BACKOFF[0] * 2**failures, RETRY_BACKOFF[1])
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(lambda: self._cancel is not None, timeout=backoff)
        if self._cancel is None:
            return True
        self._finish("cancelled", f"{self._cancel} while waiting to retry")
        return False

    async def _attempt(self, input: TaskInput) -> TaskRecord:
        """One attempt: queued until placed, then run on its worker (placed again, up to
        PLACEMENTS times, while its RunTask never got through to a worker now gone)."""
        reason = ""
        for placements in range(1, PLACEMENTS + 1):
            summary = f"placement: waiting for one worker with {input.gpus} free cards" + (
                f" (placement {placements}: {reason})" if placements > 1 else ""
            )
            placement = await self._queue(input, summary)
            if placement is None:
                assert self._record is not None
                return self._record
            self._placement = placement
            try:
                return await self._run_on_worker(input, self._placement)
            except _NeverStarted as never:
                reason = str(never)
                self._update(
                    state="queued", worker_id=None, node_name=None, address=None, tls=False
                )
            finally:
                await self._release(input)
        return self._finish("failed", f"placed {PLACEMENTS} times, never started: {reason}")

    async def _release(self, input: TaskInput) -> None:
        if self._continuing:  # the next run holds the cards and releases them
            return
        pool = workflow.get_external_workflow_handle(pool_workflow_id(input.pool_name))
        with contextlib.suppress(FailureError):  # a pool that is gone holds no cards
            await pool.signal("release", input.task_id)

    async def _tell_endpoint(self, input: TaskInput) -> None:
        """An endpoint's replica tells `endpoint:<name>` it is ready, or how it ended."""
        record = self._record
        assert record is not None
        report = ReplicaReport(
            task_id=input.task_id,
            state=record.state if record.state in TERMINAL else "ready" if record.ready else "",
            reason=record.reason,
        )
        if not report.state:
            return
        endpoint = workflow.get_external_workflow_handle(endpoint_workflow_id(input.endpoint))
        with contextlib.suppress(FailureError):  # an endpoint deleted meanwhile
            await endpoint.signal("replica", report)

    async def _resume(self, input: TaskInput, resume: TaskResume) -> TaskRecord:
        """A run continued as new while its task ran (its state set in __init__): on
        following the task to its end."""
        try:
            return await self._follow(
                input, resume.placement, timedelta(seconds=resume.liveness_seconds)
            )
        finally:
            await self._release(input)

    async def _queue(self, input: TaskInput, summary: str) -> Placement | None:
        """Asks the pool and waits for its `placed`; None when the task ended meanwhile
        (cancelled while queued, or no machine of the pool can ever hold it)."""
        assert self._record is not None
        request = PlaceRequest(
            pool_name=input.pool_name,
            task_id=input.task_id,
            gpus=input.gpus,
            created_at=self._record.created_at,
            ports=input.ports,
            memory_bytes=input.memory_bytes,
            workspace=input.workspace,
            borrow=input.borrow,
            disks=tuple(m.name for m in input.mounts if m.kind == "disk"),
            image=input.image,
            **({"node": input.node, "pinned_by": _pin(input)} if input.node else {}),
            **({"avoid_node": input.avoid_node} if input.avoid_node else {}),
        )
        self._offered = None
        self._queued = True
        refused: str = await workflow.execute_activity_method(
            TaskActivities.request_placement,
            request,
            start_to_close_timeout=REQUEST_TIMEOUT,
            retry_policy=REQUEST_RETRY,
            summary=summary,
        )
        if refused:
            self._queued = False
            self._finish("failed", refused)
            return None
        refused = await self._wait_placed(input, request)
        if refused:
            self._queued = False
            self._finish("failed", refused)
            return None
        self._queued = False
        if self._offered is not None:
            return self._offered
        pool = workflow.get_external_workflow_handle(pool_workflow_id(input.pool_name))
        with contextlib.suppress(FailureError):  # withdraws it (or frees what it was given)
            await pool.signal("release", input.task_id)
        self._finish("cancelled", f"{self._cancel} while queued")
        return None

    async def _wait_placed(self, input: TaskInput, request: PlaceRequest) -> str:
        """Until placed or cancelled, asking the pool again now and then (a request it never
        took: a pool terminated and started empty, a signal a replica of older code left
        behind); a repeated request queues nothing twice. Returns why no machine of the pool
        can hold it any more, if that is what the pool's machines now say, else ""."""
        every = timedelta(seconds=input.ask_again_seconds)
        while True:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._offered is not None or self._cancel is not None, timeout=every
                )
            if self._offered is not None or self._cancel is not None:
                return ""
            every = min(every * 2, ASK_AGAIN_AT_MOST)
            refused: str = await workflow.execute_activity_method(
                TaskActivities.request_placement,
                request,
                start_to_close_timeout=REQUEST_TIMEOUT,
                retry_policy=REQUEST_RETRY,
                summary="still queued: asking the pool again",
            )
            if refused:
                return refused

    async def _run_on_worker(self, input: TaskInput, placement: Placement) -> TaskRecord:
        self._update(
            state="placed",
            worker_id=placement.worker_id,
            node_name=placement.node_name,
            address=placement.address,
            tls=placement.tls,
            gpu_indices=placement.gpu_indices,
            phases=(TaskPhase(name="placement", at=workflow.now()),),
            **({"borrowed": True} if placement.borrowed else {}),
        )
        on_worker = WorkerTaskInput(
            pool_name=input.pool_name,
            worker_id=placement.worker_id,
            address=placement.address,
            task=input,
            gpu_indices=placement.gpu_indices,
            task_queue=placement.task_queue,
            tls=placement.tls,
            **({"attempt": self._attempt_number()} if input.retries or input.on_preempt else {}),
        )
        self._route = on_worker
        stop = self._cancel or self._preempt
        if stop is not None:
            return self._finish("cancelled", f"{stop} before it started")
        try:
            await self._on_worker(
                TaskActivities.run_task,
                RUN_RETRY,
                f"RunTask on worker {placement.worker_id} ({placement.node_name}),"
                f" cards {','.join(map(str, placement.gpu_indices)) or 'none'}",
            )
        except ActivityError as exc:
            reason = failure_reason(exc)
            if not _refused_mount(exc):
                reason = f"worker lost before the task started: {reason}"
            if await self._worker_ended(on_worker):
                raise _NeverStarted(f"worker {placement.worker_id} ended; {reason}") from None
            return self._finish("failed", reason)
        self._update(state="running")
        return await self._follow(input, placement, LIVENESS[0])

    async def _follow(
        self, input: TaskInput, placement: Placement, liveness: timedelta
    ) -> TaskRecord:
        """Until the task's end: the worker's reports, a backed-off GetTask, a cancellation."""
        while True:
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: bool(self._reports) or self._cancel_due() or self._checkpoint_due(),
                    timeout=liveness,
                )
            if self._cancel_due():
                self._cancel_sent = True
                try:
                    await self._on_worker(
                        TaskActivities.cancel_task,
                        RUN_RETRY,
                        f"CancelTask on worker {placement.worker_id}: SIGTERM, then SIGKILL",
                    )
                except ActivityError as exc:
                    stop = self._cancel or self._preempt
                    reason = f"{stop}; the worker did not confirm: {failure_reason(exc)}"
                    return self._finish("cancelled", reason)
                continue  # the worker reports the task cancelled (or ended before it)
            if self._checkpoint_due() and not self._reports:
                await self._take_checkpoint()
                continue  # the worker reports the task cancelled (checkpointed)
            if self._reports:
                # The end says all; reports travel apart, so a start may come after it.
                ended = [r for r in self._reports if r.state in TERMINAL]
                report = ended[0] if ended else self._reports[-1]
                self._reports.clear()
            else:
                liveness = min(liveness * 2, LIVENESS[1])
                try:
                    report = await self._on_worker(
                        TaskActivities.get_task,
                        POLL_RETRY,
                        "GetTask: no report yet, ask the worker",
                    )
                except ActivityError as exc:
                    return self._finish("lost", f"worker lost mid-task: {failure_reason(exc)}")
                if report.attempt not in (0, self._attempt_number()):
                    continue  # the worker still holds an earlier attempt's record
            was_ready = self._record is not None and self._record.ready
            self._apply(report)
            if report.state in TERMINAL:
                # A cancelled task's reason is the canceller's (`task cancel --reason`, an
                # endpoint scaling down), not the worker's bare "cancelled".
                reason = report.reason
                stop = self._cancel or self._preempt
                if report.state == "cancelled" and stop:
                    reason = stop
                return self._finish(report.state, reason)
            if input.endpoint and report.ready and not was_ready:
                await self._tell_endpoint(input)
            long = workflow.info().get_current_history_length() > input.max_history_events
            if long:
                # A checkpoint asked for meanwhile is taken first (its Update waits for it).
                await workflow.wait_condition(
                    lambda: workflow.all_handlers_finished() or self._checkpoint_due()
                )
                if self._checkpoint_due():
                    continue
                if self._reports and not any(r.state in TERMINAL for r in self._reports):
                    self._apply(self._reports[-1])  # progress that came meanwhile: the latest
                    self._reports.clear()
                if not (self._reports or self._cancel_due()):  # else this run acts on them
                    self._continue(input, placement, liveness)

    async def _take_checkpoint(self) -> None:
        """CheckpointTask on its worker: the image is recorded (`checkpoints`) and the task
        ends as the worker then reports; refused or failed, the Update answers why."""
        request = self._checkpoint
        record = self._record
        assert request is not None
        assert record is not None
        try:
            outcome: CheckpointOutcome = await self._on_worker(
                TaskActivities.checkpoint_task,
                CHECKPOINT_RETRY,
                f"CheckpointTask {request.name}"
                + (f", uploaded to volume {request.volume}" if request.volume else ""),
                argument=request,
                within=CHECKPOINT_TIMEOUT,
            )
        except ActivityError as exc:
            outcome = CheckpointOutcome(refused=failure_reason(exc))
        if not outcome.refused:
            taken = TaskCheckpoint(
                name=outcome.name,
                node=outcome.node,
                size_bytes=outcome.size_bytes,
                seconds=outcome.seconds,
                volume=request.volume,
                stored=outcome.stored,
                store_error=outcome.store_error,
                sha256=outcome.stored_sha256,
                store_seconds=outcome.store_seconds,
                at=workflow.now(),
            )
            self._update(checkpoints=(*record.checkpoints, taken))
            assert self._record is not None
            workflow.upsert_memo({"record": self._record.model_dump(mode="json")})
        if self._preempt_checkpoint:
            self._preempted_to(request, outcome)
            return
        if not self._ask:
            self._checkpointed = outcome  # its Update answers with it
            return
        if outcome.refused:
            assert self._record is not None
            refusal = CheckpointRefusal(
                ask=self._ask,
                name=request.name,
                reason=outcome.refused,
                not_running=outcome.not_running,
                at=workflow.now(),
            )
            refusals = (*self._record.checkpoint_refusals, refusal)[-KEPT_REFUSALS:]
            self._update(checkpoint_refusals=refusals)
        self._checkpoint = None
        self._ask = 0

    def _preempted_to(self, request: BoxCheckpoint, outcome: CheckpointOutcome) -> None:
        """A preemption's checkpoint is over. Taken and stored in its volume: the task has
        ended (the worker reports it), and the next attempt restores it. Refused, failed, or
        not stored (the preempted machine is going): its refusal recorded, and the task is
        stopped as a preemption without one is (then queued again: --on-preempt)."""
        assert self._record is not None
        self._checkpoint = None
        self._preempt_checkpoint = False
        if not outcome.refused and outcome.stored:
            self._restore_after = self._record.checkpoints[-1]
            self._preempt_note = f"checkpointed to {request.name}, restored where it runs next"
            self._cancel_sent = True  # the checkpoint ended it: nothing to cancel
            return
        why = outcome.refused or f"not stored in volume {request.volume}: {outcome.store_error}"
        self._preempt_note = f"its checkpoint was refused ({why}): queued again to start afresh"
        if not outcome.refused:
            self._cancel_sent = True  # it ended with the checkpoint; queued again fresh
        refusal = CheckpointRefusal(
            ask=0,
            name=request.name,
            reason=f"on preempt: {why}",
            not_running=outcome.not_running,
            at=workflow.now(),
        )
        refusals = (*self._record.checkpoint_refusals, refusal)[-KEPT_REFUSALS:]
        self._update(checkpoint_refusals=refusals)

    def _continue(self, input: TaskInput, placement: Placement, liveness: timedelta) -> None:
        assert self._record is not None
        assert self._route is not None
        resume = TaskResume(
            record=self._record,
            placement=placement,
            route=self._route,
            cancel=self._cancel,
            cancel_sent=self._cancel_sent,
            preempt=self._preempt,
            restore_after=self._restore_after,
            liveness_seconds=liveness.total_seconds(),
        )
        self._continuing = True
        # With the record as its memo: a continued run otherwise starts with the first run's
        # start memo (none, or `queued`), which `task list` would show until the task's end.
        workflow.continue_as_new(
            input.model_copy(update={"resume": resume}),
            memo={"record": self._record.model_dump(mode="json")},
        )

    def _attempt_number(self) -> int:
        return 1 + (len(self._record.attempts) if self._record is not None else 0)

    def _cancel_due(self) -> bool:
        preempt = self._preempt is not None and not self._preempt_checkpoint
        return (self._cancel is not None or preempt) and not self._cancel_sent

    async def _on_worker(
        self,
        call: Callable[..., Awaitable[T]],
        retry: RetryPolicy,
        summary: str,
        *,
        argument: object = None,
        within: timedelta = WORKER_TIMEOUT,
    ) -> T:
        """`call` on the worker (with the route, or `argument` when given). A tunnelled
        worker's calls run on the queue of the replica holding its tunnel; when no replica
        picks one up (that replica is gone and the worker reconnected to another), the route
        is read again from the worker's record."""
        reroutes = 0  # after calls no replica picked up
        reconnects = 0  # waits for the worker's tunnel to come back
        waited = timedelta()
        while True:
            route = self._route
            assert route is not None
            try:
                return await workflow.execute_activity_method(
                    call,
                    route if argument is None else argument,
                    start_to_close_timeout=within,
                    schedule_to_start_timeout=REPLICA_PICKUP if route.task_queue else None,
                    retry_policy=retry,
                    task_queue=route.task_queue,
                    summary=summary,
                )
            except ActivityError as exc:
                reconnecting = route.task_queue and _reconnecting(exc) and waited < TUNNEL_WAIT
                if reconnecting:
                    # Its tunnel comes back (a restarted controlplane): wait, route again.
                    await workflow.sleep(TUNNEL_POLL)
                    waited += TUNNEL_POLL
                # The caller ends the task with this error when it cannot be routed again.
                elif not (route.task_queue and _not_picked_up(exc)) or _rerouted_enough(
                    reroutes, reconnects
                ):
                    raise
                fresh: WorkerTaskInput | None = await workflow.execute_activity_method(
                    TaskActivities.worker_route,
                    route,
                    start_to_close_timeout=WORKER_TIMEOUT,
                    retry_policy=ENDED_RETRY,
                    summary=f"where is worker {route.worker_id} now? (its replica is gone)",
                )
                if fresh is None:
                    raise
                self._route = fresh
                if reconnecting:
                    reconnects += 1
                else:
                    reroutes += 1

    async def _worker_ended(self, on_worker: WorkerTaskInput) -> bool:
        with contextlib.suppress(ActivityError):  # unknown: treat as alive (never run twice)
            ended: bool = await workflow.execute_activity_method(
                TaskActivities.worker_ended,
                on_worker,
                start_to_close_timeout=WORKER_TIMEOUT,
                retry_policy=ENDED_RETRY,
                summary=f"is worker {on_worker.worker_id} gone? (RunTask never got through)",
            )
            return ended
        return False

    def _apply(self, report: TaskReport) -> None:
        assert self._record is not None
        placement = self._record.phases[:1]
        self._update(
            phases=placement + report.phases,
            exit_code=report.exit_code if report.state in TERMINAL else None,
            result_json=report.result_json,
            log_tail=report.log_tail,
            host=report.host,
            image_digest=report.image_digest,
            image=report.image or self._record.image,
            ready=self._record.ready or report.ready,
        )

    def _update(self, **changes: object) -> None:
        assert self._record is not None
        before = self._record.state
        self._record = self._record.model_copy(update=changes)
        if self._record.state != before:  # the memo (task list) follows the state, not logs
            workflow.upsert_memo({"record": self._record.model_dump(mode="json")})

    def _finish(self, state: str, reason: str) -> TaskRecord:
        self._update(state=state, reason=reason, finished_at=workflow.now())
        assert self._record is not None
        return self._record


def _rerouted_enough(reroutes: int, reconnects: int) -> bool:
    """Whether a call no replica picked up has been routed again REROUTES times already."""
    if workflow.patched(REROUTES_APART_PATCH):
        return reroutes >= REROUTES
    return reroutes + reconnects == REROUTES  # as histories before the patch decided


def _refused_mount(exc: ActivityError) -> bool:
    cause = exc.cause
    return isinstance(cause, ApplicationError) and cause.type in MOUNT_REFUSALS


def _next_checkpoint(record: TaskRecord, volume: str) -> BoxCheckpoint:
    """The task's next checkpoint (`task checkpoint`'s, or its preemption's), kept in
    `volume` when one is named."""
    return BoxCheckpoint(
        task_id=record.task_id,
        name=task_checkpoint_name(record.task_id, len(record.checkpoints) + 1),
        workspace=record.workspace,
        volume=volume,
    )


def _reconnecting(exc: ActivityError) -> bool:
    """The worker's tunnel session is not on the replica that ran the call (yet)."""
    cause = exc.cause
    return isinstance(cause, ApplicationError) and cause.type == TUNNEL_RECONNECTING


def _not_picked_up(exc: ActivityError) -> bool:
    cause = exc.cause
    return isinstance(cause, ActivityTimeout) and cause.type == TimeoutType.SCHEDULE_TO_START


def _pin(input: TaskInput) -> str:
    """What pins a task with `node` there (the reason it waits names it)."""
    return f"checkpoint {input.restore_from}" if input.restore_from else "its node"
