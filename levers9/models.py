"""Workflow and activity inputs and results, and the search attributes the Temporal UI filters on.

One `<Thing>Input` / `<Thing>Result` per workflow and activity, so fields can be added later
without breaking running workflows. Inputs carry pool *names*, never credentials.
"""

from __future__ import annotations

import base64
import hashlib
import uuid
import zlib
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from levers9.core.capacity import NodeCapacity
from levers9.core.endpoints import EndpointSpec, EndpointState
from levers9.core.observation import Fingerprints
from levers9.core.placement import Placement, PoolState, QueueSpot, Share
from levers9.core.storage import TaskMount
from levers9.core.task_reports import TaskPhase
from levers9.core.workspaces import DEFAULT_WORKSPACE, WorkspaceState, name_problem
from levers9.providers.joined import ClusterState

RECONCILE_POOL_WORKFLOW = "ReconcilePoolWorkflow"
MACHINE_WORKFLOW = "MachineWorkflow"
WORKER_WORKFLOW = "WorkerWorkflow"
POOL_WORKFLOW = "PoolWorkflow"
TASK_WORKFLOW = "TaskWorkflow"
ENDPOINT_WORKFLOW = "EndpointWorkflow"
CLUSTER_WORKFLOW = "ClusterWorkflow"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True)


class ReconcilePoolInput(_Record):
    pool_name: str


class RunRef(_Record):
    """One workflow run, by id."""

    workflow_id: str
    run_id: str


class ObservePoolInput(_Record):
    pool_name: str
    previous: RunRef | None = None
    """The last successful pass, whose observe result holds the fingerprints to diff against."""
    full_resync: bool = False
    """Tell every machine, changed or not (level-triggered repair of a missed signal)."""


class WorkerTimings(_Record):
    """How long a worker may idle, and how long its record lives without a heartbeat."""

    idle_seconds: float = 300.0
    record_ttl_seconds: float = 600.0
    pod_check_seconds: float = 10.0
    liveness_seconds: float = 30.0
    """Three of the agent's 10 s heartbeats: a worker silent this long leaves placement and its
    Job is looked at (failed or deleted: the record ends now, not at the record TTL)."""


class ObservePoolResult(_Record):
    """What one observation found and told; `fingerprints` is what the next pass diffs with."""

    fingerprints: Fingerprints
    nodes: int
    machines: int
    told: int
    gone: int
    api_calls: int
    timings: WorkerTimings | None = None
    """The settings its machines were told; a pass with other settings tells them all."""
    settings_told: int = 0


class ReconcilePoolResult(_Record):
    """One reconcile pass; the next pass reads it back as its last completion result."""

    pool_name: str
    pass_number: int
    observed_at: datetime
    run: RunRef
    nodes: int
    machines: int
    told: int


class MachineInput(_Record):
    pool_name: str
    node_name: str
    timings: WorkerTimings = WorkerTimings()
    machine_id: str | None = None
    worker_id: str | None = None
    """A worker this machine started that may not be in an observation yet."""
    capacity: NodeCapacity | None = None
    max_history_events: int = Field(default=2_000, ge=20)
    """Continue as new past this many events (a machine lives for months)."""


class MachineRecord(_Record):
    """The machine record: what `levers9 machine list` shows (the workflow's memo)."""

    pool_name: str
    node_name: str
    machine_id: str
    status: str
    machine: bool
    gpu_type: str | None
    total_gpus: int
    free_gpus: int
    free_cpu_millis: int
    free_memory_bytes: int
    workers: tuple[str, ...]
    observed_at: datetime
    total_memory_bytes: int = 0
    """The node's allocatable memory (0: a record made before it was kept)."""
    worker_gpus: int = 0
    """Cards levers9's workers hold there (0 too in a record made before it was kept)."""
    neighbour_gpus: int = 0
    """Cards the node's other pods (neighbours) hold."""


class WorkerRegistration(_Record):
    """Signal `register` to WorkerWorkflow: the agent is up (from the gateway's Register)."""

    worker_id: str
    pod_uid: str
    address: str
    """host:port of the agent's WorkerService: the node's external IP, never its name."""
    gpus: int
    visible_devices: tuple[int, ...]
    gpu_product: str = ""
    agent_version: str = ""
    task_queue: str | None = None
    """Tunnelled: the task queue of the controlplane replica holding the worker's tunnel
    session; calls to the worker run there (`address` is that replica's end of the tunnel)."""
    replica_address: str | None = None
    """Tunnelled: where the other replicas reach that replica's gateway, to relay a stream
    (logs, exec) to the worker through it (`replicaAddress`)."""
    tls: bool = False
    """WorkerService serves TLS with the certificate its Secret carries (levers9.rpc.worker_tls):
    calls to it verify the worker's name against the worker CA."""
    checkpoint: str = ""
    """What it can checkpoint tasks with, as its agent reports it (levers9.agent.checkpoints):
    `runsc`, `runsc+cuda`, `criu`, or `none (...)` saying why; "": an agent that does not say."""


class WorkerHeartbeat(_Record):
    """Signal `heartbeat` to WorkerWorkflow (from the gateway's Heartbeat)."""

    worker_id: str
    running_tasks: int
    idle_since: datetime | None = None
    images: tuple[str, ...] | None = None
    """`placement.image_key`s of what its node's image cache holds, when the agent reports it
    (the pool's `cache.enabled`) and it changed since its last beat; None: unchanged."""


class WorkerInput(_Record):
    pool_name: str
    node_name: str
    worker_id: str
    machine_id: str
    gpus: int
    gpu_type: str | None = None
    external_ip: str | None = None
    node_gpus: int = 0
    timings: WorkerTimings = WorkerTimings()
    resume: WorkerRegistration | None = None
    """Set when the record continues as new while available."""
    resume_beat: WorkerHeartbeat | None = None
    """Its latest heartbeat then (running tasks, the agent's idle-since)."""
    resume_images: tuple[str, ...] = ()
    """What its node's image cache held, as its heartbeats last said (`WorkerHeartbeat.images`)."""
    max_history_events: int = Field(default=5_000, ge=20)
    """Continue as new past this many events (an available worker beats every 10 s)."""


class WorkerRecord(_Record):
    """The worker record: `levers9 worker list` (the workflow's memo) and its query."""

    pool_name: str
    node_name: str
    worker_id: str
    job_name: str
    gpus: int
    state: str
    created_at: datetime
    reason: str | None = None
    condition: str | None = None
    """What holds a pending worker back, e.g. ImagePullBackOff, with the fix."""
    address: str | None = None
    task_queue: str | None = None
    replica_address: str | None = None
    """Tunnelled: the gateway of the replica holding its session (WorkerRegistration)."""
    """Tunnelled: the queue of the controlplane replica holding its session."""
    tls: bool = False
    """Dialed with TLS (its Job carries a certificate); false for tunnelled workers and those of
    an older controlplane, until replaced."""
    visible_devices: tuple[int, ...] = ()
    last_heartbeat: datetime | None = None
    idle_since: datetime | None = None
    running_tasks: int = 0
    checkpoint: str = ""
    """What it can checkpoint tasks with (WorkerRegistration.checkpoint): `pool check` shows it."""


class PodState(_Record):
    """What the worker's Job and pod say (`describe_worker_pod`): while the worker is pending,
    and when an available one falls silent or its machine saw its Job finish."""

    exists: bool
    phase: str | None = None
    waiting_reason: str | None = None
    message: str | None = None
    job_failed: bool = False
    job_exists: bool = True
    node_gone: bool = False  # the Job failed because its node left the cluster
    exit_code: int | None = None
    """The agent container's exit code, once it has terminated."""


class WorkerJobInput(_Record):
    """Create or delete one worker's Job; the credentials come from the pool config."""

    pool_name: str
    worker_id: str
    node_name: str = ""
    gpus: int = 0
    external_ip: str | None = None


class ReconcileFailure(_Record):
    pool_name: str
    error: str


def reconcile_schedule_id(pool_name: str) -> str:
    return f"reconcile:{pool_name}"


def machine_workflow_id(pool_name: str, node_name: str) -> str:
    return f"machine:{pool_name}:{node_name}"


def worker_workflow_id(pool_name: str, worker_id: str) -> str:
    return f"worker:{pool_name}:{worker_id}"


class PlaceRequest(_Record):
    """Signal `request` to PoolWorkflow (the pool signals `placed` back to the task's record
    once one worker has `gpus` cards free); before, the argument of its Update `place`."""

    pool_name: str
    task_id: str
    gpus: int
    created_at: datetime | None = None
    """The task's creation: the queue keeps this order."""
    ports: tuple[int, ...] = ()
    """The ports it publishes: it goes to a worker where no placed task publishes them."""
    memory_bytes: int = 0
    """Its container's memory limit (0: none of its own): refused at once when no machine of
    the pool has that much allocatable."""
    workspace: str = DEFAULT_WORKSPACE
    borrow: bool = False
    share: Share | None = None
    """Its workspace's quota and weight as the request's activity read them (None: not read):
    the pool takes the newest."""
    disks: tuple[str, ...] = ()
    """The workspace's disks it mounts, by name (its record sets them; the request's activity
    reads where each is and pins the task there)."""
    node: str = ""
    """The one node it may run on (its disk's), as the request's activity found it."""
    pinned_by: str = ""
    """What pins it there (`disk scratch`): the reason it waits names it."""
    disk_ids: tuple[str, ...] = ()
    image: str = ""
    """Its image reference ("": none): a worker whose node's cache holds it goes first (the
    pool's `cache.enabled`)."""
    avoid_node: str = ""
    """A node it may not run on ("": none): TaskInput.avoid_node."""


class WorkerSlotInput(_Record):
    """Signal `worker_available` to PoolWorkflow (from WorkerWorkflow, when it is available)."""

    worker_id: str
    node_name: str
    address: str
    devices: tuple[int, ...]
    node_gpus: int = 0
    task_queue: str | None = None
    """Tunnelled workers: where calls to it run (WorkerRegistration.task_queue)."""
    tls: bool = False
    """Dial it with TLS (WorkerRegistration.tls)."""
    images: tuple[str, ...] = ()
    """`placement.image_key`s of what its node's image cache holds, as its heartbeats last said
    (only with the pool's `cache.enabled`)."""


class StopWorker(_Record):
    """Signal `stop` of WorkerWorkflow (no argument: the defaults)."""

    reason: str = "stopped by the controlplane"
    delete_job: bool = True


class DrainWorker(_Record):
    """Signal `worker_draining` of PoolWorkflow: the worker's node is being drained."""

    worker_id: str
    reason: str
    """What each task taken off it ends its attempt with (`preempted: ...`)."""
    spare: tuple[str, ...] = ()
    """Tasks not preempted now: boxes' tasks, which `box stop` checkpoints first (a second
    signal without them preempts whatever of them still runs)."""


class WorkerBoxes(_Record):
    """Activity `boxes_on_worker`: the running boxes whose task is on this worker."""

    pool_name: str
    worker_id: str


class BoxOnWorker(_Record):
    workspace: str
    name: str
    task_id: str


class StopBoxes(_Record):
    """Activity `stop_boxes`: `box stop` of each, with `reason`."""

    boxes: tuple[BoxOnWorker, ...]
    reason: str


def drain_reason(node_name: str) -> str:
    """Why the tasks of a worker whose node is cordoned (`kubectl drain`, a GKE upgrade) are
    taken off it: their attempts end `preempted` with it."""
    return f"preempted: its node {node_name} is cordoned (drain)"


def preemption_reason(node_name: str) -> str:
    """Why the tasks of a worker whose node's VM is announced to go (a spot preemption's
    notice) are taken off it."""
    return f"preempted: its node {node_name} is being preempted (its VM goes at the notice's end)"


def node_gone_reason(node_name: str) -> str:
    """A worker record's end reason when its node left the cluster: the same whether the
    machine (told by reconcile) or the worker (its Job failed by pod GC) sees it first."""
    return f"its node {node_name} is gone"


PACK_STATE_OVER = 256 * 1024
"""A pool's carried state longer than this as JSON goes across continue-as-new compressed
(`PoolInput.packed_state`). Temporal refuses a payload past 2 MB (the run could not continue,
and its workflow task would fail again and again), and a waiting task is about 180 bytes of it:
a queue of 16,000 is 2.8 MB as JSON and about 0.4 MB packed."""


POOL_MAX_WAITING = 50_000
"""The most tasks one pool keeps waiting: past it a submit is refused (RESOURCE_EXHAUSTED). The
queue is carried across continue-as-new in one payload, packed about 27 bytes a task (1.35 MB
at this bound), and Temporal refuses one past 2 MB (about 77,000 waiting tasks): this keeps
under it, with room for a burst admitted while the gateway's count is a second or two old."""


PACKED: Literal["packed"] = "packed"


class PoolInput(_Record):
    pool_name: str
    state: PoolState | Literal["packed"] | None = None
    """Carried across continue-as-new, as it is while small (PACK_STATE_OVER); PACKED when it
    is in `packed_state`. A Temporal worker of the code before packing cannot read that (its
    workflow task fails, and is retried until a replica of this code takes it) rather than
    ignore `packed_state` and start the pool empty, its queue and card ledger lost."""
    packed_state: str | None = None
    """Carried across continue-as-new when large: its JSON, zlib-compressed, in base64."""
    max_history_events: int = Field(default=5_000, ge=20)
    """Continue as new past this many events (once no placement waits)."""

    def carried(self) -> PoolState | None:
        """The state the run before carried over, if any."""
        if self.packed_state is not None:
            packed = base64.b64decode(self.packed_state, validate=True)
            return PoolState.model_validate_json(zlib.decompress(packed))
        return self.state if isinstance(self.state, PoolState) else None

    def carrying(self, state: PoolState) -> PoolInput:
        """This input for the next run, with `state`: packed when large."""
        text = state.model_dump_json()
        if len(text) <= PACK_STATE_OVER:
            return self.model_copy(update={"state": state, "packed_state": None})
        packed = base64.b64encode(zlib.compress(text.encode(), 6)).decode("ascii")
        return self.model_copy(update={"state": PACKED, "packed_state": packed})


MAX_STOP_GRACE_S = 3600
"""The longest grace a task may ask for between SIGTERM and SIGKILL."""
MAX_RETRIES = 100
OnPreempt = Literal["", "requeue", "checkpoint"]
ON_PREEMPT = ("requeue", "checkpoint")
"""What `--on-preempt` may name (TaskInput.on_preempt)."""

MIN_TASK_MEMORY_BYTES = 6 * 1024 * 1024
"""The smallest memory limit a task's container may have (6 MiB, Docker's floor): below it runc
cannot start the container's first process in its cgroup, and the task would fail late, at its
start on the worker, with runc's cgroup error. `--memory`, `taskDefaults.memory` and the
gateway's SubmitTask refuse less."""


def memory_floor_problem(memory_bytes: int) -> str | None:
    """Why a task's memory limit is refused (set, and below MIN_TASK_MEMORY_BYTES)."""
    if 0 < memory_bytes < MIN_TASK_MEMORY_BYTES:
        return (
            f"{memory_bytes} bytes is below the 6Mi a container needs to start (a bare number"
            " is bytes): write a unit, e.g. 512Mi or 8Gi"
        )
    return None


class TaskInput(_Record):
    """One task a user runs; its id names the record (`task:<id>`)."""

    task_id: str
    pool_name: str
    command: tuple[str, ...]
    gpus: int = 1
    image: str = ""
    env: dict[str, str] = {}
    memory_bytes: int = 0
    """Its container's memory limit (`--memory 8Gi`); 0: the worker's default."""
    cpu_millis: int = 0
    """Its container's CPU limit in millicores (`--cpus 4`); 0: the worker's default."""
    ports: tuple[int, ...] = ()
    """Container ports reachable through the controlplane (`--port 8080`)."""
    ready_path: str = ""
    """Readiness: "" the first port accepts connections; a path, a GET of it answers 2xx."""
    stop_grace_seconds: int = Field(default=0, ge=0, le=MAX_STOP_GRACE_S)
    """When it is stopped (cancel, its worker's shutdown): seconds between SIGTERM and SIGKILL
    to every process of its container (`--stop-grace`); 0: the worker's 10 s."""
    runtime: str = ""
    """The runtime it runs in (`--runtime runsc`), one its pool offers; "": the pool's."""
    workspace: str = DEFAULT_WORKSPACE
    """The workspace it belongs to: the submitting token's (the operator's: `default`)."""
    borrow: bool = False
    """It may run past its workspace's GPU quota on cards nobody within quota waits for
    (`--borrow`); the first work taken back when a task within quota waits."""
    mounts: tuple[TaskMount, ...] = ()
    """The workspace's volumes and disks it mounts (`--volume NAME:/data[:ro]`, `--disk`)."""
    restore_from: str = ""
    """A checkpoint of its workspace its processes are restored from rather than its command
    started (levers9.agent.checkpoints; runsc only); "": none."""
    checkpoint_volume: str = ""
    """The workspace's volume its checkpoints are kept in (`box create --checkpoints VOLUME`):
    an image is uploaded there and fetched by the machine that restores it, so its restore may
    run anywhere in the pool; "": they stay on the machine that took them."""
    restore_sha256: str = ""
    """The sha256 of `restore_from`'s image.tar as its checkpoint uploaded it: an image fetched
    from the checkpoint volume must match it (the workspace may write its bucket)."""
    node: str = ""
    """The one node it may run on ("": any): a box's restore goes to the node whose disk holds
    its checkpoint (images are not copied between machines)."""
    avoid_node: str = ""
    """A node it may not run on ("": none): `box start --elsewhere` restores a box's
    checkpoint (kept in a volume) on another machine than the one that took it."""
    retries: int = Field(default=0, ge=0, le=MAX_RETRIES)
    """How many times it is queued again after an attempt that failed, was lost with its worker,
    or was taken back for a workspace within its quota (`--retries`, as a Job's backoffLimit);
    never after a cancel or a success."""
    on_preempt: OnPreempt = ""
    """What a preemption does (its node drained, its cards taken back; `--on-preempt`): "" as
    `retries` says; "requeue": queued again whatever its retries; "checkpoint": checkpointed to
    `checkpoint_volume` first and restored where it is placed next (a refused or failed
    checkpoint: as "requeue")."""
    endpoint: str = ""
    """The endpoint this task is a replica of: its record tells `endpoint:<name>` when the
    task is ready and when it ends."""
    resume: TaskResume | None = None
    """Set when the record continues as new while its task runs."""
    max_history_events: int = Field(default=10_000, ge=50)
    """Continue as new past this many events while the task runs (a worker that reports
    progress without end, say); a task's own history stays far below it."""
    ask_again_seconds: float = Field(default=600.0, gt=0)
    """While queued, the record asks the pool again after this, doubling up to an hour."""


TERMINAL = frozenset({"succeeded", "failed", "cancelled", "lost"})
"""Task states a task never leaves (`TaskRecord.state`)."""

PREEMPTED = "preempted"
"""An attempt's end when the pool took its cards back for a workspace within its quota (its
record ends `cancelled` with the reason unless it has a retry left)."""


class TaskAttempt(_Record):
    """One earlier attempt of a task that was queued again (`--retries`): where it ran and how
    it ended."""

    state: str
    """failed, lost or preempted"""
    reason: str = ""
    exit_code: int | None = None
    worker_id: str | None = None
    node_name: str | None = None
    gpu_indices: tuple[int, ...] = ()
    placed_at: datetime | None = None
    finished_at: datetime | None = None


class TaskCheckpoint(_Record):
    """A checkpoint taken of a task (`levers9 task checkpoint`), kept in its record for
    `levers9 task restore NAME`: where the image is and what its restore must fetch."""

    name: str
    """The image's name in its workspace (`<task>-ck<n>`)."""
    node: str = ""
    """The node whose disk holds it: a restore runs there unless it is `stored`."""
    size_bytes: int = 0
    seconds: float = 0.0
    volume: str = ""
    """The checkpoint volume it was uploaded to ("": none was asked)."""
    stored: str = ""
    """Where it is kept in that volume ("": on its node only; `store_error` says why)."""
    store_error: str = ""
    sha256: str = ""
    """Its image.tar's sha256 as uploaded: a restore refuses any other (restore_sha256)."""
    store_seconds: float = 0.0
    at: datetime | None = None


class CheckpointRefusal(_Record):
    """A `levers9 task checkpoint` its worker refused (the task runs on), kept in the record for
    the caller, who reads it by the ask's number (the Update answers at once)."""

    ask: int
    name: str
    """The name it was asked under."""
    reason: str
    not_running: bool = False
    at: datetime | None = None


class TaskRecord(_Record):
    """The task record: `levers9 task get` reads it (query, and the memo when it ended)."""

    task_id: str
    pool_name: str
    command: tuple[str, ...]
    gpus: int
    image: str
    state: str
    """queued, placed, running, succeeded, failed, cancelled, lost"""
    created_at: datetime
    workspace: str = DEFAULT_WORKSPACE
    """The workspace it belongs to; another workspace's token finds no such task."""
    borrowed: bool = False
    """Placed past its workspace's quota (`--borrow`): the first taken back."""
    worker_id: str | None = None
    node_name: str | None = None
    address: str | None = None
    """The worker's advertised address (node external IP:port), once placed."""
    tls: bool = False
    """The worker serves TLS (the gateway's log relay dials it so)."""
    gpu_indices: tuple[int, ...] = ()
    phases: tuple[TaskPhase, ...] = ()
    exit_code: int | None = None
    result_json: str = ""
    reason: str = ""
    log_tail: str = ""
    host: str = ""
    image_digest: str = ""
    """The manifest digest the task's image resolved to, when it ran in one (runc)."""
    ports: tuple[int, ...] = ()
    ready: bool = False
    """Its first port answered (`container.ready`)."""
    endpoint: str = ""
    finished_at: datetime | None = None
    queue: QueueSpot | None = None
    """Where it waits, while queued: read from its pool when the record is read, not kept."""
    retries: int = 0
    """How many times it may be queued again (`--retries`)."""
    on_preempt: str = ""
    """What a preemption of it does (`--on-preempt`): "", "requeue", "checkpoint"."""
    attempts: tuple[TaskAttempt, ...] = ()
    """Its earlier attempts, oldest first (this one is attempt len(attempts) + 1)."""
    checkpoints: tuple[TaskCheckpoint, ...] = ()
    """The checkpoints taken of it (`levers9 task checkpoint`; one ends it), oldest first."""
    checkpoint_asks: int = 0
    """How many `task checkpoint` asks its record accepted (each answered by its number)."""
    checkpoint_refusals: tuple[CheckpointRefusal, ...] = ()
    """The last asks its worker refused, oldest first."""

    @classmethod
    def queued(cls, task: TaskInput, at: datetime) -> TaskRecord:
        """A new task's record: queued since `at` (its memo from the start on, so
        that Temporal holds it before any Temporal worker ran it)."""
        return cls(
            task_id=task.task_id,
            pool_name=task.pool_name,
            command=task.command,
            gpus=task.gpus,
            image=task.image,
            state="queued",
            created_at=at,
            ports=task.ports,
            endpoint=task.endpoint,
            workspace=task.workspace,
            retries=task.retries,
            on_preempt=task.on_preempt,
        )


class WorkerTaskInput(_Record):
    """RunTask / GetTask on one worker (the activity computes the worker's token)."""

    pool_name: str
    worker_id: str
    address: str
    task: TaskInput
    gpu_indices: tuple[int, ...] = ()
    task_queue: str | None = None
    """Tunnelled workers: the queue of the replica holding the tunnel (the activity runs there)."""
    tls: bool = False
    """Dial the worker with TLS (WorkerRegistration.tls)."""
    attempt: int = 0
    """Which attempt of the task this is (1, 2, ...: `--retries`); 0 from a record of older
    code: the first."""


class TaskResume(_Record):
    """What a running task's record carries into its next run (continue-as-new)."""

    record: TaskRecord
    placement: Placement
    route: WorkerTaskInput
    cancel: str | None = None
    cancel_sent: bool = False
    preempt: str | None = None
    restore_after: TaskCheckpoint | None = None
    """The checkpoint a preemption took (`--on-preempt checkpoint`): its next attempt restores
    it."""
    liveness_seconds: float


def pool_workflow_id(pool_name: str) -> str:
    return f"pool:{pool_name}"


def new_task_id() -> str:
    """A task id as `levers9 run` picks one: twelve hex digits."""
    return uuid.uuid4().hex[:12]


def task_workflow_id(task_id: str) -> str:
    return f"task:{task_id}"


CHECKPOINT_MARK = "-ck"


def task_checkpoint_name(task_id: str, n: int) -> str:
    """The name of the `n`-th checkpoint of a task: `<task>-ck<n>` (so `task restore NAME`
    finds its task's record), or `ck-<hash>-<n>` when that is no workspace name (a long task
    id, or one with capitals, dots or underscores: `task restore` then takes the task's id)."""
    name = f"{task_id}{CHECKPOINT_MARK}{n}"
    if name_problem(name) is None:
        return name
    return f"ck-{hashlib.sha256(task_id.encode()).hexdigest()[:16]}-{n}"


def checkpointed_task_id(name: str) -> str | None:
    """The task a checkpoint named `<task>-ck<n>` was taken of; None for another name."""
    task_id, mark, n = name.rpartition(CHECKPOINT_MARK)
    return task_id if mark and task_id and n.isdigit() else None


def endpoint_workflow_id(name: str) -> str:
    return f"endpoint:{name}"


class EndpointInput(_Record):
    """EndpointWorkflow's argument: the spec at create; its state across continue-as-new."""

    spec: EndpointSpec
    state: EndpointState | None = None
    env: dict[str, str] | None = None
    """The replicas' environment, once computed (`replica_environment`)."""
    max_history_events: int = Field(default=2_000, ge=50)


class ClusterInput(_Record):
    """ClusterWorkflow's argument: the join, and its state across continue-as-new."""

    state: ClusterState
    max_history_events: int = Field(default=1_000, ge=20)


class WorkspaceInput(_Record):
    """WorkspaceWorkflow's argument: the workspace, and its state across continue-as-new."""

    state: WorkspaceState
    max_history_events: int = Field(default=1_000, ge=20)


class ReplicaReport(_Record):
    """Signal `replica` to `endpoint:<name>`, from a replica's record: it is ready, or ended."""

    task_id: str
    state: str
    """`ready`, or the task's end: succeeded, failed, cancelled, lost."""
    reason: str = ""


TaskInput.model_rebuild()  # its `resume` names TaskResume, defined after it
