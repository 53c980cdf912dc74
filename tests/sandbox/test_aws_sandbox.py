"""The sandbox's AWS: moto's server seeded as the spec's controlplane (a VPC with a public
subnet, the EKS cluster, two nodes tagged as EKS tags them with public IPs, a NAT gateway with
an Elastic IP, the ECR repository), idempotently; replacing the EKS nodes gives new public IPs
and terminates the old nodes; boto3 finds it all through the env the dev stack exports; only a
loopback endpoint is accepted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from sandbox import aws
from sandbox.aws import AwsSandboxError, ControlplaneAws, LocalMoto

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMoto]:
    with LocalMoto(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture(scope="module")
def seeded(moto: LocalMoto) -> ControlplaneAws:
    return aws.seed(moto.endpoint)


def _tagged(moto: LocalMoto, state: str = "running") -> list[str]:
    ec2 = aws.ec2_client(moto.endpoint)
    found = ec2.describe_instances(
        Filters=[
            {"Name": "tag:kubernetes.io/cluster/levers9-controlplane", "Values": ["owned"]},
            {"Name": "tag:eks:cluster-name", "Values": ["levers9-controlplane"]},
            {"Name": "instance-state-name", "Values": [state]},
        ]
    )
    return [i["InstanceId"] for r in found["Reservations"] for i in r["Instances"]]


def test_seed_makes_the_controlplanes_aws(moto: LocalMoto, seeded: ControlplaneAws) -> None:
    ec2 = aws.ec2_client(moto.endpoint)
    assert len(seeded.node_ips) == 2
    assert len(_tagged(moto)) == 2
    [subnet] = ec2.describe_subnets(SubnetIds=[seeded.subnet_id])["Subnets"]
    assert subnet["MapPublicIpOnLaunch"]
    assert subnet["VpcId"] == seeded.vpc_id
    [gateway] = ec2.describe_nat_gateways(Filters=[{"Name": "vpc-id", "Values": [seeded.vpc_id]}])[
        "NatGateways"
    ]
    assert gateway["NatGatewayAddresses"][0]["PublicIp"] == seeded.nat_ip
    assert seeded.egress_ips == [*seeded.node_ips, seeded.nat_ip]
    cluster = aws.eks_client(moto.endpoint).describe_cluster(name="levers9-controlplane")
    assert cluster["cluster"]["status"] == "ACTIVE"
    repositories = aws.ecr_client(moto.endpoint).describe_repositories()["repositories"]
    assert [r["repositoryName"] for r in repositories] == ["levers9/worker"]
    assert seeded.repository_uri.endswith("/levers9/worker")


def test_seed_is_idempotent(moto: LocalMoto, seeded: ControlplaneAws) -> None:
    again = aws.seed(moto.endpoint)
    assert (again.vpc_id, again.subnet_id, again.nat_ip) == (
        seeded.vpc_id,
        seeded.subnet_id,
        seeded.nat_ip,
    )
    assert again.node_ips == aws.node_ips(moto.endpoint)
    assert len(_tagged(moto)) == 2
    assert len(aws.ec2_client(moto.endpoint).describe_vpcs()["Vpcs"]) == 2  # moto's default too


def test_boto3_finds_it_through_the_env(
    moto: LocalMoto, seeded: ControlplaneAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = aws.client_env(moto.endpoint)
    assert env == {
        "AWS_ENDPOINT_URL": moto.endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ec2 = boto3.client("ec2")  # nothing but the environment
    found = ec2.describe_instances(
        Filters=[{"Name": "tag:eks:cluster-name", "Values": ["levers9-controlplane"]}]
    )
    ips = {i.get("PublicIpAddress") for r in found["Reservations"] for i in r["Instances"]}
    assert set(aws.node_ips(moto.endpoint)) <= ips


def test_replacing_the_nodes_changes_their_ips(moto: LocalMoto, seeded: ControlplaneAws) -> None:
    before = aws.node_ips(moto.endpoint)
    old_ids = _tagged(moto)
    after = aws.replace_eks_nodes(moto.endpoint)
    assert len(after) == len(before) == 2
    assert not set(after) & set(before)
    assert aws.node_ips(moto.endpoint) == after
    assert set(old_ids) <= set(_tagged(moto, "terminated"))
    assert not set(old_ids) & set(_tagged(moto))
    assert aws.seed(moto.endpoint).node_ips == after, "a reseed keeps the new nodes"


def test_replacing_nodes_of_an_unknown_cluster_says_to_seed(moto: LocalMoto) -> None:
    with pytest.raises(AwsSandboxError, match="seed it first"):
        aws.replace_eks_nodes(moto.endpoint, "no-such-cluster")


def test_a_restarted_moto_gets_the_previous_egress_back(
    moto: LocalMoto, seeded: ControlplaneAws, tmp_path: Path
) -> None:
    """moto's state is memory only and it draws public IPs at random; the real AWS keeps its
    nodes while the controlplane restarts, so a new moto seeded with what the old one had
    answers with the same nodes' and NAT's addresses (`levers9 dev up` after `dev down`)."""
    kept = aws.egress(moto.endpoint)
    assert kept.node_ips == aws.node_ips(moto.endpoint)
    assert kept.nat_ip == seeded.nat_ip
    saved = aws.Egress.from_json(kept.to_json())
    with LocalMoto(tmp_path / "moto.log") as again:
        restored = aws.seed(again.endpoint, keep=saved)
        assert restored.node_ips == kept.node_ips
        assert restored.nat_ip == kept.nat_ip
        assert aws.egress(again.endpoint) == kept
        assert aws.seed(again.endpoint).node_ips == kept.node_ips, "a reseed keeps them"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"node_ips": "54.214.1.2", "nat_ip": null}', "node_ips"),
        ('{"node_ips": ["54.214.1.2"], "nat_ip": 7}', "nat_ip"),
        ("[]", "node_ips and nat_ip"),
    ],
)
def test_a_saved_egress_that_is_not_one_names_the_field(text: str, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        aws.Egress.from_json(text)


def test_only_a_loopback_endpoint(tmp_path: Path) -> None:
    for endpoint in ("http://10.0.0.1:5000", "https://ec2.us-east-1.amazonaws.com"):
        with pytest.raises(AwsSandboxError, match="loopback"):
            aws.ec2_client(endpoint)
        with pytest.raises(AwsSandboxError, match="loopback"):
            aws.client_env(endpoint)
    assert not aws.moto_ready("http://127.0.0.1:9")  # nothing listens: not ready, no error
