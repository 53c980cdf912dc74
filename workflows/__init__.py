"""Deterministic workflows: one `<Noun>Workflow` per module (the pool-wide operations share
`pool_ops`), no I/O."""

from __future__ import annotations

from workflows.attach import AttachClusterWorkflow
from workflows.egress import EgressAllowlistWorkflow
from workflows.machine import MachineWorkflow
from workflows.pool import PoolWorkflow
from workflows.pool_ops import ImageRecopyWorkflow, RemovePoolWorkflow
from workflows.reconcile_pool import ReconcilePoolWorkflow
from workflows.task import TaskWorkflow
from workflows.worker import WorkerWorkflow

WORKFLOWS = [
    ReconcilePoolWorkflow,
    MachineWorkflow,
    WorkerWorkflow,
    PoolWorkflow,
    TaskWorkflow,
    EgressAllowlistWorkflow,
    ImageRecopyWorkflow,
    RemovePoolWorkflow,
]
"""What the controlplane's Temporal worker hosts. AttachClusterWorkflow runs on the task queue
of the `levers9 gke attach` process, with the operator's credentials."""

__all__ = [
    "WORKFLOWS",
    "AttachClusterWorkflow",
    "EgressAllowlistWorkflow",
    "ImageRecopyWorkflow",
    "MachineWorkflow",
    "PoolWorkflow",
    "ReconcilePoolWorkflow",
    "RemovePoolWorkflow",
    "TaskWorkflow",
    "WorkerWorkflow",
]
