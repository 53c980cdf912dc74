"""What several workflows do alike: one retried activity call, typed (the cloud and pool-wide
workflows run their steps so), stopping a pool's workers by signal, and the reason an activity
failed with."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from levers9.models import StopWorker, worker_workflow_id

STEP_TIMEOUT = timedelta(minutes=5)
STEP_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=10,
)

A = TypeVar("A")
R = TypeVar("R")


async def step(
    activity: Callable[[Any, A], Awaitable[R]],
    arg: A,
    start_to_close: timedelta = STEP_TIMEOUT,
    retry: RetryPolicy = STEP_RETRY,
) -> R:
    """Retried with backoff on transient errors; a non-retryable error is raised at once."""
    return await workflow.execute_activity_method(
        activity, arg, start_to_close_timeout=start_to_close, retry_policy=retry
    )


async def stop_workers(pool_name: str, workers: Iterable[str], request: StopWorker) -> list[str]:
    """Signals `stop` to each worker record, in order; returns those still running to take it
    (one that ended on its own meanwhile is skipped)."""
    stopped = []
    for worker_id in workers:
        handle = workflow.get_external_workflow_handle(worker_workflow_id(pool_name, worker_id))
        try:
            await handle.signal("stop", request)
        except FailureError:
            continue
        stopped.append(worker_id)
    return stopped


def failure_reason(exc: ActivityError) -> str:
    """The activity's own message when it raised one (the record keeps it verbatim)."""
    return exc.cause.message if isinstance(exc.cause, ApplicationError) else str(exc)
