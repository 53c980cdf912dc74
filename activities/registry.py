"""Every activity the controlplane's Temporal worker hosts, built from its injected clients."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio.client import Client

from activities.kube import KubeActivities, KubeObserver
from activities.kube_clients import KubeClients
from activities.reconcile import ReconcileActivities
from activities.tasks import TaskActivities
from levers9.config import ControlplaneSettings


def controlplane_activities(
    clients: KubeClients, client: Client, settings: ControlplaneSettings
) -> list[Callable[..., Any]]:
    reconcile = ReconcileActivities(KubeObserver(clients), client, settings)
    kube = KubeActivities(clients, settings)
    tasks = TaskActivities(client, settings)
    return [
        reconcile.observe_pool,
        kube.create_worker_job,
        kube.delete_worker_job,
        kube.describe_worker_pod,
        tasks.place_task,
        tasks.run_task,
        tasks.get_task,
    ]
