"""The node's NVIDIA cards as a CDI spec (Container Device Interface, the format NVIDIA's
container toolkit writes with `nvidia-ctk cdi generate`), and its edits applied to a container.

The agent generates it once, when it starts, for the cards the worker holds:

    {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu",
     "devices": [{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0",
        "hostPath": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0,
        "permissions": "rw"}]}}, ...],
     "containerEdits": {"deviceNodes": [/dev/nvidiactl, /dev/nvidia-uvm, ... when present],
        "mounts": [{"hostPath": "/usr/local/nvidia", "containerPath": "/usr/local/nvidia",
                    "options": ["ro", "nosuid", "nodev", "rbind"]}]}}

and writes it beside its state (`cdi/nvidia.json`, where `nvidia-ctk cdi list` and a CDI-aware
runtime read it). A container asking for `nvidia.com/gpu=0,2` gets those devices' edits and the
spec's common ones; a card the spec does not hold is refused as CDI runtimes refuse it
(`unresolvable CDI devices nvidia.com/gpu=3`).

Generation fails, and the worker exits with `failed to generate CDI spec: ...` (the
troubleshooting row of the page), when the worker holds cards but the node lacks what the
spec needs: a card's device node, or the driver's libraries at `/usr/local/nvidia/lib64`
(mounted where the loader does not look).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CDI_VERSION = "0.6.0"
KIND = "nvidia.com/gpu"
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
DRIVER_ROOT = "/usr/local/nvidia"
MOUNT_OPTIONS = ("ro", "nosuid", "nodev", "rbind")
SPEC_FILE = "nvidia.json"
_CARD = re.compile(r"nvidia(\d+)")


class CdiError(RuntimeError):
    """The CDI spec cannot be generated; the message starts `failed to generate CDI spec`."""


@dataclass(frozen=True)
class DeviceNode:
    path: str
    """Inside the container (`/dev/nvidia0`)."""
    host_path: str
    major: int
    minor: int


@dataclass(frozen=True)
class Edits:
    """What a container gets for its cards."""

    device_nodes: tuple[DeviceNode, ...]
    mounts: tuple[tuple[str, str], ...]
    """(host path, container path), read-only binds."""


def node_cards(dev_root: Path) -> list[int]:
    """The card indices whose `/dev/nvidiaN` the node has."""
    found = (_CARD.fullmatch(p.name) for p in dev_root.glob("nvidia*"))
    return sorted(int(m[1]) for m in found if m)


def generate(dev_root: Path, driver_root: Path, cards: Sequence[int]) -> dict[str, Any]:
    """The spec for `cards` (node paths: `dev_root` is the node's /dev, `driver_root` its
    `/usr/local/nvidia`). Raises CdiError (see module doc)."""
    devices = [
        {"name": str(i), "containerEdits": {"deviceNodes": [_node(dev_root, f"nvidia{i}")]}}
        for i in sorted(set(cards))
    ]
    common: dict[str, Any] = {"deviceNodes": [], "mounts": []}
    if cards:
        if not (driver_root / "lib64").is_dir():
            raise CdiError(
                f"failed to generate CDI spec: no driver libraries at {DRIVER_ROOT}/lib64 on"
                " this node (the driver is mounted where the loader does not look); worker"
                f" images register {DRIVER_ROOT} themselves"
            )
        common["deviceNodes"] = [
            _node(dev_root, name) for name in CONTROL_DEVICES if (dev_root / name).exists()
        ]
        common["mounts"] = [
            {
                "hostPath": str(driver_root),
                "containerPath": DRIVER_ROOT,
                "options": list(MOUNT_OPTIONS),
            }
        ]
    return {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": devices, "containerEdits": common}


def _node(dev_root: Path, name: str) -> dict[str, Any]:
    path = dev_root / name
    try:
        info = path.stat()
    except FileNotFoundError:
        raise CdiError(
            f"failed to generate CDI spec: {path} is missing on this node"
            " (is the NVIDIA driver loaded?)"
        ) from None
    if not stat.S_ISCHR(info.st_mode):
        raise CdiError(f"failed to generate CDI spec: {path} is not a character device")
    return {
        "path": f"/dev/{name}",
        "hostPath": str(path),
        "type": "c",
        "major": os.major(info.st_rdev),
        "minor": os.minor(info.st_rdev),
        "permissions": "rw",
    }


def write(spec: Mapping[str, Any], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / SPEC_FILE
    path.write_text(json.dumps(spec, indent=2))
    return path


class UnresolvableDevices(LookupError):
    """A card the spec does not hold was asked for."""


def edits(spec: Mapping[str, Any], cards: Sequence[int]) -> Edits:
    """The edits for `nvidia.com/gpu=<cards>`: each card's, then the common ones (none for a
    task with no card: it gets no driver and no control device)."""
    by_name = {d["name"]: d["containerEdits"] for d in spec.get("devices") or ()}
    missing = [str(i) for i in cards if str(i) not in by_name]
    if missing:
        raise UnresolvableDevices(
            "unresolvable CDI devices " + ", ".join(f"{KIND}={i}" for i in missing)
        )
    if not cards:
        return Edits((), ())
    wanted = [by_name[str(i)] for i in sorted(set(cards))] + [spec.get("containerEdits") or {}]
    nodes = tuple(
        DeviceNode(n["path"], n.get("hostPath", n["path"]), int(n["major"]), int(n["minor"]))
        for e in wanted
        for n in e.get("deviceNodes") or ()
    )
    mounts = tuple(
        (m["hostPath"], m["containerPath"]) for e in wanted for m in e.get("mounts") or ()
    )
    return Edits(nodes, mounts)
