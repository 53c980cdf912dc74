"""Endpoints as Temporal holds them (EndpointWorkflow, `endpoint:<name>`): create, read, list,
tell, delete. The CLI (straight to Temporal, the operator's fallback), the gateway's Endpoints
service (`TemporalEndpointRecords`) and its proxy share these."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import datetime

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import WorkflowAlreadyStartedError

from levers9.core.endpoints import EndpointSpec, EndpointView, Load
from levers9.models import ENDPOINT_WORKFLOW, EndpointInput, endpoint_workflow_id
from levers9.records.found import (
    QUERY_WITHIN_S,
    delivered,
    is_running,
    or_none,
    query_within,
)
from levers9.records.workspaces import workspace_clause
from levers9.search_attributes import WORKSPACE
from levers9.temporal import unknown_pool


class EndpointExists(Exception):
    """An endpoint of that name runs already."""


async def create_endpoint(client: Client, task_queue: str, spec: EndpointSpec) -> None:
    try:
        await client.start_workflow(
            ENDPOINT_WORKFLOW,
            EndpointInput(spec=spec),
            id=endpoint_workflow_id(spec.name),
            task_queue=task_queue,
            memo={"spec": spec.model_dump(mode="json")},
            # Listed under its workspace (Levers9Workspace), as its replicas are.
            search_attributes=TypedSearchAttributes(
                [SearchAttributePair(WORKSPACE, spec.workspace)]
            ),
            static_summary=f"endpoint {spec.name}: {spec.gpus} card(s) per replica,"
            f" {spec.min_replicas}-{spec.max_replicas} replicas",
        )
    except WorkflowAlreadyStartedError:
        raise EndpointExists(
            f"endpoint {spec.name} exists: `levers9 endpoint delete {spec.name}` first"
        ) from None


async def endpoint_view(
    client: Client, name: str, *, within: float | None = None
) -> EndpointView | None:
    """The endpoint now; None when there is none running of that name. With `within`, a query
    no Temporal worker answers in that many seconds is NoQueryAnswer (`recorded_endpoints`
    says what Temporal holds then)."""
    handle = client.get_workflow_handle(endpoint_workflow_id(name))
    if not await is_running(handle):
        return None
    if within is None:
        return await or_none(handle.query("view", result_type=EndpointView))
    return await or_none(query_within(handle, "view", within, result_type=EndpointView))


async def query_endpoint(client: Client, name: str) -> EndpointView | None:
    """`endpoint_view` in one call (a query; the gateway's hot path): None when unknown."""
    handle = client.get_workflow_handle(endpoint_workflow_id(name))
    view = await or_none(handle.query("view", result_type=EndpointView))
    return None if view is None or view.deleted else view


async def report_load(client: Client, name: str, load: Load) -> bool:
    """Signals `load`; False when the endpoint is gone."""
    handle = client.get_workflow_handle(endpoint_workflow_id(name))
    return await delivered(handle.signal("load", load))


async def delete_endpoint(client: Client, name: str) -> bool:
    """Signals `delete`; False when there is no such endpoint running."""
    return await delivered(client.get_workflow_handle(endpoint_workflow_id(name)).signal("delete"))


async def list_endpoints(
    client: Client, workspace: str | None = None, task_queue: str | None = None
) -> list[str]:
    """The names of the running endpoints (of one workspace: those its search attribute
    names; of one controlplane: its task queue's)."""
    query = f"WorkflowType = '{ENDPOINT_WORKFLOW}' AND ExecutionStatus = 'Running'"
    if workspace is not None:
        query += workspace_clause(workspace)
    if task_queue is not None:
        query += f" AND TaskQueue = '{task_queue}'"
    names = []
    async for execution in client.list_workflows(query):
        names.append(execution.id.removeprefix("endpoint:"))
    return sorted(names)


@dataclass(frozen=True)
class RecordedEndpoint:
    """A running endpoint as Temporal holds it without a Temporal worker: the spec it was
    created with (its memo) and when."""

    spec: EndpointSpec
    created_at: datetime


async def recorded_endpoints(client: Client, name: str | None = None) -> list[RecordedEndpoint]:
    """The running endpoints (or the one named), from the visibility list and their memos."""
    query = f"WorkflowType = '{ENDPOINT_WORKFLOW}' AND ExecutionStatus = 'Running'"
    if name is not None:
        query += f" AND WorkflowId = '{endpoint_workflow_id(name)}'"
    recorded = []
    async for execution in client.list_workflows(query):
        memo = await execution.memo()
        if "spec" in memo:
            spec = EndpointSpec.model_validate(memo["spec"])
            recorded.append(RecordedEndpoint(spec, execution.start_time))
    return sorted(recorded, key=lambda r: r.spec.name)


async def endpoint_spec(client: Client, name: str) -> EndpointSpec | None:
    """The running endpoint's spec as it was created (its memo, read at once and without a
    Temporal worker: whose it is); None when none of that name runs."""
    description = await or_none(client.get_workflow_handle(endpoint_workflow_id(name)).describe())
    if description is None or description.status != WorkflowExecutionStatus.RUNNING:
        return None
    memo = await description.memo()
    return EndpointSpec.model_validate(memo["spec"]) if "spec" in memo else None


class TemporalEndpointRecords:
    """The endpoints of one controlplane (its task queue), as the gateway's Endpoints service
    reads and tells them. A query no Temporal worker answers within QUERY_WITHIN_S is
    NoQueryAnswer."""

    def __init__(self, client: Client, task_queue: str) -> None:
        self._client = client
        self._task_queue = task_queue

    async def unknown_pool(self, pool_name: str) -> str | None:
        """Why an endpoint of the pool is refused (no such pool here), or None."""
        return await unknown_pool(self._client, self._task_queue, pool_name)

    async def create(self, spec: EndpointSpec) -> None:
        """Starts its record; EndpointExists when one of that name runs."""
        await create_endpoint(self._client, self._task_queue, spec)

    async def spec(self, name: str) -> EndpointSpec | None:
        return await endpoint_spec(self._client, name)

    async def view(self, name: str) -> EndpointView | None:
        return await endpoint_view(self._client, name, within=QUERY_WITHIN_S)

    async def views(self, workspace: str | None) -> list[EndpointView]:
        """The running endpoints (of one workspace), by name."""
        names = await list_endpoints(self._client, workspace, self._task_queue)
        views = [await self.view(name) for name in names]
        return [v for v in views if v is not None]

    async def delete(self, name: str) -> bool:
        return await delete_endpoint(self._client, name)

    async def ended(self, name: str, timeout_s: float) -> EndpointView | None:
        """The endpoint as its record ended (its replicas stopped), or None when it has not
        ended within `timeout_s`."""
        handle = self._client.get_workflow_handle(
            endpoint_workflow_id(name), result_type=EndpointView
        )
        try:
            async with asyncio.timeout(timeout_s):
                view: EndpointView = await handle.result()
                return view
        except TimeoutError:
            return None
