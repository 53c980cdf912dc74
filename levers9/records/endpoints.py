"""Endpoints as Temporal holds them (EndpointWorkflow, `endpoint:<name>`): create, read, list,
tell, delete. The CLI and the gateway's proxy share these."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from temporalio.client import Client
from temporalio.exceptions import WorkflowAlreadyStartedError

from levers9.core.endpoints import EndpointSpec, EndpointView, Load
from levers9.models import ENDPOINT_WORKFLOW, EndpointInput, endpoint_workflow_id
from levers9.records.found import delivered, is_running, or_none, query_within


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


async def list_endpoints(client: Client) -> list[str]:
    """The names of the running endpoints."""
    query = f"WorkflowType = '{ENDPOINT_WORKFLOW}' AND ExecutionStatus = 'Running'"
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
