"""The watch-fed pool cache against the sandbox's real HTTPS API with the pool's GKE key: once
synced it gives exactly what three lists give, and follows the cluster by watch alone (no
list) as nodes join, go and change; it never answers unsynced. Its reflector, told 410 Gone
by the sandbox (a continue token of a compacted list, a watch from a compacted version),
lists again and then holds what the server holds.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from activities import informer
from activities.informer import Reflector
from activities.kube import KubeObserver
from activities.pool_cache import PoolCache
from levers9.core.capacity import MachineStatus, NodeCapacity
from sandbox.admin_client import SandboxAdmin
from tests.controlplane import POOL, Controlplane, controlplane
from tests.factories import add_gpu_node
from tests.waiting import eventually

pytestmark = pytest.mark.integration

NODE_1X = "gke-demo-gpu-1x-5d3a1f2b-x7k9"


@pytest.fixture(scope="module")
async def cp(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Controlplane]:
    directory: Path = tmp_path_factory.mktemp("cache")
    async with controlplane(directory, "127.0.0.1:1", "unused") as plane:
        yield plane


@pytest.fixture
async def cache(cp: Controlplane) -> AsyncIterator[PoolCache]:
    cache = PoolCache(POOL, cp.clients)
    cache.start()
    try:
        await eventually(lambda: _synced(cache), within=30)
        yield cache
    finally:
        await asyncio.to_thread(cache.stop)


async def _synced(cache: PoolCache) -> bool:
    return cache.capacity() is not None


def _listed(cp: Controlplane) -> dict[str, NodeCapacity]:
    nodes, _ = KubeObserver(cp.clients).list_capacity(POOL)
    return nodes


async def _agrees(cp: Controlplane, cache: PoolCache) -> bool:
    return cache.capacity() == await asyncio.to_thread(_listed, cp)


async def test_a_synced_cache_is_what_the_lists_say(cp: Controlplane, cache: PoolCache) -> None:
    cached = cache.capacity()
    assert cached is not None
    assert len(cached) >= 2
    assert cached == await asyncio.to_thread(_listed, cp)
    # Read through the observer: one GET proving the cluster still answers, no list.
    observer = KubeObserver(cp.clients, {POOL: cache}.get)
    counter = cp.sandbox.sandbox.parts.counter
    counter.reset()
    nodes, calls = await asyncio.to_thread(observer.observe, POOL)
    assert (nodes, calls) == (cached, 1)
    verbs = {c["verb"]: c["count"] for c in counter.describe()["counts"]}
    assert verbs == {"get": 1}


async def test_nodes_joining_and_leaving_reach_it_by_watch(
    cp: Controlplane, cache: PoolCache
) -> None:
    lists = cache.list_calls()
    await add_gpu_node(
        cp.sandbox.cluster, "gke-demo-gpu-2x-cache-a1", 2, "127.0.31.1", "127.0.31.2"
    )

    async def joined() -> bool:
        cached = cache.capacity() or {}
        node = cached.get("gke-demo-gpu-2x-cache-a1")
        return node is not None and node.status is MachineStatus.HEALTHY

    await eventually(joined, within=30)
    await eventually(lambda: _agrees(cp, cache), within=30)
    await cp.sandbox.cluster.set_node_ready("gke-demo-gpu-2x-cache-a1", False)

    async def not_ready() -> bool:
        node = (cache.capacity() or {}).get("gke-demo-gpu-2x-cache-a1")
        return node is not None and node.status is MachineStatus.NOT_READY

    await eventually(not_ready, within=30)
    await cp.sandbox.cluster.remove_node("gke-demo-gpu-2x-cache-a1")

    async def left() -> bool:
        return "gke-demo-gpu-2x-cache-a1" not in (cache.capacity() or {})

    await eventually(left, within=30)
    await eventually(lambda: _agrees(cp, cache), within=30)
    assert cache.list_calls() == lists  # all of it by watch


async def test_it_does_not_answer_before_it_is_synced(cp: Controlplane) -> None:
    cache = PoolCache(POOL, cp.clients)
    assert (cache.synced, cache.capacity(), cache.take_changes()) == (False, None, [])
    observer = KubeObserver(cp.clients, {POOL: cache}.get)
    nodes, calls = await asyncio.to_thread(observer.observe, POOL)
    assert calls >= 3
    assert nodes == await asyncio.to_thread(_listed, cp)


def _watches(cache: PoolCache) -> int:
    return sum(reflector.watches for reflector in cache.reflectors)


async def test_a_dropped_watch_resumes_from_its_version_without_a_list(
    cp: Controlplane, cache: PoolCache
) -> None:
    lists, watches = cache.list_calls(), _watches(cache)
    # Connections reset (the sandbox's own controllers watch too).
    assert cp.sandbox.sandbox.drop_watches() >= len(cache.reflectors)
    await add_gpu_node(
        cp.sandbox.cluster, "gke-demo-gpu-2x-cache-b1", 2, "127.0.31.3", "127.0.31.4"
    )

    async def rewatched() -> bool:
        return _watches(cache) >= watches + len(cache.reflectors)

    await eventually(rewatched, within=30)
    await eventually(lambda: _agrees(cp, cache), within=30)
    assert "gke-demo-gpu-2x-cache-b1" in (cache.capacity() or {})
    assert cache.list_calls() == lists  # resumed from its resourceVersion: nothing relisted
    await cp.sandbox.cluster.remove_node("gke-demo-gpu-2x-cache-b1")
    await eventually(lambda: _agrees(cp, cache), within=30)


async def test_a_watch_too_old_for_the_server_relists(cp: Controlplane, cache: PoolCache) -> None:
    lists = cache.list_calls()
    # What changes while the watches are down is past the server's window when they return.
    cp.sandbox.sandbox.drop_watches()
    await add_gpu_node(
        cp.sandbox.cluster, "gke-demo-gpu-2x-cache-c1", 2, "127.0.31.5", "127.0.31.6"
    )
    cp.sandbox.sandbox.compact()

    async def relisted() -> bool:
        return cache.list_calls() >= lists + 1 and cache.synced

    await eventually(relisted, within=30)
    await eventually(lambda: _agrees(cp, cache), within=30)
    assert "gke-demo-gpu-2x-cache-c1" in (cache.capacity() or {})
    await cp.sandbox.cluster.remove_node("gke-demo-gpu-2x-cache-c1")
    await eventually(lambda: _agrees(cp, cache), within=30)


async def test_refused_it_makes_passes_list_and_a_list_that_works_ends_its_backoff(
    cp: Controlplane,
) -> None:
    """While the cluster refuses us (the egress IP moved off the authorized networks) the
    watches back off (30 s here) and the cache answers nothing, so a pass lists and fails with
    the 403; once allowed again, the pass's list succeeds and wakes the watches at once."""
    cache = PoolCache(POOL, cp.clients, backoff_s=(30.0, 30.0))
    observer = KubeObserver(cp.clients, {POOL: cache}.get)
    cp.sandbox.sandbox.policy.update({"egressIp": "127.0.0.9"})
    try:
        cache.start()

        async def refused() -> bool:
            return all(r.failures >= 1 and r.lists == 0 for r in cache.reflectors)

        await eventually(refused, within=30)
        with pytest.raises(k8s.ApiException) as caught:
            await asyncio.to_thread(observer.observe, POOL)
        assert caught.value.status == 403
        assert cache.capacity() is None
    finally:
        cp.sandbox.sandbox.policy.update({"egressIp": "127.0.0.1"})
    try:
        nodes, calls = await asyncio.to_thread(observer.observe, POOL)  # lists, then kicks
        assert calls >= 3
        await eventually(lambda: _synced(cache), within=15)  # well inside the 30 s backoff
        assert cache.capacity() == nodes
    finally:
        await asyncio.to_thread(cache.stop)


OURS = {"reflector-test": "yes"}
OUR_SELECTOR = "reflector-test=yes"


class _Held:
    """A reflector's sink that keeps what it is told: each config map's `v`."""

    def __init__(self) -> None:
        self.items: dict[str, str] = {}
        self.lock = threading.Lock()

    def replace(self, kind: str, items: dict[str, str]) -> None:
        with self.lock:
            self.items = dict(items)

    def upsert(self, kind: str, key: str, item: str | None) -> None:
        with self.lock:
            self.items[key] = item or ""

    def delete(self, kind: str, key: str) -> None:
        with self.lock:
            self.items.pop(key, None)

    def unsynced(self, kind: str) -> None:
        pass

    def resumed(self, kind: str) -> None:
        pass

    def snapshot(self) -> dict[str, str]:
        with self.lock:
            return dict(self.items)


class _Gap:
    """The reflector's list call, with a gap before the first call of one kind (`at`: a list's
    next page, or the watch): there the cluster changes and the sandbox compacts, so that call
    is answered 410 Gone. Records every call and what was answered."""

    def __init__(self, core: Any, namespace: str, admin: SandboxAdmin, at: str) -> None:
        self.core = core
        self.namespace = namespace
        self.admin = admin
        self.at = at
        self.armed = True
        self.calls: list[tuple[str, int | str]] = []  # (what, HTTP status or "stream")

    def __call__(self, **kwargs: Any) -> Any:
        what = "watch" if kwargs.get("watch") else "page" if kwargs.get("_continue") else "list"
        if self.armed and what == self.at:
            self.armed = False
            _change(self.core, self.namespace)
            self.admin.compact()
        try:
            answer = self.core.list_namespaced_config_map(self.namespace, **kwargs)
        except k8s.ApiException as error:
            self.calls.append((what, error.status))
            raise
        if what == "watch":  # a watch's 410 comes as an ERROR event in its stream
            self.calls.append((what, "stream"))
        else:
            self.calls.append((what, answer.status))
        return answer


def _change(core: Any, namespace: str) -> None:
    """One change of each kind: modified, deleted, added."""
    core.patch_namespaced_config_map("c1", namespace, {"data": {"v": "changed"}})
    core.delete_namespaced_config_map("c2", namespace)
    core.create_namespaced_config_map(namespace, _config_map("c4", "4"))


def _config_map(name: str, value: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": OURS}, "data": {"v": value}}


def _server_view(core: Any, namespace: str) -> dict[str, str]:
    listed = core.list_namespaced_config_map(namespace, label_selector=OUR_SELECTOR).items
    return {f"{namespace}/{c.metadata.name}": c.data["v"] for c in listed}


@pytest.mark.parametrize("at", ["page", "watch"], ids=["continue-token", "watch"])
async def test_the_reflector_relists_after_410_and_holds_what_the_server_holds(
    cp: Controlplane, at: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(informer, "PAGE", 1)  # one item a page: every list has a next page
    core: Any = k8s.CoreV1Api(cp.clients.api(POOL))
    namespace = f"reflect-{uuid.uuid4().hex[:8]}"

    def seed() -> None:
        core.create_namespace({"metadata": {"name": namespace}})
        for i in (1, 2, 3):
            core.create_namespaced_config_map(namespace, _config_map(f"c{i}", str(i)))

    await asyncio.to_thread(seed)
    gap = _Gap(core, namespace, SandboxAdmin(cp.sandbox.state.dir), at)
    held = _Held()
    stop = threading.Event()
    convert: Callable[[dict[str, Any]], str | None] = lambda obj: (obj.get("data") or {})["v"]  # noqa: E731
    selectors = {"label_selector": OUR_SELECTOR}  # not the namespace's kube-root-ca.crt
    reflector = Reflector("configmaps", gap, selectors, convert=convert, sink=held, stop=stop)
    thread = threading.Thread(target=reflector.run, daemon=True)
    thread.start()
    try:

        async def relisted() -> bool:
            return reflector.lists >= (2 if at == "watch" else 1) and reflector.watches >= 1

        await eventually(relisted, within=30)
        # The call after the gap was answered 410, and a list from its first page followed.
        after = gap.calls[[what for what, _ in gap.calls].index(at) :]
        assert after[0] == (at, 410 if at == "page" else "stream")
        assert after[1] == ("list", 200)
        assert reflector.lists == (2 if at == "watch" else 1)  # one list completed per pass
        expected = {f"{namespace}/c1": "changed", f"{namespace}/c3": "3", f"{namespace}/c4": "4"}
        assert await asyncio.to_thread(_server_view, core, namespace) == expected
        assert held.snapshot() == expected
        # And it follows by watch from there: a change reaches it without another list.
        lists = reflector.lists
        await asyncio.to_thread(
            core.patch_namespaced_config_map, "c3", namespace, {"data": {"v": "watched"}}
        )

        async def followed() -> bool:
            return held.snapshot().get(f"{namespace}/c3") == "watched"

        await eventually(followed, within=30)
        assert reflector.lists == lists
    finally:
        stop.set()
        reflector.close()
        await asyncio.to_thread(thread.join, 10)
        await asyncio.to_thread(core.delete_namespace, namespace)
