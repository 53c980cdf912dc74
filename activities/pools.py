"""Pool-wide operations of the controlplane: what image recopy, pool removal and the egress
allowlist need beyond one worker's Job. Clients injected (Temporal, the pools' Kubernetes
clients, the settings); every step is idempotent (a second delete of a thing gone is a no-op).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from kubernetes import client as k8s
from pydantic import BaseModel
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from activities.kube import job_selector, kube_error
from activities.kube_clients import KubeClients, UnknownPool
from levers9.config import ControlplaneSettings
from levers9.core.manifests import disruption_budget_name
from levers9.models import MACHINE_WORKFLOW, WORKER_WORKFLOW, reconcile_schedule_id
from levers9.providers.gke import EGRESS_WORKFLOW, CopyImageInput, EgressInput, egress_workflow_id
from levers9.records.found import delivered, is_running

T = TypeVar("T")


class PoolRecords(BaseModel):
    """The running records of one pool: worker ids, machine node names."""

    workers: list[str]
    machines: list[str]


class EgressStart(BaseModel):
    """Start `egress:<cluster>` if absent (on the controlplane's queue) and tell it what is
    allowlisted now."""

    input: EgressInput
    task_queue: str
    cidrs: list[str]


class PoolActivities:
    def __init__(
        self, client: Client, clients: KubeClients, settings: ControlplaneSettings
    ) -> None:
        self._client = client
        self._clients = clients
        self._settings = settings

    @activity.defn
    async def recopy_target(self, pool_name: str) -> CopyImageInput:
        """From the controlplane's registry to the pool's `workerImage`."""
        try:
            pool = self._clients.pool(pool_name)
        except UnknownPool:
            raise ApplicationError(
                f"pool {pool_name} is not in this controlplane's values", non_retryable=True
            ) from None
        if not self._settings.source_image:
            raise ApplicationError(
                "no source image: set LEVERS9_SOURCE_IMAGE (sourceImage) to the worker image in"
                " the controlplane's ECR",
                type="ConfigMissing",
                non_retryable=True,
            )
        return CopyImageInput(
            source=self._settings.source_image, destination=pool.kubernetes.worker_image
        )

    @activity.defn
    async def pool_records(self, pool_name: str) -> PoolRecords:
        workers = await self._running(WORKER_WORKFLOW, pool_name)
        machines = await self._running(MACHINE_WORKFLOW, pool_name)
        return PoolRecords(
            workers=[w.removeprefix(f"worker:{pool_name}:") for w in workers],
            machines=[m.removeprefix(f"machine:{pool_name}:") for m in machines],
        )

    async def _running(self, workflow_type: str, pool_name: str) -> list[str]:
        query = (
            f"WorkflowType='{workflow_type}' AND ExecutionStatus='Running'"
            f" AND PoolName='{pool_name}' AND TaskQueue='{self._settings.task_queue}'"
        )
        return sorted([w.id async for w in self._client.list_workflows(query)])

    @activity.defn
    async def delete_reconcile_schedule(self, pool_name: str) -> bool:
        """False when there was none."""
        handle = self._client.get_schedule_handle(reconcile_schedule_id(pool_name))
        return await delivered(handle.delete())

    @activity.defn
    async def delete_pool_jobs(self, pool_name: str) -> list[str]:
        """Deletes every worker Job of the pool (and, by ownership, pods and token Secrets)
        and the pool's PodDisruptionBudget; returns the Jobs' names. Non-retryable when the
        pool's cluster is out of reach (no longer in the values: no credentials)."""

        def delete() -> list[str]:
            pool = self._clients.pool(pool_name)
            api = self._clients.api(pool_name)
            batch = k8s.BatchV1Api(api)
            namespace = pool.kubernetes.namespace
            try:
                k8s.PolicyV1Api(api).delete_namespaced_pod_disruption_budget(
                    disruption_budget_name(pool_name), namespace
                )
            except k8s.ApiException as exc:
                if exc.status != 404:
                    raise
            jobs = batch.list_namespaced_job(namespace, label_selector=job_selector(pool_name))
            names = [job.metadata.name for job in jobs.items if job.metadata and job.metadata.name]
            for name in names:
                try:
                    batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
                except k8s.ApiException as exc:
                    if exc.status != 404:
                        raise
            return names

        return await self._in_cluster(pool_name, "delete the pool's worker Jobs", delete)

    @activity.defn
    async def delete_pool_namespace(self, pool_name: str) -> bool:
        def delete() -> bool:
            pool = self._clients.pool(pool_name)
            core = k8s.CoreV1Api(self._clients.api(pool_name))
            try:
                core.delete_namespace(pool.kubernetes.namespace)
            except k8s.ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            return True

        return await self._in_cluster(pool_name, "delete the pool's namespace", delete)

    async def _in_cluster(self, pool_name: str, doing: str, call: Callable[[], T]) -> T:
        """`call` (blocking Kubernetes calls) off the event loop; its API errors and an unknown
        pool as `kube_error` says (permanent ones non-retryable, with the fix)."""
        try:
            return await asyncio.to_thread(call)
        except (k8s.ApiException, UnknownPool) as exc:
            raise kube_error(exc, doing, pool_name) from None

    @activity.defn
    async def ensure_egress_workflow(self, start: EgressStart) -> bool:
        """True when it was not running (started now)."""
        cluster = start.input.cluster.cluster
        handle = self._client.get_workflow_handle(egress_workflow_id(cluster))
        running = await is_running(handle)
        await self._client.start_workflow(
            EGRESS_WORKFLOW,
            start.input,
            id=egress_workflow_id(cluster),
            task_queue=start.task_queue,
            start_signal="allowlisted",
            start_signal_args=[start.cidrs],
        )
        if running:  # a rerun of attach: the rule's tags and upkeep follow what it says now
            await handle.signal("attached", start.input)
        return not running
