"""Scenarios: the cluster the sandbox simulates, as a validated YAML document.

A scenario names the nodes (labels, taints, capacity, GPUs and their device-id style,
addresses, readiness), the images the registries hold and which of them the kubelet runs as
local processes, the Kubernetes objects to create at start (`kubectl apply` of
`objects:`), the cloud network values the API server enforces (egress IPs, authorized
networks), and the timings (pull delay, heartbeats, back-offs) so tests can run fast.
`scenarios/default.yaml` is the GKE-like default; keys are camelCase as in Kubernetes.

Every address is a loopback address (127.0.0.0/8): the sandbox never reaches beyond the
machine it runs on.
"""

from __future__ import annotations

import ipaddress
import uuid
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
DEFAULT_PRODUCT = "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


def _loopback_address(value: str) -> str:
    address = ipaddress.IPv4Address(value)
    if address not in LOOPBACK:
        raise ValueError(f"{value} is not a loopback address; the sandbox uses 127.0.0.0/8 only")
    return str(address)


def _loopback_network(value: str) -> str:
    network = ipaddress.IPv4Network(value, strict=False)
    if not network.subnet_of(LOOPBACK):
        raise ValueError(f"{value} is not inside 127.0.0.0/8; the sandbox uses loopback only")
    return str(network)


class Taint(_Model):
    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]

    def manifest(self) -> dict[str, str]:
        out = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out


class Gpus(_Model):
    """A node's cards: how many, what GFD calls them, and how the device plugin names them
    (`nvidia`: GKE's `nvidia0`...; `uuid`: NVIDIA's plugin, `GPU-<uuid>`), or explicit ids."""

    count: int = Field(default=0, ge=0)
    product: str = DEFAULT_PRODUCT
    id_style: Literal["nvidia", "uuid"] = "nvidia"
    ids: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _ids_match_count(self) -> Gpus:
        if self.ids is not None and len(self.ids) != self.count:
            raise ValueError(f"gpus.ids has {len(self.ids)} ids for count {self.count}")
        return self

    def device_ids(self, node: str) -> list[str]:
        if self.ids is not None:
            return list(self.ids)
        if self.id_style == "nvidia":
            return [f"nvidia{i}" for i in range(self.count)]
        # Stable per node and index, so a restarted sandbox reports the same cards.
        return [
            f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}.gpu{i}')}" for i in range(self.count)
        ]


class NodeSpec(_Model):
    name: str = Field(min_length=1, max_length=63)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    cpu: str = "8"
    memory: str = "32Gi"
    max_pods: int = Field(default=110, ge=1)
    # What the kubelet reserves for the system: allocatable = capacity - reserved.
    reserved_cpu: str = "0"
    reserved_memory: str = "0"
    gpus: Gpus = Field(default_factory=Gpus)
    internal_ip: str
    external_ip: str
    pod_cidr: str | None = None
    ready: bool = True
    unschedulable: bool = False

    _ips = field_validator("internal_ip", "external_ip")(_loopback_address)

    @field_validator("pod_cidr")
    @classmethod
    def _cidr(cls, value: str | None) -> str | None:
        return None if value is None else _loopback_network(value)


class ProcessImage(_Model):
    """An image the kubelet runs as a local process: its ENTRYPOINT and CMD."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()


class Images(_Model):
    pull_seconds: float = Field(default=2.0, ge=0)
    present: tuple[str, ...] = ()
    process: dict[str, ProcessImage] = Field(default_factory=dict)
    # Registry host -> the loopback `host:port` of a real registry standing in for it: images
    # on that host are pullable when that registry holds them (`present` is not consulted).
    mirrors: dict[str, str] = Field(default_factory=dict)
    process_tasks: bool = False
    """The agent's tests' knob, which no pool value can express: the kubelet adds
    `LEVERS9_PROCESS_TASKS=true` to the containers it runs from `process` images, so a worker
    agent there runs its tasks that name no image as processes of its own (outside any
    container) instead of in the pool's default image. Only for tests whose point is the
    controlplane (counting runs through host files, restarts, faults), never the product."""

    @field_validator("mirrors")
    @classmethod
    def _loopback_mirrors(cls, values: dict[str, str]) -> dict[str, str]:
        for host, address in values.items():
            ip, colon, port = address.rpartition(":")
            if not colon or not port.isdigit() or not host:
                raise ValueError(f"mirror {host}={address}: want HOST=127.0.0.1:PORT")
            _loopback_address(ip)
        return values


class Network(_Model):
    """Cloud-side values the API server enforces (it owns auth; the sandbox carries them)."""

    egress_ips: tuple[str, ...] = ()
    authorized_networks: tuple[str, ...] = ()

    @field_validator("egress_ips")
    @classmethod
    def _egress(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_loopback_address(v) for v in values)

    @field_validator("authorized_networks")
    @classmethod
    def _networks(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_loopback_network(v) for v in values)


class Timing(_Model):
    """How fast the simulated cluster moves; the defaults are the real components'."""

    heartbeat_seconds: float = Field(default=10.0, gt=0)
    resync_seconds: float = Field(default=30.0, gt=0)
    node_monitor_grace_seconds: float = Field(default=40.0, gt=0)
    # Pod GC collects the pods of a deleted node once the node has been missing for the
    # quarantine, on its next pass (every `pod_gc_period_seconds`): 40 to 60 s, as on GKE.
    orphan_pod_quarantine_seconds: float = Field(default=40.0, ge=0)
    pod_gc_period_seconds: float = Field(default=20.0, ge=0)
    # The apiserver's watch cache keeps events this long (410 Expired for older versions),
    # and a paginated list's continue token lasts this long (etcd's compaction interval).
    watch_cache_seconds: float = Field(default=75.0, gt=0)
    continue_token_seconds: float = Field(default=300.0, gt=0)
    image_pull_backoff_seconds: float = Field(default=10.0, gt=0)
    image_pull_backoff_max_seconds: float = Field(default=300.0, gt=0)
    crash_loop_backoff_seconds: float = Field(default=10.0, gt=0)
    crash_loop_backoff_max_seconds: float = Field(default=300.0, gt=0)
    job_backoff_seconds: float = Field(default=10.0, ge=0)
    job_backoff_max_seconds: float = Field(default=360.0, ge=0)

    @staticmethod
    def backoff(first: float, longest: float, attempt: int) -> float:
        """`first`, doubled per earlier attempt, capped at `longest`."""
        return float(min(first * 2 ** min(attempt, 30), longest))


class ClusterInfo(_Model):
    name: str = "sandbox"
    project: str = "demo"
    location: str = "us-central1-a"
    kubelet_version: str = "v1.33.5-gke.1308000"


class Scenario(_Model):
    cluster: ClusterInfo = Field(default_factory=ClusterInfo)
    nodes: tuple[NodeSpec, ...] = ()
    images: Images = Field(default_factory=Images)
    network: Network = Field(default_factory=Network)
    timing: Timing = Field(default_factory=Timing)
    objects: tuple[dict[str, Any], ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> Scenario:
        for what, values in (
            ("node name", [n.name for n in self.nodes]),
            ("internal IP", [n.internal_ip for n in self.nodes]),
            ("external IP", [n.external_ip for n in self.nodes]),
        ):
            seen: set[str] = set()
            for value in values:
                if value in seen:
                    raise ValueError(f"duplicate {what} {value}")
                seen.add(value)
        for obj in self.objects:
            if not obj.get("apiVersion") or not obj.get("kind"):
                raise ValueError("every entry of objects needs apiVersion and kind")
        return self

    def with_registry_mirrors(self, mirrors: dict[str, str]) -> Scenario:
        """This scenario with `mirrors` added to `images.mirrors` (validated)."""
        images = self.images.model_dump()
        images["mirrors"] = {**self.images.mirrors, **mirrors}
        return self.model_copy(update={"images": Images.model_validate(images)})

    def with_process_images(self, entrypoints: dict[str, str]) -> Scenario:
        """This scenario with each image (reference -> the command it runs) a process image."""
        images = self.images.model_dump()
        added = {ref: {"entrypoint": [command]} for ref, command in entrypoints.items()}
        images["process"] = {**images["process"], **added}
        return self.model_copy(update={"images": Images.model_validate(images)})

    @staticmethod
    def from_yaml(text: str) -> Scenario:
        return Scenario.model_validate(yaml.safe_load(text) or {})

    @staticmethod
    def load(path: Path | None = None) -> Scenario:
        """A scenario file, or the packaged default."""
        if path is None:
            text = resources.files("sandbox").joinpath("scenarios/default.yaml").read_text()
        else:
            text = path.read_text()
        return Scenario.from_yaml(text)
