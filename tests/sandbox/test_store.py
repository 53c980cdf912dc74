"""The store on its own: resourceVersions, key-ordered pages with continue tokens, indexed
field lookups, watch fan-out with selector transitions, history replay and 410 Expired."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox import errors
from sandbox.resources import NODES, PODS
from sandbox.selectors import FieldSelector, LabelSelector
from sandbox.store import Store, StoredEvent
from sandbox.watches import Watch


def pod(name: str, ns: str = "a", node: str = "", **labels: str) -> dict[str, Any]:
    spec = {"nodeName": node} if node else {}
    return {"metadata": {"name": name, "namespace": ns, "labels": labels}, "spec": spec}


@pytest.fixture
def store() -> Store:
    return Store(history_limit=50)


async def drain(watch: Watch) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    while (event := watch.next_nowait()) is not None:
        out.append((event.type, event.name))
    return out


def test_every_write_takes_the_next_resource_version(store: Store) -> None:
    first = store.create(PODS, pod("p1"))
    second = store.update(PODS, {**first, "spec": {"x": 1}})
    final = store.delete(PODS, "a", "p1")
    versions = [int(o["metadata"]["resourceVersion"]) for o in (first, second, final)]
    assert versions == sorted(versions)
    assert len(set(versions)) == 3
    assert second["metadata"]["uid"] == first["metadata"]["uid"]
    assert store.resource_version == versions[-1]


def test_conflicts_and_missing_objects(store: Store) -> None:
    created = store.create(PODS, pod("p1"))
    with pytest.raises(errors.ApiError) as exists:
        store.create(PODS, pod("p1"))
    assert exists.value.code == 409
    store.update(PODS, created)
    with pytest.raises(errors.ApiError) as stale:
        store.update(PODS, created, expected_rv=int(created["metadata"]["resourceVersion"]))
    assert stale.value.reason == "Conflict"
    with pytest.raises(errors.ApiError) as missing:
        store.get(PODS, "a", "nope")
    assert missing.value.code == 404


def test_reads_return_private_copies(store: Store) -> None:
    store.create(PODS, pod("p1", app="x"))
    copy = store.get(PODS, "a", "p1")
    copy["metadata"]["labels"]["app"] = "changed"
    assert store.get(PODS, "a", "p1")["metadata"]["labels"]["app"] == "x"


def test_pages_cover_every_object_once_in_key_order(store: Store) -> None:
    for ns in ("b", "a"):
        for i in range(7):
            store.create(PODS, pod(f"p{i}", ns))
    seen, token, pages = [], None, 0
    while True:
        page = store.list(PODS, limit=4, continue_token=token)
        pages += 1
        seen += [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in page.items()]
        token = page.continue_token
        if token is None:
            break
        assert page.remaining == 14 - len(seen)
    assert pages == 4
    assert seen == sorted(seen)
    assert len(set(seen)) == 14
    assert [n for _, n in seen[:7]] == [f"p{i}" for i in range(7)]


def test_namespace_and_selector_lists(store: Store) -> None:
    store.create(PODS, pod("p1", "a", node="n1", app="x"))
    store.create(PODS, pod("p2", "a", node="n2", app="y"))
    store.create(PODS, pod("p3", "b", node="n1", app="x"))
    names = [o["metadata"]["name"] for o in store.list(PODS, "a").items()]
    assert names == ["p1", "p2"]
    by_node = store.list(PODS, fields=FieldSelector.parse("spec.nodeName=n1"))
    assert [o["metadata"]["name"] for o in by_node.items()] == ["p1", "p3"]
    unscheduled = store.list(PODS, fields=FieldSelector.parse("spec.nodeName="))
    assert unscheduled.items() == []
    by_label = store.list(PODS, "b", labels=LabelSelector.parse("app in (x)"))
    assert [o["metadata"]["name"] for o in by_label.items()] == ["p3"]


def test_index_follows_updates(store: Store) -> None:
    created = store.create(PODS, pod("p1"))
    created["spec"]["nodeName"] = "n9"
    store.update(PODS, created)
    assert store.list(PODS, fields=FieldSelector.parse("spec.nodeName=n9")).raw_items
    assert not store.list(PODS, fields=FieldSelector.parse("spec.nodeName=")).raw_items


async def test_watch_sees_changes_and_selector_transitions(store: Store) -> None:
    watch = store.watch(
        PODS, "a", since=str(store.resource_version), labels=LabelSelector.parse("app=x")
    )
    created = store.create(PODS, pod("p1", app="x"))
    store.create(PODS, pod("p2", app="y"))
    created["metadata"]["labels"]["app"] = "y"
    moved = store.update(PODS, created)
    moved["metadata"]["labels"]["app"] = "x"
    store.update(PODS, moved)
    store.delete(PODS, "a", "p1")
    assert await drain(watch) == [
        ("ADDED", "p1"),
        ("DELETED", "p1"),
        ("ADDED", "p1"),
        ("DELETED", "p1"),
    ]
    watch.close()


async def test_watch_without_version_starts_with_current_state(store: Store) -> None:
    store.create(PODS, pod("p1"))
    async with store.watch(PODS) as watch:
        event = await watch.next(timeout=1)
        assert event is not None
        assert (event.type, event.name) == ("ADDED", "p1")
        store.create(PODS, pod("p2"))
        event = await watch.next(timeout=1)
        assert event is not None
        assert event.name == "p2"


async def test_watch_replays_history_until_compacted(store: Store) -> None:
    start = store.resource_version
    store.create(NODES, {"metadata": {"name": "n1"}})
    replay = store.watch(NODES, since=str(start))
    assert await drain(replay) == [("ADDED", "n1")]
    replay.close()
    for i in range(60):  # history_limit is 50
        store.create(NODES, {"metadata": {"name": f"m{i}"}})
    with pytest.raises(errors.ApiError) as caught:
        store.watch(NODES, since=str(start))
    assert caught.value.code == 410
    assert caught.value.reason == "Expired"


async def test_a_watch_that_falls_behind_is_ended(store: Store) -> None:
    watch = store.watch(PODS, since=str(store.resource_version), queue_limit=3)
    for i in range(5):
        store.create(PODS, pod(f"p{i}"))
    assert len(await drain(watch)) == 3
    assert await watch.next(timeout=0.1) is None
    assert watch.closed


def test_listeners_run_after_each_commit(store: Store) -> None:
    seen: list[StoredEvent] = []
    unsubscribe = store.add_listener(seen.append)
    store.create(PODS, pod("p1"))
    store.delete(PODS, "a", "p1")
    unsubscribe()
    store.create(PODS, pod("p2"))
    assert [(e.type, e.name) for e in seen] == [("ADDED", "p1"), ("DELETED", "p1")]


def test_owner_index(store: Store) -> None:
    owner = store.create(NODES, {"metadata": {"name": "owner"}})
    uid = owner["metadata"]["uid"]
    child = pod("c1")
    child["metadata"]["ownerReferences"] = [{"uid": uid, "kind": "Node", "name": "owner"}]
    store.create(PODS, child)
    assert store.dependents(uid) == [(PODS, "a", "c1")]
    assert store.locate_uid(uid) == (NODES, "", "owner")
    store.delete(PODS, "a", "c1")
    assert store.dependents(uid) == []


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _names(page: Any) -> list[str]:
    return [o["metadata"]["name"] for o in page.items()]


async def test_watch_history_is_bounded_by_age() -> None:
    clock = Clock()
    store = Store(history_limit=50, history_seconds=75, clock=clock)
    start = store.resource_version
    store.create(NODES, {"metadata": {"name": "n1"}})
    clock.now += 74
    replay = store.watch(NODES, since=str(start))
    assert await drain(replay) == [("ADDED", "n1")]  # still in the window
    replay.close()
    clock.now += 2
    with pytest.raises(errors.ApiError) as caught:
        store.watch(NODES, since=str(start))
    assert (caught.value.code, caught.value.reason) == (410, "Expired")
    # A client that saw the event (or a bookmark after it) resumes without a relist.
    current = store.watch(NODES, since=str(store.resource_version))
    store.create(NODES, {"metadata": {"name": "n2"}})
    assert await drain(current) == [("ADDED", "n2")]


async def test_compact_expires_every_earlier_version() -> None:
    store = Store()
    before = store.resource_version
    store.create(PODS, pod("p1"))
    assert await drain(store.watch(PODS, since=str(before))) == [("ADDED", "p1")]
    store.compact()
    for resource in (PODS, NODES):  # NODES: a table made only after the compaction
        with pytest.raises(errors.ApiError) as caught:
            store.watch(resource, since=str(store.resource_version - 1))
        assert caught.value.code == 410
    resumed = store.watch(PODS, since=str(store.resource_version))
    store.create(PODS, pod("p2"))
    assert await drain(resumed) == [("ADDED", "p2")]


async def test_drop_watches_ends_every_open_watch() -> None:
    store = Store()
    watches = [store.watch(PODS), store.watch(NODES, since=str(store.resource_version))]
    assert store.drop_watches(reset=True) == 2
    assert all(w.closed and w.reset for w in watches)
    assert await watches[1].next(timeout=1) is None
    assert store.drop_watches() == 0


def test_every_page_of_a_list_is_the_first_page_snapshot() -> None:
    store = Store()
    for i in range(10):
        store.create(PODS, pod(f"p{i}", app="x"))
    first = store.list(PODS, limit=4)
    assert _names(first) == ["p0", "p1", "p2", "p3"]
    store.delete(PODS, "a", "p5")
    store.create(PODS, pod("p55", app="x"))  # sorts into the rest of the list
    changed = store.get(PODS, "a", "p7")
    changed["metadata"]["labels"] = {"app": "changed"}
    store.update(PODS, changed)
    second = store.list(PODS, limit=4, continue_token=first.continue_token)
    third = store.list(PODS, limit=4, continue_token=second.continue_token)
    assert _names(second) + _names(third) == ["p4", "p5", "p6", "p7", "p8", "p9"]
    assert second.items()[3]["metadata"]["labels"] == {"app": "x"}  # p7 as it was
    assert first.resource_version == second.resource_version == third.resource_version
    assert (second.remaining, third.continue_token) == (2, None)
    # Selectors apply to the snapshot's objects too.
    selected = store.list(PODS, labels=LabelSelector.parse("app=x"), limit=8)
    assert _names(selected)[-2:] == ["p6", "p8"]  # p7 changed before this list: not selected
    store.delete(PODS, "a", "p9")
    rest = store.list(
        PODS, labels=LabelSelector.parse("app=x"), limit=8, continue_token=selected.continue_token
    )
    assert _names(rest) == ["p9"]
    # A fresh list sees the changes.
    assert _names(store.list(PODS)) == ["p0", "p1", "p2", "p3", "p4", "p55", "p6", "p7", "p8"]


def test_a_continue_token_expires() -> None:
    clock = Clock()
    store = Store(continue_ttl_seconds=300, clock=clock)
    for i in range(6):
        store.create(PODS, pod(f"p{i}"))
    first = store.list(PODS, limit=2)
    clock.now += 299
    assert _names(store.list(PODS, limit=2, continue_token=first.continue_token)) == ["p2", "p3"]
    clock.now += 2
    store.create(PODS, pod("p22"))
    with pytest.raises(errors.ApiError) as caught:
        store.list(PODS, limit=2, continue_token=first.continue_token)
    error = caught.value
    assert (error.code, error.reason) == (410, "Expired")
    assert error.message.startswith("The provided continue parameter is too old to display")
    # The Status carries a token that goes on inconsistently, from the live data.
    live = store.list(PODS, limit=2, continue_token=error.metadata["continue"])
    assert _names(live) == ["p2", "p22"]
    assert live.resource_version == store.resource_version


def test_compaction_and_the_snapshot_bound_expire_continue_tokens() -> None:
    store = Store(snapshot_limit=2)
    for i in range(4):
        store.create(PODS, pod(f"p{i}"))
    tokens = [store.list(PODS, limit=1).continue_token for _ in range(3)]
    with pytest.raises(errors.ApiError) as evicted:  # the oldest of three went
        store.list(PODS, limit=1, continue_token=tokens[0])
    assert evicted.value.code == 410
    assert _names(store.list(PODS, limit=1, continue_token=tokens[2])) == ["p1"]
    store.compact()
    with pytest.raises(errors.ApiError) as compacted:
        store.list(PODS, limit=1, continue_token=tokens[1])
    assert compacted.value.code == 410


def test_the_last_page_frees_its_snapshot() -> None:
    store = Store()
    for i in range(3):
        store.create(PODS, pod(f"p{i}"))
    first = store.list(PODS, limit=2)
    last = store.list(PODS, limit=2, continue_token=first.continue_token)
    assert (_names(last), last.continue_token) == (["p2"], None)
    with pytest.raises(errors.ApiError) as caught:  # the list is done: its token is spent
        store.list(PODS, limit=2, continue_token=first.continue_token)
    assert caught.value.code == 410
