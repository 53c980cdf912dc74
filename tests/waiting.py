"""Waiting on servers that answer eventually (visibility, schedules), bounded in time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

POLL_S = 0.2
T = TypeVar("T")


async def eventually(
    check: Callable[[], Awaitable[bool]], within: float = 20, *, what: str = ""
) -> None:
    """Polls `check` until it is true; fails after `within` seconds with a TimeoutError naming
    what did not happen (`what`, else the check's own name)."""
    try:
        async with asyncio.timeout(within):
            while not await check():  # noqa: ASYNC110 - polling a remote server, not a local event
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        name = what or getattr(check, "__name__", "the condition")
        raise TimeoutError(f"{name}: not true within {within:g} s") from None


def until(check: Callable[[], T | None], within: float, *, what: str, poll: float = POLL_S) -> T:
    """`eventually` for synchronous tests (a CLI, a process, a file): calls `check` until it
    returns something truthy and returns that; fails after `within` seconds with a
    TimeoutError naming what did not happen and what `check` returned last."""
    deadline = time.monotonic() + within
    while True:
        seen = check()
        if seen:
            return seen
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not true within {within:g} s (last: {seen!r})")
        time.sleep(poll)


async def signals_handled(client: Client, workflow_id: str, within: float = 30) -> None:
    """Until the workflow's latest run has completed a workflow task after the last signal it
    holds (any task, when it holds none: its signals went to the run before it)."""

    async def after() -> bool:
        events = (await client.get_workflow_handle(workflow_id).fetch_history()).events
        signalled = [
            i
            for i, e in enumerate(events)
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        ]
        return any(
            e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
            for e in events[signalled[-1] if signalled else 0 :]
        )

    await eventually(after, within=within)
