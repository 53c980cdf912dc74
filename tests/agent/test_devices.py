"""Which cards the worker holds: the kubelet checkpoint by pod UID, read as indices.

Checkpoints are written by the sandbox's `DeviceManager` in the real kubelet format (and
rewritten in the pre-1.20 flat shape). Covers GKE-style ids (`nvidia0` read as index 0, the
spec's `visible=0` failure), GPU UUIDs mapped through `nvidia-smi --query-gpu=index,uuid`,
both `DeviceIDs` shapes, a CPU-only worker needing no checkpoint, and the clear errors: no
checkpoint, no entry for this pod, a count that differs from the Job's, UUIDs without
nvidia-smi.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from levers9.agent.checkpoint import CHECKPOINT_PATH, parse_checkpoint, pod_devices
from levers9.agent.devices import DeviceError, resolve_visible_devices
from levers9.agent.paths import HostPaths
from levers9.agent.smi import NvidiaSmi
from tests.agent.kit import (
    NEIGHBOUR_UID,
    POD_UID,
    UUIDS,
    install_nvidia_smi,
    sandbox_paths,
    write_checkpoint,
)

NVIDIA_IDS = ["nvidia0", "nvidia1", "nvidia2", "nvidia3"]
CARD = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


@pytest.fixture
def paths(node_root: Path) -> HostPaths:
    return sandbox_paths(node_root)


@pytest.mark.parametrize("flat", [False, True], ids=["numa-map", "flat-list"])
async def test_nvidia_style_ids_are_indices(node_root: Path, paths: HostPaths, flat: bool) -> None:
    write_checkpoint(
        node_root,
        NVIDIA_IDS,
        {NEIGHBOUR_UID: ["nvidia0", "nvidia1"], POD_UID: ["nvidia3", "nvidia2"]},
        flat=flat,
    )

    assert await resolve_visible_devices(paths, POD_UID, None, None) == (2, 3)
    assert await resolve_visible_devices(paths, POD_UID, 2, None) == (2, 3)


@pytest.mark.parametrize("flat", [False, True], ids=["numa-map", "flat-list"])
async def test_gpu_uuids_map_through_nvidia_smi(
    node_root: Path, paths: HostPaths, flat: bool
) -> None:
    write_checkpoint(node_root, UUIDS, {POD_UID: [UUIDS[2], UUIDS[0]]}, flat=flat)
    install_nvidia_smi(node_root, [(i, u, CARD) for i, u in enumerate(UUIDS)])
    smi = NvidiaSmi.find([paths.map("/usr/local/nvidia/bin")])

    assert smi is not None
    assert await resolve_visible_devices(paths, POD_UID, None, smi) == (0, 2)
    assert await smi.names() == {0: CARD, 1: CARD, 2: CARD}


async def test_gpu_uuids_without_nvidia_smi_is_a_clear_error(
    node_root: Path, paths: HostPaths
) -> None:
    write_checkpoint(node_root, UUIDS, {POD_UID: [UUIDS[1]]})

    with pytest.raises(DeviceError, match=r"nvidia-smi.*/usr/local/nvidia/bin") as raised:
        await resolve_visible_devices(paths, POD_UID, None, None)
    assert UUIDS[1] in str(raised.value)


async def test_a_cpu_only_worker_needs_no_checkpoint(paths: HostPaths) -> None:
    assert await resolve_visible_devices(paths, "", 0, None) == ()


async def test_a_missing_checkpoint_names_the_file_and_the_pod(paths: HostPaths) -> None:
    with pytest.raises(DeviceError) as raised:
        await resolve_visible_devices(paths, POD_UID, 2, None)
    assert CHECKPOINT_PATH in str(raised.value)
    assert "does not exist" in str(raised.value)
    assert POD_UID in str(raised.value)


async def test_an_unreadable_checkpoint_names_the_file(node_root: Path, paths: HostPaths) -> None:
    write_checkpoint(node_root, NVIDIA_IDS, {}).write_text("{not json")

    with pytest.raises(DeviceError, match="is not JSON") as raised:
        await resolve_visible_devices(paths, POD_UID, None, None)
    assert POD_UID in str(raised.value)


@pytest.mark.parametrize(
    "pods", [{}, {NEIGHBOUR_UID: ["nvidia0"]}], ids=["nothing-allocated", "other-pods-only"]
)
async def test_no_entry_for_this_pod_is_an_error_not_a_guess(
    node_root: Path, paths: HostPaths, pods: dict[str, list[str]]
) -> None:
    write_checkpoint(node_root, NVIDIA_IDS, pods)

    with pytest.raises(DeviceError) as raised:
        await resolve_visible_devices(paths, POD_UID, None, None)
    assert str(raised.value) == (
        f"kubelet device-plugin checkpoint {CHECKPOINT_PATH} has no nvidia.com/gpu entry for "
        f"pod {POD_UID}"
    )


async def test_a_count_other_than_the_jobs_is_an_error(node_root: Path, paths: HostPaths) -> None:
    write_checkpoint(node_root, NVIDIA_IDS, {POD_UID: ["nvidia0"]})

    with pytest.raises(DeviceError, match=r"lists 1 cards .* the Job asked for 2"):
        await resolve_visible_devices(paths, POD_UID, 2, None)


def test_entries_without_the_data_wrapper_and_init_containers_sharing_cards() -> None:
    # Kubelets before 1.14 wrote the entries at the top level; an init container's entry
    # repeats the ids its pod's containers hold.
    text = (
        '{"PodDeviceEntries":['
        '{"PodUID":"p","ContainerName":"init","ResourceName":"nvidia.com/gpu",'
        '"DeviceIDs":["nvidia1"],"AllocResp":""},'
        '{"PodUID":"p","ContainerName":"worker","ResourceName":"nvidia.com/gpu",'
        '"DeviceIDs":["nvidia1","nvidia0"],"AllocResp":""}],'
        '"RegisteredDevices":{"nvidia.com/gpu":["nvidia0","nvidia1"]}}'
    )
    assert pod_devices(parse_checkpoint(text), "p") == ("nvidia1", "nvidia0")
