"""Node paths, and where they really are.

In the worker Job a path such as `/usr/local/nvidia/lib64` or the mounted
`/var/lib/kubelet/device-plugins` is simply itself. In the sandbox the kubelet runs the worker
image's container as a local process with no filesystem of its own, and says where things are
(`sandbox.cluster.podenv`): `LEVERS9_SANDBOX_MOUNTS` maps each volume's mountPath to a
directory, and everything else of the node lives under `LEVERS9_SANDBOX_ROOT`. The agent
always speaks in node paths (they are what the spec's log lines quote) and asks `HostPaths`
where to read or write.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

# The sandbox kubelet's contract (sandbox/cluster/podenv.py). Spelled out here rather
# than imported: the agent ships in the worker image and must not depend on the sandbox.
ROOT_ENV = "LEVERS9_SANDBOX_ROOT"
MOUNTS_ENV = "LEVERS9_SANDBOX_MOUNTS"


class HostPathsError(ValueError):
    """The sandbox contract's variables cannot be read."""


@dataclass(frozen=True)
class HostPaths:
    """Maps absolute node paths to real paths: mounts first (longest mountPath wins), then the
    sandbox root, else the path itself."""

    root: Path | None = None
    mounts: Mapping[str, Path] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> HostPaths:
        root = env.get(ROOT_ENV) or None
        raw = env.get(MOUNTS_ENV) or "{}"
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError as error:
            raise HostPathsError(f"{MOUNTS_ENV} is not JSON: {error}") from None
        if not isinstance(parsed, dict):
            raise HostPathsError(f"{MOUNTS_ENV} must be a JSON object of mountPath to directory")
        mounts = {_normal(str(k)): Path(str(v)) for k, v in parsed.items()}
        return cls(Path(root) if root else None, mounts)

    @property
    def sandboxed(self) -> bool:
        """True when node paths are not what they say (the sandbox's process containers)."""
        return self.root is not None or bool(self.mounts)

    def map(self, node_path: str | PurePosixPath) -> Path:
        """Where the absolute `node_path` really is."""
        path = _normal(str(node_path))
        if not path.startswith("/"):
            raise ValueError(f"node path must be absolute: {node_path}")
        best = max(
            (m for m in self.mounts if path == m or path.startswith(m.rstrip("/") + "/")),
            key=len,
            default=None,
        )
        if best is not None:
            rest = path[len(best.rstrip("/")) :].lstrip("/")
            return self.mounts[best] / rest if rest else self.mounts[best]
        if self.root is not None:
            return self.root / path.lstrip("/")
        return Path(path)


def _normal(path: str) -> str:
    # posixpath.normpath keeps a leading "//"; a node path never means anything by it.
    normal = os.path.normpath(path) if path else path
    return "/" + normal.lstrip("/") if normal.startswith("/") else normal
