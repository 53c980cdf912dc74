"""`heartbeating()`: an activity heartbeats on a timer while a block runs.

An attempt whose Temporal worker was killed is only noticed when its heartbeat timeout passes
(otherwise its start-to-close timeout): heartbeating every couple of seconds, whatever the block
is waiting on, lets that timeout be short, so a crashed controlplane's reconcile pass is retried
within seconds rather than after minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from temporalio import activity

HEARTBEAT_EVERY_S = 2.0


@contextlib.asynccontextmanager
async def heartbeating(every_s: float = HEARTBEAT_EVERY_S) -> AsyncIterator[None]:
    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(every_s)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
