"""What a reconcile pass reads, kept by watches in this Temporal worker process; and the passes
that its events start.

A `PoolCache` holds, for one pool, the nodes its selector matches, the pods bound to any node
(as `PodHold`s: node, amounts, our labels), and our worker Jobs (`JobHold`s), fed by three
`Reflector`s (list once, then watch). Each node's `NodeCapacity` is memoised and recomputed
only when an event touches the node, so a pass over an idle 5,000-node cluster reads 5,000
ready records and calls nothing. A pass on a cache that is not synced (at startup, or while a
reflector relists after a 410) gets None, and lists instead: it never decides from a
half-filled cache.

`PassTrigger` turns events into passes: an event that changes a node's capacity (the node
added, Ready, cordoned, tainted, gone, cards freed) triggers the pool's `reconcile:<pool>`
schedule once, about 200 ms after it (a burst is one pass), at most one a second; the 15 s
schedule stays as the level-triggered safety net. With several replicas each process holds
its own caches and triggers on what it sees; whichever replica runs a pass reads its own
cache, or lists while that is not synced.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from temporalio.client import Client, ScheduleOverlapPolicy
from temporalio.service import RPCError, RPCStatusCode

from activities.informer import Reflector
from activities.kube import BOUND_AND_RUNNING, job_selector, node_selector, pool_view
from activities.kube_clients import KubeClients
from levers9.core.capacity import (
    JobHold,
    NodeCapacity,
    PodHold,
    PoolView,
    job_hold,
    node_capacity,
    pod_hold,
)
from levers9.logs import get_logger
from levers9.models import reconcile_schedule_id

NODES, PODS, JOBS = "nodes", "pods", "jobs"
DEBOUNCE_S = 0.2
MIN_SPACING_S = 1.0

log = get_logger("levers9.reconcile")


def strip_node(node: dict[str, Any]) -> dict[str, Any]:
    """The fields of a Node that capacity reads: no managedFields, images, heartbeat times."""
    metadata, spec, status = node.get("metadata", {}), node.get("spec", {}), node.get("status", {})
    kept_spec = {key: spec[key] for key in ("unschedulable", "taints") if spec.get(key)}
    ready = [
        {"type": "Ready", "status": c.get("status")}
        for c in status.get("conditions") or ()
        if c.get("type") == "Ready"
    ]
    return {
        "metadata": {"name": metadata.get("name"), "labels": metadata.get("labels") or {}},
        "spec": kept_spec,
        "status": {
            "allocatable": status.get("allocatable") or {},
            "capacity": status.get("capacity") or {},
            "conditions": ready,
            "addresses": [
                {"type": a.get("type"), "address": a.get("address")}
                for a in status.get("addresses") or ()
                if a.get("type") in ("ExternalIP", "InternalIP")
            ],
        },
    }


@dataclass
class _State:
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, PodHold] = field(default_factory=dict)
    pods_by_node: dict[str, dict[str, PodHold]] = field(default_factory=dict)
    jobs: dict[str, JobHold] = field(default_factory=dict)
    jobs_by_node: dict[str, dict[str, JobHold]] = field(default_factory=dict)


class PoolCache:
    """The watch-fed view of one pool (see module doc); thread-safe."""

    def __init__(
        self,
        pool_name: str,
        clients: KubeClients,
        *,
        watch_timeout_s: tuple[int, int] | None = None,
        backoff_s: tuple[float, float] | None = None,
    ) -> None:
        self.pool_name = pool_name
        pool = clients.pool(pool_name)
        api = clients.api(pool_name)
        core, batch = k8s.CoreV1Api(api), k8s.BatchV1Api(api)
        self._view: PoolView = pool_view(pool_name, pool)
        self._lock = threading.Lock()
        self._state = _State()
        self._synced: set[str] = set()
        self._capacity: dict[str, NodeCapacity] = {}
        self._dirty: set[str] = set()
        self._listeners: list[Any] = []
        self._stop = threading.Event()
        labels = {"pool_name": pool_name}
        timeouts: dict[str, Any] = {}
        if watch_timeout_s:
            timeouts["watch_timeout_s"] = watch_timeout_s
        if backoff_s:
            timeouts["backoff_s"] = backoff_s
        self.reflectors: list[Reflector[Any]] = [
            Reflector(
                NODES,
                core.list_node,
                {"label_selector": node_selector(pool)},
                convert=strip_node,
                sink=self,
                stop=self._stop,
                labels=labels,
                **timeouts,
            ),
            Reflector(
                PODS,
                core.list_pod_for_all_namespaces,
                {"field_selector": BOUND_AND_RUNNING},
                convert=pod_hold,
                sink=self,
                stop=self._stop,
                labels=labels,
                **timeouts,
            ),
            Reflector(
                JOBS,
                batch.list_namespaced_job,
                {"namespace": pool.kubernetes.namespace, "label_selector": job_selector(pool_name)},
                convert=job_hold,
                sink=self,
                stop=self._stop,
                labels=labels,
                **timeouts,
            ),
        ]
        self._threads: list[threading.Thread] = []

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        for reflector in self.reflectors:
            thread = threading.Thread(
                target=reflector.run,
                name=f"reflector-{self.pool_name}-{reflector.kind}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for reflector in self.reflectors:
            reflector.close()
        for thread in self._threads:
            thread.join(timeout)

    def kick(self) -> None:
        """The cluster answered a list: reflectors waiting out a backoff try again now."""
        for reflector in self.reflectors:
            reflector.kick()

    def on_change(self, listener: Any) -> None:
        """`listener()` is called (from a reflector thread) after every event that may move a
        node's capacity."""
        self._listeners.append(listener)

    # -- what passes read --------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        with self._lock:
            return len(self._synced) == len(self.reflectors)

    def list_calls(self) -> int:
        """List passes the reflectors made (1 each at start, plus relists)."""
        return sum(reflector.lists for reflector in self.reflectors)

    def capacity(self) -> dict[str, NodeCapacity] | None:
        """Every selected node's capacity; None while not synced (the pass lists instead)."""
        with self._lock:
            if len(self._synced) != len(self.reflectors):
                return None
            self._recompute()
            return dict(self._capacity)

    def take_changes(self) -> list[str]:
        """The nodes whose capacity moved since it was last computed (by a pass or by this):
        what the trigger asks before starting a pass. Nothing while not synced."""
        with self._lock:
            if len(self._synced) != len(self.reflectors):
                return []
            return self._recompute()

    def _recompute(self) -> list[str]:
        changed: list[str] = []
        state = self._state
        for name in self._dirty:
            node = state.nodes.get(name)
            if node is None:
                if self._capacity.pop(name, None) is not None:
                    changed.append(name)
                continue
            now = node_capacity(
                node,
                state.pods_by_node.get(name, {}).values(),
                state.jobs_by_node.get(name, {}).values(),
                self._view,
            )
            if self._capacity.get(name) != now:
                self._capacity[name] = now
                changed.append(name)
        self._dirty.clear()
        return sorted(changed)

    # -- the reflectors' sink ----------------------------------------------------------------

    def unsynced(self, kind: str) -> None:
        with self._lock:
            self._synced.discard(kind)

    def resumed(self, kind: str) -> None:
        with self._lock:
            self._synced.add(kind)
        self._changed()  # what changed while it was away may be pending in a node

    def replace(self, kind: str, items: dict[str, Any]) -> None:
        with self._lock:
            state = self._state
            if kind == NODES:
                self._dirty.update(state.nodes)
                state.nodes = {key.partition("/")[2]: node for key, node in items.items()}
                self._dirty.update(state.nodes)
            elif kind == PODS:
                self._dirty.update(state.pods_by_node)
                state.pods, state.pods_by_node = items, _by_node(items)
                self._dirty.update(state.pods_by_node)
            else:
                self._dirty.update(state.jobs_by_node)
                jobs = {k: j for k, j in items.items() if j.pool == self.pool_name}
                state.jobs, state.jobs_by_node = jobs, _by_node(jobs)
                self._dirty.update(state.jobs_by_node)
            self._synced.add(kind)
        self._changed()

    def upsert(self, kind: str, key: str, item: Any) -> None:
        if item is None:  # no longer something a pass counts (a pod that finished)
            self.delete(kind, key)
            return
        with self._lock:
            state = self._state
            if kind == NODES:
                name = key.partition("/")[2]
                if state.nodes.get(name) == item:
                    return  # a heartbeat, an image list: nothing capacity reads
                state.nodes[name] = item
                self._dirty.add(name)
            elif kind == PODS:
                if not self._put(state.pods, state.pods_by_node, key, item):
                    return
            elif item.pool != self.pool_name or not self._put(
                state.jobs, state.jobs_by_node, key, item
            ):
                return
        self._changed()

    def delete(self, kind: str, key: str) -> None:
        with self._lock:
            state = self._state
            if kind == NODES:
                name = key.partition("/")[2]
                if state.nodes.pop(name, None) is None:
                    return
                self._dirty.add(name)
            elif kind == PODS:
                if not self._remove(state.pods, state.pods_by_node, key):
                    return
            elif not self._remove(state.jobs, state.jobs_by_node, key):
                return
        self._changed()

    def _put(
        self, items: dict[str, Any], by_node: dict[str, dict[str, Any]], key: str, item: Any
    ) -> bool:
        old = items.get(key)
        if old == item:
            return False
        if old is not None:
            by_node.get(old.node, {}).pop(key, None)
            self._dirty.add(old.node)
        items[key] = item
        by_node.setdefault(item.node, {})[key] = item
        self._dirty.add(item.node)
        return True

    def _remove(self, items: dict[str, Any], by_node: dict[str, dict[str, Any]], key: str) -> bool:
        old = items.pop(key, None)
        if old is None:
            return False
        held = by_node.get(old.node)
        if held is not None:
            held.pop(key, None)
            if not held:
                del by_node[old.node]
        self._dirty.add(old.node)
        return True

    def _changed(self) -> None:
        for listener in self._listeners:
            listener()

    def threads(self) -> list[threading.Thread]:
        """The reflectors' threads (the benchmark reads their CPU clocks)."""
        return list(self._threads)

    def state(self) -> object:
        """What the cache holds (the benchmark sizes it)."""
        return (self._state, self._capacity)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {
                NODES: len(self._state.nodes),
                PODS: len(self._state.pods),
                JOBS: len(self._state.jobs),
            }


def _by_node(items: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    grouped: dict[str, dict[str, Any]] = {}
    for key, item in items.items():
        grouped.setdefault(item.node, {})[key] = item
    return grouped


class PassTrigger:
    """Starts a pass of `reconcile:<pool>` when the pool cache says a node's capacity moved
    (see module doc). Built on the event loop it runs on; `poke` may be called from any
    thread."""

    def __init__(
        self,
        client: Client,
        cache: PoolCache,
        *,
        debounce_s: float = DEBOUNCE_S,
        min_spacing_s: float = MIN_SPACING_S,
    ) -> None:
        self._client = client
        self._cache = cache
        self._debounce_s = debounce_s
        self._min_spacing_s = min_spacing_s
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self.triggered = 0
        self.changes_taken = 0
        """Bursts of changed nodes this trigger acted on (triggered, or not: the schedule gone)."""
        cache.on_change(self.poke)

    def poke(self) -> None:
        if not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._wake.set)

    async def run(self) -> None:
        pool_name = self._cache.pool_name
        handle = self._client.get_schedule_handle(reconcile_schedule_id(pool_name))
        while True:
            await self._wake.wait()
            await asyncio.sleep(self._debounce_s)  # the rest of the burst joins this one
            self._wake.clear()
            changed = await asyncio.to_thread(self._cache.take_changes)
            if not changed:
                continue
            self.changes_taken += 1
            try:
                await handle.trigger(overlap=ScheduleOverlapPolicy.BUFFER_ONE)
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:  # the pool is being removed
                    log.warning("unable to trigger a pass", pool_name=pool_name, error=str(exc))
                continue
            self.triggered += 1
            log.info(
                "nodes changed: reconciling now",
                pool_name=pool_name,
                nodes=len(changed),
                first=changed[0],
            )
            await asyncio.sleep(self._min_spacing_s)


class PoolCaches:
    """Every loaded pool's cache and trigger, for one process: `async with caches:` starts
    them (the passes list until each is synced) and stops them."""

    def __init__(
        self,
        clients: KubeClients,
        pool_names: list[str],
        client: Client | None,
        *,
        watch_timeout_s: tuple[int, int] | None = None,
    ) -> None:
        self._clients = clients
        self._names = pool_names
        self._client = client
        self._watch_timeout_s = watch_timeout_s
        self.caches: dict[str, PoolCache] = {}
        self.triggers: dict[str, PassTrigger] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def get(self, pool_name: str) -> PoolCache | None:
        return self.caches.get(pool_name)

    async def __aenter__(self) -> PoolCaches:
        for name in self._names:
            self.add(name)
        return self

    def add(self, name: str) -> None:
        """Starts the cache of pool `name` (a pool joined while the process runs); once."""
        if name in self.caches:
            return
        try:
            cache = PoolCache(name, self._clients, watch_timeout_s=self._watch_timeout_s)
        except (ValueError, KeyError) as exc:  # its client cannot be built: passes say why
            log.warning("no cache for pool", pool_name=name, error=str(exc))
            return
        self.caches[name] = cache
        if self._client is not None:
            trigger = PassTrigger(self._client, cache)
            self.triggers[name] = trigger
            self._tasks.append(asyncio.create_task(trigger.run()))
        cache.start()

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.gather(*(asyncio.to_thread(c.stop) for c in self.caches.values()))
