"""How fast the official client lists 100,000 pods over 5,000 nodes from the API emulator.

Loads the objects straight into the emulator's store (no HTTP), then lists every pod across
namespaces in pages of 500 with the official Python client, twice: as the client's model
objects (what the product does) and as raw JSON (the client's transport only, which shows how
much of the time is the client's own deserialization). The emulator runs on its own thread;
its CPU seconds are that thread's, measured there.

    python benchmarks/list_pods.py [--nodes 5000] [--pods 100000] [--page 500]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client

from levers9.sandbox.resources import NAMESPACES, NODES, PODS
from levers9.sandbox.store import Store
from levers9.sandbox.threaded import SandboxThread

NAMESPACE_COUNT = 20


def node_object(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"gke-gpu-{i:05d}",
            "labels": {
                "cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000",
                "cloud.google.com/gke-nodepool": f"pool-{i % 3}",
                "kubernetes.io/hostname": f"gke-gpu-{i:05d}",
            },
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "48", "memory": "192Gi", "nvidia.com/gpu": "4"},
            "allocatable": {"cpu": "47", "memory": "180Gi", "nvidia.com/gpu": "4"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "addresses": [{"type": "InternalIP", "address": f"10.{i // 250}.{i % 250}.2"}],
        },
    }


def pod_object(i: int, nodes: int) -> dict[str, Any]:
    """A pod of typical size (about 1.5 KB of JSON): requests, a GPU limit, status."""
    namespace = f"team-{i % NAMESPACE_COUNT:02d}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"model-{i:06d}",
            "namespace": namespace,
            "labels": {"app": "model-server", "shard": str(i % 16)},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "model-7d9f",
                    "uid": "00000000-0000-4000-8000-000000000001",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": f"gke-gpu-{i % nodes:05d}",
            "containers": [
                {
                    "name": "server",
                    "image": "us-docker.pkg.dev/demo/models/server:1.4.2",
                    "args": ["--port=8000", "--max-batch=32"],
                    "ports": [{"containerPort": 8000, "protocol": "TCP"}],
                    "resources": {
                        "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
                        "limits": {"nvidia.com/gpu": "1"},
                    },
                }
            ],
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": f"10.200.{(i // 250) % 250}.{i % 250}",
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": [
                {
                    "name": "server",
                    "ready": True,
                    "restartCount": 0,
                    "image": "us-docker.pkg.dev/demo/models/server:1.4.2",
                    "imageID": "us-docker.pkg.dev/demo/models/server@sha256:" + "ab" * 32,
                    "containerID": f"containerd://{i:064x}",
                    "state": {"running": {"startedAt": "2026-09-18T10:00:00Z"}},
                }
            ],
        },
    }


def load(store: Store, nodes: int, pods: int) -> None:
    for n in range(NAMESPACE_COUNT):
        store.create(
            NAMESPACES,
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"team-{n:02d}"}},
        )
    for i in range(nodes):
        store.create(NODES, node_object(i))
    for i in range(pods):
        store.create(PODS, pod_object(i, nodes))


def list_all(core: Any, page_size: int, raw: bool) -> tuple[int, int]:
    """Lists every pod in pages; returns (pages, pods)."""
    token: str | None = None
    pages = count = 0
    while True:
        if raw:
            response = core.list_pod_for_all_namespaces(
                limit=page_size, _continue=token, _preload_content=False
            )
            body = json.loads(response.data)
            count += len(body["items"])
            token = body["metadata"].get("continue")
        else:
            page = core.list_pod_for_all_namespaces(limit=page_size, _continue=token)
            count += len(page.items)
            token = page.metadata._continue
        pages += 1
        if not token:
            return pages, count


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def measure(thread: SandboxThread, run: Callable[[], tuple[int, int]]) -> dict[str, float]:
    cpu_before = thread.call(time.thread_time)
    started = time.perf_counter()
    pages, pods = run()
    seconds = time.perf_counter() - started
    cpu = thread.call(time.thread_time) - cpu_before
    return {
        "seconds": seconds,
        "pages": pages,
        "pods": pods,
        "pods_per_s": pods / seconds,
        "emulator_cpu_s": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--page", type=int, default=500)
    args = parser.parse_args()

    with SandboxThread() as thread, tempfile.TemporaryDirectory() as tmp:
        sandbox = thread.sandbox
        started = time.perf_counter()
        thread.run(_load_async(sandbox.store, args.nodes, args.pods), timeout=None)
        load_seconds = time.perf_counter() - started
        ca = Path(tmp, "ca.crt")
        ca.write_bytes(sandbox.ca.ca_pem)
        config = client.Configuration()
        config.host = sandbox.url
        config.ssl_ca_cert = str(ca)
        config.api_key = {"authorization": f"Bearer {sandbox.admin_token}"}
        core = client.CoreV1Api(client.ApiClient(config))
        rows = [
            ("official client, models", measure(thread, lambda: list_all(core, args.page, False))),
            ("official client, raw JSON", measure(thread, lambda: list_all(core, args.page, True))),
        ]

    print(
        f"loaded {args.nodes:,} nodes and {args.pods:,} pods into the store in {load_seconds:.1f} s"
    )
    print(
        f"machine: nproc={len(os.sched_getaffinity(0))}, cpu={cpu_model()}, "
        f"python {platform.python_version()}"
    )
    print()
    header = (
        f"{'list all pods, pages of ' + str(args.page):<30} {'seconds':>8} {'pages':>6} "
        f"{'pods':>8} {'pods/s':>9} {'emulator CPU s':>15}"
    )
    print(header)
    print("-" * len(header))
    for label, r in rows:
        print(
            f"{label:<30} {r['seconds']:>8.2f} {r['pages']:>6.0f} {r['pods']:>8,.0f} "
            f"{r['pods_per_s']:>9,.0f} {r['emulator_cpu_s']:>15.2f}"
        )


async def _load_async(store: Store, nodes: int, pods: int) -> None:
    load(store, nodes, pods)


if __name__ == "__main__":
    main()
