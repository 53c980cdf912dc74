"""ReconcilePoolWorkflow's own decisions, pass after pass, on the time-skipping server: the
observe activity is replaced by one that records what the workflow asked of it, so the test
checks what the workflow computes (the pass number, the previous pass it diffs against, the
full resync every FULL_RESYNC_EVERY passes, the run that holds the fingerprints), not what the
stand-in answered. The real activity against the sandbox: test_reconcile_sandbox.py.

The passes run as the schedule runs them, one workflow run after another with the last
completion result carried between them (a cron workflow: the time-skipping server has no
schedules).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.core.observation import fingerprints
from levers9.models import ObservePoolInput, ObservePoolResult, ReconcilePoolInput
from levers9.models import ReconcilePoolResult as Result
from tests.waiting import eventually
from workflows.reconcile_pool import FULL_RESYNC_EVERY, ReconcilePoolWorkflow

pytestmark = pytest.mark.integration

PASSES = FULL_RESYNC_EVERY + 2


class Recorder:
    """The observe stand-in: records each request and answers with counts that differ per pass,
    so a result carried from the wrong pass shows."""

    def __init__(self, pool: str) -> None:
        self.pool = pool
        self.seen: list[ObservePoolInput] = []

    @activity.defn(name="observe_pool")
    async def observe_pool(self, input: ObservePoolInput) -> ObservePoolResult:
        assert input.pool_name == self.pool
        self.seen.append(input)
        n = len(self.seen)
        return ObservePoolResult(
            fingerprints=fingerprints({}), nodes=n, machines=n + 1, told=n + 2, gone=0, api_calls=3
        )


async def _carried(client: Client, workflow_id: str, run_id: str) -> Result:
    """The last completion result a run started with: what the pass before it returned."""
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    payloads = started.last_completion_result.payloads
    [result] = await client.data_converter.decode(payloads, [Result])
    assert isinstance(result, Result)
    return result


async def test_passes_chain_their_results_and_resync_in_full_every_n(
    time_env: WorkflowEnvironment, task_queue: str
) -> None:
    pool = f"gke-{uuid.uuid4().hex[:8]}"
    recorder = Recorder(pool)
    async with Worker(
        time_env.client,
        task_queue=task_queue,
        workflows=[ReconcilePoolWorkflow],
        activities=[recorder.observe_pool],
    ):
        handle = await time_env.client.start_workflow(
            ReconcilePoolWorkflow.run,
            ReconcilePoolInput(pool_name=pool),
            id=f"reconcile:{pool}",
            task_queue=task_queue,
            cron_schedule="* * * * *",
        )

        async def enough() -> bool:
            await time_env.sleep(timedelta(minutes=5))
            return len(recorder.seen) >= PASSES

        await eventually(enough, within=120)
        await handle.terminate("test done")

    seen = recorder.seen[:PASSES]
    # The first pass diffs against nothing; each later one against the run before it.
    assert seen[0].previous is None
    assert all(s.previous is not None for s in seen[1:])
    assert len({s.previous.run_id for s in seen[1:] if s.previous}) == PASSES - 1
    # Every FULL_RESYNC_EVERY-th pass tells every machine; the others only what changed.
    assert [n + 1 for n, s in enumerate(seen) if s.full_resync] == [FULL_RESYNC_EVERY]

    # The result pass n left, as the run after it (pass n + 1) started with it.
    for n in (1, FULL_RESYNC_EVERY - 1, FULL_RESYNC_EVERY):
        ref, next_run = seen[n].previous, seen[n + 1].previous
        assert ref is not None
        assert next_run is not None
        result = await _carried(time_env.client, handle.id, next_run.run_id)
        assert result.pass_number == n, "the pass number counts the schedule's runs"
        assert result.run == ref, "the result names its own run, where its fingerprints are"
        assert (result.nodes, result.machines, result.told) == (n, n + 1, n + 2)
        assert "credentials" not in result.model_dump_json()
