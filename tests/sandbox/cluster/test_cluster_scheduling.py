"""The scheduler: where pods land, and why a pod that fits nowhere stays Pending.

Covers the default scenario's placement of model-server, kube-scheduler's Unschedulable
condition and FailedScheduling message for resources, taints, cordon, NotReady nodes and
node affinity, retries when nodes or pods change, and the pure filters behind them
(tolerations, node affinity operators, pod requests with init containers).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from sandbox.cluster import Cluster
from sandbox.cluster.predicates import matches_node_affinity, tolerates
from sandbox.cluster.requests import pod_requests
from sandbox.patch import PatchType
from sandbox.registry import Registry
from sandbox.resources import DEPLOYMENTS, EVENTS, NODES, PODS
from tests.sandbox.cluster.kit import (
    CPU_NODE,
    GPU_1X,
    GPU_4X,
    GPU_TOLERATION,
    SERVER_IMAGE,
    phase,
    pod,
    pod_manifest,
    scheduled_condition,
    wait_for,
)


def _unschedulable(registry: Registry, name: str) -> str | None:
    found = pod(registry, name)
    cond = scheduled_condition(found) if found else None
    if cond and cond["status"] == "False" and cond.get("reason") == "Unschedulable":
        return str(cond["message"])
    return None


def _events(registry: Registry, name: str, reason: str) -> list[dict[str, Any]]:
    return [
        e
        for e in registry.list(EVENTS, "default").items()
        if e["involvedObject"].get("name") == name and e["reason"] == reason
    ]


async def test_model_server_lands_on_the_four_card_node(registry: Registry) -> None:
    server = await wait_for(
        lambda: next(
            (
                p
                for p in registry.list(PODS, "default", label_selector="app=model-server").items()
                if p["status"].get("phase") == "Running"
            ),
            None,
        )
    )
    assert server["spec"]["nodeName"] == GPU_4X
    assert server["metadata"]["name"].startswith("model-server-")
    assert scheduled_condition(server) is not None
    scheduled = _events(registry, server["metadata"]["name"], "Scheduled")
    assert (
        scheduled[0]["message"]
        == f"Successfully assigned default/{server['metadata']['name']} to {GPU_4X}"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        pytest.param(
            {"gpus": 8, "tolerations": [GPU_TOLERATION]},
            "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: 0/4 nodes are "
            "available: 4 No preemption victims found for incoming pod.",
            id="too-big",
        ),
        pytest.param(
            {"gpus": 1},
            "0/4 nodes are available: 1 Insufficient nvidia.com/gpu, 3 node(s) had untolerated "
            "taint {nvidia.com/gpu: present}. preemption: 0/4 nodes are available: 1 No "
            "preemption victims found for incoming pod, 3 Preemption is not helpful for "
            "scheduling.",
            id="untolerated-taint",
        ),
        pytest.param(
            {
                "gpus": 1,
                "tolerations": [GPU_TOLERATION],
                "preemptionPolicy": "Never",
                "nodeSelector": {"cloud.google.com/gke-nodepool": "gpu-8x"},
            },
            "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector. "
            "preemption: not eligible due to preemptionPolicy=Never.",
            id="no-such-pool",
        ),
    ],
)
async def test_a_pod_that_fits_nowhere_stays_pending(
    registry: Registry, spec: dict[str, Any], message: str
) -> None:
    registry.create(PODS, pod_manifest("nowhere", image=SERVER_IMAGE, **spec))
    assert await wait_for(lambda: _unschedulable(registry, "nowhere")) == message
    assert pod(registry, "nowhere")["status"]["phase"] == "Pending"  # type: ignore[index]
    events = await wait_for(lambda: _events(registry, "nowhere", "FailedScheduling"))
    assert events[0]["type"] == "Warning"
    assert events[0]["message"] == message
    assert events[0]["source"] == {"component": "default-scheduler"}


async def test_cordon_blocks_until_uncordoned(registry: Registry) -> None:
    registry.patch(NODES, None, GPU_1X, {"spec": {"unschedulable": True}}, PatchType.MERGE)
    registry.create(
        PODS,
        pod_manifest(
            "pinned",
            image=SERVER_IMAGE,
            gpus=1,
            tolerations=[GPU_TOLERATION],
            nodeSelector={"kubernetes.io/hostname": GPU_1X},
        ),
    )
    message = await wait_for(lambda: _unschedulable(registry, "pinned"))
    assert message.startswith(
        "0/4 nodes are available: 1 node(s) were unschedulable, 3 node(s) didn't match Pod's "
        "node affinity/selector."
    )
    node = await wait_for(
        lambda: (
            registry.get(NODES, None, GPU_1X)["spec"].get("taints")
            if len(registry.get(NODES, None, GPU_1X)["spec"]["taints"]) > 1
            else None
        )
    )
    assert {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"} in node
    registry.patch(NODES, None, GPU_1X, {"spec": {"unschedulable": None}}, PatchType.MERGE)
    running = await wait_for(lambda: phase(registry, "pinned", "Running"))
    assert running["spec"]["nodeName"] == GPU_1X


async def test_a_not_ready_node_takes_nothing_until_ready(cluster: Cluster) -> None:
    registry = cluster.registry
    await cluster.set_node_ready(CPU_NODE, False)
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/hostname",
                                "operator": "In",
                                "values": [CPU_NODE],
                            }
                        ]
                    }
                ]
            }
        }
    }
    registry.create(PODS, pod_manifest("on-cpu", image=SERVER_IMAGE, affinity=affinity))
    message = await wait_for(lambda: _unschedulable(registry, "on-cpu"))
    assert "1 node(s) had untolerated taint {node.kubernetes.io/not-ready: }" in message
    node = registry.get(NODES, None, CPU_NODE)
    ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "KubeletNotReady")
    await cluster.set_node_ready(CPU_NODE, True)
    running = await wait_for(lambda: phase(registry, "on-cpu", "Running"))
    assert running["spec"]["nodeName"] == CPU_NODE


async def test_a_pending_pod_takes_the_cards_a_neighbour_frees(registry: Registry) -> None:
    await wait_for(
        lambda: registry.list(
            PODS,
            "default",
            label_selector="app=model-server",
            field_selector="status.phase=Running",
        ).items()
    )
    registry.create(
        PODS,
        pod_manifest(
            "three-cards",
            image=SERVER_IMAGE,
            gpus=3,
            tolerations=[GPU_TOLERATION],
            nodeSelector={"cloud.google.com/gke-nodepool": "gpu-4x"},
        ),
    )
    message = await wait_for(lambda: _unschedulable(registry, "three-cards"))
    assert "1 Insufficient nvidia.com/gpu" in message
    registry.patch(
        DEPLOYMENTS, "default", "model-server", {"spec": {"replicas": 0}}, PatchType.MERGE
    )
    running = await wait_for(lambda: phase(registry, "three-cards", "Running"))
    assert running["spec"]["nodeName"] == GPU_4X


# -- the filters, pure ---------------------------------------------------------------------

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "expected"),
    [
        ({"key": "nvidia.com/gpu", "operator": "Exists"}, True),
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "present"}, True),
        ({"key": "nvidia.com/gpu", "value": "present"}, True),  # Equal is the default
        ({"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}, False),
        ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"operator": "Exists"}, True),  # an empty key with Exists tolerates everything
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_tolerations_match_taints_like_kubernetes(
    toleration: dict[str, str], expected: bool
) -> None:
    assert tolerates(toleration, GPU_TAINT) is expected


NODE = {"metadata": {"name": "n1", "labels": {"pool": "gpu-4x", "cards": "4"}}}


def _required(*expressions: dict[str, Any], fields: tuple[dict[str, Any], ...] = ()) -> Any:
    term: dict[str, Any] = {"matchExpressions": list(expressions)}
    if fields:
        term["matchFields"] = list(fields)
    return {
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            }
        }
    }


@pytest.mark.parametrize(
    ("pod_obj", "expected"),
    [
        ({"spec": {"nodeSelector": {"pool": "gpu-4x"}}}, True),
        ({"spec": {"nodeSelector": {"pool": "gpu-1x"}}}, False),
        (_required({"key": "pool", "operator": "In", "values": ["gpu-2x", "gpu-4x"]}), True),
        (_required({"key": "pool", "operator": "NotIn", "values": ["gpu-4x"]}), False),
        (_required({"key": "pool", "operator": "Exists"}), True),
        (_required({"key": "zone", "operator": "DoesNotExist"}), True),
        (_required({"key": "cards", "operator": "Gt", "values": ["2"]}), True),
        (_required({"key": "cards", "operator": "Lt", "values": ["2"]}), False),
        (_required(fields=({"key": "metadata.name", "operator": "In", "values": ["n1"]},)), True),
        (
            {
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [{}]
                            }
                        }
                    }
                }
            },
            False,
        ),
    ],
)
def test_node_affinity_operators(pod_obj: dict[str, Any], expected: bool) -> None:
    assert matches_node_affinity(pod_obj, NODE) is expected


def _container(name: str, cpu: str, gpus: int = 0, **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {"name": name, "resources": resources, **extra}


def test_pod_requests_count_init_containers_as_the_scheduler_does() -> None:
    spec = {
        "initContainers": [
            _container("fetch", "2"),
            _container("sidecar", "250m", restartPolicy="Always"),
            _container("warm", "500m", gpus=4),
        ],
        "containers": [_container("a", "500m", gpus=1), _container("b", "1")],
    }
    requests = pod_requests({"spec": spec})
    # cpu: max(2, 0.25 + 0.5, 1.5 + 0.25) = 2; GPUs: max(4 during init, 1) = 4
    assert requests == {"cpu": Fraction(2), "nvidia.com/gpu": Fraction(4)}


async def test_a_preemption_taints_the_node_at_once_and_removes_it_at_its_notice_end(
    cluster: Cluster,
) -> None:
    """`levers9 sandbox node preempt NODE --notice N`: the node carries GKE's
    impending-node-termination taint at once, takes no new pod, and is gone once the notice
    ends (its pods with it)."""
    registry = cluster.registry
    registry.create(PODS, pod_manifest("doomed", image=SERVER_IMAGE, node_name=CPU_NODE))
    await wait_for(lambda: phase(registry, "doomed", "Running"))
    cluster.preempt_node(CPU_NODE, 2.0)
    taints = registry.get(NODES, None, CPU_NODE)["spec"]["taints"]
    assert {"key": "cloud.google.com/impending-node-termination", "value": "true",
            "effect": "NoSchedule"} in taints  # fmt: skip
    cluster.preempt_node(CPU_NODE, 2.0)  # announced twice: one taint
    taints = registry.get(NODES, None, CPU_NODE)["spec"]["taints"]
    assert sum(t["key"] == "cloud.google.com/impending-node-termination" for t in taints) == 1

    def gone() -> bool | None:
        return True if not registry.store.exists(NODES, None, CPU_NODE) else None

    assert await wait_for(gone)
    assert CPU_NODE not in {spec.name for spec in cluster.node_specs()}
