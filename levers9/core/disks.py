"""Durable disks: a size-limited filesystem under one machine's `durableDisksPath` (an ext4
image the agent makes on first use and loop-mounts), owned by a workspace, and the record
DiskWorkflow keeps of it (`disk:<workspace>:<name>`). Pure: names, sizes, the record, which
machine a new disk goes to, and what a disk's state is.

A disk lives on one node: the tasks that mount it are placed on that node's worker only (the
pool's `PlaceRequest.node`), and wait for it while it is busy. If the node leaves the pool (no
machine record for it), the disk is `lost`, as a local SSD is, and a task that mounts it fails
with that reason instead of waiting.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime

from pydantic import BaseModel, Field

from levers9.core.quantity import binary_text, whole
from levers9.core.workspaces import name_problem

DISK_WORKFLOW = "DiskWorkflow"
MIN_DISK_BYTES = 16 * 2**20
"""16Mi: below this ext4 keeps little room for files after its own metadata."""
MAX_DISK_BYTES = 64 * 2**40
"""64Ti: more than any node's local disk today; a typo (50Pi) is refused, not tried."""
MAX_DISK_NAME_CHARS = 40
DISK_ID = re.compile(r"[a-z0-9][a-z0-9.-]{0,126}")
"""A disk's file name under `durableDisksPath` (without `.ext4`): no `/`, no `..`."""

READY = "ready"
LOST = "lost"
"""Its node is no machine of its pool any more: the data went with it."""
DELETING = "deleting"


def disk_workflow_id(workspace: str, name: str) -> str:
    return f"disk:{workspace}:{name}"


def disk_id(workspace: str, name: str, unique: str) -> str:
    """The disk's stable name on its node (`<workspace>.<name>.<unique>`): the image file
    `<durableDisksPath>/<disk id>.ext4`. `unique` (hex) keeps a disk deleted and created again
    under the same name from ever finding the first one's file."""
    return f"{workspace}.{name}.{unique}"


def disk_record_id(disk_id: str) -> str | None:
    """The id of the record of the disk whose id this is (`disk_id`'s own form), or None for an
    id of another form."""
    parts = disk_id.split(".")
    if len(parts) != 3 or not all(parts):
        return None
    return disk_workflow_id(parts[0], parts[1])


def disk_name_problem(name: str) -> str | None:
    """Why `name` cannot name a disk (None: it can): a DNS label, as a workspace's."""
    problem = name_problem(name)
    if problem is None:
        return None
    return problem.replace("a workspace is named", "a disk is named").replace("team-a", "scratch")


def parse_disk_size(text: str) -> int:
    """`--size 50Gi` as bytes (a Kubernetes quantity, as `--memory`); ValueError naming the
    bounds or the form."""
    try:
        size = whole(text)
    except ValueError as exc:
        raise ValueError(f"--size: {exc}") from None
    return disk_size(size, f"--size {text}")


def disk_size(size: int, given: str = "size_bytes") -> int:
    """`size` when a disk may have it; ValueError naming the bounds."""
    if size < MIN_DISK_BYTES:
        raise ValueError(
            f"{given}: {binary_text(max(size, 0))} is below the {binary_text(MIN_DISK_BYTES)}"
            " a disk needs (a bare number is bytes): write a unit, e.g. 64Mi or 50Gi"
        )
    if size > MAX_DISK_BYTES:
        raise ValueError(
            f"{given}: {binary_text(size)} is above {binary_text(MAX_DISK_BYTES)}, more than a"
            " node's local disk holds"
        )
    return size


class DiskState(BaseModel):
    """A disk's record (its workflow's memo `record`)."""

    name: str
    workspace: str
    pool_name: str
    node_name: str
    """The node whose `durableDisksPath` holds it; its tasks run there only."""
    disk_id: str
    size_bytes: int
    created_at: datetime
    chosen: str = ""
    """Why it went to this node (`disk create` says so)."""
    used_bytes: int | None = None
    """What the agent last reported in use (None: never reported)."""
    deleting: bool = False
    file: str = ""
    """Once deleted: what became of its file on the node (removed, or why it stays)."""
    file_removed: bool = False


class DiskInput(BaseModel):
    """DiskWorkflow's argument: the disk's record, carried across continue-as-new."""

    state: DiskState
    max_history_events: int = Field(default=1_000, ge=20)


class DiskFile(BaseModel):
    """A disk's file on its node: which worker of the node to ask about it (its route, as the
    pool's placement holds it) and the file's id."""

    pool_name: str
    node_name: str
    disk_id: str
    worker_id: str = ""
    address: str = ""
    task_queue: str | None = None
    """A tunnelled worker's: the replica queue whose process holds its session."""
    tls: bool = False


class DiskView(BaseModel):
    """A disk as `disk list` and `disk get` show it: its record and its state now."""

    disk: DiskState
    state: str
    """ready, lost (its node left the pool), deleting"""
    reason: str = ""


class MachineRoom(BaseModel):
    """One machine of the pool as a new disk's placement reads it."""

    node_name: str
    ready: bool
    disk_bytes: int = 0
    """What the pool's disks already take on its node."""


def choose_machine(machines: Iterable[MachineRoom]) -> tuple[str, str] | None:
    """The node a new disk goes to and why (None: the pool has no Ready machine): the Ready
    machine whose node holds the fewest bytes of disks already, the first by name among equals
    (the machine records say nothing of a node's free disk, so the disks are spread)."""
    ready = sorted((m for m in machines if m.ready), key=lambda m: (m.disk_bytes, m.node_name))
    if not ready:
        return None
    best = ready[0]
    if len(ready) == 1:
        return best.node_name, "the pool's only Ready machine"
    if all(m.disk_bytes == best.disk_bytes for m in ready):
        return best.node_name, f"the first of {len(ready)} Ready machines (none holds more disks)"
    return best.node_name, (
        f"the Ready machine whose node holds the fewest disks"
        f" ({binary_text(best.disk_bytes) if best.disk_bytes else 'none'})"
    )


def disk_view(disk: DiskState, machines: Iterable[str] | None) -> DiskView:
    """The disk's state, given the nodes that are machines of its pool now (None: unknown,
    taken as there)."""
    if disk.deleting:
        return DiskView(disk=disk, state=DELETING)
    if machines is not None and disk.node_name not in set(machines):
        return DiskView(disk=disk, state=LOST, reason=lost_reason(disk))
    return DiskView(disk=disk, state=READY)


def lost_reason(disk: DiskState) -> str:
    return (
        f"disk {disk.name} is lost: its node {disk.node_name} is no longer a machine of pool"
        f" {disk.pool_name} (a disk lives on its node's own disk, as a local SSD)"
    )


def pinned_reason(pinned_by: str, node_name: str) -> str:
    """Why a task waits in its pool's queue for the one node its disk is on."""
    return f"waiting for {pinned_by}'s machine {node_name}"
