"""The records a visibility query lists: the `record` memo of each workflow it names, among one
controlplane's own (its task queue); the machines' and the workers' by pool. A pool name goes
into a query only once it is a DNS label (`pool_clause`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel
from temporalio.client import Client

from levers9.config import ControlplaneSettings
from levers9.contract import DNS_LABEL
from levers9.models import MACHINE_WORKFLOW, WORKER_WORKFLOW, MachineRecord, WorkerRecord
from levers9.temporal import PASS_POLL_S, connect


def pool_clause(pool_name: str | None) -> str:
    """The visibility query's clause for one pool (empty for every pool); ValueError naming
    `pool` unless the name is a DNS label, so no quote or operator ever reaches the query."""
    if not pool_name:
        return ""
    if not DNS_LABEL.fullmatch(pool_name):
        raise ValueError(f"pool: {pool_name!r} is not a pool name (lowercase DNS label)")
    return f" AND PoolName='{pool_name}'"


R = TypeVar("R", bound=BaseModel)


async def memo_records(client: Client, task_queue: str, query: str, model: type[R]) -> list[R]:
    """The `record` memo of every workflow the visibility query lists (one list call, paged),
    among one controlplane's own (its task queue: two controlplanes may share a namespace)."""
    records = []
    async for listed in client.list_workflows(f"{query} AND TaskQueue='{task_queue}'"):
        memo = await listed.memo()
        if "record" in memo:
            records.append(model.model_validate(memo["record"]))
    return records


async def list_memo_records(settings: ControlplaneSettings, query: str, model: type[R]) -> list[R]:
    """`memo_records` of this controlplane, over a client of its own."""
    return await memo_records(await connect(settings), settings.task_queue, query, model)


def _machines_query(pool_name: str | None) -> str:
    return f"WorkflowType='{MACHINE_WORKFLOW}' AND ExecutionStatus='Running'" + pool_clause(
        pool_name
    )


def _by_node(records: list[MachineRecord]) -> list[MachineRecord]:
    return sorted(records, key=lambda r: (r.pool_name, r.node_name))


async def machine_records(
    client: Client, task_queue: str, pool_name: str | None
) -> list[MachineRecord]:
    """The machine records (running MachineWorkflows' memos), by pool and node; ValueError
    naming `pool` for a pool name that is not a DNS label."""
    query = _machines_query(pool_name)
    return _by_node(await memo_records(client, task_queue, query, MachineRecord))


async def list_machine_records(
    settings: ControlplaneSettings, pool_name: str | None
) -> list[MachineRecord]:
    """`machine_records` of this controlplane, over a client of its own (a bad pool name is
    refused before it connects)."""
    return _by_node(await list_memo_records(settings, _machines_query(pool_name), MachineRecord))


async def list_worker_records(
    settings: ControlplaneSettings, pool_name: str | None, include_ended: bool
) -> list[WorkerRecord]:
    """The worker records (WorkerWorkflows' memos), ended ones too when asked; ValueError
    naming `pool` for a pool name that is not a DNS label (before it connects)."""
    query = f"WorkflowType='{WORKER_WORKFLOW}'"
    if not include_ended:
        query += " AND ExecutionStatus='Running'"
    query += pool_clause(pool_name)
    records = await list_memo_records(settings, query, WorkerRecord)
    return sorted(records, key=lambda r: (r.pool_name, r.node_name, r.created_at))


async def wait_for_workers(
    settings: ControlplaneSettings, within: float, progress: Callable[[int, int], None]
) -> None:
    """Waits (bounded) until every machine has an available worker."""
    async with asyncio.timeout(within):
        while True:
            machines = [m for m in await list_machine_records(settings, None) if m.machine]
            workers = await list_worker_records(settings, None, include_ended=False)
            available = sum(1 for w in workers if w.state == "available")
            progress(available, len(machines))
            if machines and available >= len(machines):
                return
            await asyncio.sleep(PASS_POLL_S)
