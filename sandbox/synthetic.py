"""Synthetic clusters for benchmarks: GPU nodes and pods of typical size, loaded straight into
the emulator's store (no HTTP), so a 5,000-node, 100,000-pod cluster takes seconds to build.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

from sandbox.resources import NAMESPACES, NODES, PODS
from sandbox.store import Store

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


def cpu_model() -> str:
    """The machine's CPU model, for the figures a benchmark prints."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
