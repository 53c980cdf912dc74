"""A durable disk on the wire (levers9/proto/disks.proto's Disk), as the gateway sends it and
the CLI reads it: DiskView's record and state, field by field."""

from __future__ import annotations

from datetime import UTC, datetime

from levers9.core.disks import DiskState, DiskView
from levers9.proto import disks_pb2


def disk_message(view: DiskView) -> disks_pb2.Disk:
    disk = view.disk
    message = disks_pb2.Disk(
        name=disk.name,
        workspace=disk.workspace,
        pool_name=disk.pool_name,
        node_name=disk.node_name,
        disk_id=disk.disk_id,
        size_bytes=disk.size_bytes,
        chosen=disk.chosen,
        used_bytes=disk.used_bytes or 0,
        has_used=disk.used_bytes is not None,
        state=view.state,
        reason=view.reason,
    )
    message.created_at.FromDatetime(disk.created_at)
    return message


def disk_from_message(message: disks_pb2.Disk) -> DiskView:
    created = message.created_at.ToDatetime(tzinfo=UTC) if message.HasField("created_at") else None
    return DiskView(
        disk=DiskState(
            name=message.name,
            workspace=message.workspace,
            pool_name=message.pool_name,
            node_name=message.node_name,
            disk_id=message.disk_id,
            size_bytes=message.size_bytes,
            created_at=created or datetime.fromtimestamp(0, UTC),
            chosen=message.chosen,
            used_bytes=message.used_bytes if message.has_used else None,
            deleting=message.state == "deleting",
        ),
        state=message.state,
        reason=message.reason,
    )
