"""Joined pools loaded where their activities run.

A cluster joined while the controlplane runs is loaded by the replica its agent dialled; an
activity of its pool may run on any replica's Temporal worker. This interceptor loads the pool
first (its client, cache and reconcile schedule, as the agent's replica did) when the
activity's input names a pool this process has not loaded and that is a joined cluster; its
Kubernetes calls then go through the replica holding the agent's session
(levers9.gateway.cluster_relay). A pool neither loaded nor joined runs on as before (the
activity says it is not loaded).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)


class LoadJoinedPools(Interceptor):
    def __init__(self, loaded: Callable[[str], bool], load: Callable[[str], Awaitable[bool]]):
        """`loaded`: whether this process has the pool; `load`: loads a joined one (False
        when no such cluster is joined)."""
        self._loaded = loaded
        self._load = load

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _LoadFirst(next, self._loaded, self._load)


class _LoadFirst(ActivityInboundInterceptor):
    def __init__(
        self,
        next: ActivityInboundInterceptor,
        loaded: Callable[[str], bool],
        load: Callable[[str], Awaitable[bool]],
    ) -> None:
        super().__init__(next)
        self._loaded = loaded
        self._load = load

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        name = getattr(input.args[0], "pool_name", None) if input.args else None
        if isinstance(name, str) and name and not self._loaded(name):
            await self._load(name)
        return await super().execute_activity(input)
