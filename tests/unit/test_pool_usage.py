"""Each workspace's part of a pool from PoolWorkflow's state (levers9.core.pool_usage, pure): the
cards its placed work holds (borrowed ones counted apart), its tasks placed and waiting, its
quota and weight as the pool knows them; a silent worker's free cards are not free; one
workspace's view holds its own row only."""

from __future__ import annotations

from datetime import UTC, datetime

from levers9.core.placement import Placement, PoolState, Share, Slot, Waiting
from levers9.core.pool_usage import WorkspaceUsage, only_workspace, pool_usage

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _placed(
    task_id: str, workspace: str, cards: tuple[int, ...], *, borrowed: bool = False
) -> Placement:
    return Placement(
        task_id=task_id,
        worker_id="w-1",
        node_name="n-1",
        address="192.0.2.1:7000",
        gpu_indices=cards,
        workspace=workspace,
        borrowed=borrowed,
    )


def _state() -> PoolState:
    return PoolState(
        slots={
            "w-1": Slot(
                worker_id="w-1",
                node_name="n-1",
                address="192.0.2.1:7000",
                devices=(0, 1, 2, 3),
                busy={"a1": (0,), "b1": (1, 2)},
            ),
            "w-2": Slot(
                worker_id="w-2",
                node_name="n-2",
                address="192.0.2.2:7000",
                devices=(0,),
                silent=True,
            ),
        },
        placed={
            "a1": _placed("a1", "team-a", (0,)),
            "b1": _placed("b1", "team-b", (1, 2), borrowed=True),
        },
        waiting=[
            Waiting(task_id="a2", gpus=2, since=NOW, workspace="team-a"),
            Waiting(task_id="c1", gpus=1, since=NOW, workspace="team-c"),
        ],
        shares={"team-a": Share(quota=1), "team-d": Share(quota=4, weight=3.0)},
    )


def test_each_workspace_holds_waits_and_has_its_quota_and_weight() -> None:
    usage = pool_usage(_state())
    assert (usage.workers, usage.gpus, usage.free_gpus, usage.placed, usage.waiting) == (
        2,
        5,
        1,  # card 3 of w-1; w-2 is silent, its card not free
        2,
        2,
    )
    assert usage.workspaces == [
        WorkspaceUsage(workspace="team-a", gpus=1, placed=1, waiting=1, gpu_quota=1),
        WorkspaceUsage(workspace="team-b", gpus=2, borrowed_gpus=2, placed=1),
        WorkspaceUsage(workspace="team-c", waiting=1),
        WorkspaceUsage(workspace="team-d", gpu_quota=4, weight=3.0),
    ]


def test_a_workspace_sees_its_own_row_and_the_pools_totals_only() -> None:
    usage = pool_usage(_state())
    own = only_workspace(usage, "team-b")
    assert [row.workspace for row in own.workspaces] == ["team-b"]
    assert (own.gpus, own.waiting) == (usage.gpus, usage.waiting)
    assert only_workspace(usage, "team-z").workspaces == []


def test_an_empty_pool_has_no_rows() -> None:
    assert pool_usage(PoolState()).workspaces == []
