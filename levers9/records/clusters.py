"""Joined clusters as Temporal holds them (ClusterWorkflow, `cluster:<name>`): start a join,
read them, leave. The CLI and the controlplane's start share these.

Reads never ask the workflow (a query needs a polling Temporal worker, and a controlplane that
starts, or a CLI whose controlplane is down, has none): the record is the workflow's memo
(`record`).
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from levers9.models import CLUSTER_WORKFLOW, ClusterInput, reconcile_schedule_id
from levers9.providers.joined import JOIN_TTL, ClusterState, JoinedCluster, cluster_workflow_id
from levers9.temporal import schedule_memo
from levers9.tokens import join_digest


class ClusterExists(Exception):
    """A cluster of that name is joined already, or the values define a pool of that name."""


async def start_join(
    client: Client, task_queue: str, spec: JoinedCluster, join_token: str
) -> ClusterState:
    """Records the join: the pool's spec, the join token's SHA-256 (never the token) and its
    expiry."""
    state = ClusterState(
        spec=spec, join_digest=join_digest(join_token), expires_at=datetime.now(UTC) + JOIN_TTL
    )
    if await _values_pool(client, spec.name):
        raise ClusterExists(
            f"pool {spec.name} is defined by the controlplane's values (its"
            f" {reconcile_schedule_id(spec.name)} schedule runs): a join never takes a pool it"
            " does not own; join under another --name"
        )
    try:
        await client.start_workflow(
            CLUSTER_WORKFLOW,
            ClusterInput(state=state),
            id=cluster_workflow_id(spec.name),
            task_queue=task_queue,
            memo={"record": state.model_dump(mode="json")},
            static_summary=f"joined cluster {spec.name}: {spec.gpu_type} nodes",
        )
    except WorkflowAlreadyStartedError:
        raise ClusterExists(
            f"cluster {spec.name} is joined already: `levers9 cluster leave {spec.name}` first"
        ) from None
    return state


async def _values_pool(client: Client, name: str) -> bool:
    """A pool of this name is reconciled, and no join made it: the values define it."""
    if await schedule_memo(client, name) is None:
        return False
    return await cluster_state(client, name) is None


async def joined_clusters(client: Client) -> list[ClusterState]:
    """Every joined cluster, as its record holds it (the controlplane loads their pools).
    Answered by the server alone: no Temporal worker needs to poll."""
    query = f"WorkflowType = '{CLUSTER_WORKFLOW}' AND ExecutionStatus = 'Running'"
    states = []
    async for execution in client.list_workflows(query):
        state = await _recorded(execution)
        if state is not None and not state.leaving:
            states.append(state)
    return sorted(states, key=lambda s: s.spec.name)


async def cluster_state(client: Client, name: str) -> ClusterState | None:
    """The running join of cluster `name` as its record holds it; None when there is none."""
    handle = client.get_workflow_handle(cluster_workflow_id(name))
    try:
        description = await handle.describe()
        if description.status != WorkflowExecutionStatus.RUNNING:
            return None
        return await _recorded(description)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def _recorded(execution: WorkflowExecution) -> ClusterState | None:
    """The record in the run's memo (set when the join starts)."""
    memo = await execution.memo()
    if "record" not in memo:
        return None
    return ClusterState.model_validate(memo["record"])


async def leave_cluster(client: Client, name: str) -> bool:
    """Signals `leave`; False when no such cluster is joined."""
    try:
        await client.get_workflow_handle(cluster_workflow_id(name)).signal("leave")
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True
