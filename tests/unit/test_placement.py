"""Placement: a task takes cards of one worker at once, the tightest fit, in arrival order; a
multi-card task waits for one worker with that many free; past the reservation threshold it
reserves a worker and small tasks stop taking cards there, so it is not starved.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from levers9.core.placement import PoolState, QueueSpot, Slot

T0 = datetime(2026, 9, 18, 10, 0, tzinfo=UTC)
RESERVE = timedelta(seconds=30)


def _pool(**workers: tuple[int, ...]) -> PoolState:
    state = PoolState()
    for worker_id, devices in workers.items():
        state.add_worker(
            Slot(
                worker_id=worker_id,
                node_name=f"n-{worker_id}",
                address="127.0.20.1:1",
                devices=devices,
            )
        )
    return state


def test_tightest_fit_and_lowest_cards() -> None:
    state = _pool(big=(0, 1, 2, 3), small=(0,))
    state.request("t1", 1, T0)
    [placed] = state.assign(T0, RESERVE)
    assert (placed.worker_id, placed.gpu_indices) == ("small", (0,))
    state.request("t2", 2, T0)
    [placed] = state.assign(T0, RESERVE)
    assert (placed.worker_id, placed.gpu_indices) == ("big", (0, 1))


def test_multi_card_task_needs_one_worker_with_that_many() -> None:
    state = _pool(a=(0, 1), b=(0, 1))
    state.request("four", 4, T0)
    assert state.assign(T0, RESERVE) == []
    assert [w.task_id for w in state.waiting] == ["four"]
    state.add_worker(Slot(worker_id="c", node_name="n-c", address="x:1", devices=(0, 1, 2, 3)))
    [placed] = state.assign(T0, RESERVE)
    assert (placed.worker_id, placed.gpu_indices) == ("c", (0, 1, 2, 3))


def test_release_frees_cards() -> None:
    state = _pool(a=(0, 1))
    state.request("t1", 2, T0)
    state.assign(T0, RESERVE)
    state.request("t2", 1, T0)
    assert state.assign(T0, RESERVE) == []
    state.release("t1")
    [placed] = state.assign(T0, RESERVE)
    assert placed.task_id == "t2"


def test_big_task_not_starved_by_a_stream_of_small_ones() -> None:
    state = _pool(w=(0, 1, 2, 3))
    state.request("small-0", 1, T0)
    state.assign(T0, RESERVE)
    state.request("big", 4, T0)
    now = T0
    for i in range(1, 20):  # a small task every 10 s, each done 10 s later
        now += timedelta(seconds=10)
        state.release(f"small-{i - 1}")
        state.request(f"small-{i}", 1, now)
        placed = {p.task_id for p in state.assign(now, RESERVE)}
        if "big" in placed:
            break
    assert "big" in state.placed, "the big task got the worker"
    assert now - T0 <= RESERVE + timedelta(seconds=20)
    assert state.placed["big"].gpu_indices == (0, 1, 2, 3)


def test_without_reservation_small_tasks_would_keep_the_cards() -> None:
    state = _pool(w=(0, 1, 2, 3))
    state.request("small-0", 1, T0)
    state.assign(T0, RESERVE)
    state.request("big", 4, T0)
    state.request("small-1", 1, T0)
    [placed] = state.assign(T0, RESERVE)  # before the threshold, small tasks still fit
    assert placed.task_id == "small-1"


def test_gone_worker_reports_its_tasks() -> None:
    state = _pool(a=(0,), b=(0,))
    state.request("t1", 1, T0)
    [placed] = state.assign(T0, RESERVE)
    assert state.remove_worker(placed.worker_id) == ["t1"]
    assert placed.worker_id not in state.slots


def test_cpu_task_needs_no_card() -> None:
    state = _pool(a=(0,))
    state.request("t1", 1, T0)
    state.request("cpu", 0, T0)
    placed = state.assign(T0, RESERVE)
    assert [(p.task_id, p.gpu_indices) for p in placed] == [("t1", (0,)), ("cpu", ())]


def test_part_of_a_node_is_reserved_so_it_drains_for_a_whole_node_worker() -> None:
    state = PoolState()
    state.add_worker(
        Slot(worker_id="w", node_name="n4", address="x:1", devices=(2, 3), node_gpus=4)
    )
    state.request("big", 4, T0)
    state.assign(T0, RESERVE)
    later = T0 + RESERVE
    state.request("small", 1, later)
    assert state.assign(later, RESERVE) == [], "the big task reserved the worker"
    assert state.reservations == {"w": "big"}
    state.remove_worker("w")  # drained, wound down
    state.add_worker(
        Slot(worker_id="w2", node_name="n4", address="x:2", devices=(0, 1, 2, 3), node_gpus=4)
    )
    placed = state.assign(later, RESERVE)
    assert placed[0].task_id == "big"


def test_tasks_publishing_a_port_go_to_workers_where_it_is_free() -> None:
    """Containers share their worker's network: two tasks publishing 8080 never share one."""
    state = PoolState()
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for worker in ("w1", "w2"):
        state.add_worker(
            Slot(worker_id=worker, node_name=worker, address="a", devices=(0, 1, 2, 3))
        )
    for index, ports in enumerate([(8080,), (8080,), (8080,), (9000,)]):
        state.request(f"t{index}", 1, now + timedelta(seconds=index), ports=ports)
    placed = {p.task_id: p.worker_id for p in state.assign(now, timedelta(hours=1))}
    assert set(placed) == {"t0", "t1", "t3"}, "the third 8080 waits for a worker to free it"
    assert placed["t0"] != placed["t1"]
    assert [w.task_id for w in state.waiting] == ["t2"]
    state.release("t0")
    assert [p.task_id for p in state.assign(now, timedelta(hours=1))] == ["t2"]


def test_a_silent_worker_takes_nothing_until_heard_again_and_keeps_its_ledger() -> None:
    state = _pool(quiet=(0, 1), other=(0,))
    state.request("t1", 2, T0)
    [held] = state.assign(T0, RESERVE)
    assert held.worker_id == "quiet"
    state.release("t1")
    state.request("t1", 1, T0)
    state.assign(T0, RESERVE)  # the tightest fit: `other`
    state.request("t2", 1, T0)
    [on_quiet] = state.assign(T0, RESERVE)
    assert (on_quiet.worker_id, on_quiet.gpu_indices) == ("quiet", (0,))
    state.silence("quiet")
    state.request("t3", 1, T0)
    assert state.assign(T0, RESERVE) == [], "its free card is not offered while it is silent"
    assert state.most_free() == 0
    state.add_worker(Slot(worker_id="quiet", node_name="n-quiet", address="a:1", devices=(0, 1)))
    [placed] = state.assign(T0, RESERVE)
    assert (placed.task_id, placed.worker_id, placed.gpu_indices) == ("t3", "quiet", (1,))


def test_a_silent_worker_gives_up_its_reservation() -> None:
    state = _pool(a=(0, 1), b=(0, 1))
    state.request("pair", 2, T0)
    state.request("one", 1, T0)
    state.assign(T0, RESERVE)  # a full, b with a card free
    state.request("big", 2, T0)
    state.assign(T0 + RESERVE, RESERVE)
    assert state.reservations == {"b": "big"}
    state.silence("b")
    state.assign(T0 + RESERVE, RESERVE)
    assert state.reservations == {"a": "big"}


def test_a_draining_worker_takes_nothing_again_and_names_what_runs_on_it() -> None:
    state = _pool(going=(0, 1), other=(0,))
    state.request("t1", 2, T0)
    state.request("t2", 1, T0)
    placed = state.assign(T0, RESERVE)
    assert {(p.task_id, p.worker_id) for p in placed} == {("t1", "going"), ("t2", "other")}
    assert [p.task_id for p in state.drain("going")] == ["t1"]
    state.release("t1")
    state.request("t3", 1, T0)
    assert state.assign(T0, RESERVE) == [], "its freed cards are not offered while it drains"
    # Announced again (a tunnel moved, or heard after a silence): still draining.
    state.add_worker(Slot(worker_id="going", node_name="n-going", address="a:1", devices=(0, 1)))
    assert state.assign(T0, RESERVE) == []
    assert state.drain("going") == []
    assert state.drain("unknown") == []


def test_a_draining_worker_gives_up_its_reservation() -> None:
    state = _pool(a=(0, 1), b=(0, 1))
    state.request("pair", 2, T0)
    state.request("one", 1, T0)
    state.assign(T0, RESERVE)  # a full, b with a card free
    state.request("big", 2, T0)
    state.assign(T0 + RESERVE, RESERVE)
    assert state.reservations == {"b": "big"}
    state.drain("b")
    state.assign(T0 + RESERVE, RESERVE)
    assert state.reservations == {"a": "big"}


# The edges below were found by the mutation check (benchmarks/mutation.py).


def test_spot_says_where_a_task_waits() -> None:
    empty = PoolState()
    empty.request("alone", 1, T0)
    assert empty.spot("alone") == QueueSpot(position=1, waiting=1, gpus=1, most_free=0, workers=0)
    state = _pool(a=(0, 1), b=(0,))
    for task_id, gpus in (("first", 2), ("second", 2), ("third", 2)):
        state.request(task_id, gpus, T0)
    [placed] = state.assign(T0, RESERVE)
    assert placed.task_id == "first"
    assert state.spot("third") == QueueSpot(position=2, waiting=2, gpus=2, most_free=1, workers=2)
    assert state.spot("first") is None, "placed: it waits no more"
    assert state.spot("unknown") is None


def test_a_request_is_queued_once_in_the_order_of_its_creation() -> None:
    state = _pool(a=(0,))
    state.request("later", 1, T0 + timedelta(seconds=2))
    state.request("earlier", 1, T0, notify=True)
    state.request("between", 1, T0 + timedelta(seconds=1))
    state.request("same-time", 1, T0 + timedelta(seconds=2))
    state.request("earlier", 1, T0 + timedelta(seconds=5), notify=True)
    assert [w.task_id for w in state.waiting] == ["earlier", "between", "later", "same-time"]
    assert state.notify == ["earlier"], "told by signal only when it asked so, and once"
    [placed] = state.assign(T0, RESERVE)
    state.request("earlier", 1, T0)
    assert placed.task_id == "earlier"
    assert [w.task_id for w in state.waiting] == ["between", "later", "same-time"]


def test_release_withdraws_a_waiting_task_and_its_reservation() -> None:
    state = _pool(a=(0, 1))
    state.request("holder", 1, T0)
    state.assign(T0, RESERVE)
    state.request("quiet", 2, T0)
    state.request("told", 1, T0, notify=True)
    state.request("other", 1, T0, notify=True)
    state.assign(T0 + RESERVE, RESERVE)
    assert state.reservations == {"a": "quiet"}
    state.release("quiet")
    assert state.reservations == {}
    state.release("told")
    state.release("never-asked")
    assert ([w.task_id for w in state.waiting], state.notify) == (["other"], ["other"])
    state.request("quiet", 2, T0 + RESERVE)
    assert [w.task_id for w in state.waiting] == ["other", "quiet"], "asked again: it waits"


def test_a_removed_worker_takes_its_reservation_and_an_unknown_one_is_no_error() -> None:
    state = _pool(a=(0,), b=(0, 1))
    state.request("held", 2, T0)
    state.assign(T0, RESERVE)
    state.request("big", 2, T0)
    state.assign(T0 + RESERVE, RESERVE)
    assert state.reservations == {"b": "big"}
    assert state.remove_worker("b") == ["held"]
    assert state.reservations == {}
    assert state.remove_worker("never-there") == []
    state.request("held", 2, T0 + RESERVE)
    assert [w.task_id for w in state.waiting] == ["big", "held"], "lost, asked again: it waits"


def test_a_placement_carries_the_workers_queue_and_tls() -> None:
    state = PoolState()
    state.add_worker(
        Slot(worker_id="w", node_name="n", address="a:1", devices=(0,), task_queue="q", tls=True)
    )
    state.request("t", 1, T0)
    [placed] = state.assign(T0, RESERVE)
    assert (placed.task_queue, placed.tls) == ("q", True)


def test_a_reserving_task_takes_its_worker_once_a_card_is_free() -> None:
    """Every worker reserved and its cards free: the task that reserved it is placed there (and
    its reservation ends), which the shortcut for "no card free" must not skip."""
    state = _pool(w=(0, 1))
    for task_id, gpus in (("x", 1), ("y", 1), ("r", 2)):
        state.request(task_id, gpus, T0)
    assert [p.task_id for p in state.assign(T0, RESERVE)] == ["x", "y"]
    state.assign(T0 + RESERVE, RESERVE)
    assert state.reservations == {"w": "r"}
    state.release("y")
    state.request("late", 1, T0 + RESERVE)
    assert state.assign(T0 + RESERVE, RESERVE) == [], "the free card is r's: late waits"
    state.release("x")
    [placed] = state.assign(T0 + RESERVE, RESERVE)
    assert (placed.task_id, placed.gpu_indices) == ("r", (0, 1))
    assert state.reservations == {}


def test_a_one_card_task_never_reserves_and_takes_the_next_card_in_its_turn() -> None:
    state = _pool(w=(0,))
    state.request("x", 1, T0)
    state.request("one", 1, T0 + timedelta(seconds=1))
    state.assign(T0, RESERVE)
    assert state.assign(T0 + 2 * RESERVE, RESERVE) == []
    assert state.reservations == {}
    state.release("x")
    [placed] = state.assign(T0 + 2 * RESERVE, RESERVE)
    assert placed.task_id == "one"


def test_with_every_worker_reserved_and_no_card_free_later_tasks_are_still_looked_at() -> None:
    """A CPU task that reserved a worker (a port there was taken) is placed once the port is
    free, though a GPU task before it in the queue waits for a card."""
    state = _pool(w1=(0,), w2=(0,))
    state.request("a", 1, T0)
    state.request("b", 1, T0)
    state.request("p1", 0, T0, ports=(80,))
    state.request("p2", 0, T0, ports=(80,))
    placed = {p.task_id: p.worker_id for p in state.assign(T0, RESERVE)}
    assert placed == {"a": "w1", "b": "w2", "p1": "w1", "p2": "w2"}
    state.request("gpu", 1, T0 + timedelta(seconds=1))
    state.request("cpu", 0, T0 + timedelta(seconds=2), ports=(80,))
    later = T0 + timedelta(seconds=2) + RESERVE
    assert state.assign(later, RESERVE) == []
    assert state.reservations == {"w2": "cpu"}, "the port task reserves; a one-card one never"
    state.release("p1")
    [placed_cpu] = state.assign(later, RESERVE)
    assert (placed_cpu.task_id, placed_cpu.worker_id) == ("cpu", "w1")
    assert [w.task_id for w in state.waiting] == ["gpu"]


def test_no_worker_is_reserved_for_a_task_none_could_hold() -> None:
    state = _pool(small=(0,))
    state.request("huge", 4, T0)
    assert state.assign(T0 + RESERVE, RESERVE) == []
    assert state.reservations == {}
