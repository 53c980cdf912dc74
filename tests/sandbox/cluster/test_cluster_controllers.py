"""The Deployment, ReplicaSet and Job controllers, and nodes coming and going.

Covers model-server's ReplicaSet and status, scaling up onto the free cards and down
(surplus pods deleted, newest first), a Job's pods going with it on a Background delete and
staying on the batch/v1 default (Orphan), a Job with parallelism 2 and 3 completions,
`ttlSecondsAfterFinished`, and the scenario commands that add and remove nodes (pods of a
vanished node kept listed through pod GC's quarantine, then collected; a pending pod scheduled
onto a new node).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from sandbox.cluster import Cluster
from sandbox.cluster.nodes import NodeLifecycle
from sandbox.cluster.objects import condition
from sandbox.options import DeleteOptions
from sandbox.patch import PatchType
from sandbox.registry import Registry
from sandbox.resources import DEPLOYMENTS, JOBS, NODES, PODS, REPLICA_SETS
from sandbox.scenario import Gpus, Timing
from tests.sandbox.cluster.kit import (
    FAST,
    GPU_4X,
    MakeCluster,
    fast_scenario,
    job_manifest,
    pod,
    python,
    wait_for,
)


def _servers(registry: Registry, phase: str | None = "Running") -> list[dict[str, Any]]:
    selector = f"status.phase={phase}" if phase else None
    return registry.list(
        PODS, "default", label_selector="app=model-server", field_selector=selector
    ).items()


def _scale(registry: Registry, replicas: int) -> None:
    registry.patch(
        DEPLOYMENTS, "default", "model-server", {"spec": {"replicas": replicas}}, PatchType.MERGE
    )


def _status(registry: Registry) -> dict[str, Any]:
    status: dict[str, Any] = registry.get(DEPLOYMENTS, "default", "model-server")["status"]
    return status


async def test_model_server_runs_through_its_replica_set(registry: Registry) -> None:
    await wait_for(lambda: _status(registry).get("availableReplicas") == 1)
    [rs] = registry.list(REPLICA_SETS, "default").items()
    digest = rs["metadata"]["labels"]["pod-template-hash"]
    assert rs["metadata"]["name"] == f"model-server-{digest}"
    assert rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
    [server] = _servers(registry)
    assert server["metadata"]["name"].startswith(f"model-server-{digest}-")
    assert server["metadata"]["ownerReferences"][0]["name"] == rs["metadata"]["name"]
    status = _status(registry)
    assert {
        k: status[k]
        for k in (
            "replicas",
            "updatedReplicas",
            "readyReplicas",
            "availableReplicas",
            "observedGeneration",
        )
    } == {
        "replicas": 1,
        "updatedReplicas": 1,
        "readyReplicas": 1,
        "availableReplicas": 1,
        "observedGeneration": 1,
    }
    deployment = registry.get(DEPLOYMENTS, "default", "model-server")
    available, progressing = (
        condition(deployment, "Available"),
        condition(deployment, "Progressing"),
    )
    assert available is not None
    assert progressing is not None
    assert (available["status"], available["reason"]) == ("True", "MinimumReplicasAvailable")
    assert progressing["reason"] == "NewReplicaSetAvailable"


async def test_scaling_up_takes_free_cards_and_down_removes_the_newest(
    cluster: Cluster,
) -> None:
    registry = cluster.registry
    [first] = await wait_for(lambda: _servers(registry))
    _scale(registry, 2)
    await wait_for(lambda: len(_servers(registry)) == 2)
    kubelet = cluster.kubelet(GPU_4X)
    assert kubelet is not None
    assert kubelet.devices.free() == []
    _scale(registry, 1)
    await wait_for(lambda: len(_servers(registry, None)) == 1)
    [left] = _servers(registry)
    assert left["metadata"]["uid"] == first["metadata"]["uid"]
    await wait_for(lambda: kubelet.devices.free() == ["nvidia2", "nvidia3"])
    _scale(registry, 0)
    await wait_for(lambda: not _servers(registry, None))
    await wait_for(lambda: "replicas" not in _status(registry))
    assert _status(registry)["observedGeneration"] == 4


async def test_a_job_deleted_in_the_background_takes_its_pods(registry: Registry) -> None:
    registry.create(JOBS, job_manifest("sleepy", python("import time; time.sleep(60)")))
    await wait_for(
        lambda: registry.list(
            PODS, "default", label_selector="job-name=sleepy", field_selector="status.phase=Running"
        ).items()
    )
    registry.delete(JOBS, "default", "sleepy", DeleteOptions(propagation_policy="Background"))
    await wait_for(
        lambda: not registry.list(PODS, "default", label_selector="job-name=sleepy").items()
    )


async def test_a_job_deleted_by_default_orphans_its_pods(registry: Registry) -> None:
    registry.create(JOBS, job_manifest("kept", python("print('done')")))
    await wait_for(
        lambda: registry.list(
            PODS, "default", label_selector="job-name=kept", field_selector="status.phase=Succeeded"
        ).items()
    )
    outcome = registry.delete(JOBS, "default", "kept", DeleteOptions())
    assert outcome.warnings  # kubectl prints the apiserver's warning about orphaned pods
    [orphan] = registry.list(PODS, "default", label_selector="job-name=kept").items()
    assert not orphan["metadata"].get("ownerReferences")
    assert not orphan["metadata"].get("finalizers")


async def test_a_parallel_job_runs_until_its_completions(registry: Registry) -> None:
    job = job_manifest("three", python("print('one done')"))
    job["spec"].update(completions=3, parallelism=2)
    registry.create(JOBS, job)

    def complete() -> dict[str, Any] | None:
        found = registry.get(JOBS, "default", "three")
        cond = condition(found, "Complete")
        return found if cond and cond["status"] == "True" else None

    done = await wait_for(complete)
    assert done["status"]["succeeded"] == 3
    assert len(registry.list(PODS, "default", label_selector="job-name=three").items()) == 3


async def test_nodes_come_and_go(cluster: Cluster) -> None:
    registry = cluster.registry
    [server] = await wait_for(lambda: _servers(registry))
    await cluster.remove_node(GPU_4X)
    assert not registry.list(NODES, field_selector=f"metadata.name={GPU_4X}").items()
    await wait_for(lambda: pod(registry, server["metadata"]["name"]) is None)
    replacement = await wait_for(lambda: _servers(registry, "Pending"))
    assert "nodeName" not in replacement[0]["spec"]

    spec = next(n for n in cluster.scenario.nodes if n.name == GPU_4X)
    await cluster.add_node(
        spec.model_copy(
            update={
                "name": "gke-demo-gpu-4x-2f7c9e1a-z9z9",
                "internal_ip": "127.0.10.5",
                "external_ip": "127.0.20.5",
                "gpus": Gpus(count=4),
            }
        )
    )
    [moved] = await wait_for(lambda: _servers(registry))
    assert moved["spec"]["nodeName"] == "gke-demo-gpu-4x-2f7c9e1a-z9z9"


async def test_pods_of_a_deleted_node_stay_listed_through_the_quarantine(
    make_cluster: MakeCluster,
) -> None:
    quarantine = 1.5
    timing = FAST.model_copy(
        update={"orphan_pod_quarantine_seconds": quarantine, "pod_gc_period_seconds": 0.5}
    )
    cluster = await make_cluster(fast_scenario(timing=timing))
    registry = cluster.registry
    [server] = await wait_for(lambda: _servers(registry))
    name = server["metadata"]["name"]
    lifecycle = cluster.node_lifecycle
    assert lifecycle is not None
    loop = asyncio.get_running_loop()
    removed = loop.time()
    await cluster.remove_node(GPU_4X)
    assert not registry.list(NODES, field_selector=f"metadata.name={GPU_4X}").items()
    # Pod GC has seen the node gone: it set when it collects, and its pods are still listed.
    collects_at = await wait_for(lambda: lifecycle.collects_at(GPU_4X))
    kept = pod(registry, name)
    assert kept is not None, "pod GC waits out its quarantine"
    assert (kept["spec"]["nodeName"], kept["status"]["phase"]) == (GPU_4X, "Running")
    assert collects_at >= removed + quarantine, "its deadline is the quarantine after the removal"
    await wait_for(lambda: pod(registry, name) is None)
    assert loop.time() >= collects_at, "collected at its deadline, not before"


async def test_pod_gc_collects_a_deleted_node_40_to_60_seconds_later_by_default(
    registry: Registry,
) -> None:
    timing = Timing()
    delays = []
    for seed in range(20):
        lifecycle = NodeLifecycle(
            registry,
            timing.resync_seconds,
            timing.node_monitor_grace_seconds,
            timing.orphan_pod_quarantine_seconds,
            timing.pod_gc_period_seconds,
            random.Random(seed),
        )
        delays.append(lifecycle._missing("gone"))
    assert all(40 <= d <= 60 for d in delays)
    assert len({round(d) for d in delays}) > 1  # spread over the GC pass, not one fixed delay


async def test_a_finished_job_with_a_ttl_is_deleted_with_its_pods(registry: Registry) -> None:
    job = job_manifest("brief", python("print('bye')"))
    job["spec"]["ttlSecondsAfterFinished"] = 0
    registry.create(JOBS, job)
    await wait_for(lambda: registry.list(PODS, "default", label_selector="job-name=brief").items())
    await wait_for(lambda: not registry.list(JOBS, "default").items())
    await wait_for(
        lambda: not registry.list(PODS, "default", label_selector="job-name=brief").items()
    )
