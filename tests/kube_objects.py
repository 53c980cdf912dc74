"""Kubernetes objects as the API returns them (JSON dicts), for the pure modules' tests."""

from __future__ import annotations

from typing import Any

from levers9.contract import GPU
from levers9.core.capacity import (
    ACCELERATOR_LABEL,
    GKE_GPU_TOLERATION,
    MANAGED_BY,
    NODE_LABEL,
    POOL_LABEL,
    WORKER_ID_LABEL,
    PoolView,
)

GPU_TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
POOL = PoolView(
    pool_name="gke-rtx6000",
    node_selector={"cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000"},
    tolerations=(GKE_GPU_TOLERATION,),
)
"""The demo's GKE pool as capacity sees it."""


def node(
    name: str = "gke-gpu-4x-1",
    gpus: int = 4,
    *,
    accelerator: str | None = "nvidia-rtx-pro-6000",
    ready: bool = True,
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
    allocatable_gpus: int | None = None,
    cpu: str = "48",
    memory: str = "192Gi",
    external_ip: str = "127.0.10.4",
) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if accelerator:
        labels[ACCELERATOR_LABEL] = accelerator
    capacity = {"cpu": cpu, "memory": memory, GPU: str(gpus)}
    allocatable = {**capacity, GPU: str(gpus if allocatable_gpus is None else allocatable_gpus)}
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "unschedulable": unschedulable,
            "taints": [GPU_TAINT] if taints is None and accelerator else (taints or []),
        },
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "ExternalIP", "address": external_ip},
                {"type": "Hostname", "address": name},
            ],
        },
    }


def container(gpus: int = 0, cpu: str | None = None, memory: str | None = None) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    limits = {GPU: str(gpus)} if gpus else {}
    return {"name": "main", "image": "x", "resources": {"requests": requests, "limits": limits}}


def pod(
    name: str = "model-server-abc12",
    node_name: str | None = "gke-gpu-4x-1",
    *,
    gpus: int = 0,
    cpu: str | None = None,
    memory: str | None = None,
    phase: str = "Running",
    init: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    terminating: bool = False,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "default", "labels": labels or {}}
    if terminating:
        metadata["deletionTimestamp"] = "2026-09-18T10:00:00Z"
    spec: dict[str, Any] = {"containers": [container(gpus, cpu, memory)]}
    if node_name:
        spec["nodeName"] = node_name
    if init:
        spec["initContainers"] = init
    return {"metadata": metadata, "spec": spec, "status": {"phase": phase}}


def worker_labels(pool: str, node_name: str, worker_id: str) -> dict[str, str]:
    return {
        MANAGED_BY: "levers9",
        POOL_LABEL: pool,
        NODE_LABEL: node_name,
        WORKER_ID_LABEL: worker_id,
    }


def worker_job(
    pool: str = "gke-rtx6000",
    node_name: str = "gke-gpu-4x-1",
    worker_id: str = "w1",
    gpus: int = 2,
    *,
    finished: str | None = None,
) -> dict[str, Any]:
    conditions = [{"type": finished, "status": "True"}] if finished else []
    return {
        "metadata": {
            "name": f"worker-{pool}-{worker_id}",
            "namespace": "levers9",
            "labels": worker_labels(pool, node_name, worker_id),
        },
        "spec": {"template": {"spec": {"containers": [container(gpus)]}}},
        "status": {"conditions": conditions},
    }
