"""Tasks on this worker: their calls, their cards, their start and their end.

A task is accepted once per id (a retried RunTask finds the record and starts nothing), gets
the cards it names if they are this worker's and free (else it fails with the spec's
`not enough GPUs available: requested=<n> visible=<m>`), runs in the runtime, and on exit keeps
its exit code, result JSON and log tail until the controlplane fetches them; every end is also
reported to the gateway. Phases carry timestamps: `worker.gpu_assignment`, `container.start`,
`container.ready`, `container.exit` (and `task.result` when the result file is unusable).

A task's record and its copy on disk, from which a restarted agent takes it over, are
levers9.agent.task_record's; its published ports (the claim, the readiness probe, `connect`)
levers9.agent.task_ports'; what the calls refuse with, levers9.agent.task_errors'.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from levers9.agent import checkpoints, task_ports
from levers9.agent.disks import DiskAccess, DiskBusy
from levers9.agent.output import TaskOutput
from levers9.agent.runtime import (
    Container,
    ContainerSpec,
    ImageUnavailable,
    Runtime,
    StartError,
    StorageMount,
    TaskDefaults,
)
from levers9.agent.task_errors import InvalidTask, ShuttingDown, TaskNotFound, TaskNotRunning
from levers9.agent.task_record import (
    CANCELLED,
    CONTAINER_EXIT,
    CONTAINER_START,
    FAILED,
    GPU_ASSIGNMENT,
    IMAGE_PULL,
    LOST,
    PORTS,
    RUNNING,
    SUCCEEDED,
    TASK_FILE,
    State,
    TaskRecord,
    directory_name,
    load,
    read_result,
    save,
)
from levers9.agent.volumes import VolumeAccess, bucket_problem
from levers9.contract import task_input_problem
from levers9.core.storage import TaskMount, mounts_problem
from levers9.core.workspaces import DEFAULT_WORKSPACE, name_problem
from levers9.logs import get_logger
from levers9.proto import worker_pb2

log = get_logger("levers9.agent.supervisor")
NO_DEFAULTS = TaskDefaults()

OOM_KILLED = "OOMKilled"
"""The reason of a task the kernel killed at its memory limit (Kubernetes' word)."""
START_WAIT_S = 5.0
"""How long RunTask waits for the task's start before it answers (accepted, still starting)."""
SHUT_DOWN = "worker shut down"
ORPHANED = "the worker restarted and found its container without a record: killed"
NO_CONTAINER = "the worker restarted and could not follow it (killed, if it still ran)"
KEEP_FINISHED = 256

Reporter = Callable[[worker_pb2.TaskStatus], None]


class TaskManager:
    """The worker's tasks (see module doc)."""

    def __init__(
        self,
        runtime: Runtime,
        visible: Sequence[int],
        work_dir: Path,
        report: Reporter,
        *,
        clock: Callable[[], float] = time.time,
        keep_finished: int = KEEP_FINISHED,
        defaults: TaskDefaults = NO_DEFAULTS,
        task_host: str = "127.0.0.1",
        pool_name: str = "",
        checkpoints_root: Path | None = None,
        cuda_problem: str = "",
    ) -> None:
        """`checkpoints_root`: where its tasks' checkpoints go, one folder per workspace
        (default: the work dir's `checkpoints/`); `cuda_problem`: why this machine cannot
        checkpoint a GPU task's CUDA state ("": it can: levers9.agent.checkpoints.cuda_problem)."""
        self._checkpoints = checkpoints_root or work_dir / "checkpoints"
        self._cuda_problem = cuda_problem
        self._runtime = runtime
        self._pool_name = pool_name
        self._task_host = task_host
        self._defaults = defaults
        self._visible = tuple(visible)
        self._dir = work_dir / "tasks"
        self._report = report
        self._clock = clock
        self._keep = keep_finished
        self._records: dict[str, TaskRecord] = {}
        self._mounts: dict[str, tuple[StorageMount, ...]] = {}
        """Each task's volumes and disks with what mounts them, until it ends."""
        self._stores: dict[str, tuple[VolumeAccess, str]] = {}
        """Each restoring task's checkpoint volume (RunTaskRequest.checkpoint_store), until
        its start: in memory only."""
        self._finished: list[str] = []
        self._watchers: set[asyncio.Task[Any]] = set()
        self._idle_since: float | None = clock()
        self._closed = False

    @property
    def visible(self) -> tuple[int, ...]:
        return self._visible

    @property
    def running(self) -> int:
        return sum(1 for r in self._records.values() if r.state == RUNNING)

    @property
    def idle_since(self) -> float | None:
        """When the last task ended (or the agent started); None while tasks run."""
        return self._idle_since

    # -- the calls ---------------------------------------------------------------------------

    async def run(
        self,
        spec: worker_pb2.TaskSpec,
        volumes: Sequence[worker_pb2.VolumeAccess] = (),
        disks: Sequence[worker_pb2.DiskAccess] = (),
        checkpoint_store: worker_pb2.VolumeAccess | None = None,
    ) -> bool:
        """Accepts and starts a task (its mounts with what mounts them: `volumes` and `disks`,
        RunTaskRequest's; `checkpoint_store`: where its restore_from image is fetched from when
        this machine lacks it); True when a task of that id was already accepted."""
        if not spec.task_id:
            raise InvalidTask("task_id is required")
        known = self._records.get(spec.task_id)
        later = known is not None and spec.attempt > known.spec.attempt
        if known is not None and not (later and known.finished.is_set()):
            # A retried RunTask of the attempt it has or had (never run twice); a later
            # attempt (`--retries`) replaces the record of one that has ended.
            return True
        if not spec.command:
            raise InvalidTask("command is required")
        workspace_refused = name_problem(spec.workspace) if spec.workspace else None
        if workspace_refused is not None:  # it names the container (runc_config)
            raise InvalidTask(f"workspace {workspace_refused}")
        mounts = storage_mounts(spec, volumes, disks)  # InvalidTask naming what is missing
        busy = self._disk_in_use(spec.task_id, mounts)
        if busy is not None:
            raise DiskBusy(busy)
        refused = task_input_problem(spec.command, spec.env)
        if refused is not None:  # the controlplane refused it at submit; a caller that is not
            raise InvalidTask(refused)  # the controlplane is refused here, before anything runs
        if self._closed:
            raise ShuttingDown("the worker is shutting down")
        task_ports.check_ports(spec)
        record = self._accept(spec)
        # In memory only, for its start: the credentials are never in its record on disk.
        self._mounts[spec.task_id] = mounts
        if checkpoint_store is not None and spec.restore_from:
            self._stores[spec.task_id] = (store_access(checkpoint_store), spec.restore_sha256)
        for phase, check in ((GPU_ASSIGNMENT, self._assign), (PORTS, self._claim_ports)):
            problem = check(record)
            if problem is not None:
                reason, detail = problem
                record.phase(phase, detail)
                self._finish(record, FAILED, reason)
                return False
            if phase == GPU_ASSIGNMENT or record.spec.ports:
                record.phase(phase)
        # A pull of a 20 GB image takes minutes: RunTask answers once the task is accepted
        # and its start under way (or done, for most: within START_WAIT_S); the task's
        # record learns the rest from its reports.
        starting = asyncio.create_task(self._starting(record), name=f"{spec.task_id}-start")
        self._watchers.add(starting)
        starting.add_done_callback(self._watchers.discard)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(starting), START_WAIT_S)
        return False

    def status(self, task_id: str) -> worker_pb2.TaskStatus:
        record = self._record(task_id)
        status = record.status()
        if record.state != RUNNING:
            record.fetched = True
            self._evict()
        return status

    def output(self, task_id: str) -> TaskOutput:
        return self._record(task_id).output

    async def cancel(self, task_id: str) -> bool:
        """Stops the task's container (SIGTERM to all of it, SIGKILL after its grace) and returns
        once it is gone and its end recorded; False when it had already ended (or was told to)."""
        record = self._record(task_id)
        if record.state != RUNNING or record.ending is not None:
            return False
        record.ending = (CANCELLED, "cancelled")
        if record.container is None:
            # Still starting (its image pulling): the pull goes on (the cache keeps it), its
            # container is stopped as it starts, and the end is reported then.
            return True
        # Shielded: a caller that gives up (its RPC's deadline) must not leave a container that
        # ignored SIGTERM running without its SIGKILL.
        await asyncio.shield(self._stop(record, record.container))
        await record.finished.wait()
        return True

    async def checkpoint(
        self, task_id: str, name: str, store: VolumeAccess | None = None
    ) -> worker_pb2.CheckpointTaskResponse:
        """Checkpoints the running task to its workspace's checkpoint `name` on this machine
        (levers9.agent.checkpoints) and ends it CANCELLED, reason `checkpointed to NAME`: it
        neither failed nor succeeded, and a cancelled task is not queued again. Refused
        (CheckpointRefused, nothing written, the task runs on) where its runtime cannot, with
        cards where this machine cannot checkpoint CUDA, while it starts or ends. With `store`
        (its checkpoint volume) the sealed image is uploaded there too; an upload that fails
        leaves it on this machine only, and the answer's store_error says why."""
        record = self._record(task_id)
        workspace = record.spec.workspace or DEFAULT_WORKSPACE
        path = checkpoints.image_path(self._checkpoints, workspace, name)
        container = record.container
        if record.state != RUNNING or record.ending is not None or container is None:
            raise checkpoints.CheckpointRefused(f"task {task_id} is not running")
        take = getattr(container, "checkpoint", None)
        if take is None:
            raise checkpoints.CheckpointRefused(
                f"task {task_id} runs in the {container.host} runtime, which cannot checkpoint;"
                " run it with --runtime runsc"
            )
        if record.cards and self._cuda_problem:
            raise checkpoints.CheckpointRefused(
                f"task {task_id} holds GPUs and this machine cannot checkpoint CUDA state:"
                f" {self._cuda_problem}"
            )
        started = time.monotonic()
        record.ending = (CANCELLED, f"checkpointed to {name}")
        try:
            size = await take(
                path,
                {
                    "task_id": task_id,
                    "workspace": workspace,
                    "image": record.spec.image,
                    "command": list(record.spec.command),
                    "taken_at_unix_ms": int(self._clock() * 1000),
                },
            )
        except BaseException:
            if not getattr(container, "exited", True):
                record.ending = None  # it runs on
            raise
        await record.finished.wait()
        response = worker_pb2.CheckpointTaskResponse(
            name=name, path=str(path), size_bytes=size, seconds=time.monotonic() - started
        )
        if store is not None:
            sent = time.monotonic()
            try:
                stored = await asyncio.to_thread(checkpoints.upload, path, store)
                response.stored, response.stored_sha256 = stored
            except (checkpoints.StoreFailed, checkpoints.CheckpointFailed) as error:
                response.store_error = str(error)
                log.warning("checkpoint upload failed", task_id=task_id, error=str(error))
            response.store_seconds = time.monotonic() - sent
            if response.stored:
                log.info(
                    "checkpoint uploaded",
                    task_id=task_id,
                    stored=response.stored,
                    seconds=round(response.store_seconds, 2),
                )
        return response

    async def delete_checkpoint(self, workspace: str, name: str) -> bool:
        """Removes the workspace's checkpoint `name` from this machine (False: it had none).
        CheckpointRefused while a task here is being restored from it (not yet running)."""
        path = checkpoints.image_path(self._checkpoints, workspace, name)
        for record in self._records.values():
            spec = record.spec
            restoring = spec.restore_from == name and record.container is None
            ours = (spec.workspace or DEFAULT_WORKSPACE) == workspace
            if restoring and ours and record.state == RUNNING:
                raise checkpoints.CheckpointRefused(
                    f"checkpoint {name} is being restored by task {record.task_id}: delete"
                    " it once that task runs"
                )
        deleted = await asyncio.to_thread(checkpoints.delete, path)
        if deleted:
            log.info("checkpoint deleted", workspace=workspace, checkpoint=name)
        return deleted

    async def exec(
        self, task_id: str, command: Sequence[str], terminal: int | None = None
    ) -> asyncio.subprocess.Process:
        record = self._record(task_id)
        if record.state != RUNNING or record.container is None:
            raise TaskNotRunning(f"task {task_id} is not running")
        return await self._runtime.exec(record.container, command, terminal)

    async def connect(
        self, task_id: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A TCP connection to `port` of the running task's container (one it published)."""
        record = self._record(task_id)
        if record.state != RUNNING or record.container is None:
            raise TaskNotRunning(f"task {task_id} is not running: its ports are closed")
        return await task_ports.connect(record, self._task_host, port)

    async def shutdown(self, grace_s: float, reason: str = SHUT_DOWN) -> None:
        """Kills every running task and records it LOST with `reason`."""
        self._closed = True
        running = [r for r in self._records.values() if r.state == RUNNING]
        for record in running:
            record.ending = record.ending or (LOST, reason)
        await asyncio.gather(
            *(
                self._stop(r, r.container, min(grace_s, r.grace_s))
                for r in running
                if r.container is not None
            )
        )
        await asyncio.gather(*(r.finished.wait() for r in running))

    # -- a task's life -----------------------------------------------------------------------

    def _accept(self, given: worker_pb2.TaskSpec) -> TaskRecord:
        spec = self._with_defaults(given)
        directory = self._dir / directory_name(spec.task_id)
        shutil.rmtree(directory, ignore_errors=True)  # a task id reused after eviction
        record = TaskRecord(
            spec=spec,
            directory=directory,
            output=TaskOutput(directory / "output.log"),
            host=self._runtime.host_for(spec.image, spec.runtime),
            clock=self._clock,
        )
        self._records[spec.task_id] = record
        self._idle_since = None
        log.info("task accepted", task_id=spec.task_id, gpu_indices=list(spec.gpu_indices))
        save(record)
        return record

    def _with_defaults(self, given: worker_pb2.TaskSpec) -> worker_pb2.TaskSpec:
        """The task as it runs: the pool's default image, memory and CPUs where it named none."""
        spec = worker_pb2.TaskSpec()
        spec.CopyFrom(given)
        spec.image = spec.image or self._defaults.image
        spec.memory_bytes = spec.memory_bytes or self._defaults.memory_bytes
        spec.cpu_millis = spec.cpu_millis or self._defaults.cpu_millis
        return spec

    def _assign(self, record: TaskRecord) -> tuple[str, str] | None:
        """Gives the task its cards; (reason, detail) when it cannot have them."""
        wanted = tuple(sorted(set(record.spec.gpu_indices)))
        busy = {c for r in self._records.values() if r.state == RUNNING for c in r.cards}
        foreign = [c for c in wanted if c not in self._visible]
        taken = [c for c in wanted if c in busy]
        if foreign or taken:
            free = len([c for c in self._visible if c not in busy])
            visible = len(self._visible) if foreign else free
            reason = f"not enough GPUs available: requested={len(wanted)} visible={visible}"
            shown = ",".join(map(str, self._visible)) or "none"
            detail = (
                f"cards {foreign} are not this worker's (visible: {shown})"
                if foreign
                else f"cards {taken} are in use by other tasks"
            )
            return reason, detail
        record.cards = wanted
        save(record)
        return None

    def _claim_ports(self, record: TaskRecord) -> tuple[str, str] | None:
        """(reason, detail) when another running task published one of its ports on the
        network they share (a task in a namespace of its own claims nothing)."""
        return task_ports.port_conflict(record, self._records.values())

    async def _starting(self, record: TaskRecord) -> None:
        try:
            await self._start(record)
        except Exception as error:  # a bug must not leave the task running forever
            log.error("task start failed", task_id=record.task_id, error=repr(error))
            record.phase(CONTAINER_START, repr(error))
            self._finish(record, FAILED, f"the worker could not start it: {error!r}")

    async def _start(self, record: TaskRecord) -> None:
        spec = record.spec
        container_spec = ContainerSpec(
            task_id=spec.task_id,
            image=spec.image,
            command=tuple(spec.command),
            env=task_ports.task_env(spec, task_ports.reached_at(record, self._task_host)),
            gpu_indices=record.cards,
            result_path=record.result_path,
            work_dir=record.directory / "work",
            memory_bytes=spec.memory_bytes,
            cpu_millis=spec.cpu_millis,
            ports=tuple(spec.ports),
            runtime=spec.runtime,
            entrypoint=not spec.image or spec.image != self._defaults.worker_image,
            workspace=spec.workspace or DEFAULT_WORKSPACE,
            pool=self._pool_name,
            mounts=self._mounts.get(spec.task_id, ()),
        )
        if spec.restore_from:
            try:
                restore = checkpoints.image_path(
                    self._checkpoints, spec.workspace or DEFAULT_WORKSPACE, spec.restore_from
                )
            except checkpoints.ImageInvalid as error:
                record.phase(CONTAINER_START, str(error))
                self._finish(record, FAILED, f"restore_from: {error}")
                return
            store = self._stores.pop(spec.task_id, None)
            if store is not None and not restore.exists():
                try:
                    await self._fetch(spec.task_id, *store, restore)
                except (
                    checkpoints.ImageInvalid,
                    checkpoints.StoreFailed,
                    checkpoints.CheckpointFailed,
                ) as error:
                    record.phase(CONTAINER_START, str(error))
                    self._finish(record, FAILED, f"restore_from: {error}")
                    return
            container_spec = dataclasses.replace(container_spec, restore_from=restore)
        try:
            container = await self._runtime.start(container_spec, record.output.write)
        except ImageUnavailable as error:
            record.phase(IMAGE_PULL, str(error))
            self._finish(record, FAILED, str(error))
            return
        except StartError as error:
            record.phase(CONTAINER_START, str(error))
            self._finish(record, FAILED, str(error))
            return
        finally:
            self._forget_credentials(spec.task_id)
        record.container = container
        pulled = container.image
        if pulled is not None:
            record.image_digest = pulled.digest
            detail = "cached" if pulled.cached else f"pulled {pulled.bytes_pulled} bytes"
            record.phase(IMAGE_PULL, detail=detail)
        record.phase(CONTAINER_START)
        self._tell(record)  # its record shows the start (runtime, image) at once
        self._follow(record, container)

    def _follow(self, record: TaskRecord, container: Container) -> None:
        """Watches the running container to its end, and probes its port until it is ready."""
        watcher = asyncio.create_task(self._watch(record, container), name=record.task_id)
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        if record.spec.ports and not record.ready:
            probe = asyncio.create_task(
                task_ports.probe_until_ready(record, self._task_host, self._tell),
                name=f"{record.task_id}-ready",
            )
            self._watchers.add(probe)
            probe.add_done_callback(self._watchers.discard)

    def _stop(
        self, record: TaskRecord, container: Container, grace_s: float | None = None
    ) -> asyncio.Task[int]:
        """Its container's stop, begun once and left to finish whoever waits for it."""
        if record.stopping is None:
            grace = record.grace_s if grace_s is None else grace_s
            record.stopping = asyncio.create_task(
                container.stop(grace), name=f"{record.task_id}-stop"
            )
            self._watchers.add(record.stopping)
            record.stopping.add_done_callback(self._watchers.discard)
        return record.stopping

    async def _watch(self, record: TaskRecord, container: Container) -> None:
        if record.ending is not None:  # cancelled or shut down while it was starting
            await self._stop(record, container)
        code = await container.wait()
        record.exit_code = code
        record.phase(CONTAINER_EXIT)
        record.result_json = read_result(record)
        if record.ending is not None:
            state, reason = record.ending
        elif container.lost:
            state, reason = LOST, container.lost
        elif container.storage_error:
            state, reason = FAILED, f"{container.storage_error} (exited with code {code})"
        elif code == 0:
            state, reason = SUCCEEDED, ""
        elif container.oom_killed:
            state, reason = FAILED, OOM_KILLED
        elif container.limit_hit:
            state, reason = FAILED, f"{container.limit_hit} (exited with code {code})"
        else:
            state, reason = FAILED, f"exited with code {code}"
        self._finish(record, state, reason)

    async def _fetch(self, task_id: str, store: VolumeAccess, expected: str, path: Path) -> None:
        """The checkpoint image at `path` fetched from its volume (checkpoints.download), its
        tar's sha256 `expected` ("": the bucket's own is checked)."""
        started = time.monotonic()
        size = await asyncio.to_thread(checkpoints.download, store, path, expected)
        log.info(
            "checkpoint fetched",
            task_id=task_id,
            checkpoint=path.name,
            volume=store.name,
            size_bytes=size,
            seconds=round(time.monotonic() - started, 2),
        )

    def _forget_credentials(self, task_id: str) -> None:
        """Once its volumes are mounted (or could not be), the agent keeps no key of theirs: the
        FUSE processes hold them; its disks stay known (one task at a time)."""
        held = self._mounts.get(task_id)
        if held:
            self._mounts[task_id] = tuple(dataclasses.replace(m, volume=None) for m in held)

    def _disk_in_use(self, task_id: str, mounts: Sequence[StorageMount]) -> str | None:
        """Why one of the task's disks cannot be had now: another running task of this
        worker has it (another agent's task on the machine: its start says so)."""
        for mount in mounts:
            if mount.disk is None:
                continue
            for other, held in self._mounts.items():
                record = self._records.get(other)
                if other == task_id or record is None or record.state != RUNNING:
                    continue
                if any(m.disk is not None and m.disk.disk_id == mount.disk.disk_id for m in held):
                    return (
                        f"disk {mount.name} is in use by task {other} on this machine: a disk"
                        " is mounted for one task at a time"
                    )
        return None

    def _finish(self, record: TaskRecord, state: State, reason: str) -> None:
        self._mounts.pop(record.task_id, None)
        self._stores.pop(record.task_id, None)
        record.state = state
        record.reason = reason
        record.cards = ()
        record.output.close()
        record.finished.set()
        self._finished.append(record.task_id)
        if self.running == 0:
            self._idle_since = self._clock()
        log.info(
            "task ended",
            task_id=record.task_id,
            state=worker_pb2.TaskState.Name(state),
            exit_code=record.exit_code,
            reason=reason,
        )
        self._tell(record)
        self._evict()

    def _tell(self, record: TaskRecord) -> None:
        """Keeps the task's record where a restarted agent finds it, and reports it."""
        save(record)
        self._report(record.status())

    # -- what an agent before this one left --------------------------------------------------

    async def adopt(self) -> None:
        """Takes over what an agent before this one (killed, say) left in the work dir: its
        ended tasks as they ended (not reported again), its running tasks' containers (output
        followed on, the end reported once it comes, their cards held until then), and kills
        every container it finds no record of, or whose task it cannot follow, reporting those
        tasks lost."""
        adopted: dict[str, TaskRecord] = {}
        orphaned: list[TaskRecord] = []
        for saved in sorted(self._dir.glob(f"*/{TASK_FILE}")):
            record = load(saved, self._clock)
            if record is None or record.task_id in self._records:
                continue
            self._records[record.task_id] = record
            if record.state != RUNNING:
                record.finished.set()
                self._finished.append(record.task_id)
                continue
            container = await self._runtime.adopt(
                record.task_id, record.output.write, record.output.size
            )
            if container is None:
                orphaned.append(record)
                continue
            record.container = container
            adopted[record.task_id] = record
        for task_id in await self._runtime.sweep(keep=adopted):
            if task_id not in self._records:
                record = self._accept(worker_pb2.TaskSpec(task_id=task_id))
                self._finish(record, LOST, ORPHANED)
        for record in orphaned:
            self._finish(record, LOST, NO_CONTAINER)
        for record in adopted.values():
            assert record.container is not None
            log.info("task adopted", task_id=record.task_id, cards=list(record.cards))
            self._follow(record, record.container)
        self._idle_since = None if self.running else self._clock()

    # -- bookkeeping -------------------------------------------------------------------------

    def _record(self, task_id: str) -> TaskRecord:
        record = self._records.get(task_id)
        if record is None:
            raise TaskNotFound(f"task {task_id} is not known to this worker")
        return record

    def _evict(self) -> None:
        """Forgets the oldest finished tasks beyond `keep_finished`: fetched ones first, and
        unfetched ones too once there are four times as many (memory stays bounded)."""
        while len(self._finished) > self._keep:
            fetched = [t for t in self._finished if self._records[t].fetched]
            if fetched:
                victim = fetched[0]
            elif len(self._finished) > 4 * self._keep:
                victim = self._finished[0]
            else:
                return
            self._finished.remove(victim)
            record = self._records.pop(victim)
            with contextlib.suppress(OSError):
                shutil.rmtree(record.directory)


def store_access(given: worker_pb2.VolumeAccess) -> VolumeAccess:
    """A checkpoint volume as the wire gives it; InvalidTask naming the field when malformed."""
    refused = bucket_problem(given.bucket)
    if refused is not None:
        raise InvalidTask(f"checkpoint_store.bucket: {refused}")
    return VolumeAccess(
        name=given.name,
        bucket=given.bucket,
        endpoint=given.endpoint,
        region=given.region,
        access_key_id=given.access_key_id,
        secret_access_key=given.secret_access_key,
    )


def storage_mounts(
    spec: worker_pb2.TaskSpec,
    volumes: Sequence[worker_pb2.VolumeAccess],
    disks: Sequence[worker_pb2.DiskAccess],
) -> tuple[StorageMount, ...]:
    """The task's mounts (TaskSpec.mounts) each with its VolumeAccess or DiskAccess of that
    name; InvalidTask naming the field when one is malformed or has no access entry."""
    mounts = [
        TaskMount(kind=m.kind, name=m.name, path=m.path, read_only=m.read_only) for m in spec.mounts
    ]
    problem = mounts_problem(mounts)
    if problem is not None:
        raise InvalidTask(f"task.mounts: {problem}")
    by_volume = {v.name: v for v in volumes}
    by_disk = {d.name: d for d in disks}
    found = []
    for mount in mounts:
        if mount.kind == "volume":
            given = by_volume.get(mount.name)
            if given is None:
                raise InvalidTask(
                    f"task.mounts: volume {mount.name} has no entry in volumes"
                    " (RunTaskRequest.volumes: its bucket and credentials)"
                )
            bucket_refused = bucket_problem(given.bucket)
            if bucket_refused is not None:
                raise InvalidTask(f"volumes[{mount.name}].bucket: {bucket_refused}")
            volume = VolumeAccess(
                name=given.name,
                bucket=given.bucket,
                endpoint=given.endpoint,
                region=given.region,
                access_key_id=given.access_key_id,
                secret_access_key=given.secret_access_key,
            )
            found.append(StorageMount("volume", mount.name, mount.path, mount.read_only, volume))
        else:
            disk = by_disk.get(mount.name)
            if disk is None:
                raise InvalidTask(
                    f"task.mounts: disk {mount.name} has no entry in disks"
                    " (RunTaskRequest.disks: its disk_id and size_bytes)"
                )
            if not disk.disk_id or disk.size_bytes <= 0:
                raise InvalidTask(
                    f"disks[{mount.name}]: disk_id and a size_bytes above 0 are required"
                )
            access = DiskAccess(disk.name, disk.disk_id, disk.size_bytes)
            found.append(StorageMount("disk", mount.name, mount.path, mount.read_only, disk=access))
    return tuple(found)
