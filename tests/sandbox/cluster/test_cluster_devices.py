"""GPUs: device ids, the kubelet's device-plugin checkpoint, and admission of cards.

Covers the checkpoint's exact format and checksum (checked against checkpoints published
from real kubelets), the protobuf `AllocResp`, lowest-free assignment and release, ids handed
to model-server and freed when it scales to zero, UUID-style ids, and the kubelet rejecting
a pod placed by `spec.nodeName` on a node without enough cards (`OutOfnvidia.com/gpu`).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from sandbox.cluster import Cluster
from sandbox.cluster.devices import (
    CHECKPOINT,
    ContainerAllocateResponse,
    DeviceManager,
    checksum,
)
from sandbox.patch import PatchType
from sandbox.registry import Registry
from sandbox.resources import DEPLOYMENTS, PODS
from sandbox.scenario import Gpus
from tests.sandbox.cluster.kit import (
    GPU_4X,
    GPU_TOLERATION,
    SERVER_IMAGE,
    MakeCluster,
    fast_scenario,
    phase,
    pod_manifest,
    wait_for,
)

# Checkpoints as real kubelets wrote them, with the checksums they computed.
_NVIDIA_ALLOC = (
    "CkIKFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSKEdQVS03N2E3MDJkYi1lMzdmLTNhNzQtZDQ2ZC1jNTcxM2Y2NjA1OGMa"
    "JAoOL2Rldi9udmlkaWFjdGwSDi9kZXYvbnZpZGlhY3RsGgJydxomCg8vZGV2L252aWRpYS11dm0SDy9kZXYvbnZpZGlh"
    "LXV2bRoCcncaMgoVL2Rldi9udmlkaWEtdXZtLXRvb2xzEhUvZGV2L252aWRpYS11dm0tdG9vbHMaAnJ3Gi4KEy9kZXYv"
    "bnZpZGlhLW1vZGVzZXQSEy9kZXYvbnZpZGlhLW1vZGVzZXQaAnJ3GiAKDC9kZXYvbnZpZGlhMBIML2Rldi9udmlkaWEw"
    "GgJydw=="
)
_UUIDS = [
    "GPU-c1e9f249-b37b-81c2-a8d9-ba5ca0294841",
    "GPU-77a702db-e37f-3a74-d46d-c5713f66058c",
    "GPU-9b341c59-f96b-ba85-c137-78c3652fea65",
]
REAL_CHECKPOINTS = [
    pytest.param(
        {
            "PodDeviceEntries": None,
            "RegisteredDevices": {"nvidia.com/gpu": ["GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0"]},
        },
        3952659280,
        id="nothing-allocated",
    ),
    pytest.param(
        {
            "PodDeviceEntries": [
                {
                    "PodUID": "bf52b2cd-b611-4e79-86b1-280b283185c3",
                    "ContainerName": "check",
                    "ResourceName": "nvidia.com/gpu",
                    "DeviceIDs": {"-1": ["tegra"]},
                    "AllocResp": "Ch8KFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBXRlZ3Jh",
                }
            ],
            "RegisteredDevices": {"nvidia.com/gpu": ["tegra"]},
        },
        3660592824,
        id="no-numa",
    ),
    pytest.param(
        {
            "PodDeviceEntries": [
                {
                    "PodUID": "513cb897-0262-4868-826f-aa943ee45a38",
                    "ContainerName": "app",
                    "ResourceName": "nvidia.com/gpu",
                    "DeviceIDs": {"0": [_UUIDS[1]]},
                    "AllocResp": _NVIDIA_ALLOC,
                }
            ],
            "RegisteredDevices": {"nvidia.com/gpu": [_UUIDS[1], _UUIDS[2], _UUIDS[0]]},
        },
        133412836,
        id="numa-node-0",
    ),
]


@pytest.mark.parametrize(("data", "expected"), REAL_CHECKPOINTS)
def test_checksum_is_the_kubelets(data: dict[str, Any], expected: int) -> None:
    assert checksum(data) == expected


def test_allocate_response_is_the_device_plugins_protobuf() -> None:
    control = (
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
        "/dev/nvidia0",
    )
    response = ContainerAllocateResponse(
        envs=(("NVIDIA_VISIBLE_DEVICES", _UUIDS[1]),),
        mounts=(),
        devices=tuple((p, p, "rw") for p in control),
    )
    assert base64.b64encode(response.encode()).decode() == _NVIDIA_ALLOC


def _read(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_devices_go_lowest_free_first_and_come_back(tmp_path: Path) -> None:
    manager = DeviceManager(tmp_path, {"nvidia.com/gpu": [f"nvidia{i}" for i in range(4)]})
    manager.write()
    assert _read(tmp_path / CHECKPOINT)["Data"]["PodDeviceEntries"] is None
    assert manager.allocate("pod-a", "main", 2) == ["nvidia0", "nvidia1"]
    assert manager.allocate("pod-b", "main", 1) == ["nvidia2"]
    assert manager.allocate("pod-a", "main", 2) == ["nvidia0", "nvidia1"]  # idempotent
    manager.release("pod-a")
    assert manager.allocate("pod-c", "main", 3) == ["nvidia0", "nvidia1", "nvidia3"]
    written = _read(tmp_path / CHECKPOINT)
    assert list(written) == ["Data", "Checksum"]
    assert [e["PodUID"] for e in written["Data"]["PodDeviceEntries"]] == ["pod-b", "pod-c"]
    assert written["Data"]["PodDeviceEntries"][1]["DeviceIDs"] == {
        "-1": ["nvidia0", "nvidia1", "nvidia3"]
    }
    assert written["Checksum"] == checksum(written["Data"])


def _server(registry: Registry) -> dict[str, Any] | None:
    return next(
        iter(
            registry.list(
                PODS,
                "default",
                label_selector="app=model-server",
                field_selector="status.phase=Running",
            ).items()
        ),
        None,
    )


async def test_model_server_holds_two_cards_until_scaled_to_zero(cluster: Cluster) -> None:
    registry = cluster.registry
    server = await wait_for(lambda: _server(registry))
    path = cluster.node_root(GPU_4X) / CHECKPOINT
    written = _read(path)
    assert written["Data"]["RegisteredDevices"] == {
        "nvidia.com/gpu": ["nvidia0", "nvidia1", "nvidia2", "nvidia3"]
    }
    [entry] = written["Data"]["PodDeviceEntries"]
    assert entry["PodUID"] == server["metadata"]["uid"]
    assert entry["ContainerName"] == "server"
    assert entry["ResourceName"] == "nvidia.com/gpu"
    assert entry["DeviceIDs"] == {"-1": ["nvidia0", "nvidia1"]}
    assert written["Checksum"] == checksum(written["Data"])

    registry.patch(
        DEPLOYMENTS, "default", "model-server", {"spec": {"replicas": 0}}, PatchType.MERGE
    )
    await wait_for(lambda: not registry.list(PODS, "default").items())
    assert _read(path)["Data"]["PodDeviceEntries"] is None
    kubelet = cluster.kubelet(GPU_4X)
    assert kubelet is not None
    assert kubelet.devices.free() == ["nvidia0", "nvidia1", "nvidia2", "nvidia3"]


async def test_uuid_style_ids(make_cluster: MakeCluster) -> None:
    base = fast_scenario()
    nodes = tuple(
        n.model_copy(update={"gpus": Gpus(count=n.gpus.count, id_style="uuid")}) for n in base.nodes
    )
    cluster = await make_cluster(base.model_copy(update={"nodes": nodes}))
    await wait_for(lambda: _server(cluster.registry))
    written = _read(cluster.node_root(GPU_4X) / CHECKPOINT)
    registered = written["Data"]["RegisteredDevices"]["nvidia.com/gpu"]
    assert len(registered) == 4
    assert all(r.startswith("GPU-") and len(r) == 40 for r in registered)
    [entry] = written["Data"]["PodDeviceEntries"]
    assert entry["DeviceIDs"]["-1"] == registered[:2]
    assert b"NVIDIA_VISIBLE_DEVICES" in base64.b64decode(entry["AllocResp"])


async def test_a_pod_placed_on_a_full_node_fails_out_of_gpus(registry: Registry) -> None:
    await wait_for(lambda: _server(registry))
    registry.create(
        PODS,
        pod_manifest(
            "squeezed", image=SERVER_IMAGE, gpus=3, node_name=GPU_4X, tolerations=[GPU_TOLERATION]
        ),
    )
    failed = await wait_for(lambda: phase(registry, "squeezed", "Failed"))
    assert failed["status"]["reason"] == "OutOfnvidia.com/gpu"
    assert failed["status"]["message"] == (
        "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 3, "
        "used: 2, capacity: 4"
    )
    assert "containerStatuses" not in failed["status"]
