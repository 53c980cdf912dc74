"""ReconcilePoolWorkflow: one scheduled pass over a pool (`reconcile:<pool>`, every ~15 s)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities.pools import PoolActivities
    from levers9.logs import KV_EXTRA
    from levers9.models import (
        RECONCILE_POOL_WORKFLOW,
        DescribePoolInput,
        ReconcilePoolInput,
        ReconcilePoolResult,
    )

DESCRIBE_TIMEOUT = timedelta(seconds=10)
DESCRIBE_RETRY = RetryPolicy(maximum_attempts=3)


@workflow.defn(name=RECONCILE_POOL_WORKFLOW)
class ReconcilePoolWorkflow:
    """Reads what the Temporal worker holds for the pool and records the pass.

    The previous pass's result comes back as the schedule's last completion result, which is
    what later passes diff against.
    """

    @workflow.run
    async def run(self, input: ReconcilePoolInput) -> ReconcilePoolResult:
        previous = workflow.get_last_completion_result(ReconcilePoolResult)
        pool = await workflow.execute_activity_method(
            PoolActivities.describe_pool,
            DescribePoolInput(pool_name=input.pool_name),
            start_to_close_timeout=DESCRIBE_TIMEOUT,
            retry_policy=DESCRIBE_RETRY,
        )
        pass_number = previous.pass_number + 1 if previous else 1
        workflow.logger.debug(
            "reconciled pool",
            extra={KV_EXTRA: {"pass": pass_number, "pool_name": input.pool_name}},
        )
        return ReconcilePoolResult(
            pool_name=input.pool_name,
            pass_number=pass_number,
            observed_at=workflow.now(),
            pool=pool,
        )
