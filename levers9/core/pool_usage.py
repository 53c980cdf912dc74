"""What each workspace holds of one pool and how much of it waits, from PoolWorkflow's state
(pure): `levers9 pool get` shows it, `levers9 workspace get` shows its own per pool.

A workspace has a row when it holds cards, has tasks waiting, or the pool knows its quota or
weight (one of its tasks asked since the pool's last continue-as-new).
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel

from levers9.core.placement import PoolState, Share


class WorkspaceUsage(BaseModel):
    """One workspace in one pool."""

    workspace: str
    gpus: int = 0
    """Cards its placed work holds now, borrowed ones included."""
    borrowed_gpus: int = 0
    """Of those, cards held past its quota (`--borrow`): the first taken back."""
    placed: int = 0
    """Its tasks placed on a worker."""
    waiting: int = 0
    """Its tasks waiting for cards (or for its quota)."""
    gpu_quota: int | None = None
    """None: no quota."""
    weight: float = 1.0


class PoolUsage(BaseModel):
    """The pool's cards and queue, and each workspace's part of them."""

    workers: int = 0
    gpus: int = 0
    free_gpus: int = 0
    placed: int = 0
    waiting: int = 0
    workspaces: list[WorkspaceUsage]


def pool_usage(state: PoolState) -> PoolUsage:
    """The pool's usage, one row per workspace sorted by name."""
    rows: dict[str, WorkspaceUsage] = {}

    def row(workspace: str) -> WorkspaceUsage:
        if workspace not in rows:
            share = state.shares.get(workspace, Share())
            rows[workspace] = WorkspaceUsage(
                workspace=workspace, gpu_quota=share.quota, weight=share.weight
            )
        return rows[workspace]

    for workspace in state.shares:
        row(workspace)
    for placement in state.placed.values():
        held = row(placement.workspace)
        held.gpus += len(placement.gpu_indices)
        held.placed += 1
        if placement.borrowed:
            held.borrowed_gpus += len(placement.gpu_indices)
    waiting: dict[str, int] = defaultdict(int)
    for task in state.waiting:
        waiting[task.workspace] += 1
    for workspace, count in waiting.items():
        row(workspace).waiting = count
    return PoolUsage(
        workers=len(state.slots),
        gpus=sum(len(slot.devices) for slot in state.slots.values()),
        free_gpus=sum(len(slot.free()) for slot in state.slots.values() if not slot.silent),
        placed=len(state.placed),
        waiting=len(state.waiting),
        workspaces=[rows[name] for name in sorted(rows)],
    )


def only_workspace(usage: PoolUsage, workspace: str) -> PoolUsage:
    """The usage as one workspace may see it: its own row, no other workspace's name."""
    own = [row for row in usage.workspaces if row.workspace == workspace]
    return usage.model_copy(update={"workspaces": own})
