"""The pools page's chart: each pool's cards in use and tasks waiting, sampled by this replica
in the background from the moment its dashboard starts, whether or not a page is open.

One sample per pool every `every_s` (30 s), kept for `window_s` (6 h) in a ring per pool; each
sample is one read of the pools (their reconcile schedules) and one query of each pool's
placement, through the records layer the gateway's Pools service reads
(`TemporalPoolRecords`). Each replica keeps its own samples: a replica that starts shows a
chart that fills in from then.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from levers9.core.pool_usage import PoolUsage
from levers9.logs import get_logger

log = get_logger(__name__)

SAMPLE_EVERY_S = 30.0
WINDOW_S = 6 * 3600.0

Sample = tuple[float, int, int, int]
"""(when, cards in use, cards in all, tasks waiting) of one pool."""


class PoolReads(Protocol):
    """What the sampler reads: `levers9.records.pools.TemporalPoolRecords`."""

    async def names(self) -> list[str]: ...

    async def usage(self, name: str, within: float = ...) -> PoolUsage | str: ...


def sample_of(now: float, usage: PoolUsage) -> Sample:
    return (now, usage.gpus - usage.free_gpus, usage.gpus, usage.waiting)


class PoolSamples:
    """Each pool's samples over the last `window_s`, one per `every_s`."""

    def __init__(
        self,
        pools: PoolReads,
        *,
        every_s: float = SAMPLE_EVERY_S,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._pools = pools
        self.every_s = every_s
        self.window_s = window_s
        self._clock = clock
        self._kept = int(window_s / every_s) + 1
        self._samples: dict[str, deque[Sample]] = {}
        self._task: asyncio.Task[None] | None = None
        self.rounds = 0
        """Sampling rounds done (each reads every pool once)."""

    def of(self, pool_name: str) -> Sequence[Sample]:
        return self._samples.get(pool_name, ())

    @property
    def pools(self) -> Mapping[str, Sequence[Sample]]:
        return self._samples

    async def sample(self) -> None:
        """One round: every pool's usage now (a pool whose placement does not answer, or that
        is gone, gets no sample this round)."""
        names = await self._pools.names()
        for gone in set(self._samples) - set(names):
            del self._samples[gone]
        for name in names:
            usage = await self._pools.usage(name)
            if isinstance(usage, str):
                continue
            ring = self._samples.setdefault(name, deque(maxlen=self._kept))
            ring.append(sample_of(self._clock(), usage))
        self.rounds += 1

    async def _run(self) -> None:
        while True:
            try:
                await self.sample()
            except Exception as exc:  # a Temporal that does not answer: try again next round
                log.warning("dashboard could not sample the pools", error=str(exc))
            await asyncio.sleep(self.every_s)

    async def __aenter__(self) -> PoolSamples:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="dashboard pool samples")
        return self

    async def __aexit__(self, *exc: object) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
