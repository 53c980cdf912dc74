"""One retried activity call, typed: the cloud and pool-wide workflows run their steps so."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy

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
