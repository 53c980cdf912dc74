"""The simulated cluster behind the sandbox's API: scheduler, kubelets, Job, ReplicaSet and
Deployment controllers, node lifecycle, GPUs. `Cluster` starts and stops them as one."""

from __future__ import annotations

from sandbox.cluster.cluster import Cluster

__all__ = ["Cluster"]
