"""The host's NVIDIA driver, made usable by the agent and its tasks.

GKE installs the driver on the node and its device plugin mounts it at `/usr/local/nvidia`,
where the loader does not look: without registering `lib64`, the NVIDIA container tooling fails
with `failed to generate CDI spec` and CUDA finds no `libcuda.so`. So the agent writes an
`ld.so.conf.d` entry and runs `ldconfig` (it runs as root in a privileged container). Where it
may not (the sandbox, where node paths are mapped and the loader is the host's, or a non-root
run) tasks get the directories on `LD_LIBRARY_PATH` instead. The driver's binaries
(`nvidia-smi`) live in `/usr/local/nvidia/bin`, which tasks get on their PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from levers9.agent.paths import HostPaths
from levers9.logs import get_logger

log = get_logger("levers9.agent.driver")

LIB_DIRS = ("/usr/local/nvidia/lib64",)
BIN_DIRS = ("/usr/local/nvidia/bin",)
LOADER_CONF = "/etc/ld.so.conf.d/000-levers9-nvidia.conf"
_LDCONFIG_TIMEOUT_S = 60


@dataclass(frozen=True)
class DriverSetup:
    """What tasks need to find the driver."""

    registered: tuple[str, ...]
    """Node paths of the library directories registered with the loader."""
    bin_dirs: tuple[Path, ...]
    """Real paths to put first on a task's PATH."""
    library_path: tuple[Path, ...]
    """Real paths tasks need on LD_LIBRARY_PATH (the loader's cache was not updated)."""


def register_driver_libraries(paths: HostPaths) -> DriverSetup:
    """Registers the driver's library directories that exist on this node (see module doc)."""
    found = [d for d in LIB_DIRS if paths.map(d).is_dir()]
    bin_dirs = tuple(paths.map(d) for d in BIN_DIRS)
    if not found:
        log.info("no host driver libraries found", dirs=list(LIB_DIRS))
        return DriverSetup((), bin_dirs, ())
    real = [paths.map(d) for d in found]
    try:
        conf = paths.map(LOADER_CONF)
        conf.parent.mkdir(parents=True, exist_ok=True)
        conf.write_text("".join(f"{d}\n" for d in real))
    except OSError as error:
        log.warning("loader configuration not written", path=LOADER_CONF, error=str(error))
        return DriverSetup((), bin_dirs, tuple(real))
    cache_updated = _ldconfig(paths)
    log.info("host driver libraries registered with the loader", dirs=found)
    return DriverSetup(tuple(found), bin_dirs, () if cache_updated else tuple(real))


def _ldconfig(paths: HostPaths) -> bool:
    """Rebuilds the loader cache when this process owns the loader: root, not sandboxed."""
    ldconfig = shutil.which("ldconfig") or (
        "/sbin/ldconfig" if Path("/sbin/ldconfig").exists() else None
    )
    if paths.sandboxed or os.geteuid() != 0 or ldconfig is None:
        return False
    try:
        subprocess.run(
            [ldconfig], check=True, capture_output=True, text=True, timeout=_LDCONFIG_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", None) or str(error)
        log.warning("ldconfig failed", error=str(detail).strip())
        return False
    return True
