"""ReconcilePoolWorkflow: one scheduled pass over a pool (`reconcile:<pool>`, every ~15 s).

One activity observes the pool (a constant number of Kubernetes list calls), diffs against the
previous pass and tells only the machines that changed; the workflow records that one activity
and a small result, so an idle pass writes a few events whatever the cluster's size. Every
`FULL_RESYNC_EVERY` passes it tells every machine anyway: a signal lost in between is repaired
within minutes (level-triggered).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.reconcile import ReconcileActivities
    from levers9.models import (
        RECONCILE_POOL_WORKFLOW,
        ObservePoolInput,
        ReconcilePoolInput,
        ReconcilePoolResult,
        RunRef,
    )

OBSERVE_TIMEOUT = timedelta(minutes=2)
OBSERVE_HEARTBEAT = timedelta(seconds=10)
"""The activity heartbeats every 2 s: an attempt lost with its worker is retried within 10 s."""
OBSERVE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=4,
)
FULL_RESYNC_EVERY = 40
"""Passes between full resyncs: 10 minutes at the default 15 s interval."""


@workflow.defn(name=RECONCILE_POOL_WORKFLOW)
class ReconcilePoolWorkflow:
    @workflow.run
    async def run(self, input: ReconcilePoolInput) -> ReconcilePoolResult:
        previous = workflow.get_last_completion_result(ReconcilePoolResult)
        pass_number = previous.pass_number + 1 if previous else 1
        observed = await workflow.execute_activity_method(
            ReconcileActivities.observe_pool,
            ObservePoolInput(
                pool_name=input.pool_name,
                previous=previous.run if previous else None,
                full_resync=pass_number % FULL_RESYNC_EVERY == 0,
            ),
            start_to_close_timeout=OBSERVE_TIMEOUT,
            heartbeat_timeout=OBSERVE_HEARTBEAT,
            retry_policy=OBSERVE_RETRY,
            summary=f"observe pool {input.pool_name}: pass {pass_number}"
            + (" (full resync)" if pass_number % FULL_RESYNC_EVERY == 0 else ""),
        )
        info = workflow.info()
        return ReconcilePoolResult(
            pool_name=input.pool_name,
            pass_number=pass_number,
            observed_at=workflow.now(),
            run=RunRef(workflow_id=info.workflow_id, run_id=info.run_id),
            nodes=observed.nodes,
            machines=observed.machines,
            told=observed.told,
        )
