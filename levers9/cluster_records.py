"""Joined clusters as Temporal holds them (ClusterWorkflow, `cluster:<name>`): start a join,
read them, leave. The CLI and the controlplane's start share these."""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from levers9.clusters import JOIN_TTL, ClusterState, JoinedCluster, cluster_workflow_id
from levers9.models import CLUSTER_WORKFLOW, ClusterInput
from levers9.tokens import join_digest


class ClusterExists(Exception):
    """A cluster of that name is joined already."""


async def start_join(
    client: Client, task_queue: str, spec: JoinedCluster, join_token: str
) -> ClusterState:
    """Records the join: the pool's spec, the join token's SHA-256 (never the token) and its
    expiry."""
    state = ClusterState(
        spec=spec, join_digest=join_digest(join_token), expires_at=datetime.now(UTC) + JOIN_TTL
    )
    try:
        await client.start_workflow(
            CLUSTER_WORKFLOW,
            ClusterInput(state=state),
            id=cluster_workflow_id(spec.name),
            task_queue=task_queue,
            static_summary=f"joined cluster {spec.name}: {spec.gpu_type} nodes",
        )
    except WorkflowAlreadyStartedError:
        raise ClusterExists(
            f"cluster {spec.name} is joined already: `levers9 cluster leave {spec.name}` first"
        ) from None
    return state


async def joined_clusters(client: Client) -> list[ClusterState]:
    """Every joined cluster, as its record holds it (the controlplane loads their pools)."""
    query = f"WorkflowType = '{CLUSTER_WORKFLOW}' AND ExecutionStatus = 'Running'"
    states = []
    async for execution in client.list_workflows(query):
        state = await cluster_state(client, execution.id.removeprefix("cluster:"))
        if state is not None and not state.leaving:
            states.append(state)
    return sorted(states, key=lambda s: s.spec.name)


async def cluster_state(client: Client, name: str) -> ClusterState | None:
    handle = client.get_workflow_handle(cluster_workflow_id(name))
    try:
        description = await handle.describe()
        if description.status != WorkflowExecutionStatus.RUNNING:
            return None
        state: ClusterState = await handle.query("cluster", result_type=ClusterState)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return state


async def leave_cluster(client: Client, name: str) -> bool:
    """Signals `leave`; False when no such cluster is joined."""
    try:
        await client.get_workflow_handle(cluster_workflow_id(name)).signal("leave")
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True
