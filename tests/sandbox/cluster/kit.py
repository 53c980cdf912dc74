"""Builders and waits shared by the cluster tests: a fast scenario, manifests, polling."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from sandbox.cluster import Cluster
from sandbox.cluster.objects import condition
from sandbox.registry import Registry
from sandbox.resources import PODS
from sandbox.scenario import Images, ProcessImage, Scenario, Timing

T = TypeVar("T")
MakeCluster = Callable[[Scenario], Awaitable[Cluster]]

PYTHON_IMAGE = "sandbox.local/python:3"
"""A process image whose ENTRYPOINT is `python`: the kubelet runs its containers locally."""
SERVER_IMAGE = "vllm/vllm-openai:v0.10.1"
GPU_1X = "gke-demo-gpu-1x-5d3a1f2b-x7k9"
GPU_2X = "gke-demo-gpu-2x-8e4b2c6d-q3n8"
GPU_4X = "gke-demo-gpu-4x-2f7c9e1a-m5p2"
CPU_NODE = "gke-demo-default-pool-9b1d4e7f-w2c6"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

FAST = Timing(
    heartbeat_seconds=0.3,
    resync_seconds=2,
    image_pull_backoff_seconds=0.2,
    image_pull_backoff_max_seconds=0.8,
    crash_loop_backoff_seconds=0.2,
    crash_loop_backoff_max_seconds=0.8,
    job_backoff_seconds=0.05,
    job_backoff_max_seconds=0.2,
    # Pod GC after 0.3 s, not GKE's 40 to 60 s: tests of a vanished node's pods need not wait.
    orphan_pod_quarantine_seconds=0.3,
    pod_gc_period_seconds=0.0,
)


def fast_scenario(**changes: Any) -> Scenario:
    """The default scenario with short delays and a local Python process image."""
    base = Scenario.load()
    images = Images(
        pull_seconds=0.05,
        present=(*base.images.present, PYTHON_IMAGE),
        process={**base.images.process, PYTHON_IMAGE: ProcessImage(entrypoint=("python",))},
    )
    return base.model_copy(update={"timing": FAST, "images": images, **changes})


async def wait_for(check: Callable[[], T | None], within: float = 10.0) -> T:
    """Polls `check` until it returns something truthy, and returns that."""
    async with asyncio.timeout(within):
        while True:
            value = check()
            if value:
                return value
            await asyncio.sleep(0.02)


def pod_manifest(
    name: str,
    *,
    image: str = PYTHON_IMAGE,
    command: list[str] | None = None,
    gpus: int = 0,
    node_name: str | None = None,
    restart_policy: str = "Never",
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": image}
    if command is not None:
        container["command"] = command
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    for key in ("env", "volumeMounts", "args"):
        if key in spec:
            container[key] = spec.pop(key)
    body: dict[str, Any] = {"containers": [container], "restartPolicy": restart_policy, **spec}
    if node_name is not None:
        body["nodeName"] = node_name
    return {"metadata": {"name": name, "namespace": "default"}, "spec": body}


def python(code: str) -> list[str]:
    return ["python", "-c", code]


def job_manifest(name: str, command: list[str], backoff_limit: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "backoffLimit": backoff_limit,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": PYTHON_IMAGE, "command": command}],
                }
            },
        },
    }


def pod(registry: Registry, name: str) -> dict[str, Any] | None:
    """The pod, or None while it does not exist."""
    return next(
        (p for p in registry.list(PODS, "default").items() if p["metadata"]["name"] == name), None
    )


def phase(registry: Registry, name: str, wanted: str) -> dict[str, Any] | None:
    found = pod(registry, name)
    return found if found and found["status"].get("phase") == wanted else None


def scheduled_condition(obj: dict[str, Any]) -> dict[str, Any] | None:
    return condition(obj, "PodScheduled")
