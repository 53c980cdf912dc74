"""This worker's cards: the device ids the kubelet gave its pod, as nvidia-smi indices.

GKE's device plugin names cards `nvidia0`, `nvidia1`, …: those are the indices (reading them as
anything else left jobs failing with `not enough GPUs available ... visible=0`). NVIDIA's plugin
names them by UUID (`GPU-…`), which only `nvidia-smi` maps to indices. The ids come from the
kubelet checkpoint by this pod's UID; the agent never guesses: a checkpoint it cannot read, or
one without this pod, stops the worker with a message naming both.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from levers9.agent.checkpoint import (
    CHECKPOINT_PATH,
    CheckpointError,
    pod_devices,
    read_checkpoint,
)
from levers9.agent.paths import HostPaths
from levers9.agent.smi import NvidiaSmi, NvidiaSmiError

_INDEXED = re.compile(r"^(?:nvidia)?(\d+)$")


class DeviceError(RuntimeError):
    """The worker cannot tell which cards it holds; the message says why and where."""


async def resolve_visible_devices(
    paths: HostPaths, pod_uid: str, gpus: int | None, smi: NvidiaSmi | None
) -> tuple[int, ...]:
    """The indices of this pod's cards, sorted. `gpus` is what the Job asked for, when known:
    0 needs no checkpoint, any other count must match it."""
    if gpus == 0:
        return ()
    if not pod_uid:
        raise DeviceError(
            "LEVERS9_POD_UID is not set: the worker cannot find its cards in the kubelet "
            f"device-plugin checkpoint {CHECKPOINT_PATH}"
        )
    try:
        entries = read_checkpoint(paths.map(CHECKPOINT_PATH))
    except CheckpointError as error:
        raise DeviceError(f"{error} (looking up the cards of pod {pod_uid})") from None
    ids = pod_devices(entries, pod_uid)
    if ids is None:
        raise DeviceError(
            f"kubelet device-plugin checkpoint {CHECKPOINT_PATH} has no nvidia.com/gpu entry "
            f"for pod {pod_uid}"
        )
    if gpus is not None and len(ids) != gpus:
        raise DeviceError(
            f"kubelet device-plugin checkpoint {CHECKPOINT_PATH} lists {len(ids)} cards for pod "
            f"{pod_uid} ({', '.join(ids)}); the Job asked for {gpus}"
        )
    return await device_indices(ids, smi)


async def device_indices(ids: Sequence[str], smi: NvidiaSmi | None) -> tuple[int, ...]:
    """Maps device-plugin ids to indices (see module doc)."""
    indices: list[int] = []
    uuids: list[str] = []
    for device in ids:
        match = _INDEXED.match(device)
        if match:
            indices.append(int(match.group(1)))
        elif device.startswith("GPU-"):
            uuids.append(device)
        else:
            raise DeviceError(
                f"device id {device!r} in the kubelet checkpoint is neither nvidia<N> nor a "
                "GPU UUID"
            )
    if uuids:
        indices += await _uuid_indices(uuids, smi)
    return tuple(sorted(set(indices)))


async def _uuid_indices(uuids: Sequence[str], smi: NvidiaSmi | None) -> list[int]:
    if smi is None:
        raise DeviceError(
            f"the kubelet checkpoint names cards by UUID ({', '.join(uuids)}) and nvidia-smi, "
            "which maps them to indices, is not in /usr/local/nvidia/bin or on PATH"
        )
    try:
        known = await smi.uuid_indices()
    except NvidiaSmiError as error:
        raise DeviceError(f"cannot map GPU UUIDs to indices: {error}") from None
    missing = [u for u in uuids if u not in known]
    if missing:
        raise DeviceError(
            f"nvidia-smi does not list {', '.join(missing)}, which the kubelet checkpoint "
            "gives this pod"
        )
    return [known[u] for u in uuids]
