"""Deterministic workflows: one `<Noun>Workflow` per module, no I/O."""

from __future__ import annotations

from workflows.machine import MachineWorkflow
from workflows.reconcile_pool import ReconcilePoolWorkflow
from workflows.worker import WorkerWorkflow

WORKFLOWS = [ReconcilePoolWorkflow, MachineWorkflow, WorkerWorkflow]

__all__ = ["WORKFLOWS", "MachineWorkflow", "ReconcilePoolWorkflow", "WorkerWorkflow"]
