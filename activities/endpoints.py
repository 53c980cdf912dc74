"""What EndpointWorkflow asks of the world: the environment its replicas start with.

The page's vLLM row needs the pool's cards' compute capability, which the pool's `gpuType`
names (the values are loaded here, never in a workflow).
"""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.kube_clients import KubeClients, UnknownPool
from levers9.core.endpoints import ReplicaEnvironment, compute_capability, vllm_environment


class EndpointActivities:
    def __init__(self, clients: KubeClients) -> None:
        self._clients = clients

    @activity.defn
    async def replica_environment(self, input: ReplicaEnvironment) -> dict[str, str]:
        """The replicas' environment: the endpoint's own, with the pool's GPU defaults."""
        try:
            pool = self._clients.pool(input.pool_name)
        except UnknownPool:
            raise ApplicationError(
                f"no pool {input.pool_name} in this controlplane's values:"
                " `levers9 pool list` shows the pools",
                non_retryable=True,
                type="UnknownPool",
            ) from None
        return vllm_environment(input.env, compute_capability(pool.gpu_type))
