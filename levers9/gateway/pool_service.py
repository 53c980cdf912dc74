"""`levers9.v1.Pools`: `levers9 pool list|get|remove` and `levers9 machine list` for any token.

Any valid token reads pools and machines: a workspace's has no way into Temporal, and reads
here what the operator reads there, but for GetPool's usage, where it sees its own workspace's
row only (no other workspace's name). A change (RemovePool) is the operator's: a workspace token
gets PERMISSION_DENIED naming the operator, before anything is read or started.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from levers9.contract import DNS_LABEL
from levers9.core.pool_usage import only_workspace
from levers9.gateway.roles import Authority, Forbidden, operator_only
from levers9.gateway.scope import identify
from levers9.logs import get_logger
from levers9.proto import pools_pb2, pools_pb2_grpc
from levers9.records.pools import NoSuchPool, PoolRow, RemovalFailed, TemporalPoolRecords
from levers9.task_wire import to_message

MAX_REMOVE_WAIT_S = 300.0
Context = grpc.aio.ServicerContext[Any, Any]

log = get_logger(__name__)


def _timestamp(moment: datetime | None) -> Timestamp | None:
    if moment is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(moment.astimezone(UTC))
    return stamp


def pool_message(row: PoolRow) -> pools_pb2.Pool:
    schedule = row.schedule
    return pools_pb2.Pool(
        name=schedule.pool,
        schedule=schedule.schedule,
        every=schedule.every,
        paused=schedule.paused,
        passes=schedule.passes,
        last_pass=_timestamp(schedule.last_pass),
        next_pass=_timestamp(schedule.next_pass),
        joined=row.joined,
    )


class PoolsService(pools_pb2_grpc.PoolsServicer):
    def __init__(self, records: TemporalPoolRecords, authority: Authority) -> None:
        self._records = records
        self._authority = authority

    @staticmethod
    async def _pool_name(context: Context, name: str, field: str) -> None:
        if not DNS_LABEL.fullmatch(name):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{field}: {name!r} is not a pool name (lowercase DNS label)",
            )

    async def ListPools(
        self, request: pools_pb2.ListPoolsRequest, context: Context
    ) -> pools_pb2.ListPoolsResponse:
        await identify(self._authority, context)
        rows = await self._records.pools()
        return pools_pb2.ListPoolsResponse(pools=[pool_message(row) for row in rows])

    async def GetPool(
        self, request: pools_pb2.GetPoolRequest, context: Context
    ) -> pools_pb2.GetPoolResponse:
        identity = await identify(self._authority, context)
        await self._pool_name(context, request.name, "name")
        try:
            row = await self._records.pool(request.name)
        except NoSuchPool as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            raise  # abort raises; for the type checker
        usage = await self._records.usage(request.name)
        if isinstance(usage, str):
            return pools_pb2.GetPoolResponse(pool=pool_message(row), usage_note=usage)
        if identity.workspace is not None:
            usage = only_workspace(usage, identity.workspace)
        return pools_pb2.GetPoolResponse(
            pool=pool_message(row), usage=to_message(usage, pools_pb2.PoolUsage)
        )

    async def ListMachines(
        self, request: pools_pb2.ListMachinesRequest, context: Context
    ) -> pools_pb2.ListMachinesResponse:
        await identify(self._authority, context)
        if request.pool_name:
            await self._pool_name(context, request.pool_name, "pool_name")
        records = await self._records.machines(request.pool_name or None)
        return pools_pb2.ListMachinesResponse(
            machines=[to_message(record, pools_pb2.Machine) for record in records]
        )

    async def RemovePool(
        self, request: pools_pb2.RemovePoolRequest, context: Context
    ) -> pools_pb2.RemovePoolResponse:
        identity = await identify(self._authority, context)
        try:
            operator_only(identity, f"removing pool {request.name}")
        except Forbidden as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        if not 0 <= request.wait_seconds <= MAX_REMOVE_WAIT_S:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"wait_seconds: 0 to {MAX_REMOVE_WAIT_S:g}, not {request.wait_seconds:g}",
            )
        try:
            result = await self._records.remove(
                request.name,
                delete_namespace=request.delete_namespace,
                wait_s=request.wait_seconds,
                reason="removed by levers9",
            )
        except NoSuchPool as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            raise  # abort raises; for the type checker
        except RemovalFailed as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"removal failed: {exc}")
            raise
        log.info("pool removal asked", pool_name=request.name, done=result is not None)
        if result is None:
            return pools_pb2.RemovePoolResponse(done=False)
        reply = to_message(result, pools_pb2.RemovePoolResponse)
        reply.done = True
        return reply
