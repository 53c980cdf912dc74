"""EgressAllowlistWorkflow (`egress:<cluster>`): keeps the controlplane's egress IPs on the GKE
cluster's authorized networks and its firewall rule, for as long as the pool exists.

Started by attach (which has allowlisted the IPs of the day). When EKS nodes are replaced the
controlplane's IPs change; an operator then sends

    temporal workflow signal --workflow-id egress:<cluster> --name rotate_ips \\
      --input '{"ips": ["203.0.113.7"]}'

(or `--input '{}'` to discover them from EC2, or `levers9 egress rotate --cluster C`). Each
rotation appends the missing /32s to both (never removes: an IP of a node still draining must
keep working), and is recorded with what it added or why it failed; a bad IP is refused with
its index and value, and the workflow goes on. Query `allowlist`.

The activities run on the controlplane's Temporal worker with its Google identity (it needs
roles/container.clusterAdmin and roles/compute.securityAdmin on the GKE project for this) and
its AWS identity (ec2:Describe*).
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

from workflows.steps import step

with workflow.unsafe.imports_passed_through():
    from activities.aws import AwsActivities
    from activities.gcp import GcpActivities
    from levers9.logs import KV_EXTRA
    from levers9.providers.gke import (
        EGRESS_WORKFLOW,
        Allowlist,
        EgressInput,
        EgressSource,
        FirewallInput,
        NetworksInput,
        RotateIps,
        Rotation,
        Step,
        appended,
        as_cidr,
    )

KEEP_ROTATIONS = 20


@workflow.defn(name=EGRESS_WORKFLOW)
class EgressAllowlistWorkflow:
    @workflow.init
    def __init__(self, input: EgressInput) -> None:
        self._input = input
        self._allowlist: list[str] = list(input.allowlist)
        self._requests: list[RotateIps] = []
        self._rotations: list[Rotation] = list(input.rotations)

    @workflow.signal
    def rotate_ips(self, request: RotateIps | None = None) -> None:
        self._requests.append(request or RotateIps())

    @workflow.signal
    def allowlisted(self, cidrs: list[str]) -> None:
        """Attach appended these itself."""
        self._allowlist, _ = appended(self._allowlist, cidrs)

    @workflow.signal
    def attached(self, update: EgressInput) -> None:
        """Attach ran again (perhaps for another node pool of the cluster): its network tags
        join the rule's, and a pool without the tunnel turns the firewall rule's upkeep on. A
        tunnel-only attach never turns it off: another pool of the cluster may need the rule."""
        tags = sorted({*self._input.target_tags, *update.target_tags})
        self._input = self._input.model_copy(
            update={
                "network": update.network,
                "target_tags": tags,
                "eks_cluster": update.eks_cluster,
                "firewall": self._input.firewall or update.firewall,
            }
        )

    @workflow.query
    def allowlist(self) -> Allowlist:
        return Allowlist(
            **self._input.model_dump(exclude={"allowlist", "rotations"}),
            allowlist=self._allowlist,
            rotations=self._rotations,
        )

    @workflow.run
    async def run(self, input: EgressInput) -> None:
        while True:
            await workflow.wait_condition(lambda: bool(self._requests))
            request = self._requests.pop(0)
            rotation = await self._rotate(request)
            self._rotations = [*self._rotations, rotation][-KEEP_ROTATIONS:]
            info = workflow.info()
            long = (
                info.get_current_history_length() > self._input.max_history_events
                or info.is_continue_as_new_suggested()
            )
            if long and not self._requests:
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self._requests:  # else a rotation that came meanwhile goes first
                    workflow.continue_as_new(
                        self._input.model_copy(
                            update={"allowlist": self._allowlist, "rotations": self._rotations}
                        )
                    )

    async def _rotate(self, request: RotateIps) -> Rotation:
        at = workflow.now().isoformat()
        ref = self._input.cluster
        try:
            if request.ips is None:
                cidrs = await step(
                    AwsActivities.discover_egress_ips,
                    EgressSource(eks_cluster=self._input.eks_cluster),
                )
            else:
                cidrs = _valid(request.ips)
            steps: list[Step] = [
                await step(
                    GcpActivities.append_authorized_networks,
                    NetworksInput(cluster=ref, cidrs=cidrs, when_disabled="leave"),
                )
            ]
            if self._input.firewall:  # a tunnel-only cluster has no rule to keep
                firewall = FirewallInput(
                    cluster=ref,
                    network=self._input.network,
                    target_tags=self._input.target_tags,
                    cidrs=cidrs,
                )
                steps.append(await step(GcpActivities.ensure_firewall, firewall))
        except (ActivityError, ApplicationError) as exc:
            error = _message(exc)
            workflow.logger.warning(
                "egress IP rotation failed",
                extra={KV_EXTRA: {"cluster": ref.cluster, "error": error}},
            )
            requested = [str(ip) for ip in request.ips or []]
            return Rotation(
                at=at,
                request_id=request.request_id,
                requested=requested,
                added=[],
                steps=[],
                error=error,
            )
        self._allowlist, added = appended(self._allowlist, cidrs)
        workflow.logger.info(
            "egress IPs rotated",
            extra={
                KV_EXTRA: {
                    "cluster": ref.cluster,
                    "ips": ",".join(cidrs),
                    "added": ",".join(added) or "none",
                }
            },
        )
        return Rotation(
            at=at, request_id=request.request_id, requested=cidrs, added=added, steps=steps
        )


def _valid(ips: list[Any] | str) -> list[str]:
    """The IPs of a `rotate_ips` signal as CIDRs; a bad one is named by index and value."""
    if isinstance(ips, str):
        ips = [ips]
    cidrs = []
    for index, ip in enumerate(ips):
        try:
            cidrs.append(as_cidr(str(ip)))
        except ValueError as exc:
            raise ApplicationError(f"ips[{index}]: {exc}", non_retryable=True) from None
    if not cidrs:
        raise ApplicationError(
            'ips is empty: send {"ips": ["<ip>", ...]}, or {} to discover them',
            non_retryable=True,
        )
    return cidrs


def _message(exc: BaseException) -> str:
    cause = exc.cause if isinstance(exc, ActivityError) else exc
    return cause.message if isinstance(cause, ApplicationError) else str(cause)
