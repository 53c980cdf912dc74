"""AttachClusterWorkflow (`attach:<cluster>`): the cloud side of a GKE pool, step by step.

    describe the cluster -> service account -> IAM binding -> key file -> registry -> image copy
    -> egress IPs -> firewall rule -> authorized networks -> the egress workflow -> values block

`levers9 gke attach` (and `deploy/gke/attach-gke-pool.sh`) runs it on a task queue of its own,
served by the CLI process: its activities act with the operator's Google and AWS credentials and
write the key file on the operator's machine; nothing secret reaches this history (steps return
names and statuses, never key material or tokens). Every step is idempotent, so a rerun reports
`unchanged` except for appended IPs, and a run cut short is simply run again.

The query `steps` gives what is done so far (the CLI prints it as it grows).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from workflows.steps import step

with workflow.unsafe.imports_passed_through():
    from activities.aws import AwsActivities
    from activities.gcp import GcpActivities
    from activities.images import ImageActivities
    from activities.pools import EgressStart, PoolActivities
    from levers9.logs import KV_EXTRA
    from levers9.providers.gke import (
        ATTACH_WORKFLOW,
        AttachInput,
        AttachResult,
        ClusterInfo,
        CopyImageInput,
        EgressInput,
        EgressSource,
        FirewallInput,
        KeyInput,
        NetworksInput,
        Step,
        appended,
        as_cidr,
        values_block,
    )

COPY_TIMEOUT = timedelta(minutes=20)


@workflow.defn(name=ATTACH_WORKFLOW)
class AttachClusterWorkflow:
    def __init__(self) -> None:
        self._steps: list[Step] = []

    @workflow.query
    def steps(self) -> list[Step]:
        return self._steps

    @workflow.run
    async def run(self, input: AttachInput) -> AttachResult:
        ref = input.cluster
        info: ClusterInfo = await step(GcpActivities.describe_cluster, ref)
        tags = info.node_pool_tags.get(input.node_pool)
        if tags is None:
            known = ", ".join(sorted(info.node_pool_tags)) or "none"
            raise ApplicationError(
                f"--node-pool {input.node_pool} is not a node pool of {ref.cluster} (it has:"
                f" {known})",
                non_retryable=True,
            )
        if not tags:
            raise ApplicationError(
                f"node pool {input.node_pool} has no network tags, so no firewall rule can"
                " target it: give it one (gcloud container node-pools update --tags)",
                non_retryable=True,
            )
        self._done(Step(name=f"cluster {ref.cluster}", status="unchanged", detail=info.endpoint))
        for activity in (
            GcpActivities.ensure_service_account,
            GcpActivities.ensure_developer_binding,
        ):
            self._done(await step(activity, ref))
        self._done(
            await step(GcpActivities.ensure_key, KeyInput(cluster=ref, key_file=input.key_file))
        )
        self._done(await step(GcpActivities.ensure_repository, ref))
        copied = await step(
            ImageActivities.copy_image,
            CopyImageInput(source=input.source_image, destination=ref.worker_image),
            start_to_close=COPY_TIMEOUT,
        )
        self._done(
            Step(
                name=f"image {copied.destination}",
                status=copied.status,
                detail=copied.digest,
            )
        )
        try:
            discovered = await step(
                AwsActivities.discover_egress_ips, EgressSource(eks_cluster=input.eks_cluster)
            )
        except ActivityError as exc:
            cause = exc.cause
            none_found = isinstance(cause, ApplicationError) and cause.type == "NoEgressIps"
            if not (none_found and input.ips):
                raise
            discovered = []  # the operator named them (--ip)
        ips, _ = appended(discovered, [as_cidr(ip) for ip in input.ips])
        self._done(Step(name="egress IPs", status="unchanged", detail=", ".join(ips)))
        if input.tunnel:
            self._done(
                Step(
                    name=f"firewall rule {ref.firewall_name}",
                    status="skipped",
                    detail="tunnel-only pool: the workers dial out, nothing dials the nodes",
                )
            )
        else:
            self._done(
                await step(
                    GcpActivities.ensure_firewall,
                    FirewallInput(cluster=ref, network=info.network, target_tags=tags, cidrs=ips),
                )
            )
        self._done(
            await step(
                GcpActivities.append_authorized_networks,
                NetworksInput(
                    cluster=ref,
                    cidrs=ips,
                    when_disabled="enable" if input.enable_authorized_networks else "refuse",
                ),
            )
        )
        started = await step(
            PoolActivities.ensure_egress_workflow,
            EgressStart(
                input=EgressInput(
                    cluster=ref,
                    network=info.network,
                    target_tags=tags,
                    eks_cluster=input.eks_cluster,
                    firewall=not input.tunnel,
                ),
                task_queue=input.controlplane_task_queue,
                cidrs=ips,
            ),
        )
        self._done(
            Step(
                name=f"egress workflow egress:{ref.cluster}",
                status="created" if started else "unchanged",
                detail=f"signal rotate_ips to append new IPs ({len(ips)} allowlisted)",
            )
        )
        return AttachResult(
            steps=self._steps,
            values_block=values_block(ref, info, input.gpu_type, tunnel=input.tunnel),
            image_digest=copied.digest,
            egress_ips=ips,
        )

    def _done(self, step: Step) -> None:
        self._steps.append(step)
        workflow.logger.info("attach step", extra={KV_EXTRA: {"step": step.line()}})
