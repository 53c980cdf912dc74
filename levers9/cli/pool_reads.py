"""The CLI's side of `levers9.v1.Pools`: pools, one pool's usage by workspace, machines, and a
pool's removal, through the gateway with the CLI's token (a workspace's reads there, having no
way into Temporal). Without a token, or with a gateway that does not answer, Temporal itself, as
the operator reads it; never around the gateway's refusal (GatewayDenied: a workspace token on
a change, a revoked token).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, TypeVar

from google.protobuf.timestamp_pb2 import Timestamp

from levers9.cli.gateway_api import (
    CALL_TIMEOUT_S,
    GatewayDenied,
    GatewayUnavailable,
    NoToken,
    gateway_stub,
)
from levers9.config import ControlplaneSettings
from levers9.core.pool_usage import PoolUsage, WorkspaceUsage
from levers9.errors import Unreachable
from levers9.models import MachineRecord
from levers9.proto import pools_pb2, pools_pb2_grpc
from levers9.providers.gke import RemovePoolResult
from levers9.task_wire import from_message
from levers9.temporal import PoolScheduleRow

if TYPE_CHECKING:
    from levers9.records.pools import TemporalPoolRecords

T = TypeVar("T")
REMOVE_WAIT_S = 300.0
"""How long `pool remove` waits for the removal's end (the gateway's bound)."""


@dataclass(frozen=True)
class PoolView:
    """One pool as `pool list` and `pool get` show it."""

    schedule: PoolScheduleRow
    joined: bool


@dataclass(frozen=True)
class PoolDetail:
    pool: PoolView
    usage: PoolUsage | None
    usage_note: str = ""
    """Why `usage` is None."""


async def _temporal_records(settings: ControlplaneSettings) -> TemporalPoolRecords:
    from levers9.records.pools import TemporalPoolRecords
    from levers9.temporal import connect

    return TemporalPoolRecords(await connect(settings), settings.task_queue)


async def _either(gateway: Callable[[], Awaitable[T]], temporal: Callable[[], Awaitable[T]]) -> T:
    """`gateway()`; when the gateway cannot be asked, `temporal()`; when neither answers, the
    gateway's reason (the one to fix)."""
    try:
        return await gateway()
    except GatewayDenied:
        raise
    except GatewayUnavailable as unavailable:
        try:
            return await temporal()
        except Unreachable:
            if isinstance(unavailable, NoToken):
                raise  # no token: Temporal was the way asked, its reason the one to fix
            raise unavailable from None


def _moment(message: pools_pb2.Pool, field: str) -> datetime | None:
    if not message.HasField(field):  # type: ignore[arg-type]
        return None
    stamp: Timestamp = getattr(message, field)
    return stamp.ToDatetime(tzinfo=UTC)


def _view(message: pools_pb2.Pool) -> PoolView:
    schedule = PoolScheduleRow(
        pool=message.name,
        schedule=message.schedule,
        every=message.every,
        paused=message.paused,
        passes=message.passes,
        last_pass=_moment(message, "last_pass"),
        next_pass=_moment(message, "next_pass"),
    )
    return PoolView(schedule, message.joined)


def _usage(message: pools_pb2.PoolUsage) -> PoolUsage:
    rows = [from_message(row, WorkspaceUsage) for row in message.workspaces]
    return from_message(message, PoolUsage, workspaces=rows)


async def list_pools(settings: ControlplaneSettings) -> list[PoolView]:
    async def gateway() -> list[PoolView]:
        async with gateway_stub(settings, pools_pb2_grpc.PoolsStub) as (stub, metadata):
            reply = await stub.ListPools(
                pools_pb2.ListPoolsRequest(), metadata=metadata, timeout=CALL_TIMEOUT_S
            )
            return [_view(pool) for pool in reply.pools]

    async def temporal() -> list[PoolView]:
        rows = await (await _temporal_records(settings)).pools()
        return [PoolView(row.schedule, row.joined) for row in rows]

    return await _either(gateway, temporal)


async def get_pool(settings: ControlplaneSettings, name: str) -> PoolDetail:
    """The pool and each workspace's usage of it (a workspace token: its own only). Through
    the gateway, NOT_FOUND is GatewayRefused; through Temporal, NoSuchPool."""

    async def gateway() -> PoolDetail:
        async with gateway_stub(settings, pools_pb2_grpc.PoolsStub) as (stub, metadata):
            reply = await stub.GetPool(
                pools_pb2.GetPoolRequest(name=name), metadata=metadata, timeout=CALL_TIMEOUT_S
            )
            usage = _usage(reply.usage) if reply.HasField("usage") else None
            return PoolDetail(_view(reply.pool), usage, reply.usage_note)

    async def temporal() -> PoolDetail:
        records = await _temporal_records(settings)
        row = await records.pool(name)
        usage = await records.usage(name)
        view = PoolView(row.schedule, row.joined)
        if isinstance(usage, str):
            return PoolDetail(view, None, usage)
        return PoolDetail(view, usage)

    return await _either(gateway, temporal)


async def list_machines(settings: ControlplaneSettings, pool: str | None) -> list[MachineRecord]:
    async def gateway() -> list[MachineRecord]:
        async with gateway_stub(settings, pools_pb2_grpc.PoolsStub) as (stub, metadata):
            reply = await stub.ListMachines(
                pools_pb2.ListMachinesRequest(pool_name=pool or ""),
                metadata=metadata,
                timeout=CALL_TIMEOUT_S,
            )
            return [from_message(machine, MachineRecord) for machine in reply.machines]

    async def temporal() -> list[MachineRecord]:
        from levers9.records.listing import list_machine_records

        return await list_machine_records(settings, pool)

    return await _either(gateway, temporal)


async def remove_pool(
    settings: ControlplaneSettings, name: str, *, delete_namespace: bool
) -> RemovePoolResult | None:
    """Removes the pool (the operator's); None when the removal has not ended within
    REMOVE_WAIT_S. GatewayDenied for a workspace token; GatewayRefused (NOT_FOUND, removal
    failed) through the gateway, NoSuchPool / RemovalFailed through Temporal."""

    async def gateway() -> RemovePoolResult | None:
        request = pools_pb2.RemovePoolRequest(
            name=name, delete_namespace=delete_namespace, wait_seconds=REMOVE_WAIT_S
        )
        async with gateway_stub(settings, pools_pb2_grpc.PoolsStub) as (stub, metadata):
            reply = await stub.RemovePool(
                request, metadata=metadata, timeout=CALL_TIMEOUT_S + REMOVE_WAIT_S
            )
            return from_message(reply, RemovePoolResult) if reply.done else None

    async def temporal() -> RemovePoolResult | None:
        records = await _temporal_records(settings)
        return await records.remove(
            name,
            delete_namespace=delete_namespace,
            wait_s=REMOVE_WAIT_S,
            reason="removed by levers9",
        )

    return await _either(gateway, temporal)
