"""What a reconcile pass costs as the cluster grows: Kubernetes API calls, CPU seconds of the
observation, Temporal history events and bytes, for an idle pass and a pass with 1% of nodes
changed. Targets (issue 4): API calls constant in node count; an idle pass at most 20 events and
64 KiB of history at 5,000 nodes; capacity for 5,000 nodes / 100,000 pods in at most 1 CPU-s.

The cluster is synthetic (GPU nodes, 20 pods each, loaded into the emulator's store); the pool
reaches it over HTTPS with a bearer token (flavor generic) through the real observe activity;
passes run as the `reconcile:<pool>` schedule's workflows on a Temporal dev server, triggered.

    python benchmarks/reconcile.py [--nodes 100,1000,5000] [--pods-per-node 20]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import platform
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.kube import KubeObserver
from activities.kube_clients import KubeClients
from activities.reconcile import ReconcileActivities
from levers9.capacity import NodeCapacity, PoolView
from levers9.config import ControlplaneSettings, parse_pool
from levers9.models import ReconcilePoolResult
from levers9.temporal import ensure_search_attributes, sync_reconcile_schedules
from sandbox.resources import PODS
from sandbox.server import SandboxOptions
from sandbox.synthetic import NAMESPACE_COUNT, cpu_model, load
from sandbox.threaded import SandboxThread
from workflows import WORKFLOWS

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


async def run_pass(
    client: Client, thread: SandboxThread, observer: TimedObserver, schedule_id: str
) -> Pass:
    counter = thread.sandbox.parts.counter
    thread.call(counter.reset)
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
    return Pass(
        api_calls=sum(c["count"] for c in calls["counts"] if c["verb"] == "list"),
        observe_cpu_s=observer.cpu_seconds[-1],
        capacity_cpu_s=observer.capacity_seconds[-1],
        told=result.told,
        events=len(history.events),
        history_bytes=sum(event.ByteSize() for event in history.events),
    )


def change_one_percent(thread: SandboxThread, nodes: int) -> None:
    """Deletes one pod on 1% of the nodes: their free CPU and memory move.

    Pod `model-<i>` runs on node `i % nodes` in namespace `team-<i % 20>` (the synthetic
    cluster's layout), so pod `i` for `i < nodes` is on node `i`.
    """
    store = thread.sandbox.store
    for node in range(0, nodes, 100):
        namespace = f"team-{node % NAMESPACE_COUNT:02d}"
        thread.call(store.delete, PODS, namespace, f"model-{node:06d}")


async def measure(nodes: int, pods_per_node: int, temporal: Path) -> dict[str, Any]:
    options = SandboxOptions(static_tokens={TOKEN: "levers9-bench"})
    with SandboxThread(options) as thread:
        sandbox = thread.sandbox
        thread.call(load, sandbox.store, nodes, nodes * pods_per_node)
        pool = parse_pool(
            POOL,
            {
                "mode": "external",
                "provider": "kubernetes",
                "gpuType": "RTXPro6000",
                "kubernetes": {
                    "flavor": "generic",
                    "endpoint": sandbox.url,
                    "caCertificate": base64.b64encode(sandbox.ca.ca_pem).decode(),
                    "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000"},
                    "workerImage": "worker:latest",
                    "credentials": TOKEN,
                },
            },
        )
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=str(temporal), data_converter=pydantic_data_converter
        )
        async with env:
            await ensure_search_attributes(env.client, "default")
            settings = ControlplaneSettings.model_validate(
                {
                    "temporalAddress": env.client.service_client.config.target_host,
                    "taskQueue": f"bench-{uuid.uuid4()}",
                    "reconcileIntervalSeconds": 3600,
                }
            )
            clients = KubeClients({POOL: pool})
            observer = TimedObserver(clients)
            observer.cpu_seconds = []
            observer.capacity_seconds = []
            reconcile = ReconcileActivities(observer, env.client, settings)
            async with Worker(
                env.client,
                task_queue=settings.task_queue,
                workflows=WORKFLOWS,
                activities=[reconcile.observe_pool],
                max_concurrent_activities=4,
            ):
                await sync_reconcile_schedules(env.client, [POOL], settings)
                schedule_id = f"reconcile:{POOL}"
                first = await run_pass(env.client, thread, observer, schedule_id)
                idle = await run_pass(env.client, thread, observer, schedule_id)
                change_one_percent(thread, nodes)
                changed = await run_pass(env.client, thread, observer, schedule_id)
            clients.close()
    return {"nodes": nodes, "first": first, "idle": idle, "changed": changed}


def _row(label: str, nodes: int, p: Pass) -> str:
    return (
        f"{nodes:>6,} {label:<12} {p.api_calls:>9} {p.observe_cpu_s:>10.2f} "
        f"{p.capacity_cpu_s:>11.2f} {p.told:>6} "
        f"{p.events:>7} {p.history_bytes / 1024:>10.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,1000,5000")
    parser.add_argument("--pods-per-node", type=int, default=20)
    args = parser.parse_args()
    temporal = Path(sys.executable).parent / "temporal"
    sizes = [int(n) for n in args.nodes.split(",")]
    print(
        f"machine: nproc={len(os.sched_getaffinity(0))}, cpu={cpu_model()}, "
        f"python {platform.python_version()}"
    )
    header = (
        f"{'nodes':>6} {'pass':<12} {'API lists':>9} {'observe s':>10} {'capacity s':>11} "
        f"{'told':>6} "
        f"{'events':>7} {'history KiB':>10}"
    )
    print(header)
    print("-" * len(header))
    report: Callable[[str], None] = print
    for size in sizes:
        started = time.perf_counter()
        figures = asyncio.run(measure(size, args.pods_per_node, temporal))
        for label in ("first", "idle", "changed"):
            report(_row(label if label != "changed" else "1% changed", size, figures[label]))
        report(f"{'':>6} ({time.perf_counter() - started:.0f} s wall for this size)")


if __name__ == "__main__":
    main()
