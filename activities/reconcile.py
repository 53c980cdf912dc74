"""One reconcile pass's I/O: observe the pool, diff against the previous pass, tell the machines.

Signal-with-start of `MachineWorkflow` happens here, through the Temporal client, so that a pass
writes history only in proportion to the nodes that changed: the ReconcilePoolWorkflow itself
records one activity, whatever the cluster's size.

A pass whose settings (`workerIdleMinutes`, `workerRecordTtlMinutes`) differ from the previous
pass's (the controlplane restarted with new values) signals `settings` to every running machine
of the pool, which passes them to its worker: what runs follows the values, not only what
starts after them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import urllib3
from kubernetes import client as k8s
from temporalio import activity
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.heartbeat import heartbeating
from activities.kube import KubeObserver, kube_error
from activities.kube_clients import UnknownPool
from levers9.config import ControlplaneSettings
from levers9.core.capacity import NodeCapacity
from levers9.core.observation import diff, fingerprints, vanished
from levers9.logs import get_logger
from levers9.models import (
    MACHINE_WORKFLOW,
    POOL_WORKFLOW,
    MachineInput,
    ObservePoolInput,
    ObservePoolResult,
    PoolInput,
    RunRef,
    WorkerTimings,
    machine_workflow_id,
    pool_workflow_id,
)
from levers9.records.found import delivered
from levers9.search_attributes import GPU_TYPE, NODE_NAME, POOL_NAME
from levers9.telemetry import span

SIGNAL_CONCURRENCY = 32
UNABLE = "unable to reconcile cluster nodes"

log = get_logger("levers9.reconcile")


class ReconcileActivities:
    """Observes a pool and tells its machines; Kubernetes and Temporal clients injected."""

    def __init__(
        self, observer: KubeObserver, client: Client, settings: ControlplaneSettings
    ) -> None:
        self._observer = observer
        self._client = client
        self._task_queue = settings.task_queue
        self._timings = WorkerTimings(
            idle_seconds=settings.worker_idle_minutes * 60,
            record_ttl_seconds=settings.worker_record_ttl_minutes * 60,
        )

    @activity.defn
    async def observe_pool(self, input: ObservePoolInput) -> ObservePoolResult:
        async with heartbeating():
            return await self._observe_pool(input)

    async def _observe_pool(self, input: ObservePoolInput) -> ObservePoolResult:
        previous = await self._previous_result(input.previous)
        with span("kubernetes observe pool", pool_name=input.pool_name):
            nodes, calls = await self._observe(input.pool_name)
        await self._ensure_pool_workflow(input.pool_name)
        # Settings first: a machine told of a node change below starts its worker with them.
        settings_told = 0
        if previous is not None and previous.timings != self._timings:
            settings_told = await self._tell_settings(input.pool_name)
        before = previous.fingerprints if previous is not None else None
        changes = diff(None if input.full_resync else before, nodes)
        await self._tell(input.pool_name, [nodes[name] for name in changes.changed])
        # Against the running machine records (a visibility list) when the last pass's
        # fingerprints say a node vanished, and on every pass that has none to say it: a full
        # resync (so a `gone` lost once is told again) or a pass without a previous one.
        gone: list[str] = []
        if input.full_resync or before is None or vanished(before, nodes):
            gone = await self._gone(input.pool_name, set(nodes))
        return ObservePoolResult(
            fingerprints=fingerprints(nodes),
            nodes=len(nodes),
            machines=sum(1 for node in nodes.values() if node.machine),
            told=len(changes.changed),
            gone=len(gone),
            api_calls=calls,
            timings=self._timings,
            settings_told=settings_told,
        )

    async def _observe(self, pool_name: str) -> tuple[dict[str, NodeCapacity], int]:
        try:
            return await asyncio.to_thread(self._observer.observe, pool_name)
        except (k8s.ApiException, UnknownPool) as exc:
            error = kube_error(exc, UNABLE, pool_name)
            text = error.message if isinstance(error, ApplicationError) else str(error)
            log.error(UNABLE, pool_name=pool_name, error=text.removeprefix(f"{UNABLE}: "))
            raise error from None
        except urllib3.exceptions.HTTPError as exc:
            log.error(UNABLE, pool_name=pool_name, error=f"timeout: {type(exc).__name__}")
            raise ApplicationError(
                f"{UNABLE}: {type(exc).__name__} (retrying)", type="KubernetesUnavailable"
            ) from None

    async def _ensure_pool_workflow(self, pool_name: str) -> None:
        """Placement runs before any task asks: workers announce their cards to it."""
        await self._client.start_workflow(
            POOL_WORKFLOW,
            PoolInput(pool_name=pool_name),
            id=pool_workflow_id(pool_name),
            task_queue=self._task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            search_attributes=TypedSearchAttributes([SearchAttributePair(POOL_NAME, pool_name)]),
        )

    async def _previous_result(self, ref: RunRef | None) -> ObservePoolResult | None:
        """The previous pass's observe result, read from its history."""
        if ref is None:
            return None
        handle = self._client.get_workflow_handle(ref.workflow_id, run_id=ref.run_id)
        try:
            async for event in handle.fetch_history_events():
                if event.HasField("activity_task_completed_event_attributes"):
                    payloads = event.activity_task_completed_event_attributes.result.payloads
                    [result] = await self._client.data_converter.decode(
                        payloads, [ObservePoolResult]
                    )
                    assert isinstance(result, ObservePoolResult)
                    return result
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
        return None  # past retention: this pass tells every machine once

    async def _tell(self, pool_name: str, nodes: Sequence[NodeCapacity]) -> None:
        limit = asyncio.Semaphore(SIGNAL_CONCURRENCY)

        async def tell(node: NodeCapacity) -> None:
            async with limit:
                await self._client.start_workflow(
                    MACHINE_WORKFLOW,
                    MachineInput(pool_name=pool_name, node_name=node.name, timings=self._timings),
                    id=machine_workflow_id(pool_name, node.name),
                    task_queue=self._task_queue,
                    start_signal="observe",
                    start_signal_args=[node],
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    search_attributes=TypedSearchAttributes(
                        [
                            SearchAttributePair(POOL_NAME, pool_name),
                            SearchAttributePair(NODE_NAME, node.name),
                            SearchAttributePair(GPU_TYPE, node.gpu_type or ""),
                        ]
                    ),
                )

        await asyncio.gather(*(tell(node) for node in nodes))

    async def _running_machines(self, pool_name: str) -> list[str]:
        """The node names of the pool's running machine records."""
        prefix = machine_workflow_id(pool_name, "")
        query = (
            f"WorkflowType='{MACHINE_WORKFLOW}' AND PoolName='{pool_name}'"
            " AND ExecutionStatus='Running'"
        )
        return [
            listed.id.removeprefix(prefix)
            async for listed in self._client.list_workflows(query)
            if listed.id.startswith(prefix)
        ]

    async def _signal_machine(self, pool_name: str, name: str, signal: str, *args: object) -> None:
        handle = self._client.get_workflow_handle(machine_workflow_id(pool_name, name))
        await delivered(handle.signal(signal, *args))  # not delivered: it ended since the list

    async def _tell_settings(self, pool_name: str) -> int:
        names = await self._running_machines(pool_name)
        limit = asyncio.Semaphore(SIGNAL_CONCURRENCY)

        async def tell(name: str) -> None:
            async with limit:
                await self._signal_machine(pool_name, name, "settings", self._timings)

        await asyncio.gather(*(tell(name) for name in names))
        log.info(
            "settings changed: told the running machines",
            pool_name=pool_name,
            machines=len(names),
            idle_seconds=self._timings.idle_seconds,
            record_ttl_seconds=self._timings.record_ttl_seconds,
        )
        return len(names)

    async def _gone(self, pool_name: str, observed: set[str]) -> list[str]:
        """Tells the running machine records whose node this pass did not see (deleted, or no
        longer selected) that their node is gone."""
        gone = sorted(set(await self._running_machines(pool_name)) - observed)
        for name in gone:
            await self._signal_machine(pool_name, name, "gone")
        return gone
