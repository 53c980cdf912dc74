"""PoolWorkflow on the dev server: it continues as new with its state (workers, held cards) once
its history passes the cap, and a new Temporal worker process picks it up where the last one
stopped: placements made before either still hold, releases after them still free the cards.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.core.placement import Placement, PoolState, Waiting
from levers9.core.pool_usage import PoolUsage
from levers9.models import (
    PACKED,
    PlaceRequest,
    PoolInput,
    WorkerSlotInput,
    pool_workflow_id,
    task_workflow_id,
)
from tests.waiting import eventually
from workflows.pool import PoolWorkflow

pytestmark = pytest.mark.integration

POOL = "cap"
CAP = 40


def _worker(client: Client, task_queue: str) -> Worker:
    return Worker(client, task_queue=task_queue, workflows=[PoolWorkflow])


async def _start(
    client: Client, task_queue: str, workflow_id: str
) -> tuple[WorkflowHandle[PoolWorkflow, None], str | None]:
    """A pool that continues as new past CAP events, and its first run's id."""
    handle = await client.start_workflow(
        PoolWorkflow.run,
        PoolInput(pool_name=POOL, max_history_events=CAP),
        id=workflow_id,
        task_queue=task_queue,
    )
    return handle, (await handle.describe()).run_id


async def _place(handle: WorkflowHandle[PoolWorkflow, None], task_id: str, gpus: int) -> Placement:
    request = PlaceRequest(pool_name=POOL, task_id=task_id, gpus=gpus)
    return await handle.execute_update(PoolWorkflow.place, request)


async def _runs(client: Client, workflow_id: str) -> list[WorkflowExecutionStatus | None]:
    query = f"WorkflowId = '{workflow_id}'"
    return [e.status async for e in client.list_workflows(query)]


async def test_continues_as_new_with_state_and_survives_a_worker_restart(
    dev_env: WorkflowEnvironment, task_queue: str
) -> None:
    client = dev_env.client
    workflow_id = f"{pool_workflow_id(POOL)}-{uuid.uuid4().hex[:8]}"
    async with _worker(client, task_queue):
        handle, first_run = await _start(client, task_queue, workflow_id)
        for n, gpus in enumerate((2, 4)):
            slot = WorkerSlotInput(
                worker_id=f"w{gpus}",
                node_name=f"node-{gpus}",
                address=f"127.0.20.{n + 1}:40000",
                devices=tuple(range(gpus)),
                node_gpus=gpus,
            )
            await handle.signal(PoolWorkflow.worker_available, slot)
        held = await _place(handle, "held", 3)
        assert held.worker_id == "w4"
        # Churn: short tasks come and go until the history passes the cap.
        for i in range(12):
            placement = await _place(handle, f"short-{i}", 1)
            await handle.signal(PoolWorkflow.release, placement.task_id)

        async def continued() -> str:
            while True:
                run_id = (await handle.describe()).run_id
                if run_id != first_run:
                    return str(run_id)
                await asyncio.sleep(0.1)

        await asyncio.wait_for(continued(), timeout=30)

    history = await client.get_workflow_handle(workflow_id, run_id=first_run).fetch_history()
    last = history.events[-1]
    assert last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
    assert len(history.events) > CAP
    assert WorkflowExecutionStatus.CONTINUED_AS_NEW in await _runs(client, workflow_id)

    # A new Temporal worker (the old one is gone): the carried state answers.
    async with _worker(client, task_queue):
        latest = client.get_workflow_handle_for(PoolWorkflow.run, workflow_id)
        state: PoolState = await latest.query(PoolWorkflow.state)
        assert set(state.slots) == {"w2", "w4"}
        assert set(state.placed) == {"held"}
        assert state.slots["w4"].busy == {"held": held.gpu_indices}
        # The held task's retry of `place` gets the same cards back, not new ones.
        assert await _place(latest, "held", 3) == held
        # The 4-card worker has one free card: a 2-card task goes to the 2-card worker.
        assert (await _place(latest, "two", 2)).worker_id == "w2"
        # A 4-card task waits until `held` gives its cards back, then takes the whole worker.
        four = asyncio.create_task(_place(latest, "four", 4))

        async def four_waits() -> bool:
            state = await latest.query(PoolWorkflow.state)
            return [w.task_id for w in state.waiting] == ["four"]

        # The workflow has taken the request and decided it must wait: not placed, in the queue.
        await eventually(four_waits, within=15)
        assert not four.done()
        assert "four" not in (await latest.query(PoolWorkflow.state)).placed
        await latest.signal(PoolWorkflow.release, "held")
        placement = await asyncio.wait_for(four, timeout=15)
        assert placement.worker_id == "w4"
        assert sorted(placement.gpu_indices) == [0, 1, 2, 3]
        await latest.terminate("test done")


@workflow.defn(name="TaskWorkflow")
class TaskStandIn:
    """A task's record as the pool sees it: takes `placed` and returns it."""

    def __init__(self) -> None:
        self._placement: Placement | None = None

    @workflow.signal
    def placed(self, placement: Placement) -> None:
        self._placement = placement

    @workflow.run
    async def run(self) -> Placement:
        await workflow.wait_condition(lambda: self._placement is not None)
        assert self._placement is not None
        return self._placement


async def test_a_standing_queue_by_signal_continues_as_new_and_keeps_its_order(
    dev_env: WorkflowEnvironment, task_queue: str
) -> None:
    """24 two-card tasks queue by signal on one two-card worker (more than Temporal's 10
    in-flight Updates): each is told by signal, in the order the tasks were created, while the
    pool continues as new with the queue standing; a task whose record ended before its turn
    is skipped and its cards go to the next."""
    client = dev_env.client
    suffix = uuid.uuid4().hex[:8]
    pool_id = f"{pool_workflow_id(POOL)}-q-{suffix}"
    async with Worker(client, task_queue=task_queue, workflows=[PoolWorkflow, TaskStandIn]):
        pool = await client.start_workflow(
            PoolWorkflow.run,
            PoolInput(pool_name=POOL, max_history_events=CAP),
            id=pool_id,
            task_queue=task_queue,
        )
        first_run = (await pool.describe()).run_id
        created = datetime(2026, 12, 1, tzinfo=UTC)
        ids = [f"q{suffix}{n:02d}" for n in range(24)]
        handles = {}
        for task_id in ids:
            handles[task_id] = await client.start_workflow(
                TaskStandIn.run, id=task_workflow_id(task_id), task_queue=task_queue
            )
        # They ask in a shuffled order; the queue keeps the tasks' creation order.
        for n in [*range(1, 24, 2), *range(0, 24, 2)]:
            at = created + timedelta(seconds=n)
            request = PlaceRequest(pool_name=POOL, task_id=ids[n], gpus=2, created_at=at)
            await pool.signal(PoolWorkflow.request, request)
        await handles[ids[5]].terminate("its record ended while it waited")
        # The worker comes once all wait (one that is there first places the first to ask).
        slot = WorkerSlotInput(
            worker_id="w2",
            node_name="node-2",
            address="127.0.20.1:40000",
            devices=(0, 1),
            node_gpus=2,
        )
        await pool.signal(PoolWorkflow.worker_available, slot)
        order: list[str] = []
        for task_id in ids:
            if task_id == ids[5]:
                continue
            placement = await asyncio.wait_for(handles[task_id].result(), timeout=30)
            assert placement.task_id == task_id
            order.append(task_id)
            await pool.signal(PoolWorkflow.release, task_id)
        assert order == [t for t in ids if t != ids[5]]
        runs = await _runs(client, pool_id)
        assert runs.count(WorkflowExecutionStatus.CONTINUED_AS_NEW) >= 1, runs
        history = await client.get_workflow_handle(pool_id, run_id=first_run).fetch_history()
        assert history.events[-1].event_type == (
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
        )
        latest = client.get_workflow_handle(pool_id)
        state = await latest.query(PoolWorkflow.state)
        assert (state.waiting, state.placed, state.notify) == ([], {}, [])
        await latest.terminate("test done")


async def test_a_queue_past_temporal_s_payload_limit_is_carried_whole_across_continue_as_new(
    dev_env: WorkflowEnvironment, task_queue: str
) -> None:
    """16,000 waiting tasks (about 2.8 MB of queue as JSON, past Temporal's 2 MB payload limit):
    the run continues as new and the next run holds every one of them, in order."""
    client = dev_env.client
    workflow_id = f"{pool_workflow_id(POOL)}-{uuid.uuid4().hex[:8]}"
    waiting = 16_000
    since = datetime(2026, 12, 5, tzinfo=UTC)
    ids = [uuid.uuid4().hex[:12] for _ in range(waiting)]
    async with _worker(client, task_queue):
        handle, first_run = await _start(client, task_queue, workflow_id)
        for start in range(0, waiting, 2_000):  # as the controlplane batches a burst
            batch = [
                PlaceRequest(
                    pool_name=POOL,
                    task_id=task_id,
                    gpus=1,
                    created_at=since + timedelta(milliseconds=start + n),
                    workspace=f"team-{(start + n) % 20:02d}",
                )
                for n, task_id in enumerate(ids[start : start + 2_000])
            ]
            await handle.signal(PoolWorkflow.requests, batch)
        # Past the cap: one more change and the run continues as new with the queue.
        for i in range(CAP):
            await handle.signal(PoolWorkflow.worker_gone, f"nobody-{i}")

        async def continued() -> bool:
            return (await handle.describe()).run_id != first_run

        await eventually(continued, within=60, what="the pool continued as new")
        latest = client.get_workflow_handle(workflow_id)
        assert (await latest.describe()).status == WorkflowExecutionStatus.RUNNING
        history = await client.get_workflow_handle(workflow_id, run_id=first_run).fetch_history()
        last = history.events[-1]
        assert last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
        # The whole queue, in order, came across (read from the next run's input: the query
        # `state` would answer past the 2 MB limit too).
        started = (await latest.fetch_history()).events[0]
        attributes = started.workflow_execution_started_event_attributes
        (carried,) = await client.data_converter.decode(attributes.input.payloads, [PoolInput])
        assert carried.state == PACKED
        assert carried.packed_state is not None
        assert len(attributes.input.payloads[0].data) < 1_000_000
        state = carried.carried()
        assert [w.task_id for w in state.waiting] == ids
        assert [w.workspace for w in state.waiting[:21]] == [
            f"team-{n % 20:02d}" for n in range(21)
        ]
        # What `pool get` and `workspace get` ask answers, small.
        usage: PoolUsage = await latest.query(PoolWorkflow.usage)
        assert usage.waiting == waiting
        assert {row.workspace: row.waiting for row in usage.workspaces} == {
            f"team-{n:02d}": waiting // 20 for n in range(20)
        }
        spot = await latest.query(PoolWorkflow.queue_spot, ids[-1])
        assert spot is not None
        assert spot.position == waiting
        await latest.terminate("test done")


@workflow.defn(name="PoolWorkflow")
class PoolBeforeUsage:
    """A pool run by a Temporal worker of the code before the `usage` query (an upgrade)."""

    @workflow.query
    def state(self) -> PoolState:
        return PoolState(
            waiting=[Waiting(task_id="t1", gpus=1, since=datetime(2026, 12, 5, tzinfo=UTC))]
        )

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)


async def test_usage_of_a_pool_run_by_code_before_the_usage_query_is_counted_from_its_state(
    dev_env: WorkflowEnvironment, task_queue: str
) -> None:
    from levers9.records.pools import TemporalPoolRecords  # not in this module's workflows

    client = dev_env.client
    pool = f"old-{uuid.uuid4().hex[:6]}"
    async with Worker(client, task_queue=task_queue, workflows=[PoolBeforeUsage]):
        handle = await client.start_workflow(
            PoolBeforeUsage.run, id=pool_workflow_id(pool), task_queue=task_queue
        )
        usage = await TemporalPoolRecords(client, task_queue).usage(pool)
        assert isinstance(usage, PoolUsage), usage
        assert (usage.waiting, [(r.workspace, r.waiting) for r in usage.workspaces]) == (
            1,
            [("default", 1)],
        )
        await handle.terminate("test done")
