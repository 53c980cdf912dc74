"""TaskWorkflow on the time-skipping server, its activities mocked by name: a task whose RunTask
never got through is placed again when (and only when) that worker's record has ended; a task
that started is never started again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.gateway.reports import TaskReport
from levers9.models import (
    PlaceRequest,
    TaskInput,
    TaskRecord,
    WorkerTaskInput,
    pool_workflow_id,
)
from levers9.placement import Placement
from workflows.task import PLACEMENTS, TaskWorkflow

pytestmark = pytest.mark.integration


@dataclass
class Cluster:
    """What the mocked activities see: workers in placement order, which are gone, which
    accept RunTask, and every call made."""

    workers: list[str]
    gone: set[str]
    reachable: set[str]
    placed_queue: str | None = None
    """The replica queue placement names (tunnel mode); None: the shared queue."""
    live_queue: str | None = None
    """The queue the worker's record names now (its tunnel moved to another replica)."""
    runs: list[str] = field(default_factory=list)
    placed: list[str] = field(default_factory=list)

    def activities(self) -> list[Callable[..., Any]]:
        def place(request: PlaceRequest) -> Placement:
            worker = self.workers[min(len(self.placed), len(self.workers) - 1)]
            self.placed.append(worker)
            return Placement(
                task_id=request.task_id,
                worker_id=worker,
                node_name=f"node-{worker}",
                address="127.0.0.1:1",
                gpu_indices=(0,),
                task_queue=self.placed_queue,
            )

        @activity.defn(name="place_task")
        async def place_task(request: PlaceRequest) -> Placement:
            return place(request)

        @activity.defn(name="request_placement")
        async def request_placement(request: PlaceRequest) -> str:
            """The pool, at once: signals the placement back to the asking record."""
            asking = activity.client().get_workflow_handle(activity.info().workflow_id)
            await asking.signal("placed", place(request))
            return ""

        @activity.defn(name="run_task")
        async def run_task(input: WorkerTaskInput) -> bool:
            if input.worker_id not in self.reachable:
                raise ApplicationError("UNAVAILABLE: connection refused", non_retryable=True)
            self.runs.append(input.worker_id)
            return False

        @activity.defn(name="get_task")
        async def get_task(input: WorkerTaskInput) -> TaskReport:
            return TaskReport(
                pool_name=input.pool_name,
                worker_id=input.worker_id,
                task_id=input.task.task_id,
                state="succeeded",
            )

        @activity.defn(name="worker_ended")
        async def worker_ended(input: WorkerTaskInput) -> bool:
            return input.worker_id in self.gone

        @activity.defn(name="worker_route")
        async def worker_route(input: WorkerTaskInput) -> WorkerTaskInput | None:
            if input.worker_id in self.gone:
                return None
            return input.model_copy(
                update={"task_queue": self.live_queue, "address": "127.0.0.1:2"}
            )

        return [place_task, request_placement, run_task, get_task, worker_ended, worker_route]

    def worker_calls(self) -> list[Callable[..., Any]]:
        """What a replica's own queue serves."""
        return [
            a
            for a in self.activities()
            if getattr(a, "__temporal_activity_definition").name in ("run_task", "get_task")
        ]


@workflow.defn(name="PoolWorkflow")
class PoolStandIn:
    """Takes the task's `release` signals (the real pool is tested on its own)."""

    @workflow.signal
    def release(self, task_id: str) -> None:
        pass

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)


async def _run(env: WorkflowEnvironment, task_queue: str, cluster: Cluster) -> TaskRecord:
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    replica = Worker(
        env.client,
        task_queue=cluster.live_queue or f"{task_queue}-no-replica",
        activities=cluster.worker_calls(),
    )
    async with (
        Worker(
            env.client,
            task_queue=task_queue,
            workflows=[TaskWorkflow, PoolStandIn],
            activities=cluster.activities(),
        ),
        replica,
    ):
        await env.client.start_workflow(
            PoolStandIn.run, id=pool_workflow_id(pool), task_queue=task_queue
        )
        return await env.client.execute_workflow(
            TaskWorkflow.run,
            TaskInput(task_id=uuid.uuid4().hex[:12], pool_name=pool, command=("true",)),
            id=f"task:{uuid.uuid4().hex[:12]}",
            task_queue=task_queue,
        )


async def test_a_task_on_a_gone_worker_is_placed_again(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    cluster = Cluster(workers=["w-gone", "w-ok"], gone={"w-gone"}, reachable={"w-ok"})
    record = await _run(time_env, task_queue, cluster)
    assert record.state == "succeeded", record
    assert record.worker_id == "w-ok"
    assert cluster.placed == ["w-gone", "w-ok"]
    assert cluster.runs == ["w-ok"]


async def test_an_unreachable_worker_still_running_fails_the_task_and_never_places_again(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    # Unreachable but not ended: it may be running the task, so it is not run elsewhere.
    cluster = Cluster(workers=["w-partitioned", "w-ok"], gone=set(), reachable={"w-ok"})
    record = await _run(time_env, task_queue, cluster)
    assert record.state == "failed"
    assert record.reason.startswith("worker lost before the task started")
    assert cluster.placed == ["w-partitioned"]
    assert cluster.runs == []


async def test_placements_are_bounded(time_env: WorkflowEnvironment, task_queue: str) -> None:
    cluster = Cluster(workers=["w-gone"], gone={"w-gone"}, reachable=set())
    record = await _run(time_env, task_queue, cluster)
    assert record.state == "failed"
    assert record.reason.startswith(f"placed {PLACEMENTS} times, never started")
    assert len(cluster.placed) == PLACEMENTS


async def test_a_call_no_replica_picks_up_is_routed_again_from_the_worker_record(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    """Tunnel mode: the replica that held the worker's tunnel is gone (nobody polls its queue);
    the worker reconnected to another replica, whose queue its record names."""
    cluster = Cluster(
        workers=["w-tunnelled"],
        gone=set(),
        reachable={"w-tunnelled"},
        placed_queue=f"{task_queue}-replica-gone",
        live_queue=f"{task_queue}-replica-live",
    )
    record = await _run(time_env, task_queue, cluster)
    assert (record.state, record.worker_id) == ("succeeded", "w-tunnelled")
    assert cluster.placed == ["w-tunnelled"]  # routed again, not placed again
    assert cluster.runs == ["w-tunnelled"]
