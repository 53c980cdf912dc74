"""The kubelet's device-plugin checkpoint: which devices each pod's containers hold.

`/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint` (the worker Job mounts the
directory read-only) is JSON written by the kubelet's device manager:

    {"Data": {"PodDeviceEntries": [{"PodUID": "…", "ContainerName": "worker",
       "ResourceName": "nvidia.com/gpu", "DeviceIDs": {"-1": ["nvidia0", "nvidia1"]},
       "AllocResp": "…"}], "RegisteredDevices": {…}}, "Checksum": …}

Kubelets since 1.20 key `DeviceIDs` by NUMA node; older ones wrote a flat list. Both occur on
real nodes, so both are read. `PodDeviceEntries` is `null` when nothing is allocated.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers9.contract import DEVICE_PLUGIN_DIR, GPU

CHECKPOINT_PATH = f"{DEVICE_PLUGIN_DIR}/kubelet_internal_checkpoint"
"""Node path of the checkpoint."""


class CheckpointError(RuntimeError):
    """The checkpoint cannot be read or parsed; the message names the file."""


@dataclass(frozen=True)
class PodDevices:
    """One `PodDeviceEntries` item: the devices of one resource held by one container."""

    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


def read_checkpoint(path: Path, shown_as: str = CHECKPOINT_PATH) -> list[PodDevices]:
    """The entries of the checkpoint at `path` (named `shown_as` in errors)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise CheckpointError(
            f"kubelet device-plugin checkpoint {shown_as} does not exist"
        ) from None
    except OSError as error:
        raise CheckpointError(
            f"kubelet device-plugin checkpoint {shown_as} cannot be read: {error}"
        ) from None
    return parse_checkpoint(text, shown_as)


def parse_checkpoint(text: str, shown_as: str = CHECKPOINT_PATH) -> list[PodDevices]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise CheckpointError(
            f"kubelet device-plugin checkpoint {shown_as} is not JSON: {error}"
        ) from None
    # Very old kubelets wrote the data at the top level, without the `Data` wrapper.
    data = document.get("Data", document) if isinstance(document, dict) else None
    if not isinstance(data, dict):
        raise CheckpointError(f"kubelet device-plugin checkpoint {shown_as} has no Data object")
    entries = data.get("PodDeviceEntries") or []
    if not isinstance(entries, list):
        raise CheckpointError(
            f"kubelet device-plugin checkpoint {shown_as}: PodDeviceEntries is not a list"
        )
    return [_entry(e, shown_as) for e in entries]


def pod_devices(
    entries: Iterable[PodDevices], pod_uid: str, resource: str = GPU
) -> tuple[str, ...] | None:
    """The ids of `resource` held by any container of the pod, in checkpoint order without
    repeats (init containers reuse their pod's cards); None when the pod has no entry."""
    ids: dict[str, None] = {}
    found = False
    for entry in entries:
        if entry.pod_uid == pod_uid and entry.resource == resource:
            found = True
            ids.update(dict.fromkeys(entry.device_ids))
    return tuple(ids) if found else None


def _entry(raw: Any, shown_as: str) -> PodDevices:
    if not isinstance(raw, Mapping):
        raise CheckpointError(
            f"kubelet device-plugin checkpoint {shown_as}: entry is not an object"
        )
    return PodDevices(
        pod_uid=str(raw.get("PodUID", "")),
        container=str(raw.get("ContainerName", "")),
        resource=str(raw.get("ResourceName", "")),
        device_ids=_device_ids(raw.get("DeviceIDs"), shown_as),
    )


def _device_ids(raw: Any, shown_as: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if isinstance(raw, Sequence) and not isinstance(raw, str):
        return tuple(str(d) for d in raw)  # before kubelet 1.20: a flat list
    if isinstance(raw, Mapping):
        # NUMA node → ids; nodes in numeric order, as the devices were grouped.
        return tuple(str(d) for numa in sorted(raw, key=_numa_key) for d in raw[numa] or ())
    raise CheckpointError(
        f"kubelet device-plugin checkpoint {shown_as}: DeviceIDs is neither a list nor a map"
    )


def _numa_key(key: object) -> tuple[int, str]:
    try:
        return (int(str(key)), "")
    except ValueError:
        return (0, str(key))
