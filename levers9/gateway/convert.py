"""Worker and CLI requests checked and turned into the records the workflows get (pure).

Every check names the proto field it rejects (`advertised_address: ...`), and bounds what a
worker may send: the records travel as Temporal signals, whose payloads must stay well under
the server's blob limit, and a worker that sends absurd values has a bug worth surfacing.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import NamedTuple

from levers9.contract import (
    DNS_LABEL,
    MAX_TASK_INPUT_BYTES,
    ready_path_problem,
    task_input_problem,
    task_runtime_problem,
)
from levers9.core.image_reference import DIGEST, ImageReference, ImageReferenceError
from levers9.core.placement import MAX_CACHED_IMAGES, image_key
from levers9.core.storage import TaskMount, mounts_problem
from levers9.core.task_reports import TaskPhase, TaskReport, TaskState
from levers9.gateway.errors import InvalidRequest, shown
from levers9.models import (
    MAX_RETRIES,
    MAX_STOP_GRACE_S,
    ON_PREEMPT,
    TaskInput,
    WorkerHeartbeat,
    WorkerRegistration,
    memory_floor_problem,
)
from levers9.proto import gateway_pb2, worker_pb2
from levers9.task_wire import task_input

MAX_GPUS = 64
MAX_DEVICE_INDEX = 255
MAX_RUNNING_TASKS = 4096
MAX_LABEL_CHARS = 256
MAX_CHECKPOINT_CHARS = 1024
"""Of a worker's checkpoint capability (`none (runsc: ...; criu check: ...)`), kept."""
MAX_RESULT_JSON_BYTES = 128 * 1024
MAX_REASON_BYTES = 16 * 1024
MAX_LOG_TAIL_BYTES = 64 * 1024
MAX_PHASES = 64
MAX_PHASE_ERROR_BYTES = 2 * 1024
MAX_COMMAND_BYTES = MAX_TASK_INPUT_BYTES
MAX_COMMAND_ARGS = 4096
MAX_MEMORY_BYTES = 64 * 1024**4
MAX_CPU_MILLIS = 4096 * 1000
# datetime cannot hold later instants; a worker's clock is never there.
_MAX_UNIX_MS = 253_402_300_799_999

# Pool names and worker ids end up in Job names and labels: DNS labels.
_NODE_NAME = re.compile(r"[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?")
_POD_UID = re.compile(r"[A-Za-z0-9-]{1,128}")
_TASK_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_TASK_ID_TEXT = "a task id (letters, digits, . _ -; at most 128)"
_PORT = re.compile(r"[0-9]{1,5}")
_STATE_NAMES: dict[worker_pb2.TaskState.ValueType, TaskState] = {
    worker_pb2.TASK_STATE_RUNNING: "running",
    worker_pb2.TASK_STATE_SUCCEEDED: "succeeded",
    worker_pb2.TASK_STATE_FAILED: "failed",
    worker_pb2.TASK_STATE_CANCELLED: "cancelled",
    worker_pb2.TASK_STATE_LOST: "lost",
}


def check_worker(pool_name: str, worker_id: str) -> None:
    """The ids every call carries; they name the worker record `worker:<pool>:<worker-id>`."""
    _match("pool_name", pool_name, DNS_LABEL, "a pool name (lowercase DNS label)")
    _match("worker_id", worker_id, DNS_LABEL, "a worker id (lowercase DNS label)")


def check_task_id(task_id: str) -> None:
    _match("task_id", task_id, _TASK_ID, _TASK_ID_TEXT)


def check_pool_name(pool_name: str) -> None:
    _match("pool_name", pool_name, DNS_LABEL, "a pool name (lowercase DNS label)")


def submitted_task(request: gateway_pb2.SubmitTaskRequest) -> TaskInput:
    """A task as a client submits it; the record starts from exactly this."""
    _match("pool_name", request.pool_name, DNS_LABEL, "a pool name (lowercase DNS label)")
    if not 0 <= request.gpus <= MAX_GPUS:
        raise InvalidRequest("gpus", f"{request.gpus} is not 0 to {MAX_GPUS} cards")
    if not request.HasField("task"):
        raise InvalidRequest("task", "missing: the task to run (its id, command, image, ...)")
    spec = request.task
    _match(
        "task.task_id", spec.task_id, _TASK_ID, "a task id (letters, digits, . _ -; at most 128)"
    )
    _check_command("task.command", spec.command)
    problem = task_input_problem((), spec.env)
    if problem is not None:
        raise InvalidRequest("task.env", problem)
    problem = task_input_problem(spec.command, spec.env)
    if problem is not None:
        raise InvalidRequest("task.command", problem)
    if spec.gpu_indices:
        raise InvalidRequest(
            "task.gpu_indices", "the placement picks the cards: ask for how many with gpus"
        )
    if not 0 <= spec.memory_bytes <= MAX_MEMORY_BYTES:
        raise InvalidRequest("task.memory_bytes", f"{spec.memory_bytes} is not 0 to 64 TiB")
    below = memory_floor_problem(spec.memory_bytes)
    if below is not None:
        raise InvalidRequest("task.memory_bytes", below)
    if not 0 <= spec.cpu_millis <= MAX_CPU_MILLIS:
        raise InvalidRequest("task.cpu_millis", f"{spec.cpu_millis} is not 0 to 4096 cores")
    if spec.image:
        _check_image("task.image", spec.image)
    check_ports("task.ports", spec.ports)
    problem = ready_path_problem(spec.ready_path)
    if problem is None and spec.ready_path and not spec.ports:
        problem = "needs a port to probe (ports is empty)"
    if problem is not None:
        raise InvalidRequest("task.ready_path", problem)
    problem = task_runtime_problem(spec.runtime)
    if problem is not None:
        raise InvalidRequest("task.runtime", problem)
    if not 0 <= spec.stop_grace_seconds <= MAX_STOP_GRACE_S:
        raise InvalidRequest(
            "task.stop_grace_seconds",
            f"{spec.stop_grace_seconds} is not 0 to {MAX_STOP_GRACE_S} seconds",
        )
    if not 0 <= spec.retries <= MAX_RETRIES:
        raise InvalidRequest("task.retries", f"{spec.retries} is not 0 to {MAX_RETRIES}")
    _check_on_preempt(spec)
    mounts = [
        TaskMount(kind=m.kind, name=m.name, path=m.path, read_only=m.read_only) for m in spec.mounts
    ]
    problem = mounts_problem(mounts)
    if problem is not None:
        raise InvalidRequest("task.mounts", problem)
    return task_input(spec, pool_name=request.pool_name, gpus=request.gpus)


def _check_on_preempt(spec: worker_pb2.TaskSpec) -> None:
    """`--on-preempt`: one of ON_PREEMPT; `checkpoint` needs a checkpoint volume (the image is
    restored on another machine: the preempted one is going) and a runtime that checkpoints."""
    field = "task.on_preempt"
    if spec.on_preempt and spec.on_preempt not in ON_PREEMPT:
        raise InvalidRequest(
            field, f"{spec.on_preempt!r} is not one of {', '.join(ON_PREEMPT)} (or unset)"
        )
    if spec.on_preempt != "checkpoint":
        return
    if not spec.checkpoint_volume:
        raise InvalidRequest(
            field,
            "checkpoint needs --checkpoints VOLUME: the image is restored on another machine"
            " (the preempted one is going), so it must be kept in a volume of the workspace",
        )
    if spec.runtime == "runc":
        raise InvalidRequest(
            field,
            "checkpoint needs --runtime runsc: runc's checkpoint needs CRIU, which the agent"
            " does not drive",
        )


def _check_command(field: str, command: Sequence[str]) -> None:
    if not command:
        raise InvalidRequest(field, "missing: give the command after --")
    if len(command) > MAX_COMMAND_ARGS:
        raise InvalidRequest(field, f"{len(command)} arguments, at most {MAX_COMMAND_ARGS}")
    if any("\0" in arg for arg in command):
        raise InvalidRequest(field, "an argument holds a NUL byte")


MAX_PORTS = 16


def check_ports(field: str, ports: Sequence[int]) -> tuple[int, ...]:
    """Container ports to publish: TCP ports, none twice, at most MAX_PORTS."""
    bad = [p for p in ports if not 0 < p < 65536]
    if bad:
        raise InvalidRequest(field, f"{bad[0]} is not a TCP port (1-65535)")
    if len(set(ports)) != len(ports):
        raise InvalidRequest(field, f"{list(ports)} names a port twice")
    if len(ports) > MAX_PORTS:
        raise InvalidRequest(field, f"{len(ports)} ports, at most {MAX_PORTS}")
    return tuple(ports)


class TunnelEndpoint(NamedTuple):
    """This replica's end of a worker's tunnel session, as the worker's record keeps it."""

    address: str
    """The loopback listener in front of the session (reachable on this replica only)."""
    task_queue: str
    """This replica's task queue: calls to the worker run here."""
    replica_address: str | None
    """Where the other replicas reach this replica's gateway (to relay logs and exec)."""


def registration(
    request: gateway_pb2.RegisterRequest, tunnel: TunnelEndpoint | None = None
) -> WorkerRegistration:
    """The registration to record; a tunnelled worker's address and task queue are `tunnel`'s
    (this gateway's end of its session), whatever it advertised."""
    check_worker(request.pool_name, request.worker_id)
    _match("node_name", request.node_name, _NODE_NAME, "a Kubernetes node name")
    _match("pod_uid", request.pod_uid, _POD_UID, "a pod uid")
    if tunnel is None:
        check_address("advertised_address", request.advertised_address)
    if not 0 <= request.gpus <= MAX_GPUS:
        raise InvalidRequest("gpus", f"{request.gpus} is not between 0 and {MAX_GPUS}")
    _check_devices(request.visible_devices)
    _check_size("gpu_product", request.gpu_product, MAX_LABEL_CHARS)
    _check_size("agent_version", request.agent_version, MAX_LABEL_CHARS)
    return WorkerRegistration(
        worker_id=request.worker_id,
        pod_uid=request.pod_uid,
        address=tunnel.address if tunnel else request.advertised_address,
        task_queue=tunnel.task_queue if tunnel else None,
        replica_address=tunnel.replica_address if tunnel else None,
        gpus=request.gpus,
        visible_devices=tuple(request.visible_devices),
        gpu_product=request.gpu_product,
        agent_version=request.agent_version,
        tls=request.tls and tunnel is None,
        # Words, not a name: cut, never refused (a worker is not turned away for its reason).
        checkpoint=request.checkpoint[:MAX_CHECKPOINT_CHARS],
    )


def heartbeat(request: gateway_pb2.HeartbeatRequest) -> WorkerHeartbeat:
    check_worker(request.pool_name, request.worker_id)
    if not 0 <= request.running_tasks <= MAX_RUNNING_TASKS:
        raise InvalidRequest(
            "running_tasks", f"{request.running_tasks} is not between 0 and {MAX_RUNNING_TASKS}"
        )
    return WorkerHeartbeat(
        worker_id=request.worker_id,
        running_tasks=request.running_tasks,
        idle_since=_instant("idle_since_unix_ms", request.idle_since_unix_ms),
        images=_cached_images(request) if request.cache_reported else None,
    )


def _cached_images(request: gateway_pb2.HeartbeatRequest) -> tuple[str, ...]:
    """The `placement.image_key`s of the references the node's image cache holds."""
    if len(request.cached_images) > MAX_CACHED_IMAGES:
        raise InvalidRequest(
            "cached_images",
            f"{len(request.cached_images)} images; at most {MAX_CACHED_IMAGES}, the most recent",
        )
    keys: list[str] = []
    for index, reference in enumerate(request.cached_images):
        key = image_key(reference)
        if not key:
            raise InvalidRequest(f"cached_images[{index}]", "not an image reference")
        if key not in keys:
            keys.append(key)
    return tuple(keys)


def task_report(request: gateway_pb2.ReportTaskRequest) -> TaskReport:
    check_worker(request.pool_name, request.worker_id)
    if not request.HasField("status"):
        raise InvalidRequest("status", "missing")
    status = request.status
    _match("status.task_id", status.task_id, _TASK_ID, "a task id")
    state = _STATE_NAMES.get(status.state)
    if state is None:
        raise InvalidRequest("status.state", f"{status.state} is not a final or running state")
    _check_size("status.result_json", status.result_json, MAX_RESULT_JSON_BYTES)
    _check_size("status.reason", status.reason, MAX_REASON_BYTES)
    _check_size("status.log_tail", status.log_tail, MAX_LOG_TAIL_BYTES)
    _check_size("status.host", status.host, MAX_LABEL_CHARS)
    if status.image_digest and not DIGEST.fullmatch(status.image_digest):
        raise InvalidRequest("status.image_digest", f"{shown(status.image_digest)} is not a digest")
    if status.image:
        _check_image("status.image", status.image)
    if len(status.phases) > MAX_PHASES:
        raise InvalidRequest("status.phases", f"{len(status.phases)} phases, at most {MAX_PHASES}")
    return TaskReport(
        pool_name=request.pool_name,
        worker_id=request.worker_id,
        task_id=status.task_id,
        state=state,
        exit_code=None if _never_started(status) else status.exit_code,
        result_json=status.result_json,
        reason=status.reason,
        phases=tuple(_phase(f"status.phases[{i}]", p) for i, p in enumerate(status.phases)),
        log_tail=status.log_tail,
        host=status.host,
        image_digest=status.image_digest,
        image=status.image,
        ready=status.ready,
        attempt=status.attempt,
    )


def _check_image(field: str, value: str) -> None:
    try:
        ImageReference.parse(value)
    except ImageReferenceError as exc:
        raise InvalidRequest(field, str(exc)) from None


def check_address(field: str, value: str) -> None:
    """`ip:port` or `[ipv6]:port`. A host name is refused: the controlplane dials what the worker
    advertises, and a node name does not resolve from outside the cluster."""
    host, colon, port = value.rpartition(":")
    if not colon or not host or not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
        raise InvalidRequest(field, f"{shown(value)} is not host:port with a port in 1-65535")
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        ip = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        raise InvalidRequest(
            field,
            f"{shown(value)}: the host is not an IP address; advertise the node's external IP,"
            " never its name (dialing a name fails with `dial tcp: lookup <node>`)",
        ) from None
    if (ip.version == 6) != bracketed:
        raise InvalidRequest(field, f"{shown(value)}: an IPv6 host goes in brackets, IPv4 not")
    if ip.is_unspecified:
        raise InvalidRequest(field, f"{shown(value)}: the unspecified address cannot be dialed")


_START_PHASES = frozenset({"image.pull", "container.start"})


def _never_started(status: worker_pb2.TaskStatus) -> bool:
    """Its image or its container failed to start: there is no exit code to report."""
    return any(p.name in _START_PHASES and p.error for p in status.phases)


def _phase(field: str, phase: worker_pb2.Phase) -> TaskPhase:
    if not 0 < len(phase.name) <= MAX_LABEL_CHARS:
        raise InvalidRequest(f"{field}.name", f"must be 1 to {MAX_LABEL_CHARS} characters")
    _check_size(f"{field}.error", phase.error, MAX_PHASE_ERROR_BYTES)
    _check_size(f"{field}.detail", phase.detail, MAX_PHASE_ERROR_BYTES)
    return TaskPhase(
        name=phase.name,
        at=_instant(f"{field}.at_unix_ms", phase.at_unix_ms),
        error=phase.error,
        detail=phase.detail,
    )


def _instant(field: str, unix_ms: int) -> datetime | None:
    """0 means "not set" (proto3's default); negative or beyond year 9999 is a bug."""
    if unix_ms == 0:
        return None
    if not 0 < unix_ms <= _MAX_UNIX_MS:
        raise InvalidRequest(field, f"{unix_ms} is not milliseconds since the Unix epoch")
    return datetime.fromtimestamp(unix_ms / 1000, tz=UTC)


def _check_devices(devices: Sequence[int]) -> None:
    if len(devices) > MAX_GPUS:
        raise InvalidRequest("visible_devices", f"{len(devices)} devices, at most {MAX_GPUS}")
    if len(set(devices)) != len(devices):
        raise InvalidRequest("visible_devices", f"{list(devices)} repeats a device")
    if any(not 0 <= d <= MAX_DEVICE_INDEX for d in devices):
        raise InvalidRequest(
            "visible_devices", f"{list(devices)}: indices are between 0 and {MAX_DEVICE_INDEX}"
        )


def _check_size(field: str, value: str, limit: int) -> None:
    size = len(value.encode())
    if size > limit:
        raise InvalidRequest(field, f"{size} bytes, at most {limit}")


def _match(field: str, value: str, pattern: re.Pattern[str], what: str) -> None:
    if not value:
        raise InvalidRequest(field, "missing")
    if not pattern.fullmatch(value):
        raise InvalidRequest(field, f"{shown(value)} is not {what}")
