"""The controlplane's AWS side in the sandbox: moto's server, seeded as the spec's EKS setup.

The spec's first requirement is network: "the controlplane's egress IPs are on the cluster's
authorized networks", where those IPs "are the EKS nodes' public IPs (they sit in public
subnets) plus the NAT gateway. They change when nodes are replaced". So the controlplane finds
them by asking AWS, and a sandbox that is to exercise that needs an AWS that answers: moto's
server (`moto_server`, the AWS APIs over HTTP, state in memory), on 127.0.0.1, reached by
boto3 through `AWS_ENDPOINT_URL` with fake credentials.

`seed` gives it what the spec's controlplane runs in: a VPC with a public subnet and an internet
gateway, the EKS cluster `levers9-controlplane` with a managed node group, two EC2 instances
as EKS tags its nodes (`kubernetes.io/cluster/<cluster>=owned`, `eks:cluster-name`,
`eks:nodegroup-name`) with public IPs, a NAT gateway with an Elastic IP, and the ECR
repository `levers9/worker`. Seeding is idempotent, and moto keeps it in memory only, so it
is redone whenever moto (re)starts. moto draws public IPs at random, so a restarted moto would
hand the controlplane new egress IPs, as if its nodes had been replaced; the real AWS keeps its
nodes while the controlplane restarts, so `seed(keep=...)` gives the new nodes and the NAT the
previous run's addresses back as Elastic IPs (`egress` reads them before moto stops).

`replace_eks_nodes` is the spec's day-two "EKS nodes replaced": the tagged instances are
terminated and as many new ones run, with new public IPs. Those IPs are data only: the
sandbox's Kubernetes API compares its configured egress IP against the authorized networks,
and nothing ever dials an address from AWS. Only moto's loopback endpoint is a network target.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

import boto3
from botocore.exceptions import ClientError

from sandbox.child import ChildProcess, ChildServer
from sandbox.registries import HOST, free_port

if TYPE_CHECKING:
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_ec2.type_defs import FilterTypeDef, InstanceTypeDef, TagTypeDef
    from mypy_boto3_ecr import ECRClient
    from mypy_boto3_eks import EKSClient

CLUSTER = "levers9-controlplane"
REGION = "us-east-1"
ACCESS_KEY_ID = "testing"
SECRET_ACCESS_KEY = "testing"  # moto's convention: any value, never a real credential
ACCOUNT = "123456789012"  # moto's default account
ECR_REPOSITORY = "levers9/worker"
NODE_COUNT = 2
NODE_TYPE: Final = "m5.xlarge"
VPC_CIDR = "10.20.0.0/16"
SUBNET_CIDR = "10.20.0.0/20"
ZONE = f"{REGION}a"
PROBE_TIMEOUT_S = 5.0
REPLACE_ATTEMPTS = 5


class AwsSandboxError(Exception):
    """The sandbox's AWS cannot do what was asked, with what to do about it."""


def moto_argv(port: int) -> list[str]:
    """moto's server on 127.0.0.1:`port`, under this interpreter (the venv that has moto)."""
    return [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)]


def endpoint_url(port: int) -> str:
    return f"http://{HOST}:{port}"


def _loopback(endpoint: str) -> str:
    host = urllib.parse.urlsplit(endpoint).hostname or ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise AwsSandboxError(f"{endpoint} is not a loopback endpoint; the sandbox's AWS is moto")
    return endpoint.rstrip("/")


def moto_ready(endpoint: str) -> bool:
    """True once moto's own API (`/moto-api/`) answers."""
    try:
        url = f"{_loopback(endpoint)}/moto-api/"
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def client_env(endpoint: str) -> dict[str, str]:
    """What makes boto3 (and the `aws` CLI) talk to the sandbox's moto."""
    return {
        "AWS_ENDPOINT_URL": _loopback(endpoint),
        "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        "AWS_DEFAULT_REGION": REGION,
    }


def _session(endpoint: str) -> tuple[boto3.Session, str]:
    session = boto3.Session(
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
        region_name=REGION,
    )
    return session, _loopback(endpoint)


def ec2_client(endpoint: str) -> EC2Client:
    session, url = _session(endpoint)
    return session.client("ec2", endpoint_url=url)


def eks_client(endpoint: str) -> EKSClient:
    session, url = _session(endpoint)
    return session.client("eks", endpoint_url=url)


def ecr_client(endpoint: str) -> ECRClient:
    session, url = _session(endpoint)
    return session.client("ecr", endpoint_url=url)


@dataclass(frozen=True)
class Egress:
    """The controlplane's egress addresses as AWS hands them out: what a restarted moto gets
    back (`seed(keep=...)`), kept as JSON between runs (`to_json`, `from_json`)."""

    node_ips: list[str]
    nat_ip: str | None

    def to_json(self) -> str:
        return json.dumps({"node_ips": self.node_ips, "nat_ip": self.nat_ip})

    @classmethod
    def from_json(cls, text: str) -> Egress:
        """The saved egress; ValueError (naming the field) when the text is not one."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("an object with node_ips and nat_ip is expected")
        nodes, nat = data.get("node_ips"), data.get("nat_ip")
        if not isinstance(nodes, list) or not all(isinstance(ip, str) for ip in nodes):
            raise ValueError("node_ips: a list of IP addresses is expected")
        if nat is not None and not isinstance(nat, str):
            raise ValueError("nat_ip: an IP address or null is expected")
        for field, ip in [*(("node_ips", ip) for ip in nodes), *([("nat_ip", nat)] if nat else [])]:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise ValueError(f"{field}: {ip!r} is not an IP address") from None
        return cls(node_ips=list(nodes), nat_ip=nat)


def egress(endpoint: str, cluster: str = CLUSTER) -> Egress:
    """The running nodes' public IPs and the NAT's, as they are now (nothing is made)."""
    ec2 = ec2_client(endpoint)
    vpcs = ec2.describe_vpcs(Filters=_filters(("tag:Name", cluster)))["Vpcs"]
    nat = _existing_nat_ip(ec2, vpcs[0]["VpcId"]) if vpcs else None
    return Egress(node_ips=node_ips(endpoint, cluster), nat_ip=nat)


@dataclass(frozen=True)
class ControlplaneAws:
    """What `seed` made (or found): the ids a test needs and the controlplane's egress."""

    cluster: str
    vpc_id: str
    subnet_id: str
    node_ips: list[str]
    """The EKS nodes' public IPs, in launch order (the first is the sandbox's egress IP)."""
    nat_ip: str
    repository_uri: str

    @property
    def egress_ips(self) -> list[str]:
        """Everything the controlplane's traffic may leave from: nodes, then the NAT."""
        return [*self.node_ips, self.nat_ip]


def _name_tag(name: str) -> list[TagTypeDef]:
    return [{"Key": "Name", "Value": name}]


def _node_tags(cluster: str) -> list[TagTypeDef]:
    return [
        {"Key": f"kubernetes.io/cluster/{cluster}", "Value": "owned"},
        {"Key": "eks:cluster-name", "Value": cluster},
        {"Key": "eks:nodegroup-name", "Value": f"{cluster}-nodes"},
        {"Key": "Name", "Value": f"{cluster}-node"},
    ]


def _filters(*pairs: tuple[str, str]) -> list[FilterTypeDef]:
    return [{"Name": name, "Values": [value]} for name, value in pairs]


def running_nodes(ec2: EC2Client, cluster: str) -> list[InstanceTypeDef]:
    """The cluster's running, tagged instances in launch order."""
    found = ec2.describe_instances(
        Filters=[
            {"Name": f"tag:kubernetes.io/cluster/{cluster}", "Values": ["owned"]},
            {"Name": "tag:eks:cluster-name", "Values": [cluster]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )
    instances = [i for r in found["Reservations"] for i in r.get("Instances", [])]
    return sorted(instances, key=lambda i: (i["LaunchTime"], i.get("AmiLaunchIndex", 0)))


def node_ips(endpoint: str, cluster: str = CLUSTER) -> list[str]:
    """The public IPs of the cluster's running nodes, in launch order."""
    return [i["PublicIpAddress"] for i in running_nodes(ec2_client(endpoint), cluster)]


def _node_image(ec2: EC2Client) -> str:
    images = ec2.describe_images(Owners=["amazon"], Filters=_filters(("name", "amazon-eks-node-*")))
    found = images.get("Images") or ec2.describe_images(Owners=["amazon"]).get("Images") or []
    if not found:
        raise AwsSandboxError("moto lists no Amazon machine image to start EKS nodes from")
    return found[0]["ImageId"]


def _run_nodes(ec2: EC2Client, cluster: str, subnet_id: str, count: int) -> list[InstanceTypeDef]:
    ran = ec2.run_instances(
        ImageId=_node_image(ec2),
        InstanceType=NODE_TYPE,
        MinCount=count,
        MaxCount=count,
        NetworkInterfaces=[
            {"DeviceIndex": 0, "SubnetId": subnet_id, "AssociatePublicIpAddress": True}
        ],
        TagSpecifications=[{"ResourceType": "instance", "Tags": _node_tags(cluster)}],
    )
    return sorted(ran["Instances"], key=lambda i: i.get("AmiLaunchIndex", 0))


def _network(ec2: EC2Client, cluster: str) -> tuple[str, str]:
    """The cluster's VPC and public subnet, made once (found by their Name tag after)."""
    vpcs = ec2.describe_vpcs(Filters=_filters(("tag:Name", cluster)))["Vpcs"]
    if vpcs:
        vpc_id = vpcs[0]["VpcId"]
    else:
        vpc_id = ec2.create_vpc(
            CidrBlock=VPC_CIDR,
            TagSpecifications=[{"ResourceType": "vpc", "Tags": _name_tag(cluster)}],
        )["Vpc"]["VpcId"]
    subnets = ec2.describe_subnets(Filters=_filters(("vpc-id", vpc_id)))["Subnets"]
    if subnets:
        return vpc_id, subnets[0]["SubnetId"]
    subnet_id = ec2.create_subnet(
        VpcId=vpc_id,
        CidrBlock=SUBNET_CIDR,
        AvailabilityZone=ZONE,
        TagSpecifications=[
            {"ResourceType": "subnet", "Tags": _name_tag(f"{cluster}-public-{ZONE}")}
        ],
    )["Subnet"]["SubnetId"]
    ec2.modify_subnet_attribute(SubnetId=subnet_id, MapPublicIpOnLaunch={"Value": True})
    gateway = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=gateway, VpcId=vpc_id)
    table = ec2.create_route_table(VpcId=vpc_id)["RouteTable"]["RouteTableId"]
    ec2.create_route(RouteTableId=table, DestinationCidrBlock="0.0.0.0/0", GatewayId=gateway)
    ec2.associate_route_table(RouteTableId=table, SubnetId=subnet_id)
    return vpc_id, subnet_id


def _existing_nat_ip(ec2: EC2Client, vpc_id: str) -> str | None:
    gateways = ec2.describe_nat_gateways(
        Filters=_filters(("vpc-id", vpc_id), ("state", "available"))
    )
    for gateway in gateways["NatGateways"]:
        for address in gateway.get("NatGatewayAddresses", []):
            if "PublicIp" in address:
                return address["PublicIp"]
    return None


def _nat_ip(ec2: EC2Client, vpc_id: str, subnet_id: str, keep: str | None = None) -> str:
    """The NAT gateway's Elastic IP (`keep` when it is made now), the gateway made once."""
    if (found := _existing_nat_ip(ec2, vpc_id)) is not None:
        return found
    allocation = (
        ec2.allocate_address(Domain="vpc", Address=keep)
        if keep
        else ec2.allocate_address(Domain="vpc")
    )
    ec2.create_nat_gateway(SubnetId=subnet_id, AllocationId=allocation["AllocationId"])
    return allocation["PublicIp"]


def _eks(eks: EKSClient, cluster: str, subnet_id: str) -> None:
    """The EKS cluster and its managed node group, when moto supports them."""
    with contextlib.suppress(ClientError, NotImplementedError):
        try:
            eks.describe_cluster(name=cluster)
        except eks.exceptions.ResourceNotFoundException:
            eks.create_cluster(
                name=cluster,
                roleArn=f"arn:aws:iam::{ACCOUNT}:role/{cluster}-cluster",
                resourcesVpcConfig={"subnetIds": [subnet_id], "endpointPublicAccess": True},
            )
        nodegroup = f"{cluster}-nodes"
        if nodegroup not in eks.list_nodegroups(clusterName=cluster).get("nodegroups", []):
            eks.create_nodegroup(
                clusterName=cluster,
                nodegroupName=nodegroup,
                nodeRole=f"arn:aws:iam::{ACCOUNT}:role/{cluster}-node",
                subnets=[subnet_id],
                scalingConfig={"minSize": NODE_COUNT, "maxSize": NODE_COUNT * 2},
            )


def _repository(ecr: ECRClient) -> str:
    try:
        created = ecr.create_repository(repositoryName=ECR_REPOSITORY)
        return created["repository"]["repositoryUri"]
    except ecr.exceptions.RepositoryAlreadyExistsException:
        found = ecr.describe_repositories(repositoryNames=[ECR_REPOSITORY])
        return found["repositories"][0]["repositoryUri"]


def seed(endpoint: str, cluster: str = CLUSTER, keep: Egress | None = None) -> ControlplaneAws:
    """Makes what is missing of the controlplane's AWS side; returns all of it. `keep`: the
    egress of a moto that has since stopped (`egress`): the nodes and the NAT made now get its
    addresses back, the nodes in launch order."""
    ec2 = ec2_client(endpoint)
    vpc_id, subnet_id = _network(ec2, cluster)
    _eks(eks_client(endpoint), cluster, subnet_id)
    nodes = running_nodes(ec2, cluster)
    if len(nodes) < NODE_COUNT:
        ran = _run_nodes(ec2, cluster, subnet_id, NODE_COUNT - len(nodes))
        kept = keep.node_ips[len(nodes) :] if keep is not None else []
        for node, address in zip(ran, kept, strict=False):
            allocation = ec2.allocate_address(Domain="vpc", Address=address)
            ec2.associate_address(
                InstanceId=node["InstanceId"], AllocationId=allocation["AllocationId"]
            )
        nodes = running_nodes(ec2, cluster)
    nat_ip = _nat_ip(ec2, vpc_id, subnet_id, keep.nat_ip if keep is not None else None)
    repository_uri = _repository(ecr_client(endpoint))
    return ControlplaneAws(
        cluster=cluster,
        vpc_id=vpc_id,
        subnet_id=subnet_id,
        node_ips=[i["PublicIpAddress"] for i in nodes],
        nat_ip=nat_ip,
        repository_uri=repository_uri,
    )


def replace_eks_nodes(endpoint: str, cluster: str = CLUSTER) -> list[str]:
    """Terminates the cluster's nodes and runs as many new ones (as a node group update or an
    instance refresh does); returns the new nodes' public IPs, none of them an old one."""
    ec2 = ec2_client(endpoint)
    old = running_nodes(ec2, cluster)
    if not old:
        raise AwsSandboxError(
            f"no running nodes of EKS cluster {cluster} at {endpoint}: seed it first"
            " (`levers9 dev up` does)"
        )
    old_ips = {i["PublicIpAddress"] for i in old}
    subnet_id = old[0]["SubnetId"]
    ec2.terminate_instances(InstanceIds=[i["InstanceId"] for i in old])
    new = _run_nodes(ec2, cluster, subnet_id, len(old))
    for _ in range(REPLACE_ATTEMPTS):
        # moto draws public IPs at random from one /16; a replaced node never keeps its address.
        reused = [i for i in new if i["PublicIpAddress"] in old_ips]
        if not reused:
            return [i["PublicIpAddress"] for i in new]
        ec2.terminate_instances(InstanceIds=[i["InstanceId"] for i in reused])
        kept = [i for i in new if i not in reused]
        new = kept + _run_nodes(ec2, cluster, subnet_id, len(reused))
    raise AwsSandboxError("moto kept handing out the old nodes' public IPs")


class LocalMoto(ChildServer):
    """moto's server as a child process of this one (tests, scripts)."""

    def __init__(self, log: Path, port: int = 0) -> None:
        self.log = log
        self.port = port or free_port()
        self.endpoint = endpoint_url(self.port)
        self.child = ChildProcess(f"moto on {self.endpoint}", log, AwsSandboxError, poll_s=0.1)

    def start(self) -> LocalMoto:
        self.child.spawn(moto_argv(self.port), lambda: moto_ready(self.endpoint))
        return self
