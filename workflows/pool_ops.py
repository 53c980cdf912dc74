"""Pool-wide operations, each a workflow on the controlplane's task queue:

ImageRecopyWorkflow (`image-recopy:<pool>:<time>`, `levers9 image recopy --pool P`): copy the
worker image's `latest` from the controlplane's registry into the pool's `workerImage`, then
stop every worker of the pool at once (Job deleted, record ended `stopped` with the reason
`image recopied`), so fresh workers start at the next reconcile instead of after the old
records expire (spec, "Day two": about ten minutes).

RemovePoolWorkflow (`remove:<pool>`): the reconcile schedule deleted first (nothing new starts),
then every machine record ended and every worker record ended. When the pool is still in the
values (`levers9 pool remove`), its worker Jobs are deleted, and its namespace with
`--delete-namespace`; when it is not (its block was deleted and the controlplane restarted),
the controlplane has no credentials for the cluster any more and says to delete the namespace
there, as the spec's "Removing the pool" row does.
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

from workflows.steps import step, stop_workers

with workflow.unsafe.imports_passed_through():
    from activities.images import ImageActivities
    from activities.pools import PoolActivities, PoolRecords
    from levers9.logs import KV_EXTRA
    from levers9.models import StopWorker, machine_workflow_id
    from levers9.providers.gke import (
        IMAGE_RECOPY_WORKFLOW,
        REMOVE_POOL_WORKFLOW,
        ImageRecopyInput,
        RecopyResult,
        RemovePoolInput,
        RemovePoolResult,
    )

COPY_TIMEOUT = timedelta(minutes=20)
SETTLE_ROUNDS = 30
SETTLE_INTERVAL = timedelta(seconds=2)


@workflow.defn(name=IMAGE_RECOPY_WORKFLOW)
class ImageRecopyWorkflow:
    @workflow.run
    async def run(self, input: ImageRecopyInput) -> RecopyResult:
        target = await step(PoolActivities.recopy_target, input.pool_name)
        copied = await step(ImageActivities.copy_image, target, start_to_close=COPY_TIMEOUT)
        records: PoolRecords = await step(PoolActivities.pool_records, input.pool_name)
        stopped = await stop_workers(
            input.pool_name, records.workers, StopWorker(reason="image recopied")
        )
        for _ in range(SETTLE_ROUNDS):
            # Returns once their records have ended (Jobs deleted), so what the caller sees
            # next is the fresh workers, never the old ones.
            running = await step(PoolActivities.pool_records, input.pool_name)
            if not set(running.workers) & set(stopped):
                break
            await workflow.sleep(SETTLE_INTERVAL)
        workflow.logger.info(
            "worker image recopied",
            extra={
                KV_EXTRA: {
                    "pool_name": input.pool_name,
                    "image": target.destination,
                    "digest": copied.digest,
                    "workers_restarted": len(stopped),
                }
            },
        )
        return RecopyResult(digest=copied.digest, workers_restarted=stopped)


@workflow.defn(name=REMOVE_POOL_WORKFLOW)
class RemovePoolWorkflow:
    @workflow.run
    async def run(self, input: RemovePoolInput) -> RemovePoolResult:
        pool = input.pool_name
        schedule_deleted = await step(PoolActivities.delete_reconcile_schedule, pool)
        machines: set[str] = set()
        workers: set[str] = set()
        jobs: set[str] = set()
        reachable, settled = True, False
        for _ in range(SETTLE_ROUNDS):
            # Until a listing shows nothing running: a reconcile in flight when the schedule
            # went may still have started a machine, and ending takes each record a moment.
            records: PoolRecords = await step(PoolActivities.pool_records, pool)
            # The Jobs go below, all at once (or stay, out of reach): no worker deletes its own.
            stop = StopWorker(reason=input.reason, delete_job=False)
            for node in records.machines:
                handle = workflow.get_external_workflow_handle(machine_workflow_id(pool, node))
                with contextlib.suppress(FailureError):  # ended meanwhile
                    await handle.signal("gone", stop)
                machines.add(node)
            if reachable:
                try:
                    jobs.update(await step(PoolActivities.delete_pool_jobs, pool))
                except ActivityError as exc:
                    cause = exc.cause
                    if not (isinstance(cause, ApplicationError) and cause.type == "PoolNotLoaded"):
                        raise
                    reachable = False
            await stop_workers(pool, records.workers, stop)
            # Running when listed, so ended by this removal (by its machine or just now).
            workers.update(records.workers)
            if not records.workers and not records.machines:
                settled = True
                break
            await workflow.sleep(SETTLE_INTERVAL)
        namespace_deleted = False
        if input.delete_namespace and reachable:
            namespace_deleted = await step(PoolActivities.delete_pool_namespace, pool)
        notes = []
        if not reachable:
            notes.append(
                "the pool is no longer in the values, so its cluster is out of reach: delete"
                " the levers9 namespace there (kubectl delete namespace levers9)"
            )
        if not settled:
            notes.append(
                f"records still running after {SETTLE_ROUNDS} rounds: levers9 worker list"
                f" --pool {pool}; rerun levers9 pool remove"
            )
        workflow.logger.info(
            "pool removed",
            extra={
                KV_EXTRA: {
                    "pool_name": pool,
                    "workers_ended": len(workers),
                    "machines_ended": len(machines),
                    "jobs_deleted": len(jobs),
                }
            },
        )
        return RemovePoolResult(
            schedule_deleted=schedule_deleted,
            workers_ended=sorted(workers),
            machines_ended=sorted(machines),
            jobs_deleted=len(jobs),
            namespace_deleted=namespace_deleted,
            note="; ".join(notes),
        )
