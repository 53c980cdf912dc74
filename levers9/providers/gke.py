"""The cloud side of a GKE pool, as data (pure): the objects the attach step keeps true, their
names, the inputs and results of the cloud activities and workflows, and the values block attach
prints.

Names, from the spec's "Day two" row on removing a pool:

| object | name |
| - | - |
| service account | `levers9-controlplane@<project>.iam.gserviceaccount.com` |
| Artifact Registry repository | `levers9` in the cluster's region |
| firewall rule | `levers9-controlplane-to-<cluster>` |
| worker image | `<region>-docker.pkg.dev/<project>/levers9/worker:latest` |
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from levers9.config import as_values, pool_values
from levers9.core.capacity import ACCELERATOR_LABEL

SERVICE_ACCOUNT_ID = "levers9-controlplane"
DEVELOPER_ROLE = "roles/container.developer"
REPOSITORY_ID = "levers9"
WORKER_IMAGE_NAME = "worker"
DEFAULT_KEY_FILE = "~/.levers9/gke-sa.json"
DEFAULT_EKS_CLUSTER = "levers9-controlplane"
EGRESS_WORKFLOW = "EgressAllowlistWorkflow"
ATTACH_WORKFLOW = "AttachClusterWorkflow"
IMAGE_RECOPY_WORKFLOW = "ImageRecopyWorkflow"
REMOVE_POOL_WORKFLOW = "RemovePoolWorkflow"

ACCELERATORS: dict[str, tuple[str, str]] = {
    # gpuType -> (GKE's accelerator label value, the pool name's slug)
    "RTXPro6000": ("nvidia-rtx-pro-6000", "rtx6000"),
    "L4": ("nvidia-l4", "l4"),
    "A100": ("nvidia-tesla-a100", "a100"),
    "A100-80GB": ("nvidia-a100-80gb", "a100-80gb"),
    "H100": ("nvidia-h100-80gb", "h100"),
    "H200": ("nvidia-h200-141gb", "h200"),
    "B200": ("nvidia-b200", "b200"),
    "T4": ("nvidia-tesla-t4", "t4"),
}

_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_PROJECT = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$|^[a-z][-a-z0-9]{0,28}[a-z0-9]$")
_ZONE = re.compile(r"^[a-z]+-[a-z]+\d+(-[a-z])?$")

StepStatus = Literal["created", "unchanged", "updated", "skipped"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True)


class ClusterRef(_Model):
    """A GKE cluster: `--project --zone --cluster` (a region is a location too)."""

    project: str
    location: str
    cluster: str

    @field_validator("project")
    @classmethod
    def _project(cls, value: str) -> str:
        if not _PROJECT.match(value):
            raise ValueError(f"--project {value!r} is not a GCP project id (lowercase, digits, -)")
        return value

    @field_validator("location")
    @classmethod
    def _location(cls, value: str) -> str:
        if not _ZONE.match(value):
            raise ValueError(f"--zone {value!r} is not a GCP zone or region (e.g. us-central1-a)")
        return value

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"--cluster {value!r} is not a GKE cluster name")
        return value

    @property
    def region(self) -> str:
        parts = self.location.split("-")
        return "-".join(parts[:2])

    @property
    def cluster_path(self) -> str:
        return f"projects/{self.project}/locations/{self.location}/clusters/{self.cluster}"

    @property
    def service_account_email(self) -> str:
        return f"{SERVICE_ACCOUNT_ID}@{self.project}.iam.gserviceaccount.com"

    @property
    def firewall_name(self) -> str:
        return firewall_name(self.cluster)

    @property
    def repository_path(self) -> str:
        return f"projects/{self.project}/locations/{self.region}/repositories/{REPOSITORY_ID}"

    @property
    def worker_image(self) -> str:
        host = f"{self.region}-docker.pkg.dev"
        return f"{host}/{self.project}/{REPOSITORY_ID}/{WORKER_IMAGE_NAME}:latest"


def firewall_name(cluster: str) -> str:
    return f"levers9-controlplane-to-{cluster}"


def egress_workflow_id(cluster: str) -> str:
    return f"egress:{cluster}"


def attach_workflow_id(cluster: str) -> str:
    return f"attach:{cluster}"


def remove_pool_workflow_id(pool_name: str) -> str:
    return f"remove:{pool_name}"


def as_cidr(ip: str) -> str:
    """`203.0.113.7` -> `203.0.113.7/32`; a CIDR stays as it is; anything else is refused."""
    try:
        network = ipaddress.ip_network(ip if "/" in ip else f"{ip}/32", strict=True)
    except ValueError as exc:
        raise ValueError(f"{ip!r} is not an IPv4 address or CIDR: {exc}") from None
    if network.version != 4:
        raise ValueError(f"{ip!r}: authorized networks and firewall ranges here are IPv4")
    return str(network)


def appended(existing: list[str], wanted: list[str]) -> tuple[list[str], list[str]]:
    """Append-only merge: every existing entry kept in its order, the missing wanted ones
    added after it. Returns (merged, added)."""
    have = {as_cidr(c) for c in existing}
    added = []
    for cidr in (as_cidr(c) for c in wanted):
        if cidr not in have:
            have.add(cidr)
            added.append(cidr)
    return [*existing, *added], added


class Step(_Model):
    """One step of the cloud side, as attach and rotation report it."""

    name: str
    status: StepStatus
    detail: str = ""

    def line(self) -> str:
        return f"{self.name}: {self.status}" + (f" ({self.detail})" if self.detail else "")


class ClusterInfo(_Model):
    """What attach reads from the cluster: where its API is, its CA, its node pools' tags."""

    endpoint: str
    ca_certificate: str
    network: str
    node_pool_tags: dict[str, list[str]] = Field(default_factory=dict)


class KeyInput(_Model):
    cluster: ClusterRef
    key_file: str
    """Where the key is written (0600) on the machine the activity runs on; never returned."""


class FirewallInput(_Model):
    cluster: ClusterRef
    network: str
    target_tags: list[str]
    cidrs: list[str]


class NetworksInput(_Model):
    cluster: ClusterRef
    cidrs: list[str]
    when_disabled: Literal["refuse", "enable", "leave"] = "refuse"
    """A cluster with master authorized networks disabled answers any address: attach refuses
    (enabling them with only our IPs would lock out kubectl, CI and everyone else) unless told
    to enable them; the egress workflow's rotations leave such a cluster alone."""


class EgressSource(_Model):
    """Where the controlplane's egress IPs come from: the EKS cluster's nodes and NAT gateways."""

    eks_cluster: str = DEFAULT_EKS_CLUSTER


class CopyImageInput(_Model):
    source: str
    destination: str


class CopiedImage(_Model):
    destination: str
    digest: str
    previous_digest: str = ""

    @property
    def status(self) -> StepStatus:
        if not self.previous_digest:
            return "created"
        return "unchanged" if self.previous_digest == self.digest else "updated"


class AttachInput(_Model):
    cluster: ClusterRef
    node_pool: str
    gpu_type: str
    pool_name: str
    key_file: str = DEFAULT_KEY_FILE
    source_image: str
    eks_cluster: str = DEFAULT_EKS_CLUSTER
    ips: list[str] = Field(default_factory=list)
    """Extra egress IPs (`--ip`), beside the discovered ones."""
    controlplane_task_queue: str
    """Where the controlplane's Temporal worker polls: the egress workflow lives there."""
    tunnel: bool = False
    """A tunnel-only pool: nothing dials the nodes, so no firewall rule."""
    enable_authorized_networks: bool = False
    """`--enable-authorized-networks`: on a cluster open to all, turn them on with our IPs."""


class AttachResult(_Model):
    steps: list[Step]
    values_block: dict[str, Any]
    image_digest: str
    egress_ips: list[str]


class EgressInput(_Model):
    cluster: ClusterRef
    network: str
    target_tags: list[str]
    eks_cluster: str = DEFAULT_EKS_CLUSTER
    allowlist: list[str] = Field(default_factory=list)
    """CIDRs appended so far; carried across continue-as-new."""
    firewall: bool = True
    """False for a tunnel-only cluster: only the authorized networks are kept."""
    rotations: list[Rotation] = Field(default_factory=list)
    """The latest rotations (the query shows them); carried across continue-as-new."""
    max_history_events: int = Field(default=2_000, ge=20)
    """Continue as new past this many events."""


class RotateIps(_Model):
    """Signal `rotate_ips`: `{"ips": [...]}`, or `{}` to discover them. Taken loosely (a bare
    string, numbers) and checked by the workflow, so a typo is answered, not dropped."""

    ips: list[Any] | str | None = None
    request_id: str = ""
    """Set by `levers9 egress rotate` to find its own rotation among the recorded ones."""


class Rotation(_Model):
    at: str
    request_id: str = ""
    requested: list[str]
    added: list[str]
    steps: list[Step]
    error: str = ""


class Allowlist(EgressInput):
    """Query `allowlist` of `egress:<cluster>`: what is appended so far, latest rotations."""


EgressInput.model_rebuild()  # its `rotations` names Rotation, defined after it


class ImageRecopyInput(_Model):
    """From the controlplane's `sourceImage` to the pool's `workerImage` (both from config)."""

    pool_name: str


class RecopyResult(_Model):
    digest: str
    workers_restarted: list[str]


class RemovePoolInput(_Model):
    pool_name: str
    delete_namespace: bool = False
    reason: str = "pool removed"


class RemovePoolResult(_Model):
    schedule_deleted: bool
    workers_ended: list[str]
    machines_ended: list[str]
    jobs_deleted: int
    namespace_deleted: bool
    note: str = ""


def accelerator(gpu_type: str) -> tuple[str, str]:
    try:
        return ACCELERATORS[gpu_type]
    except KeyError:
        known = ", ".join(ACCELERATORS)
        raise ValueError(f"--gpu {gpu_type!r} is not a known GPU type; one of {known}") from None


def values_block(
    cluster: ClusterRef,
    info: ClusterInfo,
    gpu_type: str,
    *,
    tunnel: bool = False,
) -> dict[str, Any]:
    """The spec's pool block with the cluster's endpoint and CA filled in (the key goes in the
    private values file, never here). The selector is the card's label, so every node pool
    with that card joins."""
    label, _ = accelerator(gpu_type)
    endpoint = info.endpoint if "://" in info.endpoint else f"https://{info.endpoint}"
    pool = pool_values(
        gpu_type=gpu_type,
        flavor="gke",
        endpoint=endpoint,
        ca_certificate=info.ca_certificate,
        node_selector={ACCELERATOR_LABEL: label},
        worker_image=cluster.worker_image,
        tunnel=tunnel,
        node_paths=True,
    )
    return as_values(pool)


def default_pool_name(gpu_type: str) -> str:
    return f"gke-{accelerator(gpu_type)[1]}"


def private_values_commands(pool_name: str, key_file: str) -> list[str]:
    """The spec's recipe for the private values file (the key never goes in the repository)."""
    return [
        "umask 077",
        'python3 -c \'import json,sys; print(json.dumps({"config": {"worker": {"pools":'
        f' {{"{pool_name}": {{"kubernetes": {{"credentials":'
        " open(sys.argv[1]).read()}}}}}}))' \\",
        f"  {key_file} > ~/.levers9/gke-pool-values.json",
        "deploy/eks/deploy.sh -f ~/.levers9/gke-pool-values.json",
    ]
