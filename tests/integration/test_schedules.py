"""Reconcile schedules on the Temporal dev server: one per pool (interval, overlap SKIP), updated
in place (an operator's pause survives), deleted when the pool leaves the values; and the
ReconcilePoolWorkflow each fires, which reads the pool from the Temporal worker and counts passes.
"""

from __future__ import annotations

import uuid

import pytest
from temporalio import activity
from temporalio.client import (
    Client,
    ScheduleActionStartWorkflow,
    ScheduleOverlapPolicy,
    WorkflowFailureError,
)
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.kube import KubeObserver
from activities.kube_clients import KubeClients
from activities.reconcile import ReconcileActivities
from levers9.config import ControlplaneSettings
from levers9.core.observation import fingerprints
from levers9.models import (
    ObservePoolInput,
    ObservePoolResult,
    ReconcilePoolInput,
    ReconcilePoolResult,
)
from levers9.search_attributes import POOL_NAME
from levers9.temporal import (
    MEMO_TASK_QUEUE,
    ensure_search_attributes,
    gpus_simulated,
    list_reconcile_schedules,
    sync_reconcile_schedules,
)
from tests.waiting import eventually
from workflows import WORKFLOWS
from workflows.reconcile_pool import ReconcilePoolWorkflow

pytestmark = pytest.mark.integration


def _settings(env: WorkflowEnvironment, task_queue: str, every: float = 15) -> ControlplaneSettings:
    return ControlplaneSettings.model_validate(
        {
            "temporalAddress": env.client.service_client.config.target_host,
            "taskQueue": task_queue,
            "reconcileIntervalSeconds": every,
        }
    )


@pytest.fixture
async def client(dev_env: WorkflowEnvironment) -> Client:
    await ensure_search_attributes(dev_env.client, "default")
    return dev_env.client


async def _schedule_ids(client: Client, task_queue: str) -> set[str]:
    ids = set()
    async for listed in await client.list_schedules():
        if (await listed.memo()).get(MEMO_TASK_QUEUE) == task_queue:
            ids.add(listed.id)
    return ids


def _names(prefix: str, *pools: str) -> list[str]:
    return [f"{prefix}-{pool}" for pool in pools]


async def test_search_attributes_are_ensured_once(client: Client) -> None:
    assert await ensure_search_attributes(client, "default") == []


async def test_one_schedule_per_pool_then_removed_pool_deleted(
    dev_env: WorkflowEnvironment, client: Client, task_queue: str
) -> None:
    prefix = uuid.uuid4().hex[:8]
    settings = _settings(dev_env, task_queue)
    first = await sync_reconcile_schedules(client, _names(prefix, "a", "b"), settings)
    assert first.created == [f"reconcile:{prefix}-a", f"reconcile:{prefix}-b"]
    described = await client.get_schedule_handle(f"reconcile:{prefix}-a").describe()
    assert described.schedule.policy.overlap == ScheduleOverlapPolicy.SKIP
    assert [i.every.total_seconds() for i in described.schedule.spec.intervals] == [15]
    action = described.schedule.action
    assert isinstance(action, ScheduleActionStartWorkflow)
    assert action.workflow == "ReconcilePoolWorkflow"

    wanted = {f"reconcile:{prefix}-a", f"reconcile:{prefix}-b"}

    async def both_listed() -> bool:
        return await _schedule_ids(client, task_queue) == wanted

    await eventually(both_listed)
    await client.get_schedule_handle(f"reconcile:{prefix}-a").pause(note="operator")
    second = await sync_reconcile_schedules(client, _names(prefix, "a"), settings)
    assert second.created == []
    assert second.updated == [f"reconcile:{prefix}-a"]
    assert second.deleted == [f"reconcile:{prefix}-b"]
    kept = await client.get_schedule_handle(f"reconcile:{prefix}-a").describe()
    assert kept.schedule.state.paused, "an operator's pause survives an update"

    async def only_a_listed() -> bool:
        return await _schedule_ids(client, task_queue) == {f"reconcile:{prefix}-a"}

    await eventually(only_a_listed)
    untouched = await sync_reconcile_schedules(client, [], settings, keep=_names(prefix, "a"))
    assert untouched.deleted == [], "a pool whose block does not load keeps its schedule"
    await sync_reconcile_schedules(client, [], settings)


async def test_other_task_queues_schedules_are_left_alone(
    dev_env: WorkflowEnvironment, client: Client, task_queue: str
) -> None:
    prefix = uuid.uuid4().hex[:8]
    other_queue = f"{task_queue}-other"
    await sync_reconcile_schedules(client, _names(prefix, "x"), _settings(dev_env, other_queue))

    async def listed() -> bool:
        return await _schedule_ids(client, other_queue) == {f"reconcile:{prefix}-x"}

    await eventually(listed)
    result = await sync_reconcile_schedules(client, [], _settings(dev_env, task_queue))
    assert f"reconcile:{prefix}-x" not in result.deleted
    await sync_reconcile_schedules(client, [], _settings(dev_env, other_queue))


async def test_a_pools_simulated_gpus_is_in_its_schedules_memo_and_a_change_keeps_the_pause(
    dev_env: WorkflowEnvironment, client: Client, task_queue: str
) -> None:
    """`levers9 pool check` reads `simulatedGpus` from the schedule's memo: set as the values say,
    false for any other pool (or none), and a change made again with an operator's pause kept."""
    settings = _settings(dev_env, task_queue)
    sim, real = _names(f"p-{uuid.uuid4().hex[:8]}", "sim", "real")
    await sync_reconcile_schedules(client, [sim, real], settings, simulated_gpus=[sim])
    assert (await gpus_simulated(client, sim), await gpus_simulated(client, real)) == (True, False)
    assert await gpus_simulated(client, "no-such-pool") is False
    await client.get_schedule_handle(f"reconcile:{sim}").pause(note="operator")
    await sync_reconcile_schedules(client, [sim, real], settings)
    assert await gpus_simulated(client, sim) is False
    described = await client.get_schedule_handle(f"reconcile:{sim}").describe()
    assert described.schedule.state.paused
    await sync_reconcile_schedules(client, [], settings)


class ObserveRecorder:
    """`observe_pool` mocked by name: records what each pass asked, answers an empty pool."""

    def __init__(self) -> None:
        self.inputs: list[ObservePoolInput] = []

    @activity.defn(name="observe_pool")
    async def observe_pool(self, input: ObservePoolInput) -> ObservePoolResult:
        self.inputs.append(input)
        return ObservePoolResult(
            fingerprints=fingerprints({}), nodes=0, machines=0, told=0, gone=0, api_calls=3
        )


async def test_schedule_fires_reconcile_passes(
    dev_env: WorkflowEnvironment, client: Client, task_queue: str
) -> None:
    settings = _settings(dev_env, task_queue, every=1)
    pool_name = f"p-{uuid.uuid4().hex[:8]}"
    recorder = ObserveRecorder()
    async with Worker(
        client, task_queue=task_queue, workflows=WORKFLOWS, activities=[recorder.observe_pool]
    ):
        await sync_reconcile_schedules(client, [pool_name], settings)

        async def two_passes() -> bool:
            rows = [r for r in await list_reconcile_schedules(settings) if r.pool == pool_name]
            return bool(rows) and rows[0].passes >= 2 and len(recorder.inputs) >= 2

        await eventually(two_passes, within=30)
        described = await client.get_schedule_handle(f"reconcile:{pool_name}").describe()
        runs = [a.action.workflow_id for a in described.info.recent_actions]  # type: ignore[attr-defined]
        first, second = [
            await client.get_workflow_handle(run, result_type=ReconcilePoolResult).result()
            for run in runs[:2]
        ]
        assert (first.pass_number, second.pass_number) == (1, 2), "a pass reads the last result"
        assert recorder.inputs[0].previous is None
        assert recorder.inputs[1].previous == first.run, "pass 2 diffs against pass 1"
        desc = await client.get_workflow_handle(runs[0]).describe()
        assert desc.typed_search_attributes.get(POOL_NAME) == pool_name
        await sync_reconcile_schedules(client, [], settings)


async def test_reconcile_of_unloaded_pool_fails_with_the_fix(
    client: Client, task_queue: str
) -> None:
    reconcile = ReconcileActivities(
        KubeObserver(KubeClients({})),
        client,
        ControlplaneSettings.model_validate({"taskQueue": task_queue}),
    )
    async with Worker(
        client, task_queue=task_queue, workflows=WORKFLOWS, activities=[reconcile.observe_pool]
    ):
        with pytest.raises(WorkflowFailureError) as caught:
            await client.execute_workflow(
                ReconcilePoolWorkflow.run,
                ReconcilePoolInput(pool_name="gone"),
                id=f"reconcile:gone-{uuid.uuid4()}",
                task_queue=task_queue,
            )
    activity_error = caught.value.cause
    assert isinstance(activity_error, ActivityError)
    assert isinstance(activity_error.cause, ApplicationError)
    assert activity_error.cause.type == "PoolNotLoaded"
    assert activity_error.cause.non_retryable
    assert "pool gone is not loaded on this Temporal worker" in str(activity_error.cause)
