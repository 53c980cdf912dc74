"""Day-two operations from the operator's side, through Temporal only: rotate the egress IPs,
recopy the worker image, remove a pool. Each starts (or signals) a workflow on the
controlplane's task queue; the CLI waits for its result and prints it.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ChildWorkflowError, FailureError
from temporalio.service import RPCError, RPCStatusCode

from levers9.config import ControlplaneSettings
from levers9.providers.gke import (
    IMAGE_RECOPY_WORKFLOW,
    REMOVE_POOL_WORKFLOW,
    Allowlist,
    ImageRecopyInput,
    RecopyResult,
    RemovePoolInput,
    RemovePoolResult,
    RotateIps,
    egress_workflow_id,
    remove_pool_workflow_id,
)


def failure_message(exc: BaseException) -> str:
    """The innermost message of a workflow's failure (workflow -> activity -> application):
    what went wrong, in the words of the step that knew."""
    while isinstance(exc, WorkflowFailureError | ActivityError | ChildWorkflowError) and (
        exc.__cause__ is not None
    ):
        exc = exc.__cause__
    return exc.message if isinstance(exc, FailureError) else str(exc)


class NoEgressWorkflow(Exception):
    def __init__(self, cluster: str) -> None:
        super().__init__(
            f"no egress:{cluster} workflow: run `levers9 gke attach` for cluster {cluster}"
            " first (it starts it)"
        )


async def allowlist(client: Client, cluster: str) -> Allowlist:
    handle = client.get_workflow_handle(egress_workflow_id(cluster))
    try:
        result: Allowlist = await handle.query("allowlist", result_type=Allowlist)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise NoEgressWorkflow(cluster) from None
        raise
    return result


async def rotate_ips(client: Client, cluster: str, ips: list[str] | None) -> str:
    """Signals `rotate_ips`; returns the request id its rotation will be recorded under."""
    await allowlist(client, cluster)  # NoEgressWorkflow, not a signal lost on a missing id
    request_id = uuid.uuid4().hex
    handle = client.get_workflow_handle(egress_workflow_id(cluster))
    await handle.signal("rotate_ips", RotateIps(ips=ips, request_id=request_id))
    return request_id


async def start_recopy(
    client: Client, settings: ControlplaneSettings, pool_name: str
) -> WorkflowHandle[object, RecopyResult]:
    now = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    return await client.start_workflow(
        IMAGE_RECOPY_WORKFLOW,
        ImageRecopyInput(pool_name=pool_name),
        id=f"image-recopy:{pool_name}:{now}",
        task_queue=settings.task_queue,
        result_type=RecopyResult,
    )


async def start_pool_removal(
    client: Client,
    settings: ControlplaneSettings,
    pool_name: str,
    *,
    delete_namespace: bool = False,
    reason: str = "pool removed",
) -> WorkflowHandle[object, RemovePoolResult]:
    """Starts `remove:<pool>`; one already running is joined rather than doubled."""
    return await start_removal(
        client, settings.task_queue, pool_name, delete_namespace=delete_namespace, reason=reason
    )


async def start_removal(
    client: Client,
    task_queue: str,
    pool_name: str,
    *,
    delete_namespace: bool = False,
    reason: str = "pool removed",
) -> WorkflowHandle[object, RemovePoolResult]:
    """`start_pool_removal` on the controlplane of `task_queue` (the gateway's way: it holds a
    client and a task queue, not the settings)."""
    return await client.start_workflow(
        REMOVE_POOL_WORKFLOW,
        RemovePoolInput(pool_name=pool_name, delete_namespace=delete_namespace, reason=reason),
        id=remove_pool_workflow_id(pool_name),
        task_queue=task_queue,
        result_type=RemovePoolResult,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )
