"""Deterministic workflows: one `<Noun>Workflow` per module (the pool-wide operations share
`pool_ops`), no I/O."""

from __future__ import annotations

from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from workflows.attach import AttachClusterWorkflow
from workflows.box import BoxWorkflow
from workflows.cluster import ClusterWorkflow
from workflows.cluster_session import ClusterSessionWorkflow
from workflows.disk import DiskWorkflow
from workflows.egress import EgressAllowlistWorkflow
from workflows.endpoint import EndpointWorkflow
from workflows.machine import MachineWorkflow
from workflows.pool import PoolWorkflow
from workflows.pool_ops import ImageRecopyWorkflow, RemovePoolWorkflow
from workflows.reconcile_pool import ReconcilePoolWorkflow
from workflows.task import TaskWorkflow
from workflows.volume import VolumeWorkflow
from workflows.worker import WorkerWorkflow
from workflows.workspace import WorkspaceWorkflow

WORKFLOWS = [
    ReconcilePoolWorkflow,
    MachineWorkflow,
    WorkerWorkflow,
    PoolWorkflow,
    TaskWorkflow,
    EndpointWorkflow,
    ClusterWorkflow,
    ClusterSessionWorkflow,
    EgressAllowlistWorkflow,
    ImageRecopyWorkflow,
    RemovePoolWorkflow,
    WorkspaceWorkflow,
    VolumeWorkflow,
    DiskWorkflow,
    BoxWorkflow,
]
"""What the controlplane's Temporal worker hosts. AttachClusterWorkflow runs on the task queue
of the `levers9 gke attach` process, with the operator's credentials."""

RUNNER = SandboxedWorkflowRunner(
    restrictions=SandboxRestrictions.default.with_passthrough_modules(
        "workflows", "activities", "levers9"
    )
)
"""The sandbox our workflows run in: Temporal's restrictions (no I/O, no clock, no threads), with
our own modules passed through instead of imported afresh for every workflow run. They hold
constants only, no state a run could leave for the next; re-importing them cost most of the
Temporal worker's CPU under a standing queue (benchmarks/README.md, placement)."""

__all__ = [
    "RUNNER",
    "WORKFLOWS",
    "AttachClusterWorkflow",
    "BoxWorkflow",
    "ClusterSessionWorkflow",
    "ClusterWorkflow",
    "DiskWorkflow",
    "EgressAllowlistWorkflow",
    "EndpointWorkflow",
    "ImageRecopyWorkflow",
    "MachineWorkflow",
    "PoolWorkflow",
    "ReconcilePoolWorkflow",
    "RemovePoolWorkflow",
    "TaskWorkflow",
    "VolumeWorkflow",
    "WorkerWorkflow",
    "WorkspaceWorkflow",
]
