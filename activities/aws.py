"""The AWS side: the controlplane's egress IPs, and a pull token for its ECR.

The controlplane runs on EKS nodes in public subnets, so what the GKE side sees as its address
is each node's public IP, plus the NAT gateways of the nodes' VPCs (spec: "What has to be
true"). Nodes are found by the EKS cluster's tag `kubernetes.io/cluster/<name>`. boto3 reads
AWS_ENDPOINT_URL (moto in the sandbox) and the usual credentials chain.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from levers9.providers.gke import EgressSource, as_cidr

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ecr import ECRClient

PERMANENT_CODES = frozenset(
    {"AuthFailure", "UnauthorizedOperation", "AccessDenied", "AccessDeniedException"}
)


def aws_error(exc: Exception, what: str) -> Exception:
    if isinstance(exc, NoCredentialsError):
        return ApplicationError(
            f"{what}: no AWS credentials; log in (`aws sso login`) or set AWS_PROFILE",
            type="AwsNoCredentials",
            non_retryable=True,
        )
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        message = exc.response.get("Error", {}).get("Message", "")
        if code in PERMANENT_CODES:
            return ApplicationError(
                f"{what}: {code}: {message}; the AWS identity needs ec2:DescribeInstances,"
                " ec2:DescribeNatGateways and ecr:GetAuthorizationToken",
                type=f"Aws{code}",
                non_retryable=True,
            )
        return ApplicationError(f"{what}: {code}: {message}", type=f"Aws{code}")
    return ApplicationError(f"{what}: {exc}", type="AwsUnavailable")


def discover_egress_ips(ec2: EC2Client, eks_cluster: str) -> list[str]:
    """The public IPs of the cluster's running nodes, then of its VPCs' NAT gateways, sorted,
    as /32 CIDRs."""
    nodes: list[str] = []
    vpcs: set[str] = set()
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": f"tag:kubernetes.io/cluster/{eks_cluster}", "Values": ["owned", "shared"]},
            {"Name": "instance-state-name", "Values": ["running"]},
        ]
    )
    for page in pages:
        for reservation in page.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                if ip := instance.get("PublicIpAddress"):
                    nodes.append(as_cidr(ip))
                if vpc := instance.get("VpcId"):
                    vpcs.add(vpc)
    nat: list[str] = []
    if vpcs:
        gateways = ec2.describe_nat_gateways(
            Filters=[
                {"Name": "vpc-id", "Values": sorted(vpcs)},
                {"Name": "state", "Values": ["available"]},
            ]
        )
        for gateway in gateways.get("NatGateways", []):
            for address in gateway.get("NatGatewayAddresses", []):
                if ip := address.get("PublicIp"):
                    nat.append(as_cidr(ip))
    return sorted(set(nodes)) + sorted(set(nat) - set(nodes))


def ecr_login(ecr: ECRClient) -> tuple[str, str]:
    """(user, password) for `docker login` to the account's ECR, from GetAuthorizationToken."""
    data = ecr.get_authorization_token()["authorizationData"][0]
    user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
    return user, password


class AwsActivities:
    def __init__(self, session: Callable[[], Any] = boto3.session.Session) -> None:
        self._session = session

    def ec2(self) -> EC2Client:
        client: EC2Client = self._session().client("ec2")
        return client

    def ecr(self) -> ECRClient:
        client: ECRClient = self._session().client("ecr")
        return client

    @activity.defn
    async def discover_egress_ips(self, source: EgressSource) -> list[str]:
        what = f"egress IPs of EKS cluster {source.eks_cluster}"
        try:
            ips = await asyncio.to_thread(discover_egress_ips, self.ec2(), source.eks_cluster)
        except (ClientError, BotoCoreError) as exc:
            raise aws_error(exc, what) from None
        if not ips:
            raise ApplicationError(
                f"{what}: no running node tagged kubernetes.io/cluster/{source.eks_cluster}"
                ' has a public IP; pass the IPs (--ip, or rotate_ips with {"ips": [...]})'
                " or set LEVERS9_EKS_CLUSTER",
                type="NoEgressIps",
                non_retryable=True,
            )
        return ips
