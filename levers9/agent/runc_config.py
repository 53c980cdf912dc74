"""A task's OCI runtime config (`config.json`): the image's, as `umoci raw runtime-config` made it
(which honours the image's Entrypoint, Cmd, Env, WorkingDir and User as Docker does, resolving a
user name in the image's /etc/passwd), narrowed for the task (pure: no I/O but the agent's own
NOFILE limit and whether resolv.conf exists):

- its own PID, mount, IPC and UTS namespaces, and the network namespace of its own the agent
  made for it (levers9.agent.task_network: `network`, joined by path; its resolv.conf names
  the namespace's DNS); without one, the agent's: the host's, or the pod's on the pod network;
- a user namespace of its own (`UserNamespace`: its 0 is an unprivileged id of the node, a
  range of its own, levers9.agent.id_ranges), where its root is owned by the range (the image
  cache's shifted roots) or, when the image gives no shifted root, read-only to it with a tmpfs
  `/tmp`; joined by path, it comes with the task's network namespace made in it (a network
  namespace the node's root made is not the task's to enter or mount a sysfs over: without
  one of its own, `/sys` is the node's, bound read-only);
- runc's default capabilities, `noNewPrivileges`, the default seccomp profile of the container
  ecosystem for those capabilities (levers9.agent.seccomp, or the pool's
  `taskSeccompProfile`), runc's masked and read-only paths of /proc and /sys, and memory, CPU and
  pids limits (`Limits`: a memory limit always, `DEFAULT_MEMORY_BYTES` when neither the task
  nor the pool gives one);
- device nodes for its cards only, from the worker's CDI spec (levers9.agent.cdi):
  `/dev/nvidiaN` for each of its indices, plus `/dev/nvidiactl`, `/dev/nvidia-uvm`,
  `/dev/nvidia-uvm-tools` and `/dev/nvidia-modeset` when the node has them, with cgroup device
  rules that allow those and nothing else of the host's;
- the driver's directories (`/usr/local/nvidia`, the spec's mount) read-only,
  `NVIDIA_VISIBLE_DEVICES` as the process runtime sets it, and the task's own directory at
  `/levers9` for its result file;
- an environment of the image's, the task's and those few variables only: nothing of the
  agent's (its token never sits in any environment a task can read), and none of the agent's
  files (its Secret, its /proc) inside the container.
- annotations naming its task, its workspace and its pool (`levers9.task`,
  `levers9.workspace`, `levers9.pool`, as containerd's CRI names a container's pod and
  namespace; `runc state` prints them): the image's own labels may not claim them.

The command replaces the image's Cmd and keeps its Entrypoint, as `docker run IMAGE CMD`; in the
worker's own image (`ContainerSpec.entrypoint` False) it runs as given, neither the image's
Entrypoint (the agent) nor its Cmd.
"""

from __future__ import annotations

import json
import resource
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from levers9.agent.cdi import DRIVER_ROOT, DeviceNode
from levers9.agent.cgroups import cgroup_path
from levers9.agent.images import ImageConfig
from levers9.agent.runtime import ContainerSpec, StartError, visible_devices
from levers9.agent.seccomp import oci_seccomp
from levers9.core.workspaces import name_problem

TASK_MOUNT = "/levers9"
"""The folder of the task's result file inside its container (`LEVERS9_RESULT_PATH`)."""
NOFILE = 1_048_576
SHM_DEFAULT_BYTES = 8 * 1024**3
"""/dev/shm's cap without a memory limit (tmpfs: nothing is reserved)."""
DEFAULT_MEMORY_BYTES = 16 * 1024**3
"""A task's memory limit when neither it (`--memory`) nor its pool (`taskDefaults.memory`) sets
one: a task that leaks is killed (`OOMKilled`) before it takes the node's memory."""
DEFAULT_DISK_BYTES = 20 * 1024**3
"""The cap on a task's writable layer (what it writes outside its mounts): past it a write
fails with ENOSPC and the task's failure says `disk full`."""
CAPABILITIES = ("CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE")
"""runc's default capabilities (`runc spec`): every set of the task's process."""
MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
)
"""runc's defaults (`runc spec`): /dev/null or an empty read-only tmpfs over each."""
READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
"""runc's defaults (`runc spec`): remounted read-only."""
ANNOTATION_PREFIX = "levers9."
TASK_ANNOTATION = "levers9.task"
WORKSPACE_ANNOTATION = "levers9.workspace"
POOL_ANNOTATION = "levers9.pool"


@dataclass(frozen=True)
class Limits:
    """Per container; None: unlimited."""

    memory_bytes: int | None = DEFAULT_MEMORY_BYTES
    cpus: float | None = None
    pids: int | None = 4096
    disk_bytes: int = DEFAULT_DISK_BYTES
    """The writable layer's size (levers9.agent.runc_runtime makes it a filesystem of it)."""


@dataclass(frozen=True)
class UserNamespace:
    """The task's user namespace: its ids 0..size-1 are the node's host_id.. (id_ranges)."""

    host_id: int
    size: int
    shifted_root: bool = True
    """Its root is owned by the range (else by the node's root: read-only to the task, which
    gets a tmpfs /tmp)."""
    path: Path | None = None
    """The namespace, made beforehand with the task's network namespace in it, to join
    (levers9.agent.id_ranges.make_namespaces); None: runc makes one."""


DEFAULT_LIMITS = Limits()


def container_config(
    base: Mapping[str, Any],
    spec: ContainerSpec,
    image: ImageConfig,
    devices: Sequence[DeviceNode],
    *,
    mounts: Sequence[tuple[str, str]] = (),
    storage: Sequence[tuple[str, str, bool]] = (),
    limits: Limits = DEFAULT_LIMITS,
    resolv_conf: Path | None = Path("/etc/resolv.conf"),
    network: Path | None = None,
    user_namespace: UserNamespace | None = None,
    seccomp: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The task's OCI runtime config, from the image's (`base`: umoci's) and the task (pure).
    `devices` and `mounts` (host path, container path; read-only) are its CDI edits; `network`
    the network namespace it joins (None: the agent's); `user_namespace` its ids (None: the
    node's own); `seccomp` its profile in the Docker/containers form (None: no filter)."""
    config: dict[str, Any] = json.loads(json.dumps(base))
    process = config["process"]
    if not spec.entrypoint:
        # The worker's own image: its Entrypoint is the agent, never a task's (every task
        # gives a command: the agent refuses one without).
        process["args"] = list(spec.command)
    elif spec.command:
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
    process["capabilities"] = {
        kind: list(CAPABILITIES) for kind in ("bounding", "effective", "permitted", "ambient")
    }
    # As many as the agent may open (Docker gives 1048576), not umoci's 1024: data loaders and
    # NCCL open many files; above the agent's own hard limit runc's init is refused.
    nofile = min(NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    process["rlimits"] = [{"type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile}]
    config["root"] = {"path": "rootfs", "readonly": False}
    config["hostname"] = f"task-{spec.task_id}"[:63]
    config["annotations"] = container_annotations(config.get("annotations") or {}, spec)

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
    for host, container, read_only in storage:  # its volumes and disks (task_storage)
        binds.append(_bind(host, container, read_only=read_only))
    if resolv_conf is not None and resolv_conf.exists():
        binds.append(_bind(str(resolv_conf), "/etc/resolv.conf", read_only=True))
    config["mounts"] = binds
    for mount in binds:
        if mount.get("destination") == "/sys":
            options = [o for o in mount.get("options") or [] if o not in ("rw", "ro")]
            mount["options"] = [*options, "ro"]

    linux = config.setdefault("linux", {})
    linux["cgroupsPath"] = cgroup_path(spec.task_id)
    namespaces = [n for n in linux.get("namespaces") or [] if n.get("type") != "network"]
    if network is not None:
        namespaces.append({"type": "network", "path": str(network)})
    for kind in ("pid", "ipc", "uts", "mount"):
        if not any(n.get("type") == kind for n in namespaces):
            namespaces.append({"type": kind})
    linux["namespaces"] = namespaces
    linux["maskedPaths"] = sorted(set(linux.get("maskedPaths") or ()) | set(MASKED_PATHS))
    linux["readonlyPaths"] = sorted(set(linux.get("readonlyPaths") or ()) | set(READONLY_PATHS))
    if user_namespace is not None:
        _in_user_namespace(config, user_namespace, devices)
    else:
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
    if seccomp is not None:
        linux["seccomp"] = oci_seccomp(seccomp, process["capabilities"]["bounding"])
    return config


def container_annotations(image: Mapping[str, str], spec: ContainerSpec) -> dict[str, str]:
    """The container's annotations: the image's (umoci makes its labels annotations) but any
    under `levers9.`, which name the task's own task, workspace and pool only. StartError when
    the workspace is not a workspace's name (the agent refuses such a task before: this holds
    for any caller)."""
    problem = name_problem(spec.workspace) if spec.workspace else None
    if problem is not None:
        raise StartError(f"workspace {problem}")
    ours = {
        TASK_ANNOTATION: spec.task_id,
        WORKSPACE_ANNOTATION: spec.workspace,
        POOL_ANNOTATION: spec.pool,
    }
    kept = {k: v for k, v in image.items() if not k.startswith(ANNOTATION_PREFIX)}
    return {**kept, **{k: v for k, v in ours.items() if v}}


def _in_user_namespace(
    config: dict[str, Any], ids: UserNamespace, devices: Sequence[DeviceNode]
) -> None:
    """The user namespace, its id maps, its cards' device nodes bound from the node's (no
    mknod in a user namespace) and, on a root it does not own, a tmpfs /tmp."""
    linux = config["linux"]
    joined = {"path": str(ids.path)} if ids.path is not None else {}
    linux["namespaces"].append({"type": "user", **joined})
    mapping = [{"containerID": 0, "hostID": ids.host_id, "size": ids.size}]
    linux["uidMappings"], linux["gidMappings"] = mapping, [dict(m) for m in mapping]
    linux["devices"] = []
    network = [n for n in linux["namespaces"] if n["type"] == "network"]
    if not network or (network[0].get("path") and ids.path is None):
        # sysfs mounts only over a network namespace the user namespace owns (one runc makes,
        # or one made in the namespace joined): else the node's /sys, bound read-only
        # (recursively: a user namespace may not bind a mount without the mounts below it;
        # runc's cgroup mount covers the node's cgroups, and what else is below is the node
        # root's, not the task's to write).
        for mount in config["mounts"]:
            if mount.get("destination") == "/sys":
                mount.update(type="bind", source="/sys", options=["rbind", *mount["options"]])
    for d in devices:
        config["mounts"].append(
            {
                "type": "bind",
                "source": d.host_path,
                "destination": d.path,
                # As runc binds them itself: no noexec (a driver may map its device so).
                "options": ["bind", "nosuid"],
            }
        )
    if not ids.shifted_root:
        config["root"]["readonly"] = True
        config["mounts"].append(
            {
                "type": "tmpfs",
                "source": "tmpfs",
                "destination": "/tmp",
                "options": ["nosuid", "nodev", "mode=1777"],
            }
        )


def _bind(source: str, destination: str, read_only: bool) -> dict[str, Any]:
    options = ["rbind", "nosuid", "nodev", "ro" if read_only else "rw"]
    return {"type": "bind", "source": source, "destination": destination, "options": options}
