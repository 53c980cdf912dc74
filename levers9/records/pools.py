"""Pools and machines as Temporal holds them, for whoever reads them without the settings (the
gateway's Pools service): each pool's reconcile schedule, which pools `levers9 cluster join`
made, its placement's state (PoolWorkflow's query `state`, read as each workspace's usage), its
machine records; and a pool's removal (`remove:<pool>`), started or joined.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from temporalio.client import Client, WorkflowFailureError, WorkflowQueryFailedError
from temporalio.service import RPCError

from levers9.contract import DNS_LABEL
from levers9.core.placement import PoolState
from levers9.core.pool_usage import PoolUsage, pool_usage
from levers9.models import MachineRecord, pool_workflow_id
from levers9.operations import failure_message, start_removal
from levers9.providers.gke import RemovePoolResult
from levers9.records.clusters import joined_clusters
from levers9.records.found import NoQueryAnswer, or_none, query_within
from levers9.records.listing import machine_records
from levers9.temporal import (
    PoolScheduleRow,
    describe_reconcile_schedules,
    has_pool,
    no_such_pool,
    pool_names,
)

STATE_WITHIN_S = 5.0
"""How long a pool's placement may take to answer its state before `pool get` shows none."""


@dataclass(frozen=True)
class PoolRow:
    """One pool as `levers9 pool list` shows it."""

    schedule: PoolScheduleRow
    joined: bool


class NoSuchPool(LookupError):
    """The controlplane reconciles no such pool; the message names those it does."""


class RemovalFailed(Exception):
    """The pool's removal failed; the message is its failure's."""


class TemporalPoolRecords:
    """The pools and machines of one controlplane (its task queue)."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self._client = client
        self._task_queue = task_queue

    async def pools(self) -> list[PoolRow]:
        schedules = await describe_reconcile_schedules(self._client, self._task_queue)
        joined = {state.spec.name for state in await joined_clusters(self._client)}
        return [PoolRow(row, row.pool in joined) for row in schedules]

    async def names(self) -> list[str]:
        """The pools reconciled here, by name (their schedules listed, none described)."""
        return await pool_names(self._client, self._task_queue)

    async def pool(self, name: str) -> PoolRow:
        """The pool's row; NoSuchPool naming the pools there are."""
        rows = await self.pools()
        for row in rows:
            if row.schedule.pool == name:
                return row
        raise NoSuchPool(no_such_pool(name, [row.schedule.pool for row in rows]))

    async def usage(self, name: str, within: float = STATE_WITHIN_S) -> PoolUsage | str:
        """Each workspace's usage of the pool, from its placement's state; a note saying why
        there is none (no task asked the pool yet, no Temporal worker answered)."""
        handle = self._client.get_workflow_handle(pool_workflow_id(name))
        try:
            try:
                usage: PoolUsage | None = await or_none(
                    query_within(handle, "usage", within, result_type=PoolUsage)
                )
            except WorkflowQueryFailedError as exc:
                if "Query handler for 'usage' expected but not found" not in str(exc):
                    raise
                # A Temporal worker of the code before `usage` (an upgrade under way): the
                # whole state, counted here.
                state: PoolState | None = await or_none(
                    query_within(handle, "state", within, result_type=PoolState)
                )
                usage = None if state is None else pool_usage(state)
        except (NoQueryAnswer, RPCError, WorkflowQueryFailedError) as exc:
            return f"its placement did not answer ({exc}): is the controlplane running?"
        if usage is None:
            return pool_usage(PoolState())  # no task has asked this pool yet
        return usage

    async def machines(self, pool_name: str | None) -> list[MachineRecord]:
        """ValueError naming `pool` for a pool name that is not a DNS label."""
        return await machine_records(self._client, self._task_queue, pool_name)

    async def removable(self, name: str) -> bool:
        """The pool is reconciled here, or a removal of it left records running (rerun to
        finish): anything else names no pool, and removing it would say it removed one.
        `name` must be a DNS label: it goes into a query."""
        if await has_pool(self._client, self._task_queue, name):
            return True
        query = (
            f"ExecutionStatus='Running' AND PoolName='{name}' AND TaskQueue='{self._task_queue}'"
        )
        async for _ in self._client.list_workflows(query, limit=1):
            return True
        return False

    async def remove(
        self, name: str, *, delete_namespace: bool, wait_s: float, reason: str
    ) -> RemovePoolResult | None:
        """Starts the pool's removal (or joins the one running) and waits for its end up to
        `wait_s`; None when it has not ended by then. NoSuchPool (a name that is no DNS label
        names none), RemovalFailed."""
        if not DNS_LABEL.fullmatch(name) or not await self.removable(name):
            raise NoSuchPool(no_such_pool(name, await pool_names(self._client, self._task_queue)))
        handle = await start_removal(
            self._client, self._task_queue, name, delete_namespace=delete_namespace, reason=reason
        )
        try:
            async with asyncio.timeout(wait_s):
                return await handle.result()
        except TimeoutError:
            return None
        except WorkflowFailureError as exc:
            raise RemovalFailed(failure_message(exc)) from None
