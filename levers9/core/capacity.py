"""What a node offers as a machine, from the node, the pods on it and our worker Jobs (pure).

The spec's "Sharing nodes with other workloads": GPUs free are what the node has allocatable
minus the GPU limits of every neighbour pod bound to it that has not finished (a terminating
pod still holds its cards), minus the cards our own workers hold, pending or running, counted
from our Jobs (so a Job whose pod is not visible yet still holds its cards). CPU and memory
likewise, from requests. Never negative.

Everything here takes Kubernetes objects as the JSON dicts the API returns: the pool observes
100,000 pods in one pass, and model objects would cost seconds of CPU.
"""

from __future__ import annotations

import enum
import functools
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from levers9.contract import GPU
from levers9.core.quantity import millicores, whole

ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
GFD_PRODUCT_LABEL = "nvidia.com/gpu.product"
MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_US = "levers9"
POOL_LABEL = "levers9.dev/pool"
NODE_LABEL = "levers9.dev/node"
WORKER_ID_LABEL = "levers9.dev/worker-id"
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

Obj = Mapping[str, Any]

# GKE's accelerator label values (cloud.google.com/gke-accelerator) -> levers9 GPU types.
GKE_ACCELERATORS = {
    "nvidia-rtx-pro-6000": "RTXPro6000",
    "nvidia-b200": "B200",
    "nvidia-gb200": "GB200",
    "nvidia-h200-141gb": "H200",
    "nvidia-h100-80gb": "H100",
    "nvidia-h100-mega-80gb": "H100Mega",
    "nvidia-a100-80gb": "A100-80GB",
    "nvidia-tesla-a100": "A100",
    "nvidia-l4": "L4",
    "nvidia-tesla-t4": "T4",
    "nvidia-tesla-v100": "V100",
    "nvidia-tesla-p100": "P100",
    "nvidia-tesla-p4": "P4",
    "nvidia-tesla-k80": "K80",
}
# GPU feature discovery's product names (nvidia.com/gpu.product), matched in order.
GFD_PRODUCTS = (
    (re.compile(r"RTX-PRO-6000", re.I), "RTXPro6000"),
    (re.compile(r"GB200", re.I), "GB200"),
    (re.compile(r"B200", re.I), "B200"),
    (re.compile(r"H200", re.I), "H200"),
    (re.compile(r"H100", re.I), "H100"),
    (re.compile(r"A100.*80GB", re.I), "A100-80GB"),
    (re.compile(r"A100", re.I), "A100"),
    (re.compile(r"L40S", re.I), "L40S"),
    (re.compile(r"L4\b", re.I), "L4"),
    (re.compile(r"T4\b", re.I), "T4"),
    (re.compile(r"V100", re.I), "V100"),
)


class MachineStatus(enum.StrEnum):
    HEALTHY = "Healthy"
    NOT_READY = "NotReady"
    CORDONED = "Cordoned"
    PREEMPTING = "Preempting"
    """Its VM is announced to go (a spot preemption's notice: PREEMPTION_TAINT): drained as a
    cordoned one is, before it goes."""
    TAINTED = "Tainted"
    FULL = "Full"
    TOO_SMALL = "TooSmall"
    """Cards free, but less CPU or memory than the worker pod requests (`workerResources`)."""


NOT_A_MACHINE = {
    MachineStatus.NOT_READY: "the node is not Ready",
    MachineStatus.CORDONED: "cordoned: draining, no new worker",
    MachineStatus.PREEMPTING: "preemption announced: draining before its VM goes",
    MachineStatus.TAINTED: "a taint the pool does not tolerate",
    MachineStatus.FULL: "no free card: its neighbours hold them all",
    MachineStatus.TOO_SMALL: "less CPU or memory free than a worker asks (workerResources)",
}
"""Why a node of the pool is not a machine, by the status `node_capacity` gave it."""


class Resources(BaseModel):
    """An amount of GPUs, CPU (millicores) and memory (bytes)."""

    model_config = ConfigDict(frozen=True)

    gpus: int = 0
    cpu_millis: int = 0
    memory_bytes: int = 0

    def minus(self, other: Resources) -> Resources:
        """Never negative: a node overcommitted by its neighbours offers nothing."""
        return Resources(
            gpus=max(0, self.gpus - other.gpus),
            cpu_millis=max(0, self.cpu_millis - other.cpu_millis),
            memory_bytes=max(0, self.memory_bytes - other.memory_bytes),
        )


class NodeCapacity(BaseModel):
    """One node as the pool sees it: compact, so a pass over 5,000 nodes stays small."""

    model_config = ConfigDict(frozen=True)

    name: str
    machine: bool
    status: MachineStatus
    gpu_type: str | None
    total_gpus: int
    free: Resources
    worker_gpus: int
    workers: tuple[str, ...]
    external_ip: str | None
    total_memory_bytes: int = 0
    """The node's allocatable memory: the most a task there could ever be given."""
    neighbour_gpus: int = 0
    """Cards the node's other pods hold (neighbours; another pool's worker, or one of ours whose
    Job is gone, is one too): `total_gpus` less these, `worker_gpus` and `free.gpus` is what the
    node does not offer at all (cards not allocatable)."""
    finished_workers: tuple[str, ...] = ()
    """Our workers whose Job has finished (Failed, or Complete) and is not deleted yet: their
    agents are gone, whatever their records say (the machine ends those records now)."""


@dataclass(frozen=True)
class Toleration:
    key: str | None
    operator: str = "Equal"
    value: str | None = None
    effect: str | None = None

    def tolerates(self, taint: Obj) -> bool:
        if self.effect and self.effect != taint.get("effect"):
            return False
        if self.key is None:  # an empty key with Exists tolerates everything
            return self.operator == "Exists"
        if self.key != taint.get("key"):
            return False
        return self.operator == "Exists" or (self.value or "") == (taint.get("value") or "")


GKE_GPU_TOLERATION = Toleration(key=GPU, operator="Exists")


def gpu_type_of(labels: Mapping[str, str]) -> str | None:
    """The levers9 GPU type of a node, from GKE's accelerator label or GFD's product label."""
    accelerator = labels.get(ACCELERATOR_LABEL)
    if accelerator:
        return GKE_ACCELERATORS.get(accelerator, accelerator)
    product = labels.get(GFD_PRODUCT_LABEL)
    if product:
        for pattern, gpu_type in GFD_PRODUCTS:
            if pattern.search(product):
                return gpu_type
        return product
    return None


Amounts = tuple[int, int, int]
"""(gpus, cpu millicores, memory bytes): plain ints in the per-pod loop, which runs 100,000 times
a pass; `Resources` is what leaves this module."""

_NONE: Amounts = (0, 0, 0)


@functools.lru_cache(maxsize=4096)
def _millicores(text: str | int | float) -> int:
    # Pods of one cluster repeat a handful of quantity strings; parse each once.
    return millicores(text)


@functools.lru_cache(maxsize=4096)
def _whole(text: str | int | float) -> int:
    return whole(text)


def _container_amounts(spec: Obj | None) -> Amounts:
    """Requests of one container: GPUs from limits (extended resources), CPU/memory requests.

    Kubernetes defaults a missing request to the limit, so the limit stands in for it.
    """
    if not spec:
        return _NONE
    limits = spec.get("limits") or {}
    requests = spec.get("requests") or {}
    gpus = limits.get(GPU, requests.get(GPU, 0))
    cpu = requests.get("cpu", limits.get("cpu", 0))
    memory = requests.get("memory", limits.get("memory", 0))
    return (
        _whole(gpus) if gpus else 0,
        _millicores(cpu) if cpu else 0,
        _whole(memory) if memory else 0,
    )


def _pod_amounts(pod_spec: Obj) -> Amounts:
    gpus = cpu = memory = 0
    for container in pod_spec.get("containers") or ():
        g, c, m = _container_amounts(container.get("resources"))
        gpus, cpu, memory = gpus + g, cpu + c, memory + m
    # Native sidecars (init containers with restartPolicy Always) run from their start to the
    # pod's end: they add to the containers, and to every init container after them.
    side_g = side_c = side_m = 0
    init_g = init_c = init_m = 0
    for container in pod_spec.get("initContainers") or ():
        g, c, m = _container_amounts(container.get("resources"))
        if container.get("restartPolicy") == "Always":
            side_g, side_c, side_m = side_g + g, side_c + c, side_m + m
            g = c = m = 0
        init_g, init_c, init_m = (
            max(init_g, side_g + g),
            max(init_c, side_c + c),
            max(init_m, side_m + m),
        )
    gpus, cpu, memory = (
        max(gpus + side_g, init_g),
        max(cpu + side_c, init_c),
        max(memory + side_m, init_m),
    )
    overhead = pod_spec.get("overhead")
    if overhead:
        g, c, m = _container_amounts({"requests": overhead})
        gpus, cpu, memory = gpus + g, cpu + c, memory + m
    return gpus, cpu, memory


def pod_requests(pod_spec: Obj) -> Resources:
    """What a pod holds on its node, as the scheduler counts it.

    Init containers run one at a time before the others, so the pod needs the larger of the
    biggest init container and the sum of the containers (plus its overhead). Native sidecars
    (`restartPolicy: Always`) keep running: their sum adds to the containers' and to each
    init container that starts after them (the scheduler's rule, Kubernetes 1.29+).
    """
    gpus, cpu, memory = _pod_amounts(pod_spec)
    return Resources(gpus=gpus, cpu_millis=cpu, memory_bytes=memory)


def node_resources(node_status: Obj, field: str) -> Resources:
    amounts = node_status.get(field) or {}
    return Resources(
        gpus=whole(amounts.get(GPU, 0)),
        cpu_millis=millicores(amounts.get("cpu", 0)),
        memory_bytes=whole(amounts.get("memory", 0)),
    )


def is_ready(node: Obj) -> bool:
    for condition in node.get("status", {}).get("conditions") or ():
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def external_ip(node: Obj) -> str | None:
    """The node's ExternalIP: what a worker advertises (never the node name)."""
    addresses = node.get("status", {}).get("addresses") or ()
    for kind in ("ExternalIP", "InternalIP"):
        for address in addresses:
            if address.get("type") == kind:
                return str(address.get("address"))
    return None


def selector_matches(labels: Mapping[str, str], selector: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


PREEMPTION_TAINT = "cloud.google.com/impending-node-termination"
"""What a node carries once its VM's preemption is announced (GKE's node termination handler
sets it on a spot VM's notice; the sandbox's `node preempt` too)."""


def preemption_announced(node: Obj) -> bool:
    return any(t.get("key") == PREEMPTION_TAINT for t in node.get("spec", {}).get("taints") or ())


def untolerated_taints(node: Obj, tolerations: Sequence[Toleration]) -> list[Obj]:
    return [
        taint
        for taint in node.get("spec", {}).get("taints") or ()
        if taint.get("effect") in BLOCKING_EFFECTS
        and taint.get("key") != "node.kubernetes.io/unschedulable"  # that is cordon
        and not any(t.tolerates(taint) for t in tolerations)
    ]


@dataclass(frozen=True, slots=True)
class PodHold:
    """What one bound, unfinished pod holds on its node: all a pass needs of it (the watch-fed
    cache keeps this, about 100 bytes, instead of the pod's JSON)."""

    node: str
    amounts: Amounts
    pool: str | None = None
    """The `levers9.dev/pool` label of one of our workers; None for any other pod."""
    worker_id: str | None = None


@dataclass(frozen=True, slots=True)
class JobHold:
    """One of our worker Jobs: where it runs, whether it is active, what its pod asks for."""

    node: str
    pool: str
    worker_id: str
    active: bool
    amounts: Amounts


def pod_hold(pod: Obj) -> PodHold | None:
    """The hold of a bound pod; None when it is finished (it holds nothing) or not bound."""
    if pod.get("status", {}).get("phase") in TERMINAL_PHASES:
        return None
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    if not node:
        return None
    labels = pod.get("metadata", {}).get("labels") or {}
    # 100,000 holds repeat a few thousand node names and a handful of amounts: share them.
    node, amounts = sys.intern(node), _shared(_pod_amounts(spec))
    if labels.get(MANAGED_BY) == MANAGED_BY_US and POOL_LABEL in labels:
        return PodHold(node, amounts, labels[POOL_LABEL], labels.get(WORKER_ID_LABEL))
    return PodHold(node, amounts)


@functools.lru_cache(maxsize=4096)
def _shared(amounts: Amounts) -> Amounts:
    return amounts


def job_hold(job: Obj) -> JobHold | None:
    """The hold of one of our worker Jobs; None for a Job without our pool and node labels."""
    labels = job.get("metadata", {}).get("labels") or {}
    pool, node = labels.get(POOL_LABEL), labels.get(NODE_LABEL)
    if not pool or not node:
        return None
    template = job.get("spec", {}).get("template", {}).get("spec") or {}
    return JobHold(
        node, pool, labels.get(WORKER_ID_LABEL, ""), job_is_active(job), _pod_amounts(template)
    )


def _holds(hold: PodHold, pool_name: str, active_workers: frozenset[str]) -> bool:
    """A worker pod whose Job is gone or finished but which has not ended yet (still
    terminating after its Job was deleted) holds its cards like any pod, and so does another
    pool's worker."""
    return not (hold.pool == pool_name and hold.worker_id in active_workers)


def job_is_active(job: Obj) -> bool:
    for condition in job.get("status", {}).get("conditions") or ():
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return False
    return True


def _total(amounts: Iterable[Amounts]) -> Resources:
    gpus = cpu = memory = 0
    for g, c, m in amounts:
        gpus, cpu, memory = gpus + g, cpu + c, memory + m
    return Resources(gpus=gpus, cpu_millis=cpu, memory_bytes=memory)


@dataclass(frozen=True)
class PoolView:
    """What decides whether a node is a machine of the pool."""

    pool_name: str
    node_selector: Mapping[str, str]
    tolerations: Sequence[Toleration]
    worker_requests: Resources = field(default_factory=Resources)
    """What a worker pod asks besides its cards: a node that cannot give it gets no worker."""


def node_capacity(
    node: Obj, pods: Iterable[PodHold], jobs: Iterable[JobHold], pool: PoolView
) -> NodeCapacity:
    """What one node offers the pool; `pods` are the holds of the pods bound to it, `jobs` our
    Jobs there."""
    metadata, status, spec = node.get("metadata", {}), node.get("status", {}), node.get("spec", {})
    allocatable = node_resources(status, "allocatable")
    capacity = node_resources(status, "capacity")
    jobs = list(jobs)
    active_jobs = [job for job in jobs if job.active]
    active_workers = frozenset(job.worker_id for job in active_jobs)
    held = _total(pod.amounts for pod in pods if _holds(pod, pool.pool_name, active_workers))
    worker_held = _total(job.amounts for job in active_jobs)
    free = allocatable.minus(held).minus(worker_held)
    workers = tuple(sorted(job.worker_id for job in active_jobs))
    finished = tuple(sorted(job.worker_id for job in jobs if not job.active))
    if not is_ready(node):
        state = MachineStatus.NOT_READY
    elif preemption_announced(node):
        state = MachineStatus.PREEMPTING
    elif spec.get("unschedulable"):
        state = MachineStatus.CORDONED
    elif untolerated_taints(node, pool.tolerations):
        state = MachineStatus.TAINTED
    elif free.gpus == 0 and worker_held.gpus == 0:
        state = MachineStatus.FULL
    elif not active_jobs and (
        free.cpu_millis < pool.worker_requests.cpu_millis
        or free.memory_bytes < pool.worker_requests.memory_bytes
    ):
        state = MachineStatus.TOO_SMALL
    else:
        state = MachineStatus.HEALTHY
    return NodeCapacity(
        name=metadata["name"],
        machine=state is MachineStatus.HEALTHY,
        status=state,
        gpu_type=gpu_type_of(metadata.get("labels") or {}),
        total_gpus=max(capacity.gpus, allocatable.gpus),
        total_memory_bytes=allocatable.memory_bytes,
        free=free,
        worker_gpus=worker_held.gpus,
        neighbour_gpus=held.gpus,
        workers=workers,
        external_ip=external_ip(node),
        finished_workers=finished,
    )


def pool_capacity(
    nodes: Iterable[Obj], pods: Iterable[Obj], jobs: Iterable[Obj], pool: PoolView
) -> dict[str, NodeCapacity]:
    """Every node that matches the pool's selector, keyed by name.

    `pods` may be every bound pod of the cluster: they are grouped by `spec.nodeName` once, so
    the cost is linear in pods plus nodes. `jobs` are our worker Jobs (their `levers9.dev/node`
    label says where they run).
    """
    selected = [
        node
        for node in nodes
        if selector_matches(node.get("metadata", {}).get("labels") or {}, pool.node_selector)
    ]
    names = {node["metadata"]["name"] for node in selected}
    pods_by_node: dict[str, list[PodHold]] = defaultdict(list)
    for pod in pods:
        if pod.get("spec", {}).get("nodeName") in names:
            hold = pod_hold(pod)
            if hold is not None:
                pods_by_node[hold.node].append(hold)
    jobs_by_node: dict[str, list[JobHold]] = defaultdict(list)
    for job in jobs:
        held = job_hold(job)
        if held is not None and held.pool == pool.pool_name and held.node in names:
            jobs_by_node[held.node].append(held)
    return {
        node["metadata"]["name"]: node_capacity(
            node,
            pods_by_node.get(node["metadata"]["name"], ()),
            jobs_by_node.get(node["metadata"]["name"], ()),
            pool,
        )
        for node in selected
    }
