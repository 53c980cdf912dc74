"""TaskWorkflow on the time-skipping server, its activities mocked by name: a task whose RunTask
never got through is placed again when (and only when) that worker's record has ended; a task
that started is never started again. `task checkpoint` (Update `checkpoint`): the checkpoint its
worker took is kept in the record and the task ends as the worker reports it; a refusal leaves
it running; an ended task is no longer asked. The Update answers at once (the ask's number),
before the checkpoint is taken: the record then says the outcome, where its caller reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

import workflows.task as task_workflow
from levers9.box_state import BoxCheckpoint, CheckpointOutcome
from levers9.core.placement import Placement
from levers9.core.task_reports import TaskReport
from levers9.models import (
    PlaceRequest,
    TaskInput,
    TaskRecord,
    WorkerTaskInput,
    checkpointed_task_id,
    pool_workflow_id,
)
from tests.waiting import eventually, signals_handled
from workflows.task import PLACEMENTS, REROUTES, TUNNEL_POLL, TUNNEL_WAIT, TaskWorkflow

with workflow.unsafe.imports_passed_through():  # this module's stand-in pool runs sandboxed
    from activities.dispatch import TUNNEL_RECONNECTING
    from levers9.records.tasks import checkpoint_task, submitted_as
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
    run_tasks: list[TaskInput] = field(default_factory=list)
    """What each RunTask started (its restore_from, say)."""
    placed: list[str] = field(default_factory=list)
    keeps_running: bool = False
    """GetTask answers `running` (the task's end comes as the worker's report)."""
    polls: int = 0
    lost_requests: int = 0
    """How many requests the pool loses (never takes) before it takes one."""
    requests: int = 0
    failures: int = 0
    """How many of its first runs end `failed` (exit code 3) before one succeeds."""
    cancels: int = 0
    reconnecting: int = 0
    """How many GetTask calls find the worker's tunnel not yet back (TUNNEL_RECONNECTING)."""
    unpicked_after_reconnect: bool = False
    """Once its tunnel is back, the worker's record names a replica queue nobody polls."""
    routes: int = 0
    """How many times the record asked where the worker is now (worker_route)."""
    mount_refusal: str = ""
    """RunTask's refusal of the task's volume (run_task's VolumeNotFound), when set."""
    checkpoint_refusal: str = ""
    """CheckpointTask's refusal (a runc task, say), when set; else it checkpoints and ends it."""
    checkpoints: list[BoxCheckpoint] = field(default_factory=list)
    hold: asyncio.Event | None = None
    """When set: CheckpointTask says it is taking the image (`taking`), then waits for it."""
    taking: asyncio.Event = field(default_factory=asyncio.Event)

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
            self.requests += 1
            if self.lost_requests:
                self.lost_requests -= 1
                return ""
            asking = activity.client().get_workflow_handle(activity.info().workflow_id or "")
            await asking.signal("placed", place(request))
            return ""

        @activity.defn(name="run_task")
        async def run_task(input: WorkerTaskInput) -> bool:
            if self.mount_refusal:
                raise ApplicationError(
                    self.mount_refusal, type="VolumeNotFound", non_retryable=True
                )
            if input.worker_id not in self.reachable:
                raise ApplicationError("UNAVAILABLE: connection refused", non_retryable=True)
            self.runs.append(input.worker_id)
            self.run_tasks.append(input.task)
            return False

        @activity.defn(name="get_task")
        async def get_task(input: WorkerTaskInput) -> TaskReport:
            self.polls += 1
            if self.reconnecting:
                self.reconnecting -= 1
                raise ApplicationError(
                    f"worker {input.worker_id} has no tunnel session on this replica yet",
                    type=TUNNEL_RECONNECTING,
                )
            failed = len(self.runs) <= self.failures
            state = "running" if self.keeps_running else "failed" if failed else "succeeded"
            return TaskReport(
                pool_name=input.pool_name,
                worker_id=input.worker_id,
                task_id=input.task.task_id,
                state=state,
                exit_code=3 if state == "failed" else 0 if state == "succeeded" else None,
                reason="exit code 3" if state == "failed" else "",
            )

        @activity.defn(name="cancel_task")
        async def cancel_task(input: WorkerTaskInput) -> None:
            """The worker stops it: its report says so, as the gateway signals it."""
            self.cancels += 1
            asking = activity.client().get_workflow_handle(activity.info().workflow_id or "")
            stopped = TaskReport(
                pool_name=input.pool_name,
                worker_id=input.worker_id,
                task_id=input.task.task_id,
                state="cancelled",
                exit_code=137,
            )
            await asking.signal("report", stopped)

        @activity.defn(name="checkpoint_task")
        async def checkpoint_task(input: BoxCheckpoint) -> CheckpointOutcome:
            """A runsc worker on node-w1: the image sealed (uploaded when a volume is named),
            then the task's end reported, as the agent does."""
            self.checkpoints.append(input)
            if self.hold is not None:
                self.taking.set()
                await self.hold.wait()
            if self.checkpoint_refusal:
                return CheckpointOutcome(refused=self.checkpoint_refusal)
            asking = activity.client().get_workflow_handle(activity.info().workflow_id or "")
            ended = TaskReport(
                pool_name="",
                worker_id="w1",
                task_id=input.task_id,
                state="cancelled",
                exit_code=137,
                reason=f"checkpointed to {input.name}",
            )
            await asking.signal("report", ended)
            stored = f"s3://b/p/checkpoints/{input.name}/" if input.volume else ""
            return CheckpointOutcome(
                name=input.name,
                node="node-w1",
                size_bytes=524288,
                seconds=0.2,
                stored=stored,
                stored_sha256="c" * 64 if stored else "",
            )

        @activity.defn(name="worker_ended")
        async def worker_ended(input: WorkerTaskInput) -> bool:
            return input.worker_id in self.gone

        @activity.defn(name="worker_route")
        async def worker_route(input: WorkerTaskInput) -> WorkerTaskInput | None:
            self.routes += 1
            if input.worker_id in self.gone:
                return None
            queue = self.live_queue
            if self.unpicked_after_reconnect and not self.reconnecting:
                queue = f"{queue}-nobody"
            return input.model_copy(update={"task_queue": queue, "address": "127.0.0.1:2"})

        return [
            place_task,
            request_placement,
            run_task,
            get_task,
            cancel_task,
            checkpoint_task,
            worker_ended,
            worker_route,
        ]

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

    def __init__(self) -> None:
        self.released: list[str] = []

    @workflow.signal
    def release(self, task_id: str) -> None:
        self.released.append(task_id)

    @workflow.query
    def releases(self) -> list[str]:
        return self.released

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)


async def _run(
    env: WorkflowEnvironment,
    task_queue: str,
    cluster: Cluster,
    retries: int = 0,
    runner: WorkflowRunner | None = None,
) -> TaskRecord:
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
            workflow_runner=runner or SandboxedWorkflowRunner(),
        ),
        replica,
    ):
        await env.client.start_workflow(
            PoolStandIn.run, id=pool_workflow_id(pool), task_queue=task_queue
        )
        return await env.client.execute_workflow(
            TaskWorkflow.run,
            TaskInput(
                task_id=uuid.uuid4().hex[:12], pool_name=pool, command=("true",), retries=retries
            ),
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


async def test_a_volume_refused_at_runtask_fails_the_task_with_that_reason(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    refusal = (
        "volume data: no volume data in workspace default (deleted since the task was submitted?)"
    )
    cluster = Cluster(workers=["w-ok"], gone=set(), reachable={"w-ok"}, mount_refusal=refusal)
    record = await _run(time_env, task_queue, cluster)
    assert (record.state, record.reason) == ("failed", refusal)
    assert cluster.placed == ["w-ok"]


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


def _tunnelled(task_queue: str, reconnecting: int, **more: Any) -> Cluster:
    """One worker in tunnel mode, on its replica's queue, whose first `reconnecting` GetTask
    calls find its tunnel not back yet."""
    replica = f"{task_queue}-replica"
    return Cluster(
        workers=["w-tunnelled"],
        gone=set(),
        reachable={"w-tunnelled"},
        placed_queue=replica,
        live_queue=replica,
        reconnecting=reconnecting,
        **more,
    )


@pytest.mark.parametrize(
    ("reconnecting", "state"),
    [(8, "succeeded"), (10**6, "lost")],
    ids=["tunnel back", "tunnel never back"],
)
async def test_a_poll_while_the_worker_s_tunnel_reconnects_waits_for_it(
    time_env: WorkflowEnvironment, task_queue: str, reconnecting: int, state: str
) -> None:
    """Tunnel mode, after a controlplane restart: GetTask finds no tunnel session for the worker
    on its replica (it reconnects with backoff, up to 30 s between tries). The record waits and
    routes again rather than calling the task lost at once (a task on a joined cluster was, in
    tests/reliability/test_restart_records_replicas.py); a tunnel that never comes back within
    TUNNEL_WAIT loses it, saying why."""
    cluster = _tunnelled(task_queue, reconnecting)
    record = await _run(time_env, task_queue, cluster)
    assert record.state == state, record
    assert cluster.runs == ["w-tunnelled"], "never run twice"
    if state == "succeeded":
        assert cluster.polls == 9  # six tries, a wait, two more, then its answer
    else:
        assert "has no tunnel session on this replica yet" in record.reason, record.reason
        assert cluster.polls >= 6 * (TUNNEL_WAIT // TUNNEL_POLL), cluster.polls


async def test_reroutes_after_a_long_tunnel_wait_are_still_bounded(
    time_env: WorkflowEnvironment, task_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tunnel back after more waits than REROUTES, then named on a replica queue nobody polls:
    the record routes the call again REROUTES times, then calls the task lost. (The waits used to
    count as reroutes, compared with `==`: past REROUTES of them, it routed again without end.)

    The time-skipping server does not skip an activity's schedule-to-start wait, so the record
    runs unsandboxed here with REPLICA_PICKUP at one second (10 reroutes: 10 s, not 200)."""
    monkeypatch.setattr(task_workflow, "REPLICA_PICKUP", timedelta(seconds=1))
    waits = REROUTES + 2  # the record's waits; GetTask's retry policy tries each 6 times
    cluster = _tunnelled(task_queue, 6 * waits, unpicked_after_reconnect=True)
    unsandboxed = UnsandboxedWorkflowRunner()
    run = _run(time_env, task_queue, cluster, runner=unsandboxed)
    record = await asyncio.wait_for(run, timeout=120)  # without the bound: no end
    assert record.state == "lost", record
    assert record.reason.startswith("worker lost mid-task"), record.reason
    assert cluster.runs == ["w-tunnelled"]
    assert cluster.polls == 6 * waits  # the GetTask calls that reached the replica's queue
    assert cluster.routes == waits + REROUTES


async def _started(handle: WorkflowHandle[Any, Any]) -> None:
    """Once the record says `running` (RunTask got through)."""

    async def past_placement() -> bool:
        record = await handle.query(TaskWorkflow.record)
        return record is not None and record.state not in ("queued", "placed")

    await eventually(past_placement, within=10, what=f"{handle.id} started")
    record = await handle.query(TaskWorkflow.record)
    assert record is not None
    assert record.state == "running", record


@dataclass
class RunningTask:
    cluster: Cluster
    stand_in: WorkflowHandle[Any, Any]
    """The pool's stand-in: what it was given back."""
    handle: WorkflowHandle[Any, Any]
    task: TaskInput


@contextlib.asynccontextmanager
async def _running_task(
    env: WorkflowEnvironment, task_queue: str, **task_fields: Any
) -> AsyncIterator[RunningTask]:
    """A task running on `w1` (which keeps running it until it reports), placed by a stand-in
    for its pool, with the Temporal worker polling until the block ends."""
    cluster = Cluster(workers=["w1"], gone=set(), reachable={"w1"}, keeps_running=True)
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    task_id = uuid.uuid4().hex[:12]
    async with Worker(
        env.client,
        task_queue=task_queue,
        workflows=[TaskWorkflow, PoolStandIn],
        activities=cluster.activities(),
    ):
        stand_in = await env.client.start_workflow(
            PoolStandIn.run, id=pool_workflow_id(pool), task_queue=task_queue
        )
        task = TaskInput(task_id=task_id, pool_name=pool, command=("train",), **task_fields)
        handle = await env.client.start_workflow(
            TaskWorkflow.run, task, id=f"task:{task_id}", task_queue=task_queue
        )
        await _started(handle)
        yield RunningTask(cluster, stand_in, handle, task)
        with contextlib.suppress(RPCError):  # the time-skipping server may have ended it
            await stand_in.terminate("test done")


async def _run_for(
    env: WorkflowEnvironment, task_queue: str, running: timedelta
) -> tuple[TaskRecord, int, list[str], int]:
    """A task that runs for `running`, its end reported by its worker (the gateway's signal):
    its record, its history's length, the pool's releases, and GetTask's liveness checks."""
    async with _running_task(env, task_queue) as running_task:
        task, handle = running_task.task, running_task.handle
        await env.sleep(running)  # its running time, by the server's clock
        end = TaskReport(
            pool_name=task.pool_name, worker_id="w1", task_id=task.task_id, state="succeeded"
        )
        await handle.signal(TaskWorkflow.report, end)
        record = await handle.result()
        events = len((await handle.fetch_history()).events)
        released = await running_task.stand_in.query(PoolStandIn.releases)
    return record, events, released, running_task.cluster.polls


async def test_a_task_history_does_not_grow_with_its_running_time(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    short, short_events, _, _ = await _run_for(time_env, task_queue, timedelta(seconds=5))
    ninety, ninety_events, _, _ = await _run_for(time_env, task_queue, timedelta(seconds=90))
    assert short.state == ninety.state == "succeeded"
    assert ninety_events - short_events <= 20, (short_events, ninety_events)


async def test_a_72_hour_task_ends_with_its_record_and_its_cards_released_once(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    record, events, released, polls = await _run_for(time_env, task_queue, timedelta(hours=72))
    assert record.state == "succeeded"
    assert released == [record.task_id], "its cards given back exactly once"
    assert polls <= 300, "backed-off liveness checks, not one every 5 s (51,840 of them)"
    assert events < 4_000, f"{events} events: far below Temporal's 51,200 (a month: about 33,000)"


async def test_a_record_flooded_with_reports_continues_as_new_and_releases_once(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    """A worker that reports `running` again and again (progress without end): the record
    passes its history cap, continues as new with what it holds, and still ends once, its
    cards released once, by the run that sees the end."""
    async with _running_task(time_env, task_queue, max_history_events=60) as running_task:
        pool, task_id = running_task.task.pool_name, running_task.task.task_id
        handle, stand_in, cluster = running_task.handle, running_task.stand_in, running_task.cluster
        progress = TaskReport(pool_name=pool, worker_id="w1", task_id=task_id, state="running")
        for n in range(120):
            await handle.signal(TaskWorkflow.report, progress)
            if n % 20 == 19:  # bursts, as progress comes: the record's task completes between
                await signals_handled(time_env.client, handle.id)
        latest = time_env.client.get_workflow_handle(f"task:{task_id}")
        continued = await latest.describe()
        assert continued.run_id != handle.first_execution_run_id, "continued as new by now"
        memo = await continued.memo()
        assert memo["record"]["state"] == "running", "task list reads the running record"
        end = TaskReport(
            pool_name=pool, worker_id="w1", task_id=task_id, state="succeeded", exit_code=0
        )
        await handle.signal(TaskWorkflow.report, end)
        record = await handle.result()
        released = await stand_in.query(PoolStandIn.releases)
        runs = []  # the chain of runs, from the first (no visibility on this server)
        run_id: str | None = handle.first_execution_run_id
        while run_id:
            history = await time_env.client.get_workflow_handle(
                f"task:{task_id}", run_id=run_id
            ).fetch_history()
            runs.append(len(history.events))
            last = history.events[-1].workflow_execution_continued_as_new_event_attributes
            run_id = last.new_execution_run_id or None
    assert (record.state, record.exit_code, record.worker_id) == ("succeeded", 0, "w1")
    assert record.phases[0].name == "placement", "the record carried across runs"
    assert released == [task_id], "its cards given back exactly once, by the last run"
    assert len(runs) >= 2, f"continued as new under the flood: {runs} events"
    assert max(runs) < 250, f"each run ends within a few bursts of its cap of 60: {runs}"
    assert cluster.runs == ["w1"], "RunTask once: a continued run never starts it again"


async def test_a_request_the_pool_never_took_is_asked_again(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    """The pool loses the first two requests (a pool terminated and started empty, say): the
    queued record asks again after ten minutes, then twenty, and runs once placed."""
    cluster = Cluster(workers=["w1"], gone=set(), reachable={"w1"}, lost_requests=2)
    record = await _run(time_env, task_queue, cluster)
    assert (record.state, record.worker_id) == ("succeeded", "w1")
    assert cluster.requests == 3
    assert cluster.runs == ["w1"]


async def test_a_failed_attempt_is_queued_again_while_retries_last(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    """`--retries 2`, the first two runs exit 3: each is kept in `attempts`, the task queues
    again (after a back-off) and the third run succeeds; with one retry, the second failure
    is the end."""
    cluster = Cluster(workers=["w1"], gone=set(), reachable={"w1"}, failures=2)
    record = await _run(time_env, task_queue, cluster, retries=2)
    assert (record.state, record.exit_code, record.worker_id) == ("succeeded", 0, "w1")
    assert [(a.state, a.exit_code, a.worker_id) for a in record.attempts] == [
        ("failed", 3, "w1"),
        ("failed", 3, "w1"),
    ]
    assert all(a.placed_at and a.finished_at for a in record.attempts)
    assert cluster.runs == ["w1", "w1", "w1"]
    assert cluster.requests == 3
    assert record.phases[0].name == "placement", "the last attempt's phases, from its placement"

    cluster = Cluster(workers=["w1"], gone=set(), reachable={"w1"}, failures=5)
    record = await _run(time_env, task_queue, cluster, retries=1)
    assert (record.state, record.exit_code, record.reason) == ("failed", 3, "exit code 3")
    assert [a.state for a in record.attempts] == ["failed"]
    assert cluster.runs == ["w1", "w1"], "no third run: its one retry is spent"


async def test_without_retries_a_failure_is_the_end(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    cluster = Cluster(workers=["w1"], gone=set(), reachable={"w1"}, failures=1)
    record = await _run(time_env, task_queue, cluster)
    assert (record.state, record.attempts, cluster.runs) == ("failed", (), ["w1"])


async def _running_again(handle: WorkflowHandle[Any, Any], what: str) -> None:
    """Until the task runs again, an earlier attempt in its record."""

    async def running_again() -> bool:
        record = await handle.query(TaskWorkflow.record)
        return record is not None and bool(record.attempts) and record.state == "running"

    await eventually(running_again, within=10, what=what)


async def test_a_preempted_task_queues_again_with_a_retry_and_ends_cancelled_without(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    reason = "preempted: reclaimed by workspace large"
    async with _running_task(time_env, task_queue, retries=1) as running_task:
        handle, cluster, stand_in = running_task.handle, running_task.cluster, running_task.stand_in
        await handle.signal(TaskWorkflow.preempt, reason)

        await _running_again(handle, "queued again and running")
        record = await handle.query(TaskWorkflow.record)
        assert record is not None
        assert [(a.state, a.reason, a.exit_code) for a in record.attempts] == [
            ("preempted", reason, 137)
        ]
        assert cluster.cancels == 1
        assert cluster.runs == ["w1", "w1"]
        assert await stand_in.query(PoolStandIn.releases) == [running_task.task.task_id]
        # Preempted again with no retry left: it ends, cancelled with the pool's reason.
        await handle.signal(TaskWorkflow.preempt, reason)
        record = await handle.result()
        assert (record.state, record.reason) == ("cancelled", reason)
        assert len(record.attempts) == 1

    async with _running_task(time_env, task_queue, retries=3) as running_task:
        handle = running_task.handle
        # A user's cancel wins over any retry.
        await handle.signal(TaskWorkflow.cancel, "not needed")
        record = await handle.result()
        assert (record.state, record.reason, record.attempts) == ("cancelled", "not needed", ())


async def test_on_preempt_checkpoint_checkpoints_it_and_restores_it_in_its_next_attempt(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    """`--on-preempt checkpoint --checkpoints ckpts`, no retries: the preemption takes a
    checkpoint to the volume instead of a CancelTask, the task queues again at once and its
    next RunTask restores that checkpoint (its sha256 checked); the attempt says so."""
    reason = "preempted: its node node-w1 is cordoned (drain)"
    fields = {"runtime": "runsc", "on_preempt": "checkpoint", "checkpoint_volume": "ckpts"}
    async with _running_task(time_env, task_queue, **fields) as running:
        handle, cluster, task = running.handle, running.cluster, running.task
        await handle.signal(TaskWorkflow.preempt, reason)

        await _running_again(handle, "restored and running")
        record = await handle.query(TaskWorkflow.record)
    name = f"{task.task_id}-ck1"
    assert record is not None
    assert cluster.cancels == 0, "the checkpoint stopped it, not a CancelTask"
    assert [(c.name, c.volume) for c in cluster.checkpoints] == [(name, "ckpts")]
    assert [(a.state, a.reason) for a in record.attempts] == [
        ("preempted", f"{reason}; checkpointed to {name}, restored where it runs next")
    ]
    first, second = cluster.run_tasks
    assert first.restore_from == ""
    assert (second.restore_from, second.restore_sha256, second.checkpoint_volume) == (
        name,
        "c" * 64,
        "ckpts",
    )
    assert [c.name for c in record.checkpoints] == [name]


async def test_on_preempt_checkpoint_refused_requeues_it_afresh_and_requeue_needs_no_retry(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    """A refused checkpoint (a GPU task on a machine without CUDA checkpointing, say): the
    refusal is kept, the task is stopped as any preemption and queued again to start afresh.
    `--on-preempt requeue` without retries queues a preempted task again too; a failure is
    still the end."""
    reason = "preempted: reclaimed by workspace large"
    refusal = "this worker cannot checkpoint a GPU task: it lacks cuda-checkpoint"
    fields = {"runtime": "runsc", "on_preempt": "checkpoint", "checkpoint_volume": "ckpts"}
    async with _running_task(time_env, task_queue, **fields) as running:
        handle, cluster = running.handle, running.cluster
        cluster.checkpoint_refusal = refusal
        await handle.signal(TaskWorkflow.preempt, reason)

        await _running_again(handle, "queued again and running")
        record = await handle.query(TaskWorkflow.record)
    assert record is not None
    assert cluster.cancels == 1
    [attempt] = record.attempts
    assert attempt.state == "preempted"
    assert attempt.reason == (
        f"{reason}; its checkpoint was refused ({refusal}): queued again to start afresh"
    )
    assert [r.reason for r in record.checkpoint_refusals] == [f"on preempt: {refusal}"]
    assert [t.restore_from for t in cluster.run_tasks] == ["", ""]

    async with _running_task(time_env, task_queue, on_preempt="requeue") as running:
        handle, cluster = running.handle, running.cluster
        await handle.signal(TaskWorkflow.preempt, reason)
        await _running_again(handle, "queued again without a retry")
        record = await handle.query(TaskWorkflow.record)
        assert record is not None
        assert [(a.state, a.reason) for a in record.attempts] == [("preempted", reason)]
        assert cluster.runs == ["w1", "w1"]


async def test_a_checkpoint_ends_the_task_and_its_record_keeps_it(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    async with _running_task(time_env, task_queue, runtime="runsc") as running:
        task, handle = running.task, running.handle
        outcome = await checkpoint_task(time_env.client, task.task_id, "ckpts")
        record: TaskRecord = await handle.result()
        again = await checkpoint_task(time_env.client, task.task_id, "")
        asked_as = await submitted_as(time_env.client, task.task_id)
    assert outcome is not None
    assert (outcome.refused, outcome.name) == ("", f"{task.task_id}-ck1")
    assert checkpointed_task_id(outcome.name) == task.task_id
    assert [(c.name, c.volume) for c in running.cluster.checkpoints] == [(outcome.name, "ckpts")]
    assert (record.state, record.reason) == ("cancelled", f"checkpointed to {outcome.name}")
    assert [(c.name, c.node, c.volume, c.stored, c.sha256) for c in record.checkpoints] == [
        (outcome.name, "node-w1", "ckpts", outcome.stored, "c" * 64)
    ]
    assert again is None  # ended: nothing runs to be asked
    assert asked_as == task


async def test_a_refused_checkpoint_leaves_the_task_running(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    refusal = "task runs under runc: CRIU cannot checkpoint here (criu check: vdso)"
    async with _running_task(time_env, task_queue) as running:
        running.cluster.checkpoint_refusal = refusal
        outcome = await checkpoint_task(time_env.client, running.task.task_id, "")
        record = await running.handle.query(TaskWorkflow.record)
    assert outcome is not None
    assert outcome.refused == refusal
    assert len(running.cluster.checkpoints) == 1  # its worker was asked, and refused
    assert record is not None
    assert (record.state, record.checkpoints) == ("running", ())


async def test_checkpoint_answers_at_once_and_the_record_then_keeps_it(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    """The Update answers while CheckpointTask is still held (released only after it answered):
    the record says the ask (`checkpoint_asks`), a second ask meanwhile is refused at once, and
    once the worker took it the record keeps the checkpoint and the task ends."""
    async with _running_task(time_env, task_queue, runtime="runsc") as running:
        task, handle = running.task, running.handle
        running.cluster.hold = asyncio.Event()
        try:
            asked = await handle.execute_update(TaskWorkflow.checkpoint, "ckpts")
            await asyncio.wait_for(running.cluster.taking.wait(), timeout=60)
            during = await handle.query(TaskWorkflow.record)
            second = await checkpoint_task(time_env.client, task.task_id, "")
        finally:
            running.cluster.hold.set()

        async def kept() -> bool:
            record = await handle.query(TaskWorkflow.record)
            return record is not None and bool(record.checkpoints)

        await eventually(kept, within=30, what="the checkpoint in the record")
        record: TaskRecord = await handle.result()
    name = f"{task.task_id}-ck1"
    assert (asked.refused, asked.name, asked.asked) == ("", name, 1), asked
    assert during is not None
    assert (during.state, during.checkpoints, during.checkpoint_asks) == ("running", (), 1)
    assert second is not None
    assert second.refused == f"checkpoint {name} of task {task.task_id} is being taken: wait for it"
    assert (record.state, record.reason) == ("cancelled", f"checkpointed to {name}")
    assert [(c.name, c.volume) for c in record.checkpoints] == [(name, "ckpts")]
    assert record.checkpoint_refusals == ()


async def test_a_refusal_is_kept_in_the_record_under_the_name_it_was_asked(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    refusal = "task runs under runc: CRIU cannot checkpoint here (criu check: vdso)"
    async with _running_task(time_env, task_queue) as running:
        running.cluster.checkpoint_refusal = refusal
        for _ in range(2):
            outcome = await checkpoint_task(time_env.client, running.task.task_id, "")
            assert outcome is not None
            assert (outcome.refused, outcome.asked) == (refusal, 0), outcome
        record = await running.handle.query(TaskWorkflow.record)
    assert record is not None
    name = f"{running.task.task_id}-ck1"
    assert [(r.ask, r.name, r.reason) for r in record.checkpoint_refusals] == [
        (1, name, refusal),
        (2, name, refusal),
    ]
