"""A node's GPUs as the kubelet's device manager sees them, and its checkpoint file.

The kubelet hands each container that asks for `nvidia.com/gpu` whole devices (here: the
lowest free ids first) and records every assignment in
`/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint`; the levers9 worker reads that
file to learn which cards it holds. The file is written exactly as kubelets since 1.20 write
it (`pkg/kubelet/cm/devicemanager/checkpoint`):

    {"Data":{"PodDeviceEntries":[{"PodUID":"…","ContainerName":"main",
      "ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["nvidia0","nvidia1"]},
      "AllocResp":"<base64 protobuf>"}],
     "RegisteredDevices":{"nvidia.com/gpu":["nvidia0","nvidia1","nvidia2","nvidia3"]}},
     "Checksum":1234567890}

- `DeviceIDs` is keyed by NUMA node (`-1` when the plugin reports no topology, as GKE's does).
  Kubelets before 1.20 wrote a flat list there (`"DeviceIDs":["nvidia0"]`); readers of real
  nodes may meet both, this file is always the newer shape. Kubelets since 1.35 may add a
  `BootID` beside `Checksum` (outside the checksummed data); it is not written.
- `PodDeviceEntries` is `null` when nothing is allocated (Go's nil slice).
- `AllocResp` is the device plugin's `ContainerAllocateResponse` in protobuf: for GKE-style
  ids (`nvidia0`) the device nodes plus the `/home/kubernetes/bin/nvidia` →
  `/usr/local/nvidia` mount GKE's plugin returns; for UUID-style ids (`GPU-…`, NVIDIA's
  plugin) `NVIDIA_VISIBLE_DEVICES` plus the device nodes. The content is plausible; the
  encoding is real protobuf.
- `Checksum` is computed exactly as the kubelet does: FNV-32a over go-spew's `%#v` rendering
  of the `checkpointData` struct (`checksum.New` → `hash.DeepHashObject`), so a real kubelet
  would accept the file. Verified against checkpoints published from real nodes.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandbox.cluster.objects import GPU

CHECKPOINT = Path("var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")
NO_NUMA = -1


@dataclass(frozen=True)
class Allocation:
    pod_uid: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


class DevicesExhausted(Exception):
    """Fewer free devices than a container asks for (admission should have prevented it)."""


class DeviceManager:
    """Device ids per resource on one node, their assignment to containers, the checkpoint."""

    def __init__(
        self,
        node_root: Path,
        registered: Mapping[str, Sequence[str]],
        numa: Mapping[str, int] | None = None,
    ) -> None:
        self._path = node_root / CHECKPOINT
        self._registered = {name: list(ids) for name, ids in registered.items() if ids}
        self._numa = dict(numa or {})
        self._allocations: list[Allocation] = []

    @property
    def path(self) -> Path:
        return self._path

    def registered(self, resource: str = GPU) -> list[str]:
        return list(self._registered.get(resource, ()))

    def free(self, resource: str = GPU) -> list[str]:
        taken = {d for a in self._allocations if a.resource == resource for d in a.device_ids}
        return [d for d in self._registered.get(resource, ()) if d not in taken]

    def allocated(self, pod_uid: str) -> dict[str, list[str]]:
        """Device ids per container of one pod."""
        out: dict[str, list[str]] = {}
        for a in self._allocations:
            if a.pod_uid == pod_uid:
                out.setdefault(a.container, []).extend(a.device_ids)
        return out

    def allocate(self, pod_uid: str, container: str, count: int, resource: str = GPU) -> list[str]:
        """The ids a container holds, assigning the lowest free ones on first call."""
        for a in self._allocations:
            if (a.pod_uid, a.container, a.resource) == (pod_uid, container, resource):
                return list(a.device_ids)
        free = self.free(resource)
        if count > len(free):
            raise DevicesExhausted(f"requested {count} {resource}, {len(free)} free")
        ids = tuple(free[:count])
        self._allocations.append(Allocation(pod_uid, container, resource, ids))
        self.write()
        return list(ids)

    def release(self, pod_uid: str) -> bool:
        before = len(self._allocations)
        self._allocations = [a for a in self._allocations if a.pod_uid != pod_uid]
        if len(self._allocations) == before:
            return False
        self.write()
        return True

    def assign(self, pod_uid: str, container: str, ids: Sequence[str], resource: str = GPU) -> None:
        """Records ids a container shares with another of its pod (init containers reuse the
        cards of the containers that follow them)."""
        self._allocations.append(Allocation(pod_uid, container, resource, tuple(ids)))
        self.write()

    def checkpoint(self) -> dict[str, object]:
        entries = [
            {
                "PodUID": a.pod_uid,
                "ContainerName": a.container,
                "ResourceName": a.resource,
                "DeviceIDs": self._by_numa(a.device_ids),
                "AllocResp": base64.b64encode(allocate_response(a.device_ids).encode()).decode(),
            }
            for a in self._allocations
        ]
        data = {
            "PodDeviceEntries": entries or None,
            "RegisteredDevices": {k: self._registered[k] for k in sorted(self._registered)},
        }
        return {"Data": data, "Checksum": checksum(data)}

    def write(self) -> None:
        """Writes the checkpoint the way the kubelet's file store does: temp file, rename."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.checkpoint(), separators=(",", ":"), ensure_ascii=False)
        temp = self._path.with_name(f".{self._path.name}.tmp")
        temp.write_text(text)
        os.replace(temp, self._path)

    def _by_numa(self, ids: Sequence[str]) -> dict[str, list[str]]:
        grouped: dict[int, list[str]] = {}
        for device in ids:
            grouped.setdefault(self._numa.get(device, NO_NUMA), []).append(device)
        # encoding/json orders map keys by their string form.
        return {str(k): grouped[k] for k in sorted(grouped, key=str)}


# -- the checksum ------------------------------------------------------------------------------


def checksum(data: Mapping[str, object]) -> int:
    """`checksum.New(checkpointData)`: FNV-32a of go-spew's `%#v` (SortKeys, DisableMethods)."""
    return fnv32a(_spew(data).encode())


def fnv32a(data: bytes) -> int:
    value = 0x811C9DC5
    for byte in data:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


def _spew_strings(values: Sequence[str]) -> str:
    return "[" + " ".join(values) + "]"


def _spew(data: Mapping[str, object]) -> str:
    # Type names print at the top and for struct fields; slice elements and map entries
    # print bare (spew's ignoreNextType). Maps print with sorted keys, nil as <nil>.
    entries = data.get("PodDeviceEntries")
    if not isinstance(entries, list):
        rendered = "<nil>"
    else:
        parts = []
        for entry in entries:
            ids = entry["DeviceIDs"]
            numa = " ".join(f"{k}:{_spew_strings(ids[str(k)])}" for k in sorted(map(int, ids)))
            resp = entry.get("AllocResp")
            resp_text = (
                "<nil>"
                if resp is None
                else "[" + " ".join(str(b) for b in base64.b64decode(resp)) + "]"
            )
            parts.append(
                f"{{PodUID:(string){entry['PodUID']} "
                f"ContainerName:(string){entry['ContainerName']} "
                f"ResourceName:(string){entry['ResourceName']} "
                f"DeviceIDs:(checkpoint.DevicesPerNUMA)map[{numa}] "
                f"AllocResp:([]uint8){resp_text}}}"
            )
        rendered = "[" + " ".join(parts) + "]"
    registered = data.get("RegisteredDevices")
    assert isinstance(registered, Mapping)
    devices = " ".join(f"{k}:{_spew_strings(registered[k])}" for k in sorted(registered))
    return (
        "(checkpoint.checkpointData){"
        f"PodDeviceEntries:([]checkpoint.PodDevicesEntry){rendered} "
        f"RegisteredDevices:(map[string][]string)map[{devices}]}}"
    )


# -- the device plugin's answer ----------------------------------------------------------------


@dataclass(frozen=True)
class ContainerAllocateResponse:
    """`v1beta1.ContainerAllocateResponse`: what the runtime adds to the container."""

    envs: tuple[tuple[str, str], ...]
    mounts: tuple[tuple[str, str, bool], ...]  # container path, host path, read-only
    devices: tuple[tuple[str, str, str], ...]  # container path, host path, permissions

    def encode(self) -> bytes:
        out = b""
        for key, value in sorted(self.envs):  # gogo's marshaller sorts map keys
            out += _field(1, _field(1, key.encode()) + _field(2, value.encode()))
        for container_path, host_path, read_only in self.mounts:
            body = _field(1, container_path.encode()) + _field(2, host_path.encode())
            if read_only:
                body += bytes([3 << 3]) + _varint(1)
            out += _field(2, body)
        for container_path, host_path, permissions in self.devices:
            body = (
                _field(1, container_path.encode())
                + _field(2, host_path.encode())
                + _field(3, permissions.encode())
            )
            out += _field(3, body)
        return out


def allocate_response(ids: Sequence[str]) -> ContainerAllocateResponse:
    control = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
    if all(d.startswith("nvidia") and d[6:].isdigit() for d in ids):
        # GKE's device plugin: device nodes and the driver install dir, no environment.
        nodes = [f"/dev/{d}" for d in ids]
        return ContainerAllocateResponse(
            envs=(),
            mounts=(("/usr/local/nvidia", "/home/kubernetes/bin/nvidia", True),),
            devices=tuple((p, p, "mrw") for p in (*control, *nodes)),
        )
    # NVIDIA's device plugin: the runtime hook finds the devices from the environment.
    return ContainerAllocateResponse(
        envs=(("NVIDIA_VISIBLE_DEVICES", ",".join(ids)),),
        mounts=(),
        devices=tuple((p, p, "rw") for p in control),
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2]) + _varint(len(payload)) + payload
