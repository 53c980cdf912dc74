"""Scenarios: the default GKE-like cluster, validation of scenario files, and what a loaded
scenario turns into (Node objects as GKE registers them, the scenario's objects created).

Covers the default's nodes, labels, taints, GPUs and model-server; loopback-only addresses;
duplicate names; unknown object kinds; image reference normalization; and the Node objects.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sandbox.cluster import Cluster
from sandbox.cluster.images import ImageSet, normalize
from sandbox.registry import Registry
from sandbox.resources import DEPLOYMENTS, NODES
from sandbox.scenario import Scenario
from tests.sandbox.cluster.kit import GPU_4X, MakeCluster, fast_scenario


def test_the_default_is_a_gke_cluster_with_1_2_and_4_card_nodes() -> None:
    scenario = Scenario.load()
    gpus = {n.labels.get("cloud.google.com/gke-nodepool"): n.gpus.count for n in scenario.nodes}
    assert gpus == {"gpu-1x": 1, "gpu-2x": 2, "gpu-4x": 4, "default-pool": 0}
    for node in scenario.nodes:
        if node.gpus.count:
            assert node.labels["cloud.google.com/gke-accelerator"] == "nvidia-rtx-pro-6000"
            assert [t.manifest() for t in node.taints] == [
                {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
            ]
            assert node.gpus.product == "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"
        assert node.internal_ip.startswith("127.")
        assert node.external_ip.startswith("127.")
    [deployment] = scenario.objects
    assert (deployment["kind"], deployment["metadata"]["name"]) == ("Deployment", "model-server")
    assert all(a.startswith("127.") for a in scenario.network.egress_ips)


def _node(**overrides: Any) -> dict[str, Any]:
    return {"name": "n1", "internalIp": "127.0.10.1", "externalIp": "127.0.20.1", **overrides}


@pytest.mark.parametrize(
    ("doc", "complaint"),
    [
        ({"nodes": [_node(externalIp="34.118.0.10")]}, "not a loopback address"),
        ({"nodes": [_node(podCidr="10.4.0.0/24")]}, "not inside 127.0.0.0/8"),
        ({"network": {"egressIps": ["52.1.2.3"]}}, "not a loopback address"),
        ({"network": {"authorizedNetworks": ["0.0.0.0/0"]}}, "not inside 127.0.0.0/8"),
        (
            {"nodes": [_node(), _node(internalIp="127.0.10.2", externalIp="127.0.20.2")]},
            "duplicate node name n1",
        ),
        ({"nodes": [_node(gpus={"count": 2, "ids": ["a"]})]}, "gpus.ids has 1 ids for count 2"),
        ({"nodes": [_node(colour="blue")]}, "Extra inputs are not permitted"),
        ({"objects": [{"metadata": {"name": "x"}}]}, "needs apiVersion and kind"),
    ],
)
def test_scenarios_are_validated(doc: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        Scenario.model_validate(doc)


async def test_unknown_object_kinds_stop_the_start(make_cluster: MakeCluster) -> None:
    scenario = fast_scenario(
        objects=({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}},)
    )
    with pytest.raises(ValueError, match=r"unknown kind example\.com/v1/Widget"):
        await make_cluster(scenario)


async def test_nodes_register_as_gke_nodes(cluster: Cluster) -> None:
    registry: Registry = cluster.registry
    node = registry.get(NODES, None, GPU_4X)
    labels = node["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == GPU_4X
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition"
    assert labels["cloud.google.com/gke-nodepool"] == "gpu-4x"
    assert node["spec"]["providerID"] == f"gce://demo/us-central1-a/{GPU_4X}"
    assert node["spec"]["podCIDR"].startswith("127.")
    status = node["status"]
    assert status["capacity"]["nvidia.com/gpu"] == "4"
    assert status["allocatable"]["nvidia.com/gpu"] == "4"
    assert status["allocatable"]["cpu"] == "191450m"
    assert {a["type"]: a["address"] for a in status["addresses"]} == {
        "InternalIP": "127.0.10.4",
        "ExternalIP": "127.0.20.4",
        "Hostname": GPU_4X,
    }
    assert status["nodeInfo"]["kubeletVersion"] == "v1.33.5-gke.1308000"
    assert registry.get(DEPLOYMENTS, "default", "model-server")


@pytest.mark.parametrize(
    ("reference", "normalized"),
    [
        ("python", "docker.io/library/python:latest"),
        ("python:3.12", "docker.io/library/python:3.12"),
        ("vllm/vllm-openai:v0.10.1", "docker.io/vllm/vllm-openai:v0.10.1"),
        (
            "us-central1-docker.pkg.dev/demo/levers9/worker",
            "us-central1-docker.pkg.dev/demo/levers9/worker:latest",
        ),
        ("localhost:5000/w@sha256:ab", "localhost:5000/w@sha256:ab"),
    ],
)
def test_image_references_compare_normalized(reference: str, normalized: str) -> None:
    assert normalize(reference) == normalized
    images = ImageSet(present=[normalized])
    assert images.has(reference)
