"""MachineWorkflow (`machine:<pool>:<node>`): one node of the pool and its machine record.

Told by each reconcile pass whose observation of the node changed (signal `observe`), it tells
its worker's record when the observation shows that worker's Job finished (signal
`job_finished`: the agent exited or was killed; the record ends at once and says
`worker_ended`), and decides when to add a worker: the node is a machine, it has a free card,
and no worker of ours is pending or running there, counting both what the observation saw (our
Jobs) and the worker this machine started itself that an observation may not show yet. Signals
are handled one at a time, so two passes at once can never add two workers. It lives while the
node matches the pool's selector (so `levers9 machine list` can say NotReady, Cordoned or Full),
and ends when the node is gone.

A node cordoned (`kubectl drain`, a GKE upgrade), or whose VM's preemption is announced (the
`cloud.google.com/impending-node-termination` taint of a spot VM's notice), gets no new worker,
and its worker is told `drain` once: its tasks are taken off it before the drain may evict its
pod (the pool's PodDisruptionBudget holds the eviction back until then; WorkerWorkflow says how)
or the VM goes.

The pool's settings (idle minutes, record TTL) come with its start and, when they change on the
controlplane, by the signal `settings` (from reconcile); the machine passes them to its worker.
It continues as new with its ids, capacity and settings, and only when no signal waits to be
acted on, so a signal that arrives meanwhile is handled by this run or carried by the server
into the next.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import FailureError

from workflows.steps import stop_workers

with workflow.unsafe.imports_passed_through():
    from levers9.core.capacity import MachineStatus, NodeCapacity
    from levers9.logs import KV_EXTRA
    from levers9.models import (
        MACHINE_WORKFLOW,
        MachineInput,
        MachineRecord,
        StopWorker,
        WorkerInput,
        WorkerTimings,
        drain_reason,
        node_gone_reason,
        preemption_reason,
        worker_workflow_id,
    )
    from levers9.search_attributes import GPU_TYPE, NODE_NAME, POOL_NAME, WORKER_STATE
    from workflows.worker import WorkerWorkflow

WORKER_ID_CHARS = 8
DRAIN_CORDONED = "drain-cordoned-worker"
"""Patch: the worker of a cordoned node is told `drain`."""


@workflow.defn(name=MACHINE_WORKFLOW)
class MachineWorkflow:
    def __init__(self) -> None:
        self._observations: list[NodeCapacity] = []
        self._gone = False
        self._gone_request: StopWorker | None = None
        self._ended_workers: list[str] = []
        self._capacity: NodeCapacity | None = None
        self._worker_id: str | None = None
        self._machine_id = ""
        self._pool = ""
        self._timings: WorkerTimings | None = None
        self._settings_to_tell = False
        self._told_finished: str | None = None
        self._told_drain: set[str] = set()

    @workflow.signal
    def observe(self, capacity: NodeCapacity) -> None:
        self._observations.append(capacity)

    @workflow.signal
    def gone(self, request: StopWorker | None = None) -> None:
        """The node is gone (reconcile), or the pool is removed (RemovePoolWorkflow, whose
        request says why and whether the Jobs can still be deleted)."""
        self._gone = True
        self._gone_request = request

    @workflow.signal
    def settings(self, timings: WorkerTimings) -> None:
        """The pool's settings changed on the controlplane: for its next worker and this one."""
        if timings != self._timings:
            self._timings = timings
            self._settings_to_tell = True

    @workflow.signal
    def worker_ended(self, worker_id: str) -> None:
        self._ended_workers.append(worker_id)

    @workflow.query
    def record(self) -> MachineRecord | None:
        return self._record()

    @workflow.run
    async def run(self, input: MachineInput) -> None:
        self._machine_id = input.machine_id or str(workflow.uuid4())
        self._pool = input.pool_name
        self._worker_id = input.worker_id
        self._capacity = input.capacity
        if self._timings is None:  # else a `settings` before run is newer
            self._timings = input.timings
        else:
            self._settings_to_tell = self._timings != input.timings
        while True:
            await workflow.wait_condition(self._pending)
            if self._gone:
                workflow.logger.info(
                    "machine gone",
                    extra={KV_EXTRA: {"hostname": input.node_name, "pool_name": input.pool_name}},
                )
                # Its workers stop now, not when their records expire ten minutes later.
                await stop_workers(
                    input.pool_name,
                    self._workers(),
                    self._gone_request or StopWorker(reason=node_gone_reason(input.node_name)),
                )
                return
            for worker_id in self._ended_workers:
                if worker_id == self._worker_id:
                    self._worker_id = None
            self._ended_workers.clear()
            if self._observations:
                self._capacity = self._observations[-1]
                self._observations.clear()
                await self._tell_job_finished(input)
                await self._tell_drain(input)
            if self._settings_to_tell:
                self._settings_to_tell = False
                await self._tell_worker_settings(input)
            await self._reconcile(input)
            long = workflow.info().get_current_history_length() > input.max_history_events
            if long and not self._pending():  # else the loop acts on what came meanwhile
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self._pending():
                    record = self._record()  # the next run's memo: else the first run's start's
                    workflow.continue_as_new(
                        input.model_copy(
                            update={
                                "timings": self._timings,
                                "machine_id": self._machine_id,
                                "worker_id": self._worker_id,
                                "capacity": self._capacity,
                            }
                        ),
                        memo=None if record is None else {"record": record.model_dump(mode="json")},
                    )

    def _pending(self) -> bool:
        return (
            bool(self._observations or self._ended_workers) or self._gone or self._settings_to_tell
        )

    async def _tell_job_finished(self, input: MachineInput) -> None:
        """Its worker's Job finished (the agent exited, was killed): its record ends now and
        tells this machine `worker_ended`, whose pass adds the next worker at once."""
        worker_id, capacity = self._worker_id, self._capacity
        if worker_id is None or capacity is None or worker_id == self._told_finished:
            return
        if worker_id not in capacity.finished_workers:
            return
        self._told_finished = worker_id
        workflow.logger.info(
            "worker Job finished: ending its record",
            extra={
                KV_EXTRA: {
                    "worker_id": worker_id,
                    "hostname": input.node_name,
                    "pool_name": input.pool_name,
                }
            },
        )
        worker = workflow.get_external_workflow_handle(
            worker_workflow_id(input.pool_name, worker_id)
        )
        with contextlib.suppress(FailureError):  # it ended meanwhile
            await worker.signal("job_finished")

    async def _tell_drain(self, input: MachineInput) -> None:
        """Its node is cordoned, or its VM's preemption is announced: each of its workers is
        told `drain`, once."""
        capacity = self._capacity
        draining = (MachineStatus.CORDONED, MachineStatus.PREEMPTING)
        if capacity is None or capacity.status not in draining:
            return
        preempting = capacity.status == MachineStatus.PREEMPTING
        reason = (preemption_reason if preempting else drain_reason)(input.node_name)
        untold = [w for w in self._workers() if w not in self._told_drain]
        if not untold or not workflow.patched(DRAIN_CORDONED):
            return
        for worker_id in untold:
            self._told_drain.add(worker_id)
            workflow.logger.info(
                "node preempting: draining its worker"
                if preempting
                else "node cordoned: draining its worker",
                extra={
                    KV_EXTRA: {
                        "worker_id": worker_id,
                        "hostname": input.node_name,
                        "pool_name": input.pool_name,
                    }
                },
            )
            worker = workflow.get_external_workflow_handle(
                worker_workflow_id(input.pool_name, worker_id)
            )
            with contextlib.suppress(FailureError):  # it ended meanwhile
                await worker.signal("drain", reason)

    async def _tell_worker_settings(self, input: MachineInput) -> None:
        if self._worker_id is None:
            return
        worker = workflow.get_external_workflow_handle(
            worker_workflow_id(input.pool_name, self._worker_id)
        )
        with contextlib.suppress(FailureError):  # it ended meanwhile: the next one is told
            await worker.signal("settings", self._timings)

    async def _reconcile(self, input: MachineInput) -> None:
        capacity = self._capacity
        if capacity is None:
            return
        self._publish(input)
        if not capacity.machine:
            return
        workflow.logger.info(
            "using existing machine",
            extra={KV_EXTRA: {"hostname": capacity.name, "machine_id": self._machine_id}},
        )
        if capacity.workers or self._worker_id is not None or capacity.free.gpus < 1:
            return
        await self._add_worker(input, capacity)

    async def _add_worker(self, input: MachineInput, capacity: NodeCapacity) -> None:
        worker_id = str(workflow.uuid4()).replace("-", "")[:WORKER_ID_CHARS]
        gpus = capacity.free.gpus
        await workflow.start_child_workflow(
            WorkerWorkflow.run,
            WorkerInput(
                pool_name=input.pool_name,
                node_name=input.node_name,
                worker_id=worker_id,
                machine_id=self._machine_id,
                gpus=gpus,
                gpu_type=capacity.gpu_type,
                external_ip=capacity.external_ip,
                node_gpus=capacity.total_gpus,
                timings=self._timings or input.timings,
            ),
            id=worker_workflow_id(input.pool_name, worker_id),
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            run_timeout=None,
            task_timeout=timedelta(seconds=10),
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(POOL_NAME, input.pool_name),
                    SearchAttributePair(NODE_NAME, input.node_name),
                    SearchAttributePair(GPU_TYPE, capacity.gpu_type or ""),
                    SearchAttributePair(WORKER_STATE, "pending"),
                ]
            ),
        )
        self._worker_id = worker_id
        workflow.logger.info(
            "added new worker to occupy existing machine",
            extra={
                KV_EXTRA: {
                    "machine_id": self._machine_id,
                    "worker_id": worker_id,
                    "gpus": gpus,
                    "pool_name": input.pool_name,
                }
            },
        )
        self._publish(input)

    def _record(self) -> MachineRecord | None:
        capacity = self._capacity
        if capacity is None:
            return None
        return MachineRecord(
            pool_name=self._pool,
            node_name=capacity.name,
            machine_id=self._machine_id,
            status=str(capacity.status),
            machine=capacity.machine,
            gpu_type=capacity.gpu_type,
            total_gpus=capacity.total_gpus,
            free_gpus=capacity.free.gpus,
            free_cpu_millis=capacity.free.cpu_millis,
            free_memory_bytes=capacity.free.memory_bytes,
            workers=self._workers(),
            observed_at=workflow.now(),
            total_memory_bytes=capacity.total_memory_bytes,
            worker_gpus=capacity.worker_gpus,
            neighbour_gpus=capacity.neighbour_gpus,
        )

    def _workers(self) -> tuple[str, ...]:
        """This node's workers: the one it started, and any its last observation saw."""
        observed = self._capacity.workers if self._capacity else ()
        return tuple(sorted({*observed, *filter(None, [self._worker_id])}))

    def _publish(self, input: MachineInput) -> None:
        record = self._record()
        if record is not None:
            workflow.upsert_memo({"record": record.model_dump(mode="json")})
