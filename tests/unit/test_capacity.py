"""What a machine offers, table-driven from the spec's "Sharing nodes with other workloads":
neighbours' GPU limits and CPU/memory requests are subtracted, our workers' cards are counted
from their Jobs, terminating pods still hold cards, init containers count as the scheduler
counts them, and a node is a machine only when selected, Ready, schedulable, tolerated, and
offering (or holding) a card.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from levers9.core.capacity import (
    MachineStatus,
    NodeCapacity,
    PoolView,
    Resources,
    gpu_type_of,
    pod_requests,
    pool_capacity,
)
from levers9.core.quantity import millicores, parse_quantity, whole
from tests.kube_objects import POOL, container, node, pod, worker_job, worker_labels

MODEL_SERVER = pod(gpus=2, cpu="4", memory="16Gi")


def _one(
    n: dict[str, Any], pods: Sequence[dict[str, Any]] = (), jobs: Sequence[dict[str, Any]] = ()
) -> NodeCapacity:
    return pool_capacity([n], pods, jobs, POOL)[n["metadata"]["name"]]


@pytest.mark.parametrize(
    ("case", "pods", "jobs", "machine", "free_gpus", "status"),
    [
        ("empty 4-GPU node", [], [], True, 4, MachineStatus.HEALTHY),
        ("model server holds two of four", [MODEL_SERVER], [], True, 2, MachineStatus.HEALTHY),
        ("model server scaled down: the machine grows", [], [], True, 4, MachineStatus.HEALTHY),
        (
            "a full node is not a machine",
            [pod("a", gpus=2), pod("b", gpus=2)],
            [],
            False,
            0,
            MachineStatus.FULL,
        ),
        (
            "a terminating neighbour still holds its cards",
            [pod(gpus=2, terminating=True)],
            [],
            True,
            2,
            MachineStatus.HEALTHY,
        ),
        (
            "finished neighbours hold nothing",
            [pod("done", gpus=2, phase="Succeeded"), pod("bad", gpus=2, phase="Failed")],
            [],
            True,
            4,
            MachineStatus.HEALTHY,
        ),
        (
            "a worker that holds cards keeps them",
            [MODEL_SERVER],
            [worker_job(gpus=2)],
            True,
            0,
            MachineStatus.HEALTHY,
        ),
        (
            "a pending worker Job with no pod yet holds its cards",
            [],
            [worker_job(gpus=4)],
            True,
            0,
            MachineStatus.HEALTHY,
        ),
        (
            "a finished worker Job holds nothing",
            [],
            [worker_job(gpus=4, finished="Failed")],
            True,
            4,
            MachineStatus.HEALTHY,
        ),
        (
            "our worker's pod is counted from its Job, not twice",
            [pod("worker-pod", gpus=2, labels=worker_labels("gke-rtx6000", "gke-gpu-4x-1", "w1"))],
            [worker_job(gpus=2)],
            True,
            2,
            MachineStatus.HEALTHY,
        ),
        (
            "our worker's pod still terminating after its Job was deleted holds its cards",
            [
                pod(
                    "worker-pod",
                    gpus=2,
                    labels=worker_labels("gke-rtx6000", "gke-gpu-4x-1", "w1"),
                    terminating=True,
                )
            ],
            [],
            True,
            2,
            MachineStatus.HEALTHY,
        ),
        (
            "the old worker's terminating pod and its replacement's Job both hold",
            [
                pod(
                    "old-worker-pod",
                    gpus=2,
                    labels=worker_labels("gke-rtx6000", "gke-gpu-4x-1", "w1"),
                    terminating=True,
                )
            ],
            [worker_job(worker_id="w2", gpus=2)],
            True,
            0,
            MachineStatus.HEALTHY,
        ),
        (
            "a finished worker Job's pod still running holds its cards",
            [pod("worker-pod", gpus=2, labels=worker_labels("gke-rtx6000", "gke-gpu-4x-1", "w1"))],
            [worker_job(gpus=2, finished="Failed")],
            True,
            2,
            MachineStatus.HEALTHY,
        ),
        (
            "another pool's worker is a neighbour",
            [pod("other", gpus=1, labels=worker_labels("other-pool", "gke-gpu-4x-1", "w9"))],
            [],
            True,
            3,
            MachineStatus.HEALTHY,
        ),
        (
            "pods of other nodes do not count",
            [pod("elsewhere", node_name="gke-gpu-2x-1", gpus=2)],
            [],
            True,
            4,
            MachineStatus.HEALTHY,
        ),
    ],
)
def test_spec_table(
    case: str,
    pods: list[dict[str, Any]],
    jobs: list[dict[str, Any]],
    machine: bool,
    free_gpus: int,
    status: MachineStatus,
) -> None:
    got = _one(node(), pods, jobs)
    assert (got.machine, got.free.gpus, got.status) == (machine, free_gpus, status), case
    assert got.total_gpus == 4


@pytest.mark.parametrize(
    ("n", "status"),
    [
        (node(ready=False), MachineStatus.NOT_READY),
        (node(unschedulable=True), MachineStatus.CORDONED),
        (
            node(taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]),
            MachineStatus.TAINTED,
        ),
        (
            node(taints=[{"key": "dedicated", "value": "ml", "effect": "PreferNoSchedule"}]),
            MachineStatus.HEALTHY,
        ),
        (
            node(
                taints=[
                    {
                        "key": "cloud.google.com/impending-node-termination",
                        "value": "true",
                        "effect": "NoSchedule",
                    }
                ],
                unschedulable=True,
            ),
            MachineStatus.PREEMPTING,
        ),
    ],
    ids=["not ready", "cordoned (drained)", "untolerated taint", "soft taint", "preempting"],
)
def test_not_a_machine(n: dict[str, Any], status: MachineStatus) -> None:
    got = _one(n)
    assert got.status == status
    assert got.machine is (status is MachineStatus.HEALTHY)


def test_gke_taint_is_tolerated_only_by_the_gke_flavor() -> None:
    generic = PoolView("gke-rtx6000", POOL.node_selector, tolerations=())
    assert pool_capacity([node()], [], [], generic)["gke-gpu-4x-1"].status == MachineStatus.TAINTED


def test_selector_picks_nodes_and_cpu_node_is_not_selected() -> None:
    nodes = [node("gpu-1", 1), node("cpu-1", 0, accelerator=None)]
    assert list(pool_capacity(nodes, [], [], POOL)) == ["gpu-1"]


def test_unhealthy_cards_still_count_in_total() -> None:
    got = _one(node(gpus=4, allocatable_gpus=3))
    assert (got.total_gpus, got.free.gpus) == (4, 3)


def test_cpu_and_memory_from_requests() -> None:
    got = _one(node(cpu="8", memory="32Gi"), [pod(gpus=1, cpu="1500m", memory="4Gi")])
    assert got.free == Resources(gpus=3, cpu_millis=6500, memory_bytes=28 * 2**30)


def test_never_negative() -> None:
    got = _one(node(gpus=2, cpu="1"), [pod(gpus=4, cpu="3")])
    assert got.free == Resources(gpus=0, cpu_millis=0, memory_bytes=got.free.memory_bytes)


def test_init_containers_as_the_scheduler_counts_them() -> None:
    spec = {
        "containers": [container(gpus=1, cpu="1"), container(gpus=1, cpu="1")],
        "initContainers": [container(gpus=3, cpu="500m"), container(gpus=1, cpu="4")],
    }
    assert pod_requests(spec) == Resources(gpus=3, cpu_millis=4000, memory_bytes=0)


def test_native_sidecars_hold_their_share_for_the_pods_life() -> None:
    sidecar = {**container(cpu="2", memory="1Gi"), "restartPolicy": "Always"}
    spec = {
        "containers": [container(gpus=1, cpu="1", memory="2Gi")],
        # setup (4 CPU) runs before the sidecar starts; migrate (3 CPU) alongside it.
        "initContainers": [container(cpu="4"), sidecar, container(cpu="3", memory="512Mi")],
    }
    # containers + sidecar = 3 CPU, 3Gi; migrate + sidecar = 5 CPU; setup alone = 4 CPU.
    assert pod_requests(spec) == Resources(gpus=1, cpu_millis=5000, memory_bytes=3 * 2**30)
    # Without the sidecar's restartPolicy it would be an init container like the others.
    plain = {**spec, "initContainers": [container(cpu="4"), container(cpu="2", memory="1Gi")]}
    assert pod_requests(plain) == Resources(gpus=1, cpu_millis=4000, memory_bytes=2 * 2**30)


def test_limit_stands_in_for_missing_request() -> None:
    spec = {"containers": [{"name": "c", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}]}
    assert pod_requests(spec) == Resources(gpus=0, cpu_millis=2000, memory_bytes=2**30)


def test_workers_listed_by_id() -> None:
    got = _one(node(), [], [worker_job(worker_id="b", gpus=1), worker_job(worker_id="a", gpus=1)])
    assert got.workers == ("a", "b")
    assert got.worker_gpus == 2


def test_workers_whose_job_finished_are_listed_apart() -> None:
    """The machine ends their records at once: their agents are gone."""
    got = _one(
        node(),
        [],
        [
            worker_job(worker_id="dead", gpus=2, finished="Failed"),
            worker_job(worker_id="done", gpus=1, finished="Complete"),
            worker_job(worker_id="next", gpus=2),
        ],
    )
    assert (got.workers, got.finished_workers) == (("next",), ("dead", "done"))


def test_external_ip_is_advertised_not_the_name() -> None:
    assert _one(node(external_ip="127.0.10.9")).external_ip == "127.0.10.9"


@pytest.mark.parametrize(
    ("labels", "gpu_type"),
    [
        ({"cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000"}, "RTXPro6000"),
        ({"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}, "H100"),
        ({"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}, "T4"),
        ({"cloud.google.com/gke-accelerator": "nvidia-l4"}, "L4"),
        ({"nvidia.com/gpu.product": "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"}, "RTXPro6000"),
        ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}, "A100-80GB"),
        ({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, "H100"),
        ({}, None),
    ],
)
def test_gpu_type(labels: dict[str, str], gpu_type: str | None) -> None:
    assert gpu_type_of(labels) == gpu_type


@pytest.mark.parametrize(
    ("text", "value"),
    [("500m", 0.5), ("2", 2), ("1Gi", 2**30), ("512Mi", 2**29), ("1e3", 1000), ("1.5k", 1500)],
)
def test_quantities(text: str, value: float) -> None:
    assert parse_quantity(text) == value


def test_quantity_rounding_and_errors() -> None:
    assert millicores("0.0001") == 1
    assert whole("1.2") == 2
    with pytest.raises(ValueError, match="'12 cores' is not a Kubernetes quantity"):
        parse_quantity("12 cores")


def test_a_node_too_small_for_the_worker_gets_none() -> None:
    """Cards free, but the neighbours leave less CPU or memory than the worker pod requests
    (`workerResources`): not a machine, and `machine list` says why."""
    view = PoolView(
        POOL.pool_name,
        POOL.node_selector,
        POOL.tolerations,
        Resources(cpu_millis=500, memory_bytes=1 << 30),
    )
    n = node(cpu="4", memory="16Gi")
    roomy = pool_capacity([n], [pod(gpus=1, cpu="3", memory="8Gi")], [], view)[
        n["metadata"]["name"]
    ]
    assert (roomy.status, roomy.machine) == (MachineStatus.HEALTHY, True)
    for hog in (pod(gpus=1, cpu="3800m"), pod(gpus=1, memory="15.5Gi")):
        small = pool_capacity([n], [hog], [], view)[n["metadata"]["name"]]
        assert (small.status, small.machine, small.free.gpus) == (MachineStatus.TOO_SMALL, False, 3)
    # A worker already there holds its requests: the node stays its machine.
    job = worker_job(gpus=3)
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] = {
        "cpu": "500m",
        "memory": "1Gi",
    }
    held = pool_capacity([n], [pod(gpus=1, cpu="3500m")], [job], view)[n["metadata"]["name"]]
    assert (held.status, held.free.cpu_millis) == (MachineStatus.HEALTHY, 0)


def test_cards_held_by_our_worker_and_by_neighbours_are_counted_apart() -> None:
    """The dashboard shows a machine's cards free, held by levers9 and held by neighbours."""
    got = _one(node(gpus=4), [MODEL_SERVER], [worker_job(gpus=1)])
    assert (got.free.gpus, got.worker_gpus, got.neighbour_gpus) == (1, 1, 2)
    assert _one(node(gpus=4)).neighbour_gpus == 0
