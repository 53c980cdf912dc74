"""Deterministic workflows: one `<Noun>Workflow` per module, no I/O."""

from __future__ import annotations

from workflows.machine import MachineWorkflow
from workflows.pool import PoolWorkflow
from workflows.reconcile_pool import ReconcilePoolWorkflow
from workflows.task import TaskWorkflow
from workflows.worker import WorkerWorkflow

WORKFLOWS = [ReconcilePoolWorkflow, MachineWorkflow, WorkerWorkflow, PoolWorkflow, TaskWorkflow]

__all__ = [
    "WORKFLOWS",
    "MachineWorkflow",
    "PoolWorkflow",
    "ReconcilePoolWorkflow",
    "TaskWorkflow",
    "WorkerWorkflow",
]
