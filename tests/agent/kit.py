"""Builders shared by the worker tests: a node filesystem with the kubelet's checkpoint (written
by the sandbox's own `DeviceManager`, in the real kubelet format), an `nvidia-smi` on the
driver's path, and the token metadata."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from levers9.agent.paths import HostPaths
from levers9.contract import COMMAND_TOKEN_HEADER, DEVICE_PLUGIN_DIR, GPU
from levers9.rpc import bearer
from sandbox.cluster.devices import DeviceManager

TOKEN = "l9w1.test-token"
AUTH = bearer.metadata(TOKEN)
COMMAND_TOKEN = "l9c1.test-command-token"
COMMAND_AUTH = ((COMMAND_TOKEN_HEADER, COMMAND_TOKEN),)
"""What the controlplane presents to a worker whose Secret holds `command_digest(COMMAND_TOKEN)`."""
POD_UID = "0d5c3e4a-7a51-4a55-9a2b-6f1f0b9d2c11"
NEIGHBOUR_UID = "5b1f2c77-0e0a-4c1e-8a53-2b8d7c6e9f00"
UUIDS = (
    "GPU-c1e9f249-b37b-81c2-a8d9-ba5ca0294841",
    "GPU-77a702db-e37f-3a74-d46d-c5713f66058c",
    "GPU-9b341c59-f96b-ba85-c137-78c3652fea65",
)


def sandbox_paths(node_root: Path) -> HostPaths:
    """What the sandbox kubelet tells the worker container: the node root, and the
    device-plugin directory mounted from it."""
    return HostPaths(node_root, {DEVICE_PLUGIN_DIR: node_root / DEVICE_PLUGIN_DIR.lstrip("/")})


def write_checkpoint(
    node_root: Path,
    registered: Sequence[str],
    pods: Mapping[str, Sequence[str]],
    *,
    flat: bool = False,
) -> Path:
    """The kubelet's checkpoint with `pods` (uid → device ids) allocated. `flat` rewrites the
    ids as kubelets before 1.20 did (a list instead of a map keyed by NUMA node)."""
    manager = DeviceManager(node_root, {GPU: list(registered)})
    for uid, ids in pods.items():
        manager.assign(uid, "worker", ids)
    manager.write()  # also when nothing is allocated (`"PodDeviceEntries": null`)
    if flat:
        document = manager.checkpoint()
        data = document["Data"]
        assert isinstance(data, dict)
        for entry in data["PodDeviceEntries"] or ():
            entry["DeviceIDs"] = [d for ids in entry["DeviceIDs"].values() for d in ids]
        manager.path.write_text(json.dumps(document, separators=(",", ":")))
    return manager.path


def install_nvidia_smi(node_root: Path, cards: Sequence[tuple[int, str, str]]) -> Path:
    """An `nvidia-smi` in the node's `/usr/local/nvidia/bin` answering `--query-gpu` for
    `cards` (index, uuid, name) as the real one does (`--format=csv,noheader`)."""
    path = node_root / "usr/local/nvidia/bin/nvidia-smi"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"index": str(i), "uuid": u, "name": n} for i, u, n in cards]
    path.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"rows = {rows!r}\n"
        "query = next(a for a in sys.argv if a.startswith('--query-gpu='))\n"
        "fields = query.split('=', 1)[1].split(',')\n"
        "for row in rows:\n"
        "    print(', '.join(row[f] for f in fields))\n"
    )
    path.chmod(0o755)
    return path
