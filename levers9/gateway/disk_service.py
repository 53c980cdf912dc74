"""`levers9.v1.Disks`: durable disks (DiskWorkflow's records), for `levers9 disk ...`.

A disk is named within its workspace. A workspace token creates, gets, lists and deletes its own
workspace's disks only (levers9.gateway.scope: naming another workspace is PERMISSION_DENIED;
another's disk looked up by name is NOT_FOUND in the words of a missing one). The operator sees all,
and names the workspace (none: `default`), which must exist to create in.

A new disk goes to a Ready machine of its pool (the one whose node holds the fewest disks; the
answer says which and why). A delete is refused while a task that mounts the disk waits or runs
(FAILED_PRECONDITION naming them); else the disk's record has a worker of its node remove its
file, and the answer says whether it did (or why the file stays, and where).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import grpc

from levers9.core.disks import (
    DiskState,
    choose_machine,
    disk_id,
    disk_name_problem,
    disk_size,
)
from levers9.core.quantity import binary_text
from levers9.disk_wire import disk_message
from levers9.gateway.errors import shown
from levers9.gateway.roles import Authority, Identity
from levers9.gateway.scope import call_workspace, identify
from levers9.logs import get_logger
from levers9.proto import disks_pb2, disks_pb2_grpc
from levers9.records.disks import DiskExists, TemporalDiskRecords
from levers9.records.found import NoQueryAnswer
from levers9.temporal import no_such_pool

Context = grpc.aio.ServicerContext[Any, Any]
MAX_USERS_SHOWN = 5
DELETE_WAIT_S = 20.0
"""How long a DeleteDisk waits for the disk's file to be removed from its node."""

log = get_logger(__name__)


def _missing(name: str) -> str:
    return f"no disk {name}: `levers9 disk list` shows them"


class DisksService(disks_pb2_grpc.DisksServicer):
    def __init__(self, records: TemporalDiskRecords, authority: Authority) -> None:
        self._records = records
        self._authority = authority

    @staticmethod
    async def _name(context: Context, name: str) -> None:
        problem = disk_name_problem(name)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"name: {problem}")

    async def _workspace(
        self, identity: Identity, asked: str, context: Context, *, creating: bool
    ) -> str:
        return await call_workspace(
            self._authority, identity, asked, context, objects="disks", creating=creating
        )

    async def _own(self, identity: Identity, request: Any, context: Context) -> DiskState:
        """The disk when the caller may see it; NOT_FOUND, in the words of a missing disk,
        when there is none or it is another workspace's."""
        await self._name(context, request.name)
        workspace = await self._workspace(identity, request.workspace, context, creating=False)
        disk = await self._records.get(workspace, request.name)
        if disk is None or not identity.sees(disk.workspace):
            await context.abort(grpc.StatusCode.NOT_FOUND, _missing(request.name))
        assert disk is not None
        return disk

    async def CreateDisk(
        self, request: disks_pb2.CreateDiskRequest, context: Context
    ) -> disks_pb2.CreateDiskResponse:
        identity = await identify(self._authority, context)
        await self._name(context, request.name)
        try:
            size = disk_size(request.size_bytes)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        workspace = await self._workspace(identity, request.workspace, context, creating=True)
        pool = request.pool_name
        if not pool:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "pool_name: missing")
        pools = await self._records.pool_names()
        if pool not in pools:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"pool_name: {no_such_pool(shown(pool), pools)}"
            )
        chosen = choose_machine(await self._records.rooms(pool))
        if chosen is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"pool {pool} has no Ready machine to hold a disk (`levers9 machine list --pool"
                f" {pool}`): create it once one is",
            )
        assert chosen is not None
        node, why = chosen
        state = DiskState(
            name=request.name,
            workspace=workspace,
            pool_name=pool,
            node_name=node,
            disk_id=disk_id(workspace, request.name, uuid.uuid4().hex[:12]),
            size_bytes=size,
            created_at=datetime.now(UTC),
            chosen=why,
        )
        try:
            await self._records.create(state)
        except DiskExists as exc:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
        log.info(
            "disk created",
            disk=state.name,
            workspace=workspace,
            pool_name=pool,
            node_name=node,
            size=binary_text(size),
            chosen=why,
        )
        view = await self._records.view(state)
        return disks_pb2.CreateDiskResponse(disk=disk_message(view))

    async def GetDisk(
        self, request: disks_pb2.GetDiskRequest, context: Context
    ) -> disks_pb2.GetDiskResponse:
        identity = await identify(self._authority, context)
        disk = await self._own(identity, request, context)
        return disks_pb2.GetDiskResponse(disk=disk_message(await self._records.view(disk)))

    async def ListDisks(
        self, request: disks_pb2.ListDisksRequest, context: Context
    ) -> disks_pb2.ListDisksResponse:
        identity = await identify(self._authority, context)
        workspace: str | None = identity.workspace
        if identity.operator and request.workspace:
            workspace = request.workspace
        elif request.workspace:
            workspace = await self._workspace(identity, request.workspace, context, creating=False)
        try:
            disks = await self._records.list(workspace, request.pool_name or None)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        seen = [d for d in disks if identity.sees(d.workspace)]
        views = await self._records.views(seen)
        return disks_pb2.ListDisksResponse(disks=[disk_message(v) for v in views])

    async def DeleteDisk(
        self, request: disks_pb2.DeleteDiskRequest, context: Context
    ) -> disks_pb2.DeleteDiskResponse:
        identity = await identify(self._authority, context)
        disk = await self._own(identity, request, context)
        try:
            users = await self._records.users(disk)
        except NoQueryAnswer as exc:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"pool {disk.pool_name}'s placement did not answer ({exc}), so whether a task"
                f" uses disk {disk.name} is not known: try again once the controlplane runs",
            )
        if users:
            named = ", ".join(users[:MAX_USERS_SHOWN])
            more = (
                f" and {len(users) - MAX_USERS_SHOWN} more" if len(users) > MAX_USERS_SHOWN else ""
            )
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"disk {disk.name} is in use by task {named}{more}: delete it once they end"
                " (levers9 task cancel ID stops one)",
            )
        deleted = await self._records.delete(disk.workspace, disk.name)
        if deleted is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, _missing(request.name))
        assert deleted is not None
        ended = await self._records.ended(deleted, DELETE_WAIT_S)
        if ended is None:
            file = (
                f"its file {disk.disk_id}.ext4 is being removed from node {disk.node_name}"
                f" (not within {DELETE_WAIT_S:g} s)"
            )
        else:
            deleted, file = ended, ended.file
        log.info(
            "disk deleted",
            disk=disk.name,
            workspace=disk.workspace,
            node_name=disk.node_name,
            file_removed=deleted.file_removed,
        )
        view = await self._records.view(deleted)
        return disks_pb2.DeleteDiskResponse(
            disk=disk_message(view), file_removed=deleted.file_removed, file=file
        )
