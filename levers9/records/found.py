"""One Temporal call's answer about one record: NOT_FOUND read as "no such record" (`or_none`,
`delivered`, `is_running`), and a query answered within a bound or `NoQueryAnswer`
(`query_within`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

T = TypeVar("T")


async def or_none(call: Awaitable[T]) -> T | None:
    """`call`'s answer; None when Temporal says NOT_FOUND: no such workflow or schedule (a
    record unknown, or ended for a signal or an update). The one place a record's absence is
    read from Temporal's status; every other error passes."""
    try:
        return await call
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def delivered(call: Awaitable[object]) -> bool:
    """Whether a signal (a delete, a terminate) reached its workflow or schedule: False when
    Temporal says NOT_FOUND (none runs under that id)."""
    try:
        await call
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def is_running(handle: WorkflowHandle[Any, Any]) -> bool:
    """Whether the handle's workflow runs now; False once it ended, or if it never existed."""
    described = await or_none(handle.describe())
    return described is not None and described.status == WorkflowExecutionStatus.RUNNING


QUERY_WITHIN_S = 5.0
"""How long the CLI waits for a query's answer. A polling Temporal worker answers in
milliseconds; without one the server holds the query until its deadline (or says it saw no
poller), and what it holds without a worker (describe: memo, search attributes, status) is the
answer then."""
NO_ANSWER = frozenset(
    {RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.FAILED_PRECONDITION}
)
"""How a query no worker took ends: the deadline ("Timeout expired", which the SDK reports as
CANCELLED), or "no poller seen for task queue recently"."""


class NoQueryAnswer(Exception):
    """No Temporal worker answered the query in time: the controlplane's is down (or its task
    queue has no poller). The message is the server's word, or the time waited."""


async def query_within(
    handle: WorkflowHandle[Any, Any],
    query: str,
    within: float,
    *args: Any,
    result_type: type | None = None,
) -> Any:
    """`handle.query`, answered within `within` seconds or NoQueryAnswer (an unknown workflow
    is still RPCError NOT_FOUND)."""
    try:
        async with asyncio.timeout(within):
            return await handle.query(
                query, args=args, result_type=result_type, rpc_timeout=timedelta(seconds=within)
            )
    except TimeoutError:
        raise NoQueryAnswer(f"no answer within {within:g} s") from None
    except RPCError as exc:
        if exc.status not in NO_ANSWER:
            raise
        raise NoQueryAnswer(exc.message or exc.status.name) from None
