"""Deterministic workflows: one `<Noun>Workflow` per module, no I/O."""

from __future__ import annotations

from workflows.reconcile_pool import ReconcilePoolWorkflow

WORKFLOWS = [ReconcilePoolWorkflow]

__all__ = ["WORKFLOWS", "ReconcilePoolWorkflow"]
