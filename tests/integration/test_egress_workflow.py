"""EgressAllowlistWorkflow when attach runs again (signal `attached`): the firewall rule's tags
gather every node pool's, and its upkeep, once a pool without the tunnel asked for it, stays on
(a later tunnel-only attach cannot turn it off under the other pool). And under a stream of
rotations it continues as new with its allowlist and latest rotations, losing none."""

from __future__ import annotations

import uuid

import pytest
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.providers.gke import (
    Allowlist,
    ClusterRef,
    EgressInput,
    FirewallInput,
    NetworksInput,
    RotateIps,
    Step,
)
from tests.waiting import eventually
from workflows.egress import KEEP_ROTATIONS, EgressAllowlistWorkflow

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


@activity.defn(name="append_authorized_networks")
async def append_authorized_networks(input: NetworksInput) -> Step:
    return Step(name="authorized networks", status="updated", detail=",".join(input.cidrs))


@activity.defn(name="ensure_firewall")
async def ensure_firewall(input: FirewallInput) -> Step:
    return Step(name="firewall rule", status="unchanged")


async def test_it_continues_as_new_under_rotations_and_loses_none(
    dev_env: WorkflowEnvironment, task_queue: str
) -> None:
    """Rotations signalled in bursts, with a 40-event cap: it continues as new between bursts
    (never with a rotation waiting), and every IP signalled is on the allowlist, the latest
    rotations still shown."""
    client = dev_env.client
    workflow_id = f"egress:{uuid.uuid4().hex[:8]}"
    ips = [f"203.0.113.{n}" for n in range(1, 41)]
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[EgressAllowlistWorkflow],
        activities=[append_authorized_networks, ensure_firewall],
    ):
        handle = await client.start_workflow(
            EgressAllowlistWorkflow.run,
            _input(tags=["gke-demo-a-node"], firewall=True).model_copy(
                update={"max_history_events": 40}
            ),
            id=workflow_id,
            task_queue=task_queue,
        )
        for burst in range(0, len(ips), 8):  # rotations come in bursts; runs end between
            for ip in ips[burst : burst + 8]:
                await handle.signal(EgressAllowlistWorkflow.rotate_ips, RotateIps(ips=[ip]))

            async def taken(count: int = burst + 8) -> bool:
                shown = await client.get_workflow_handle(workflow_id).query(
                    EgressAllowlistWorkflow.allowlist
                )
                return len(shown.allowlist) == count

            await eventually(taken, within=60)
        shown = await client.get_workflow_handle(workflow_id).query(
            EgressAllowlistWorkflow.allowlist
        )
        runs = [e.status async for e in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
        await client.get_workflow_handle(workflow_id).terminate("test done")
    assert sorted(shown.allowlist) == sorted(f"{ip}/32" for ip in ips)
    assert [r.requested for r in shown.rotations][-1] == [f"{ips[-1]}/32"]
    assert len(shown.rotations) == KEEP_ROTATIONS, "the latest rotations carried across runs"
    assert runs.count(WorkflowExecutionStatus.CONTINUED_AS_NEW) >= 2, runs
