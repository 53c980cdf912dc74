"""What a reconcile pass costs as the cluster grows: Kubernetes API calls, CPU seconds of the
observation, Temporal history events and bytes, for an idle pass and a pass with 1% of nodes
changed, read from the watch-fed pool cache (the default) or listed (`--list`). Targets
(issue 4): API calls constant in node count; an idle pass at most 20 events and 64 KiB of
history at 5,000 nodes; capacity for 5,000 nodes / 100,000 pods in at most 1 CPU-s. Issue 18:
with the cache synced, an idle pass at 5,000 nodes at most 0.25 CPU-s and no list call.

The cluster is synthetic (GPU nodes, 20 pods each, loaded into the emulator's store); the pool
reaches it over HTTPS with a bearer token (flavor generic) through the real observe activity;
passes run as the `reconcile:<pool>` schedule's workflows on a Temporal dev server, triggered.
With the cache it also reports the cache's memory (its structures, measured object by object),
the CPU its reflector threads spent while the pass was idle and while 1% changed, and the time
from a node created to its worker Job: a second pool on a cluster of the same size whose
selector matches none of its nodes, a node that matches added five times, the real
MachineWorkflow, WorkerWorkflow and create_worker_job, triggered by the cache's event.

    python benchmarks/reconcile.py [--nodes 100,1000,5000] [--pods-per-node 20] [--list] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.kube import KubeObserver
from activities.kube_clients import KubeClients
from activities.pool_cache import PODS as CACHED_PODS
from activities.pool_cache import PoolCache, PoolCaches
from activities.reconcile import ReconcileActivities
from activities.registry import controlplane_activities
from levers9.config import ControlplaneSettings, PoolConfig, parse_pool
from levers9.core.capacity import NODE_LABEL, NodeCapacity, PoolView
from levers9.models import ReconcilePoolResult
from levers9.temporal import ensure_search_attributes, sync_reconcile_schedules
from sandbox.resources import JOBS, NODES, PODS
from sandbox.selectors import LabelSelector
from sandbox.server import SandboxOptions
from sandbox.synthetic import NAMESPACE_COUNT, cpu_model, load, node_object
from sandbox.threaded import SandboxThread
from workflows import RUNNER, WORKFLOWS

POOL = "bench"
TOKEN = "bench-token"


class TimedObserver(KubeObserver):
    """The real observer, with the CPU seconds of its thread recorded per call: all of it
    (HTTP, JSON, capacity) and the capacity computation alone."""

    cpu_seconds: list[float]
    capacity_seconds: list[float]

    def observe(self, pool_name: str) -> tuple[dict[str, NodeCapacity], int]:
        started = time.thread_time()
        try:
            return super().observe(pool_name)
        finally:
            self.cpu_seconds.append(time.thread_time() - started)

    def capacity(
        self,
        nodes: list[dict[str, Any]],
        pods: list[dict[str, Any]],
        jobs: list[dict[str, Any]],
        view: PoolView,
    ) -> dict[str, NodeCapacity]:
        started = time.thread_time()
        try:
            return super().capacity(nodes, pods, jobs, view)
        finally:
            self.capacity_seconds.append(time.thread_time() - started)


@dataclass
class Pass:
    api_calls: int
    observe_cpu_s: float
    capacity_cpu_s: float
    told: int
    events: int
    history_bytes: int
    cache_cpu_s: float = 0.0
    """CPU of the cache's reflector threads from the pass before to the end of this one."""


def thread_cpu(threads: list[threading.Thread]) -> float:
    total = 0.0
    for thread in threads:
        if thread.ident is not None and thread.is_alive():
            total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return total


async def run_pass(
    client: Client,
    thread: SandboxThread,
    observer: TimedObserver,
    schedule_id: str,
    cache: PoolCache | None,
    cache_cpu_from: float | None = None,
) -> Pass:
    counter = thread.sandbox.parts.counter
    threads = cache.threads() if cache is not None else []
    started_cpu = thread_cpu(threads) if cache_cpu_from is None else cache_cpu_from
    handle = client.get_schedule_handle(schedule_id)
    before = (await handle.describe()).info.num_actions
    await handle.trigger()
    while True:
        described = await handle.describe()
        if described.info.num_actions > before and described.info.recent_actions:
            run_id = described.info.recent_actions[-1].action.workflow_id  # type: ignore[attr-defined]
            break
        await asyncio.sleep(0.1)
    workflow = client.get_workflow_handle(run_id, result_type=ReconcilePoolResult)
    result = await workflow.result()
    history = await workflow.fetch_history()
    calls = thread.call(counter.describe)
    thread.call(counter.reset)
    return Pass(
        api_calls=sum(c["count"] for c in calls["counts"] if c["verb"] == "list"),
        observe_cpu_s=observer.cpu_seconds[-1],
        capacity_cpu_s=observer.capacity_seconds[-1] if observer.capacity_seconds else 0.0,
        told=result.told,
        events=len(history.events),
        history_bytes=sum(event.ByteSize() for event in history.events),
        cache_cpu_s=thread_cpu(threads) - started_cpu,
    )


def change_one_percent(thread: SandboxThread, nodes: int) -> int:
    """Deletes one pod on 1% of the nodes: their free CPU and memory move.

    Pod `model-<i>` runs on node `i % nodes` in namespace `team-<i % 20>` (the synthetic
    cluster's layout), so pod `i` for `i < nodes` is on node `i`. Returns how many it deleted.
    """
    store = thread.sandbox.store
    deleted = 0
    for node in range(0, nodes, 100):
        namespace = f"team-{node % NAMESPACE_COUNT:02d}"
        thread.call(store.delete, PODS, namespace, f"model-{node:06d}")
        deleted += 1
    return deleted


def deep_size(root: object) -> int:
    """Bytes of `root` and everything it references, each object once."""
    seen: set[int] = set()
    stack = [root]
    total = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (bool, type)):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif hasattr(obj, "__slots__"):
            stack.extend(getattr(obj, slot) for slot in obj.__slots__ if hasattr(obj, slot))
        elif hasattr(obj, "__dict__"):
            stack.append(vars(obj))
    return total


def bench_pool(name: str, thread: SandboxThread, selector: dict[str, str]) -> PoolConfig:
    sandbox = thread.sandbox
    return parse_pool(
        name,
        {
            "mode": "external",
            "provider": "kubernetes",
            "gpuType": "RTXPro6000",
            "kubernetes": {
                "flavor": "generic",
                "endpoint": sandbox.url,
                "caCertificate": base64.b64encode(sandbox.ca.ca_pem).decode(),
                "nodeSelector": selector,
                "workerImage": "worker:latest",
                "credentials": TOKEN,
            },
        },
    )


async def until(check: Callable[[], bool], within: float = 600) -> None:
    async with asyncio.timeout(within):
        while not check():  # noqa: ASYNC110 - polling another thread's state
            await asyncio.sleep(0.05)


@dataclass
class Bench:
    """A synthetic cluster in the emulator, a Temporal dev server, and one pool on them."""

    thread: SandboxThread
    env: WorkflowEnvironment
    settings: ControlplaneSettings
    clients: KubeClients


@contextlib.asynccontextmanager
async def bench(
    nodes: int,
    pods_per_node: int,
    temporal: Path,
    pool_name: str,
    selector: dict[str, str],
    **settings: object,
) -> AsyncIterator[Bench]:
    options = SandboxOptions(static_tokens={TOKEN: "levers9-bench"})
    with SandboxThread(options) as thread:
        thread.call(load, thread.sandbox.store, nodes, nodes * pods_per_node)
        pool = bench_pool(pool_name, thread, selector)
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=str(temporal), data_converter=pydantic_data_converter
        )
        async with env:
            await ensure_search_attributes(env.client, "default")
            values = ControlplaneSettings.model_validate(
                {
                    "temporalAddress": env.client.service_client.config.target_host,
                    "taskQueue": f"bench-{uuid.uuid4()}",
                    "reconcileIntervalSeconds": 3600,
                    **settings,
                }
            )
            clients = KubeClients({pool_name: pool})
            try:
                yield Bench(thread, env, values, clients)
            finally:
                clients.close()


async def measure(nodes: int, pods_per_node: int, temporal: Path, cached: bool) -> dict[str, Any]:
    selector = {"cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000"}
    async with bench(nodes, pods_per_node, temporal, POOL, selector) as world:
        thread, env, settings, clients = world.thread, world.env, world.settings, world.clients
        figures: dict[str, Any] = {"nodes": nodes}
        async with PoolCaches(clients, [POOL] if cached else [], None) as caches:
            cache = caches.get(POOL)
            if cache is not None:
                synced_at = time.perf_counter()
                await until(lambda: cache.synced)
                figures["cache_sync_s"] = time.perf_counter() - synced_at
                figures["cache_memory_mib"] = deep_size(cache.state()) / 2**20
                figures["cache_counts"] = cache.counts()
            observer = TimedObserver(clients, caches.get)
            observer.cpu_seconds = []
            observer.capacity_seconds = []
            # The machine records the passes start go to a queue nobody polls: the 5,000 of
            # the first pass wait on the server (their own work is not what this measures).
            unpolled = settings.model_copy(update={"task_queue": f"{settings.task_queue}-m"})
            reconcile = ReconcileActivities(observer, env.client, unpolled)
            async with Worker(
                env.client,
                task_queue=settings.task_queue,
                workflows=WORKFLOWS,
                workflow_runner=RUNNER,
                activities=[reconcile.observe_pool],
                max_concurrent_activities=4,
            ):
                await sync_reconcile_schedules(env.client, [POOL], settings)
                schedule_id = f"reconcile:{POOL}"
                thread.call(thread.sandbox.parts.counter.reset)
                figures["first"] = await run_pass(env.client, thread, observer, schedule_id, cache)
                figures["idle"] = await run_pass(env.client, thread, observer, schedule_id, cache)
                pods_before = cache.counts()[CACHED_PODS] if cache is not None else 0
                cpu_before = thread_cpu(cache.threads()) if cache is not None else 0.0
                deleted = change_one_percent(thread, nodes)
                if cache is not None:
                    await until(lambda: cache.counts()[CACHED_PODS] == pods_before - deleted)
                # The cache's CPU counts from the change: its threads took the events.
                figures["changed"] = await run_pass(
                    env.client, thread, observer, schedule_id, cache, cpu_before
                )
    return figures


REACTION_POOL = "react"
REACTION_LABEL = "levers9.dev/bench"


async def reaction(nodes: int, pods_per_node: int, temporal: Path, times: int = 5) -> list[float]:
    """Seconds from a node created to its worker Job in the store, `times` nodes one by one,
    on a cluster of `nodes` other nodes and their pods (which the pool's pod watch follows)."""
    async with bench(
        nodes,
        pods_per_node,
        temporal,
        REACTION_POOL,
        {REACTION_LABEL: "reaction"},
        workerTokenSecret="bench-worker-token-secret-0123456789",
        gatewayAdvertisedAddress="127.0.0.1:1",
    ) as world:
        thread, env, settings, clients = world.thread, world.env, world.settings, world.clients
        store = thread.sandbox.store
        seconds: list[float] = []
        async with PoolCaches(clients, [REACTION_POOL], env.client) as caches:
            cache = caches.get(REACTION_POOL)
            assert cache is not None
            await until(lambda: cache.synced)
            async with Worker(
                env.client,
                task_queue=settings.task_queue,
                workflows=WORKFLOWS,
                workflow_runner=RUNNER,
                activities=controlplane_activities(clients, env.client, settings, None, caches),
            ):
                await sync_reconcile_schedules(env.client, [REACTION_POOL], settings)
                for i in range(times):
                    await asyncio.sleep(1.5)  # past the trigger's spacing
                    name = f"gke-react-{i}"
                    node = node_object(nodes + i)
                    node["metadata"]["name"] = name
                    node["metadata"]["labels"][REACTION_LABEL] = "reaction"
                    node["spec"] = {}  # untainted: flavor generic tolerates nothing
                    started = time.perf_counter()
                    thread.call(store.create, NODES, node)
                    selector = LabelSelector.parse(f"{NODE_LABEL}={name}")

                    def has_job(selector: LabelSelector = selector) -> bool:
                        page = thread.call(store.list, JOBS, "levers9", labels=selector)
                        return bool(page.items())

                    await until(has_job, within=60)
                    seconds.append(time.perf_counter() - started)
    return seconds


def _row(label: str, nodes: int, p: Pass) -> str:
    return (
        f"{nodes:>6,} {label:<12} {p.api_calls:>9} {p.observe_cpu_s:>10.3f} "
        f"{p.capacity_cpu_s:>11.3f} {p.cache_cpu_s:>9.3f} {p.told:>6} "
        f"{p.events:>7} {p.history_bytes / 1024:>10.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,1000,5000")
    parser.add_argument("--pods-per-node", type=int, default=20)
    parser.add_argument("--list", action="store_true", help="passes list (no cache)")
    parser.add_argument("--json", action="store_true", help="one JSON line per size")
    args = parser.parse_args()
    temporal = Path(sys.executable).parent / "temporal"
    sizes = [int(n) for n in args.nodes.split(",")]
    machine = {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu": cpu_model(),
        "python": platform.python_version(),
    }
    if not args.json:
        print(
            f"machine: nproc={machine['nproc']}, cpu={machine['cpu']}, python {machine['python']}"
        )
        header = (
            f"{'nodes':>6} {'pass':<12} {'API lists':>9} {'observe s':>10} {'capacity s':>11} "
            f"{'cache s':>9} {'told':>6} {'events':>7} {'history KiB':>10}"
        )
        print(header)
        print("-" * len(header))
    for size in sizes:
        started = time.perf_counter()
        figures = asyncio.run(measure(size, args.pods_per_node, temporal, not args.list))
        reacted = [] if args.list else asyncio.run(reaction(size, args.pods_per_node, temporal))
        if args.json:
            line: dict[str, Any] = {
                "nodes": size,
                "pods": size * args.pods_per_node,
                "cache": not args.list,
                **{
                    f"{label}_{k}": v
                    for label in ("first", "idle", "changed")
                    for k, v in dataclasses.asdict(figures[label]).items()
                },
                "idle_list_calls": figures["idle"].api_calls,
                "cache_memory_mib": round(figures.get("cache_memory_mib", 0.0), 1),
                "cache_sync_s": round(figures.get("cache_sync_s", 0.0), 2),
                "node_event_to_job_s": [round(s, 2) for s in reacted],
                "node_event_to_job_median_s": round(statistics.median(reacted), 2)
                if reacted
                else None,
                "machine": machine,
            }
            print(json.dumps(line), flush=True)
            continue
        for label in ("first", "idle", "changed"):
            print(_row(label if label != "changed" else "1% changed", size, figures[label]))
        if "cache_memory_mib" in figures:
            print(
                f"{'':>6} cache: synced in {figures['cache_sync_s']:.1f} s, "
                f"{figures['cache_memory_mib']:.1f} MiB for {figures['cache_counts']}"
            )
        if reacted:
            print(
                f"{'':>6} node created -> its worker Job: median "
                f"{statistics.median(reacted):.2f} s of {[round(s, 2) for s in reacted]}"
            )
        print(f"{'':>6} ({time.perf_counter() - started:.0f} s wall for this size)", flush=True)


if __name__ == "__main__":
    main()
