"""Every activity the controlplane's Temporal worker hosts, built from its injected clients."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio.client import Client

from activities.aws import AwsActivities
from activities.dispatch import TaskActivities, TunnelEndpoints
from activities.drain import DrainActivities
from activities.endpoints import EndpointActivities
from activities.gcp import GcpActivities, gcp_clients
from activities.images import ImageActivities
from activities.kube import KubeActivities, KubeObserver
from activities.kube_clients import KubeClients
from activities.pool_cache import PoolCaches
from activities.pools import PoolActivities
from activities.reconcile import ReconcileActivities
from levers9.config import ControlplaneSettings


def cloud_activities(
    client: Client, clients: KubeClients, settings: ControlplaneSettings
) -> list[Callable[..., Any]]:
    """The cloud side: GCP (Application Default Credentials, built on first use, so a
    controlplane without them runs pools and fails only the cloud steps, saying why), AWS,
    the image copy, and the pool-wide operations."""
    gcp = GcpActivities(lambda: gcp_clients(settings.gcp_endpoint))
    aws = AwsActivities()
    images = ImageActivities(settings.mirrors(), settings.insecure(), aws)
    pools = PoolActivities(client, clients, settings)
    return [
        gcp.describe_cluster,
        gcp.append_authorized_networks,
        gcp.ensure_firewall,
        gcp.ensure_service_account,
        gcp.ensure_developer_binding,
        gcp.ensure_key,
        gcp.ensure_repository,
        aws.discover_egress_ips,
        images.copy_image,
        pools.recopy_target,
        pools.pool_records,
        pools.delete_reconcile_schedule,
        pools.delete_pool_jobs,
        pools.delete_pool_namespace,
        pools.ensure_egress_workflow,
    ]


def attach_activities(client: Client, settings: ControlplaneSettings) -> list[Callable[..., Any]]:
    """What `levers9 gke attach` hosts in the operator's process: the cloud side, with the
    operator's credentials (no pool clients: attach touches no cluster's Kubernetes API)."""
    return cloud_activities(client, KubeClients({}), settings)


def replica_activities(
    client: Client, settings: ControlplaneSettings, tunnels: TunnelEndpoints
) -> list[Callable[..., Any]]:
    """What this replica's own task queue serves: calls to the workers whose tunnel sessions
    it holds (they can only be reached from here)."""
    tasks = TaskActivities(client, settings, tunnels)
    return [
        tasks.run_task,
        tasks.get_task,
        tasks.cancel_task,
        tasks.checkpoint_task,
        tasks.delete_node_disk,
        tasks.delete_node_checkpoint,
        tasks.node_disk_use,
    ]


def controlplane_activities(
    clients: KubeClients,
    client: Client,
    settings: ControlplaneSettings,
    tunnels: TunnelEndpoints | None = None,
    caches: PoolCaches | None = None,
) -> list[Callable[..., Any]]:
    observer = KubeObserver(clients, caches.get if caches is not None else None)
    reconcile = ReconcileActivities(observer, client, settings)
    kube = KubeActivities(clients, settings)
    drain = DrainActivities(client, settings)
    tasks = TaskActivities(client, settings, tunnels)
    endpoints = EndpointActivities(clients)
    return [
        reconcile.observe_pool,
        kube.create_worker_job,
        kube.delete_worker_job,
        kube.describe_worker_pod,
        kube.mark_worker_drained,
        drain.boxes_on_worker,
        drain.stop_boxes,
        tasks.place_task,
        tasks.request_placement,
        tasks.worker_ended,
        tasks.worker_route,
        tasks.run_task,
        tasks.get_task,
        tasks.cancel_task,
        tasks.checkpoint_queue,
        tasks.checkpoint_task,
        tasks.delete_stored_checkpoint,
        tasks.delete_node_checkpoint,
        tasks.task_node,
        tasks.disk_worker,
        tasks.delete_node_disk,
        tasks.node_disk_use,
        endpoints.replica_environment,
        *cloud_activities(client, clients, settings),
    ]
