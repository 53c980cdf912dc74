"""Activities that read the pool config loaded in this Temporal worker."""

from __future__ import annotations

from collections.abc import Mapping

from temporalio import activity
from temporalio.exceptions import ApplicationError

from levers9.config import PoolConfig
from levers9.models import DescribePoolInput, PoolSummary


class PoolActivities:
    """The pools this Temporal worker loaded from its values files."""

    def __init__(self, pools: Mapping[str, PoolConfig]) -> None:
        self._pools = pools

    @activity.defn
    async def describe_pool(self, input: DescribePoolInput) -> PoolSummary:
        pool = self._pools.get(input.pool_name)
        if pool is None:
            raise ApplicationError(
                f"pool {input.pool_name} is not loaded on this Temporal worker: add its block"
                " under config.worker.pools (levers9 config check -f ... says what is wrong"
                " with it); a Temporal worker started on values without the pool deletes"
                f" its schedule reconcile:{input.pool_name}",
                type="PoolNotLoaded",
                non_retryable=True,
            )
        kube = pool.kubernetes
        return PoolSummary(
            pool_name=input.pool_name,
            gpu_type=pool.gpu_type,
            flavor=kube.flavor,
            endpoint=kube.endpoint,
            namespace=kube.namespace,
            node_selector=dict(kube.node_selector),
            worker_image=kube.worker_image,
            tunnel=kube.tunnel,
            host_network=pool.host_network,
        )
