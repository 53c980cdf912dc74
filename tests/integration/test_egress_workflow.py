"""EgressAllowlistWorkflow when attach runs again (signal `attached`): the firewall rule's tags
gather every node pool's, and its upkeep, once a pool without the tunnel asked for it, stays on
(a later tunnel-only attach cannot turn it off under the other pool)."""

from __future__ import annotations

import uuid

import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.cloud import Allowlist, ClusterRef, EgressInput
from workflows.egress import EgressAllowlistWorkflow

pytestmark = pytest.mark.integration


def _input(*, tags: list[str], firewall: bool) -> EgressInput:
    return EgressInput(
        cluster=ClusterRef(project="demo", location="us-central1-a", cluster="demo"),
        network="default",
        target_tags=tags,
        firewall=firewall,
    )


async def test_a_rerun_of_attach_updates_the_rule_it_keeps(
    dev_env: WorkflowEnvironment, task_queue: str
) -> None:
    client = dev_env.client
    async with Worker(client, task_queue=task_queue, workflows=[EgressAllowlistWorkflow]):
        handle = await client.start_workflow(
            EgressAllowlistWorkflow.run,
            _input(tags=["gke-demo-a-node"], firewall=False),  # first attach: tunnel only
            id=f"egress:{uuid.uuid4().hex[:8]}",
            task_queue=task_queue,
        )
        await handle.signal(
            EgressAllowlistWorkflow.attached, _input(tags=["gke-demo-b-node"], firewall=True)
        )
        after_second = await handle.query(EgressAllowlistWorkflow.allowlist)
        await handle.signal(
            EgressAllowlistWorkflow.attached, _input(tags=["gke-demo-a-node"], firewall=False)
        )
        after_third = await handle.query(EgressAllowlistWorkflow.allowlist)
        await handle.terminate("test done")
    assert isinstance(after_second, Allowlist)
    assert (after_second.firewall, after_second.target_tags) == (
        True,
        ["gke-demo-a-node", "gke-demo-b-node"],
    )
    assert (after_third.firewall, after_third.target_tags) == (
        True,
        ["gke-demo-a-node", "gke-demo-b-node"],
    )
