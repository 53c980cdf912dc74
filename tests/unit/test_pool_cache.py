"""The pool cache's bookkeeping, fed by hand as its reflectors feed it: after any sequence of
events its capacity is what `pool_capacity` gives for the same objects; an event that moves
nothing capacity reads (a heartbeat) changes nothing and starts no pass; it answers nothing
before every resource is synced, nor while one relists or reconnects.
"""

from __future__ import annotations

from typing import Any

import pytest

from activities.kube import pool_view
from activities.kube_clients import KubeClients
from activities.pool_cache import JOBS, NODES, PODS, PoolCache, strip_node
from levers9.config import parse_pool
from levers9.core.capacity import job_hold, pod_hold, pool_capacity
from tests.kube_objects import node, pod, worker_job, worker_labels

POOL = "gke-rtx6000"
BLOCK = {
    "mode": "external",
    "provider": "kubernetes",
    "gpuType": "RTXPro6000",
    "kubernetes": {
        "flavor": "generic",
        "endpoint": "https://127.0.0.1:1",
        "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000"},
        "workerImage": "worker:latest",
        "credentials": "token",
    },
}


class World:
    """What the cluster holds, and the cache fed with it."""

    def __init__(self) -> None:
        self.config = parse_pool(POOL, BLOCK)
        self.cache = PoolCache(POOL, KubeClients({POOL: self.config}))
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.pokes = 0
        self.cache.on_change(self._poked)

    def _poked(self) -> None:
        self.pokes += 1

    def sync(self) -> None:
        self.cache.replace(NODES, {f"/{k}": strip_node(v) for k, v in self.nodes.items()})
        self.cache.replace(PODS, _holds(self.pods, pod_hold))
        self.cache.replace(JOBS, _holds(self.jobs, job_hold))

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if kind == NODES:
            self.nodes[name] = obj
            self.cache.upsert(NODES, f"/{name}", strip_node(obj))
        elif kind == PODS:
            self.pods[f"default/{name}"] = obj
            self.cache.upsert(PODS, f"default/{name}", pod_hold(obj))
        else:
            self.jobs[f"levers9/{name}"] = obj
            self.cache.upsert(JOBS, f"levers9/{name}", job_hold(obj))

    def remove(self, kind: str, key: str) -> None:
        {NODES: self.nodes, PODS: self.pods, JOBS: self.jobs}[kind].pop(key.lstrip("/"))
        self.cache.delete(kind, key)

    def listed(self) -> dict[str, Any]:
        return pool_capacity(
            self.nodes.values(),
            [p for p in self.pods.values() if pod_hold(p) is not None],
            self.jobs.values(),
            pool_view(POOL, self.config),
        )


def _holds(objects: dict[str, dict[str, Any]], convert: Any) -> dict[str, Any]:
    held = {key: convert(obj) for key, obj in objects.items()}
    return {key: hold for key, hold in held.items() if hold is not None}


@pytest.fixture
def world() -> World:
    w = World()
    w.nodes = {"gke-gpu-4x-1": node("gke-gpu-4x-1"), "gke-gpu-2x-1": node("gke-gpu-2x-1", 2)}
    w.pods = {"default/model": pod("model", "gke-gpu-4x-1", gpus=2, cpu="4", memory="16Gi")}
    w.sync()
    return w


def test_synced_it_is_what_the_lists_give(world: World) -> None:
    assert world.cache.capacity() == world.listed()
    assert world.cache.capacity()["gke-gpu-4x-1"].free.gpus == 2  # type: ignore[index]


def test_any_sequence_of_events_ends_where_the_lists_are(world: World) -> None:
    world.cache.take_changes()
    world.put(NODES, node("gke-gpu-8x-1", 8))
    world.put(PODS, pod("batch", "gke-gpu-8x-1", gpus=3))
    world.put(JOBS, worker_job(POOL, "gke-gpu-2x-1", "w1", 2))
    world.put(
        PODS,
        pod("w1-pod", "gke-gpu-2x-1", gpus=2, labels=worker_labels(POOL, "gke-gpu-2x-1", "w1")),
    )
    world.put(PODS, pod("batch", "gke-gpu-8x-1", gpus=3, phase="Succeeded"))  # finished
    world.put(NODES, node("gke-gpu-4x-1", unschedulable=True))
    world.remove(PODS, "default/model")
    world.put(JOBS, worker_job(POOL, "gke-gpu-2x-1", "w1", 2, finished="Complete"))
    assert world.cache.take_changes() == ["gke-gpu-2x-1", "gke-gpu-4x-1", "gke-gpu-8x-1"]
    assert world.cache.capacity() == world.listed()
    # The Job's pod, still terminating after its Job finished, holds its cards.
    assert world.cache.capacity()["gke-gpu-2x-1"].free.gpus == 0  # type: ignore[index]
    world.remove(NODES, "/gke-gpu-8x-1")
    assert world.cache.take_changes() == ["gke-gpu-8x-1"]
    assert world.cache.capacity() == world.listed()


def test_a_heartbeat_moves_nothing_and_starts_no_pass(world: World) -> None:
    world.cache.take_changes()
    pokes = world.pokes
    beating = node("gke-gpu-4x-1")
    beating["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-12-01T20:00:00Z"
    beating["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    world.put(NODES, beating)
    assert world.pokes == pokes  # nothing capacity reads moved: no event at all
    world.put(NODES, node("gke-gpu-4x-1", ready=False))
    assert world.pokes == pokes + 1
    assert world.cache.take_changes() == ["gke-gpu-4x-1"]
    assert world.cache.take_changes() == []


def test_it_answers_nothing_unsynced() -> None:
    world = World()
    world.nodes = {"gke-gpu-4x-1": node("gke-gpu-4x-1")}
    world.cache.replace(NODES, {"/gke-gpu-4x-1": strip_node(world.nodes["gke-gpu-4x-1"])})
    world.cache.replace(PODS, {})
    assert (world.cache.capacity(), world.cache.take_changes()) == (None, [])  # no Jobs yet
    world.cache.replace(JOBS, {})
    assert world.cache.capacity() == world.listed()
    world.cache.unsynced(PODS)  # a relist, or a watch broken until it reconnects
    assert world.cache.capacity() is None
    world.cache.resumed(PODS)
    assert world.cache.capacity() == world.listed()
