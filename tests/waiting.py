"""Waiting on servers that answer eventually (visibility, schedules), bounded in time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

POLL_S = 0.2


async def eventually(check: Callable[[], Awaitable[bool]], within: float = 20) -> None:
    """Polls `check` until it is true; fails after `within` seconds."""
    async with asyncio.timeout(within):
        while not await check():  # noqa: ASYNC110 - polling a remote server, not a local event
            await asyncio.sleep(POLL_S)
