"""Workspaces' quotas and fair share in placement (levers9.core.placement): no workspace holds
more cards than its quota unless it borrows; freed cards go to the waiting workspace that holds
the fewest for its weight, first in first out within one; borrowed work is taken back, newest
first, when a workspace within its quota waits.
"""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from levers9.core.placement import QUOTA, PoolState, Slot

T0 = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
RESERVE = timedelta(seconds=30)


def _pool(*workers: tuple[str, int]) -> PoolState:
    state = PoolState()
    for worker_id, cards in workers:
        state.add_worker(
            Slot(
                worker_id=worker_id,
                node_name=f"n-{worker_id}",
                address="127.0.20.1:1",
                devices=tuple(range(cards)),
            )
        )
    return state


def _held(state: PoolState) -> dict[str, int]:
    return dict(state.held())


def test_quotas_hold_at_every_step_and_the_shares_follow_the_quotas() -> None:
    """The issue's case: quotas 1 and 3 on a 4-card pool, eight one-card tasks each, ended in a
    random order; at every step neither workspace holds past its quota, no card stays free while
    a task within its quota waits, and each workspace's tasks start in their own order."""
    state = _pool(("w1", 2), ("w2", 2))
    state.set_share("small", quota=1)
    state.set_share("large", quota=3)
    for i in range(8):
        state.request(f"s{i}", 1, T0 + timedelta(seconds=i), workspace="small")
        state.request(f"l{i}", 1, T0 + timedelta(seconds=i), workspace="large")
    order: list[str] = []
    rng = random.Random(7)
    steps = 0
    while state.waiting or state.placed:
        order += [p.task_id for p in state.assign(T0, RESERVE)]
        held = _held(state)
        assert held.get("small", 0) <= 1, held
        assert held.get("large", 0) <= 3, held
        if state.waiting:
            # Work conserving within the quotas: with both queues non-empty, all 4 cards held.
            waiting = {w.workspace for w in state.waiting}
            if waiting == {"small", "large"}:
                assert held == {"small": 1, "large": 3}
        state.release(rng.choice(sorted(state.placed)))
        steps += 1
    assert steps == 16
    assert [t for t in order if t.startswith("s")] == [f"s{i}" for i in range(8)]
    assert [t for t in order if t.startswith("l")] == [f"l{i}" for i in range(8)]


def test_a_task_over_quota_says_quota_in_its_queue_spot() -> None:
    state = _pool(("w1", 4))
    state.set_share("team", quota=1)
    state.request("a", 1, T0, workspace="team")
    state.request("b", 1, T0 + timedelta(seconds=1), workspace="team")
    [placed] = state.assign(T0, RESERVE)
    assert placed.task_id == "a"
    spot = state.spot("b")
    assert spot is not None
    assert (spot.reason, spot.workspace) == (QUOTA, "team")
    assert spot.most_free == 3  # cards are free: it is the quota that holds it
    state.release("a")
    [placed] = state.assign(T0, RESERVE)
    assert placed.task_id == "b"


def test_freed_cards_go_to_the_workspace_with_the_smallest_share_for_its_weight() -> None:
    """Two workspaces without quotas, one with weight 3: once both queues are long, the
    heavier one holds three cards for each of the other's."""
    state = _pool(("w1", 8))
    state.set_share("a", quota=None, weight=1)
    state.set_share("b", quota=None, weight=3)
    for i in range(20):
        # `a` asked first every time: arrival order alone would give it everything.
        state.request(f"a{i}", 1, T0 + timedelta(seconds=2 * i), workspace="a")
        state.request(f"b{i}", 1, T0 + timedelta(seconds=2 * i + 1), workspace="b")
    state.assign(T0, RESERVE)
    assert _held(state) == {"a": 2, "b": 6}


def test_one_workspace_keeps_arrival_order_and_backfills() -> None:
    """Within a workspace the queue is first in, first out, and a task that does not fit does
    not hold back a smaller one behind it (as before workspaces)."""
    state = _pool(("w1", 2))
    state.request("big", 4, T0, workspace="t")
    state.request("one", 1, T0 + timedelta(seconds=1), workspace="t")
    state.request("two", 1, T0 + timedelta(seconds=2), workspace="t")
    assert [p.task_id for p in state.assign(T0, RESERVE)] == ["one", "two"]
    assert [w.task_id for w in state.waiting] == ["big"]


def test_borrowing_runs_past_the_quota_only_on_cards_nobody_within_quota_waits_for() -> None:
    state = _pool(("w1", 4))
    state.set_share("lender", quota=3)
    state.set_share("borrower", quota=1)
    state.request("own", 1, T0, workspace="borrower")
    for i in range(3):
        state.request(f"b{i}", 1, T0 + timedelta(seconds=1 + i), workspace="borrower", borrow=True)
    state.request("plain", 1, T0 + timedelta(seconds=9), workspace="borrower")
    made = state.assign(T0, RESERVE)
    assert [p.task_id for p in made] == ["own", "b0", "b1", "b2"]
    assert [p.borrowed for p in made] == [False, True, True, True]
    assert _held(state) == {"borrower": 4}
    assert [w.task_id for w in state.waiting] == ["plain"]  # never borrows
    assert state.reclaim() == []  # nobody within quota waits


def test_reclaim_takes_back_the_newest_borrowed_work_for_a_workspace_within_quota() -> None:
    """A workspace borrows all four cards; another submits within its quota: the newest
    borrowed tasks are reclaimed, the owner placed on the cards they free, and the borrower's
    work placed again (borrowing once more) when cards free up."""
    state = _pool(("w1", 4))
    state.set_share("lender", quota=3)
    state.set_share("borrower", quota=1)
    for i in range(4):
        state.request(f"b{i}", 1, T0 + timedelta(seconds=i), workspace="borrower", borrow=True)
    assert len(state.assign(T0, RESERVE)) == 4
    state.request("owner", 2, T0 + timedelta(seconds=10), workspace="lender")
    assert state.assign(T0, RESERVE) == []
    taken = [placement for placement, _ in state.reclaim()]
    assert [p.task_id for p in taken] == ["b3", "b2"]
    assert state.reclaim() == []  # being taken back: asked once
    for placement in taken:  # the pool workflow cancels or requeues them
        state.release(placement.task_id)
        state.request(
            placement.task_id, 1, placement.since or T0, workspace="borrower", borrow=True
        )
    [placed] = state.assign(T0, RESERVE)
    assert (placed.task_id, placed.workspace, placed.borrowed) == ("owner", "lender", False)
    assert state.reclaim() == []
    state.release("owner")
    again = state.assign(T0, RESERVE)
    assert sorted(p.task_id for p in again) == ["b2", "b3"]
    assert all(p.borrowed for p in again)
