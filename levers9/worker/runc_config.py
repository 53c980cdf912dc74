"""A task's OCI runtime config (`config.json`): the image's, as `umoci raw runtime-config` made it
(which honours the image's Entrypoint, Cmd, Env, WorkingDir and User as Docker does, resolving a
user name in the image's /etc/passwd), narrowed for the task (pure: no I/O but the agent's own
NOFILE limit and whether resolv.conf exists):

- its own PID, mount, IPC and UTS namespaces, and the network namespace of its own the agent
  made for it (levers9.worker.task_network: `network`, joined by path; its resolv.conf names
  the namespace's DNS); without one, the agent's: the host's, or the pod's on the pod network;
- runc's default capabilities, `noNewPrivileges`, and memory, CPU and pids limits (`Limits`);
- device nodes for its cards only, from the worker's CDI spec (levers9.worker.cdi):
  `/dev/nvidiaN` for each of its indices, plus `/dev/nvidiactl`, `/dev/nvidia-uvm`,
  `/dev/nvidia-uvm-tools` and `/dev/nvidia-modeset` when the node has them, with cgroup device
  rules that allow those and nothing else of the host's;
- the driver's directories (`/usr/local/nvidia`, the spec's mount) read-only,
  `NVIDIA_VISIBLE_DEVICES` as the process runtime sets it, and the task's own directory at
  `/levers9` for its result file;
- an environment of the image's, the task's and those few variables only: nothing of the
  agent's (its token never sits in any environment a task can read), and none of the agent's
  files (its Secret, its /proc) inside the container.

The command replaces the image's Cmd and keeps its Entrypoint, as `docker run IMAGE CMD`.
"""

from __future__ import annotations

import json
import resource
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers9.worker.cdi import DRIVER_ROOT, DeviceNode
from levers9.worker.cgroups import cgroup_path
from levers9.worker.images import ImageConfig
from levers9.worker.runtime import ContainerSpec, StartError, visible_devices

TASK_MOUNT = "/levers9"
"""The folder of the task's result file inside its container (`LEVERS9_RESULT_PATH`)."""
NOFILE = 1_048_576
SHM_DEFAULT_BYTES = 8 * 1024**3
"""/dev/shm's cap without a memory limit (tmpfs: nothing is reserved)."""


@dataclass(frozen=True)
class Limits:
    """Per container; None: unlimited."""

    memory_bytes: int | None = None
    cpus: float | None = None
    pids: int | None = 32768


DEFAULT_LIMITS = Limits()


def container_config(
    base: Mapping[str, Any],
    spec: ContainerSpec,
    image: ImageConfig,
    devices: Sequence[DeviceNode],
    *,
    mounts: Sequence[tuple[str, str]] = (),
    limits: Limits = DEFAULT_LIMITS,
    resolv_conf: Path | None = Path("/etc/resolv.conf"),
    network: Path | None = None,
) -> dict[str, Any]:
    """The task's OCI runtime config, from the image's (`base`: umoci's) and the task (pure).
    `devices` and `mounts` (host path, container path; read-only) are its CDI edits; `network`
    the network namespace it joins (None: the agent's)."""
    config: dict[str, Any] = json.loads(json.dumps(base))
    process = config["process"]
    if spec.command:
        process["args"] = [*image.entrypoint, *spec.command]
    if not process.get("args"):
        raise StartError("the task gives no command and its image has neither Entrypoint nor Cmd")
    env = dict(e.split("=", 1) for e in process.get("env") or [] if "=" in e)
    env.update(spec.env)
    env["NVIDIA_VISIBLE_DEVICES"] = visible_devices(spec.gpu_indices)
    env["LEVERS9_TASK_ID"] = spec.task_id
    env["LEVERS9_RESULT_PATH"] = f"{TASK_MOUNT}/{spec.result_path.name}"
    if any(container == DRIVER_ROOT for _, container in mounts):
        env["PATH"] = ":".join(
            [f"{DRIVER_ROOT}/bin", *[p for p in env.get("PATH", "").split(":") if p]]
        )
        env["LD_LIBRARY_PATH"] = ":".join(
            [f"{DRIVER_ROOT}/lib64", *[p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]]
        )
    process["env"] = [f"{k}={v}" for k, v in env.items()]
    process["terminal"] = False
    process["noNewPrivileges"] = True
    # As many as the agent may open (Docker gives 1048576), not umoci's 1024: data loaders and
    # NCCL open many files; above the agent's own hard limit runc's init is refused.
    nofile = min(NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    process["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile}]
    config["root"] = {"path": "rootfs", "readonly": False}
    config["hostname"] = f"task-{spec.task_id}"[:63]

    binds = [m for m in config.get("mounts") or [] if m.get("destination") != TASK_MOUNT]
    for mount in binds:
        if mount.get("destination") == "/dev/shm":
            # PyTorch's DataLoader and NCCL share tensors through /dev/shm: 64 MiB (Docker's
            # and umoci's default) is the classic "bus error"; it counts against the limit.
            size = limits.memory_bytes or SHM_DEFAULT_BYTES
            options = [o for o in mount.get("options", []) if not o.startswith("size=")]
            mount["options"] = [*options, f"size={size}"]
    binds.append(_bind(str(spec.result_path.parent), TASK_MOUNT, read_only=False))
    for host, container in mounts:
        binds.append(_bind(host, container, read_only=True))
    if resolv_conf is not None and resolv_conf.exists():
        binds.append(_bind(str(resolv_conf), "/etc/resolv.conf", read_only=True))
    config["mounts"] = binds

    linux = config.setdefault("linux", {})
    linux["cgroupsPath"] = cgroup_path(spec.task_id)
    namespaces = [n for n in linux.get("namespaces") or [] if n.get("type") != "network"]
    if network is not None:
        namespaces.append({"type": "network", "path": str(network)})
    for kind in ("pid", "ipc", "uts", "mount"):
        if not any(n.get("type") == kind for n in namespaces):
            namespaces.append({"type": kind})
    linux["namespaces"] = namespaces
    linux["devices"] = [
        {
            "path": d.path,
            "type": "c",
            "major": d.major,
            "minor": d.minor,
            "fileMode": 0o666,
            "uid": 0,
            "gid": 0,
        }
        for d in devices
    ]
    resources = linux.setdefault("resources", {})
    resources["devices"] = [
        {"allow": False, "access": "rwm"},
        *(
            {"allow": True, "type": "c", "major": d.major, "minor": d.minor, "access": "rwm"}
            for d in devices
        ),
    ]
    if limits.memory_bytes is not None:
        resources["memory"] = {"limit": limits.memory_bytes, "swap": limits.memory_bytes}
    if limits.cpus is not None:
        period = 100_000
        resources["cpu"] = {"quota": int(limits.cpus * period), "period": period}
    if limits.pids is not None:
        resources["pids"] = {"limit": limits.pids}
    return config


def _bind(source: str, destination: str, read_only: bool) -> dict[str, Any]:
    options = ["rbind", "nosuid", "nodev", "ro" if read_only else "rw"]
    return {"type": "bind", "source": source, "destination": destination, "options": options}
