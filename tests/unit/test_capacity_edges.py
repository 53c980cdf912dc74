"""What a machine offers at the edges the spec table does not reach (each found by the mutation
check, benchmarks/mutation.py): a toleration's every rule, objects with fields missing (the API
omits empty ones), a GPU named only in requests, native sidecars and a pod's overhead, a node
with only an InternalIP, the cordon taint, labels that only look like a worker's, Jobs of
other pools or of none, and the worker-size threshold exactly met.
"""

from __future__ import annotations

from typing import Any

import pytest

from levers9.contract import GPU
from levers9.core.capacity import (
    POOL_LABEL,
    WORKER_ID_LABEL,
    JobHold,
    MachineStatus,
    PoolView,
    Resources,
    Toleration,
    gpu_type_of,
    job_hold,
    pod_requests,
    pool_capacity,
)
from tests.kube_objects import POOL, container, node, pod, worker_job, worker_labels

NAME = "gke-gpu-4x-1"
GI = 2**30

TAINT = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
NO_VALUE = {"key": "dedicated", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [
        (Toleration("dedicated", "Equal", "ml", "NoSchedule"), TAINT, True),
        (Toleration("dedicated", "Equal", "ml", "NoExecute"), TAINT, False),
        (Toleration("dedicated", "Equal", "ml"), {**TAINT, "effect": "NoExecute"}, True),
        (Toleration("dedicated", "Equal", "batch"), TAINT, False),
        (Toleration("other", "Equal", "ml"), TAINT, False),
        (Toleration("dedicated", "Exists"), TAINT, True),
        (Toleration(None, "Exists"), TAINT, True),
        (Toleration(None, "Exists", effect="NoSchedule"), TAINT, True),
        (Toleration(None, "Exists", effect="NoExecute"), TAINT, False),
        (Toleration(None, "Equal", "ml"), TAINT, False),
        (Toleration("dedicated"), {"key": "dedicated", "effect": "NoSchedule"}, True),
        (
            Toleration("dedicated", "Equal", "ml"),
            {"key": "dedicated", "effect": "NoSchedule"},
            False,
        ),
        (Toleration("dedicated"), TAINT, False),
    ],
    ids=[
        "key, value and effect equal",
        "another effect",
        "no effect: any effect",
        "another value",
        "another key",
        "Exists: any value",
        "no key with Exists: everything",
        "no key with Exists, the effect named",
        "no key with Exists, another effect",
        "no key without Exists: nothing",
        "no value tolerates a taint without one",
        "a value does not tolerate a taint without one",
        "no value does not tolerate a taint with one",
    ],
)
def test_toleration_rules(toleration: Toleration, taint: dict[str, str], tolerated: bool) -> None:
    assert toleration.tolerates(taint) is tolerated


def test_an_unknown_gke_accelerator_is_its_own_type() -> None:
    labels = {"cloud.google.com/gke-accelerator": "nvidia-future-9000"}
    assert gpu_type_of(labels) == "nvidia-future-9000"


def test_a_gpu_named_only_in_requests_counts_and_absent_amounts_are_zero() -> None:
    only_requests = {"containers": [{"resources": {"requests": {GPU: "2"}}}]}
    assert pod_requests(only_requests) == Resources(gpus=2)
    memory_only = {"containers": [container(memory="1Gi")]}
    assert pod_requests(memory_only) == Resources(memory_bytes=GI)


def _sidecar(**amounts: Any) -> dict[str, Any]:
    return {**container(**amounts), "restartPolicy": "Always"}


@pytest.mark.parametrize(
    ("containers", "init", "held"),
    [
        # containers + sidecar (2 cards, 6 CPU, 5Gi) outweigh the init container after it.
        (
            [container(gpus=1, cpu="4", memory="4Gi")],
            [_sidecar(gpus=1, cpu="2", memory="1Gi"), container(cpu="1", memory="512Mi")],
            Resources(gpus=2, cpu_millis=6000, memory_bytes=5 * GI),
        ),
        # An init container after the sidecar outweighs: sidecar + it (5Gi).
        (
            [container(cpu="1", memory="1Gi")],
            [_sidecar(memory="1Gi"), container(memory="4Gi")],
            Resources(gpus=0, cpu_millis=1000, memory_bytes=5 * GI),
        ),
        # A sidecar asking for nothing adds nothing.
        (
            [container(cpu="1")],
            [_sidecar(), container()],
            Resources(cpu_millis=1000),
        ),
    ],
    ids=["containers and sidecar", "init after the sidecar", "an empty sidecar"],
)
def test_native_sidecars_add_to_what_runs_after_them(
    containers: list[dict[str, Any]], init: list[dict[str, Any]], held: Resources
) -> None:
    assert pod_requests({"containers": containers, "initContainers": init}) == held


def test_a_pods_overhead_adds_to_what_it_holds() -> None:
    spec = {
        "containers": [container(gpus=1, cpu="1", memory="1Gi")],
        "overhead": {"cpu": "250m", "memory": "1Gi", GPU: "1"},
    }
    assert pod_requests(spec) == Resources(gpus=2, cpu_millis=1250, memory_bytes=2 * GI)


def _ready_node(**fields: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": NAME},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        **fields,
    }


def test_a_node_with_fields_missing_offers_what_it_says() -> None:
    everything = PoolView(POOL.pool_name, {}, POOL.tolerations)
    bare = pool_capacity([{"metadata": {"name": NAME}}], [], [], everything)[NAME]
    assert (bare.status, bare.total_gpus, bare.free, bare.external_ip, bare.gpu_type) == (
        MachineStatus.NOT_READY,
        0,
        Resources(),
        None,
        None,
    )
    cards_only = _ready_node(status={**_ready_node()["status"], "allocatable": {GPU: "2"}})
    got = pool_capacity([cards_only], [], [], everything)[NAME]
    assert (got.status, got.total_gpus, got.free) == (MachineStatus.HEALTHY, 2, Resources(gpus=2))
    no_conditions = {**cards_only, "status": {"allocatable": {GPU: "2"}}}
    assert pool_capacity([no_conditions], [], [], everything)[NAME].status == (
        MachineStatus.NOT_READY
    )


def test_objects_without_metadata_or_spec_are_passed_over() -> None:
    n = node(NAME)
    got = pool_capacity([n, {"status": {}}], [{"metadata": {"name": "x"}}], [{}], POOL)
    assert list(got) == [NAME]
    assert got[NAME].free.gpus == 4


def test_a_pod_without_metadata_or_status_holds_its_cards() -> None:
    bare = {"spec": {"nodeName": NAME, "containers": [container(gpus=3)]}}
    assert pool_capacity([node(NAME)], [bare], [], POOL)[NAME].free.gpus == 1


def test_an_internal_ip_stands_in_for_a_missing_external_one() -> None:
    n = node(NAME)
    n["status"]["addresses"] = [{"type": "InternalIP", "address": "10.0.0.7"}]
    assert pool_capacity([n], [], [], POOL)[NAME].external_ip == "10.0.0.7"


def test_the_cordon_taint_alone_is_not_a_taint_the_pool_must_tolerate() -> None:
    cordon = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    n = node(NAME, taints=[cordon, {"key": GPU, "value": "present", "effect": "NoSchedule"}])
    assert pool_capacity([n], [], [], POOL)[NAME].status == MachineStatus.HEALTHY


def test_a_pod_labelled_with_a_pool_but_not_ours_is_a_neighbour() -> None:
    """Only a pod managed by levers9 is a worker: another's pod with our pool label holds its
    cards even when a worker of that id is active."""
    impostor = pod(gpus=1, labels={POOL_LABEL: POOL.pool_name, WORKER_ID_LABEL: "w1"})
    got = pool_capacity([node(NAME)], [impostor], [worker_job(worker_id="w1", gpus=2)], POOL)
    assert (got[NAME].free.gpus, got[NAME].worker_gpus) == (1, 2)


def test_only_this_pools_jobs_on_selected_nodes_are_its_workers() -> None:
    foreign = worker_job(pool="another-pool", worker_id="x", gpus=1)
    got = pool_capacity([node(NAME)], [], [foreign, {"metadata": {}}], POOL)[NAME]
    assert (got.workers, got.worker_gpus, got.free.gpus) == ((), 0, 4)


@pytest.mark.parametrize(
    ("job", "hold"),
    [
        ({}, None),
        ({"metadata": {"labels": {POOL_LABEL: "p"}}}, None),
        ({"metadata": {"labels": {"levers9.dev/node": NAME}}}, None),
        (
            {"metadata": {"labels": {POOL_LABEL: "p", "levers9.dev/node": NAME}}},
            JobHold(NAME, "p", "", True, (0, 0, 0)),
        ),
        (
            {
                "metadata": {"labels": worker_labels("p", NAME, "w1")},
                "status": {"conditions": [{"type": "Complete", "status": "False"}]},
            },
            JobHold(NAME, "p", "w1", True, (0, 0, 0)),
        ),
    ],
    ids=[
        "no metadata",
        "no node label",
        "no pool label",
        "no worker id, spec or status",
        "a condition not true",
    ],
)
def test_job_holds(job: dict[str, Any], hold: JobHold | None) -> None:
    assert job_hold(job) == hold


def test_node_capacity_reports_type_memory_and_nothing_below_zero() -> None:
    n = node(NAME, memory="16Gi")
    got = pool_capacity([n], [pod(memory="20Gi")], [], POOL)[NAME]
    assert (got.gpu_type, got.total_memory_bytes, got.free.memory_bytes) == (
        "RTXPro6000",
        16 * GI,
        0,
    )


def test_a_node_with_exactly_the_workers_requests_free_is_a_machine() -> None:
    view = PoolView(
        POOL.pool_name, POOL.node_selector, POOL.tolerations, Resources(cpu_millis=1000)
    )
    n = node(NAME, cpu="4", memory="16Gi")
    got = pool_capacity([n], [pod(cpu="3", memory="15Gi")], [], view)[NAME]
    assert (got.status, got.free.cpu_millis) == (MachineStatus.HEALTHY, 1000)
    view = PoolView(
        POOL.pool_name, POOL.node_selector, POOL.tolerations, Resources(memory_bytes=GI)
    )
    got = pool_capacity([n], [pod(cpu="3", memory="15Gi")], [], view)[NAME]
    assert (got.status, got.free.memory_bytes) == (MachineStatus.HEALTHY, GI)
