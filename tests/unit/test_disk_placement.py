"""Placement of a task that mounts a durable disk: it goes to a worker of its disk's node only,
waits while that worker is busy (or the node has none) with the reason naming the disk and the
machine, is placed there once cards free, never borrows another node's free worker, and reserves
only on its node; the pool says which tasks use a disk. And where `disk create` puts a disk:
the Ready machine whose node holds the fewest disks, saying why. And its opposite: a task that
may not run on one node (`box start --elsewhere`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from levers9.core.disks import (
    LOST,
    READY,
    DiskState,
    MachineRoom,
    choose_machine,
    disk_view,
    parse_disk_size,
)
from levers9.core.placement import PoolState, Slot

T0 = datetime(2026, 9, 18, 10, 0, tzinfo=UTC)
RESERVE = timedelta(seconds=30)


def _pool(**workers: tuple[int, ...]) -> PoolState:
    state = PoolState()
    for worker_id, devices in workers.items():
        state.add_worker(
            Slot(worker_id=worker_id, node_name=f"n-{worker_id}", address="x:1", devices=devices)
        )
    return state


def _pinned(state: PoolState, task_id: str, gpus: int, node: str, at: datetime = T0) -> None:
    state.request(task_id, gpus, at, node=node, pinned_by="disk data", disk_ids=("ws.data.1",))


def test_a_task_with_a_disk_goes_only_to_its_node() -> None:
    state = _pool(a=(0, 1), b=(0, 1, 2, 3))
    _pinned(state, "t1", 1, "n-b")
    [placed] = state.assign(T0, RESERVE)
    # The tightest fit would be worker a (2 cards); the disk is on b's node.
    assert (placed.worker_id, placed.node_name, placed.disk_ids) == ("b", "n-b", ("ws.data.1",))


def test_it_waits_while_its_node_is_busy_with_the_reason_and_runs_when_it_frees() -> None:
    state = _pool(a=(0, 1), b=(0,))
    state.request("holder", 1, T0, node="n-b")
    [held] = state.assign(T0, RESERVE)
    assert held.worker_id == "b"
    _pinned(state, "t2", 1, "n-b", T0 + timedelta(seconds=1))
    assert state.assign(T0 + timedelta(seconds=2), RESERVE) == []
    spot = state.spot("t2")
    assert spot is not None
    assert spot.reason == "waiting for disk data's machine n-b"
    assert state.most_free() == 2  # worker a is free, and not taken
    assert state.disk_users("ws.data.1") == ["t2"]
    state.release("holder")
    [placed] = state.assign(T0 + timedelta(seconds=3), RESERVE)
    assert (placed.task_id, placed.worker_id) == ("t2", "b")
    assert state.disk_users("ws.data.1") == ["t2"]
    state.release("t2")
    assert state.disk_users("ws.data.1") == []


def test_it_waits_for_a_node_with_no_worker_and_runs_once_one_comes() -> None:
    state = _pool(a=(0, 1))
    _pinned(state, "t1", 1, "n-gone")
    assert state.assign(T0, RESERVE) == []
    spot = state.spot("t1")
    assert spot is not None
    assert spot.reason == "waiting for disk data's machine n-gone"
    state.add_worker(Slot(worker_id="w", node_name="n-gone", address="y:1", devices=(0,)))
    [placed] = state.assign(T0, RESERVE)
    assert placed.worker_id == "w"


def test_an_unpinned_task_behind_it_still_takes_another_node() -> None:
    state = _pool(a=(0,), b=(0,))
    state.request("first", 1, T0, node="n-b")
    state.assign(T0, RESERVE)
    _pinned(state, "pinned", 1, "n-b", T0 + timedelta(seconds=1))
    state.request("free", 1, T0 + timedelta(seconds=2))
    [placed] = state.assign(T0 + timedelta(seconds=3), RESERVE)
    assert (placed.task_id, placed.worker_id) == ("free", "a")


def test_a_task_to_run_elsewhere_skips_that_node_and_waits_saying_so() -> None:
    """`box start --elsewhere`: its restore never goes to the node that took its checkpoint,
    even when that node is the tightest fit, and waits naming it while no other has room; its
    `avoid_node` is not in the state's JSON when unset (the pool's state is carried)."""
    state = _pool(a=(0,), b=(0, 1, 2, 3))
    state.request("t1", 1, T0, avoid_node="n-a")
    [placed] = state.assign(T0, RESERVE)
    assert placed.worker_id == "b"  # a (one card) would be the tightest fit
    state.request("t2", 4, T0, avoid_node="n-b")
    assert state.assign(T0, RESERVE) == []
    spot = state.spot("t2")
    assert spot is not None
    assert spot.reason == "waiting for a machine other than n-b"
    waiting = {w.task_id: w.model_dump() for w in state.waiting}
    assert waiting["t2"]["avoid_node"] == "n-b"
    state.request("t3", 1, T0)
    assert "avoid_node" not in {w.task_id: w.model_dump() for w in state.waiting}["t3"]


def test_a_long_waiting_pinned_task_reserves_only_on_its_node() -> None:
    state = _pool(a=(0, 1, 2, 3), b=(0, 1))
    state.request("small", 1, T0, node="n-b")
    state.assign(T0, RESERVE)
    _pinned(state, "big", 2, "n-b", T0)
    state.assign(T0 + RESERVE * 2, RESERVE)
    assert state.reservations == {"b": "big"}


def test_disk_create_takes_the_machine_holding_the_fewest_disks() -> None:
    rooms = [
        MachineRoom(node_name="n-1", ready=True, disk_bytes=2**30),
        MachineRoom(node_name="n-2", ready=True, disk_bytes=0),
        MachineRoom(node_name="n-0", ready=False, disk_bytes=0),
    ]
    assert choose_machine(rooms) == (
        "n-2",
        "the Ready machine whose node holds the fewest disks (none)",
    )
    even = [MachineRoom(node_name=n, ready=True) for n in ("n-b", "n-a")]
    assert choose_machine(even) == (
        "n-a",
        "the first of 2 Ready machines (none holds more disks)",
    )
    assert choose_machine([MachineRoom(node_name="n-0", ready=False)]) is None


def test_a_disk_whose_node_left_the_pool_is_lost() -> None:
    disk = DiskState(
        name="data",
        workspace="team-a",
        pool_name="p",
        node_name="n-1",
        disk_id="team-a.data.1",
        size_bytes=2**26,
        created_at=T0,
    )
    assert disk_view(disk, {"n-1", "n-2"}).state == READY
    lost = disk_view(disk, {"n-2"})
    assert lost.state == LOST
    assert lost.reason.startswith(
        "disk data is lost: its node n-1 is no longer a machine of pool p"
    )


@pytest.mark.parametrize(
    ("given", "problem"),
    [
        ("1Mi", "--size 1Mi: 1Mi is below the 16Mi a disk needs"),
        ("100Pi", "--size 100Pi: 100Pi is above 64Ti"),
        ("fifty", "--size: 'fifty' is not a Kubernetes quantity"),
    ],
)
def test_a_disk_size_out_of_bounds_is_refused_naming_them(given: str, problem: str) -> None:
    with pytest.raises(ValueError, match="^" + problem.replace("(", r"\(")):
        parse_disk_size(given)
    assert parse_disk_size("64Mi") == 64 * 2**20


def test_a_disk_is_held_by_one_task_at_a_time_even_with_cards_free() -> None:
    state = _pool(a=(0, 1, 2, 3))
    _pinned(state, "first", 1, "n-a")
    [placed] = state.assign(T0, RESERVE)
    assert placed.task_id == "first"
    _pinned(state, "second", 1, "n-a", T0 + timedelta(seconds=1))
    state.request("other", 1, T0 + timedelta(seconds=2), node="n-a", disk_ids=("ws.other.1",))
    # Three cards are free on the disk's worker: a task of another disk takes one; the
    # second task of this disk waits for the first to let it go.
    assert [p.task_id for p in state.assign(T0 + RESERVE * 2, RESERVE)] == ["other"]
    spot = state.spot("second")
    assert spot is not None
    assert spot.reason == "waiting for disk data: task first uses it"
    assert state.reservations == {}
    state.release("first")
    [then] = state.assign(T0 + RESERVE * 3, RESERVE)
    assert (then.task_id, then.worker_id) == ("second", "a")
