"""WorkerWorkflow (`worker:<pool>:<worker-id>`): one worker Job and the worker record.

    creating -> pending -> available -> stopped (idle wind-down, or stopped by the controlplane)
                   |            |-----> failed (its Job failed) / expired (its Job was deleted)
                   |            '-----> expired (no heartbeat for the record TTL)
                   '-> failed (the Job failed) / expired (never registered within the TTL)

While pending it follows the pod (ImagePullBackOff becomes a condition on the record with the
spec's fix). Registration (signal `register`, from the gateway) makes it available; heartbeats
keep it; an idle worker past the pool's idle minutes is wound down (Job deleted). Its Job
finishing ends it within seconds: the machine, whose observation (the watch-fed pool cache) saw
the Job Failed, signals `job_finished`, the record reads the Job and pod, and ends `failed` with
the agent's exit. A worker silent for the liveness window (a few heartbeats, far below the
record TTL) leaves placement at once (`worker_silent` to the pool) and its Job is read: failed
or deleted, the record ends now; still running (the agent hung, or cut off from the gateway by
a controlplane restart or a network), it stays out of placement until it is heard again, and
expires at the record TTL as before, its Job deleted. Whenever the record ends, the pool and
then the machine are told, so its next reconcile adds a fresh worker at once.

A drain of its node (signal `drain`, from its machine when the node is cordoned) takes it out of
placement for good and preempts its tasks (`worker_draining` to the pool), its boxes' tasks
stopped as `box stop` does first (checkpointed where they can be); once a heartbeat after that
says nothing runs, its pod is labelled `levers9.dev/drained=true` (out of the pool's
PodDisruptionBudget, which held the drain's evictions back until then) and the record ends
`stopped`, its Job deleted.

It tells the pool's placement its cards when it becomes available and again only when its
registration changes (its tunnel moved to another replica, say), not on a clock. The pool's
settings (idle minutes, record TTL) reach it by the signal `settings`, from its machine. It
continues as new with its registration, latest heartbeat and settings, never while a `stop`
waits to be acted on.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError

from workflows.steps import failure_reason

with workflow.unsafe.imports_passed_through():
    from activities.drain import DrainActivities
    from activities.kube import KubeActivities
    from levers9.core.manifests import worker_job_name
    from levers9.logs import KV_EXTRA
    from levers9.models import (
        WORKER_WORKFLOW,
        BoxOnWorker,
        DrainWorker,
        PodState,
        StopBoxes,
        StopWorker,
        WorkerBoxes,
        WorkerHeartbeat,
        WorkerInput,
        WorkerJobInput,
        WorkerRecord,
        WorkerRegistration,
        WorkerSlotInput,
        WorkerTimings,
        machine_workflow_id,
        node_gone_reason,
        pool_workflow_id,
    )
    from levers9.search_attributes import WORKER_STATE

KUBE_TIMEOUT = timedelta(seconds=60)
KUBE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=20,
)
IMAGE_PULL_FIX = (
    "image not in the project's registry: rerun deploy/gke/attach-gke-pool.sh (it copies latest)"
)
PULL_FAILURES = frozenset({"ImagePullBackOff", "ErrImagePull", "InvalidImageName"})
PROBE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=3,
)
"""Reading a silent worker's Job: a cluster out of reach says nothing (it stays out of
placement), and the record does not wait minutes on it."""
FINISHED_PHASES = frozenset({"Failed", "Succeeded"})
SILENT = "silent: no heartbeat for the liveness window, nothing placed on it until heard again"
CACHE_REPORT = "cache-report-announced"
"""Patch: a change in what the node's image cache holds (its heartbeats say, with the pool's
`cache.enabled`) is announced to the pool's placement."""
DRAINING = "draining: its tasks are taken off it, then its pod leaves the disruption budget"
BOX_STOP_TIMEOUT = timedelta(minutes=15)
"""A drain's `box stop` of its boxes: checkpoints of GiBs of memory take a while each."""
BOX_STOP_HEARTBEAT = timedelta(seconds=30)
PUBLISH = timedelta(minutes=1)
"""How often heartbeats refresh the record's memo (visibility), not every 10 s."""


@workflow.defn(name=WORKER_WORKFLOW)
class WorkerWorkflow:
    def __init__(self) -> None:
        self._record: WorkerRecord | None = None
        self._stop = False
        self._stop_request = StopWorker()
        self._registration: WorkerRegistration | None = None
        self._beat: WorkerHeartbeat | None = None
        self._beat_at: datetime | None = None
        self._beats = 0
        self._idle_from: datetime | None = None
        self._published_state: str | None = None
        self._timings: WorkerTimings | None = None
        self._settings_changes = 0
        self._announced: WorkerRegistration | None = None
        self._images: tuple[str, ...] = ()
        """What its node's image cache holds, as its heartbeats last said (cache.enabled)."""
        self._announced_images: tuple[str, ...] = ()
        self._job_finished = False
        self._silent = False
        self._drain: str | None = None
        """Why its node is drained (the reason its tasks are preempted with); None: it is not."""
        self._drain_told = False
        self._drain_beats = 0

    @workflow.query
    def record(self) -> WorkerRecord | None:
        return self._record

    @workflow.signal
    def stop(self, request: StopWorker | None = None) -> None:
        """Ends the record now: its Job deleted (unless the pool's cluster is out of reach,
        `delete_job=False`), with the request's reason."""
        self._stop = True
        self._stop_request = request or StopWorker()

    @workflow.signal
    def drain(self, reason: str) -> None:
        """Its node is cordoned (from the machine): its tasks are taken off it with `reason`,
        then its pod is let go (see the module)."""
        if self._drain is None:
            self._drain = reason

    @workflow.signal
    def settings(self, timings: WorkerTimings) -> None:
        """The pool's settings changed on the controlplane (from the machine)."""
        self._timings = timings
        self._settings_changes += 1

    @workflow.signal
    def job_finished(self) -> None:
        """Its machine's observation saw this worker's Job finished (Failed or Complete): the
        record reads the Job and ends now, rather than when its heartbeats are missed."""
        self._job_finished = True

    @workflow.signal
    def register(self, registration: WorkerRegistration) -> None:
        self._registration = registration
        self._beat_at = workflow.now()
        self._idle_from = self._idle_from or self._beat_at
        self._beats += 1

    @workflow.signal
    def heartbeat(self, beat: WorkerHeartbeat) -> None:
        self._beat = beat
        self._beat_at = workflow.now()
        if beat.images is not None:
            self._images = beat.images
        if beat.running_tasks:
            self._idle_from = None
        else:
            # The agent's own idle-since when it says; else idle since we first heard so.
            self._idle_from = beat.idle_since or self._idle_from or self._beat_at
        self._beats += 1

    @workflow.run
    async def run(self, input: WorkerInput) -> WorkerRecord:
        self._timings = self._timings or input.timings  # a `settings` before run is newer
        job = WorkerJobInput(
            pool_name=input.pool_name,
            worker_id=input.worker_id,
            node_name=input.node_name,
            gpus=input.gpus,
            external_ip=input.external_ip,
        )
        if input.resume is not None:  # continued as new while available
            # A registration or heartbeat handled before run (same first task) is newer.
            self._registration = self._registration or input.resume
            self._beat = self._beat or input.resume_beat
            self._images = self._images or input.resume_images
            self._beat_at = self._beat_at or workflow.now()
            carried = input.resume_beat
            if carried is not None and not carried.running_tasks:
                self._idle_from = self._idle_from or carried.idle_since
            self._idle_from = self._idle_from or self._beat_at
            return await self._serve(input, job)
        self._set(input, "creating")
        try:
            await workflow.execute_activity_method(
                KubeActivities.create_worker_job,
                job,
                start_to_close_timeout=KUBE_TIMEOUT,
                retry_policy=KUBE_RETRY,
                summary=f"create worker Job on {input.node_name} taking {input.gpus} cards",
            )
        except ActivityError as exc:
            return await self._end(input, "failed", failure_reason(exc), None)
        self._set(input, "pending")
        ended = await self._follow_pending(input, job)
        if ended is not None:
            return ended
        return await self._serve(input, job)

    async def _follow_pending(self, input: WorkerInput, job: WorkerJobInput) -> WorkerRecord | None:
        """Until registration: the pod's conditions on the record, or the record's end."""
        began = workflow.now()
        while self._registration is None:
            if self._stop:
                return await self._stopped(input, job)
            timings = self._settings()
            if workflow.now() >= began + timedelta(seconds=timings.record_ttl_seconds):
                return await self._end(
                    input, "expired", "never registered within the record TTL", job
                )
            pod: PodState = await workflow.execute_activity_method(
                KubeActivities.describe_worker_pod,
                job,
                start_to_close_timeout=KUBE_TIMEOUT,
                retry_policy=KUBE_RETRY,
                summary="pending: is the worker pod running yet?",
            )
            if not pod.job_exists:
                return await self._end(input, "expired", "its Job was deleted", None)
            if pod.node_gone:  # as the machine's `gone` says, whichever sees it first
                return await self._end(input, "stopped", node_gone_reason(input.node_name), job)
            if pod.job_failed or pod.phase == "Failed":
                return await self._end(input, "failed", pod.message or "the worker pod failed", job)
            self._pending_condition(input, pod)
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._registration is not None or self._stop or self._job_finished,
                    timeout=timedelta(seconds=timings.pod_check_seconds),
                )
            if self._registration is None:  # else serving reads the Job at once
                self._job_finished = False  # the next pass of this loop reads it
        return None

    def _pending_condition(self, input: WorkerInput, pod: PodState) -> None:
        condition = None
        if pod.waiting_reason in PULL_FAILURES:
            condition = f"{pod.waiting_reason}: {IMAGE_PULL_FIX}"
        elif pod.waiting_reason:
            condition = pod.waiting_reason + (f": {pod.message}" if pod.message else "")
        current = self._record.condition if self._record else None
        if condition != current:
            if condition and pod.waiting_reason in PULL_FAILURES:
                workflow.logger.warning(
                    "worker image cannot be pulled",
                    extra={
                        KV_EXTRA: {
                            "worker_id": input.worker_id,
                            "pool_name": input.pool_name,
                            "reason": pod.waiting_reason,
                            "fix": IMAGE_PULL_FIX,
                        }
                    },
                )
            self._set(input, "pending", condition=condition)

    def _settings(self) -> WorkerTimings:
        assert self._timings is not None
        return self._timings

    async def _announce(self, input: WorkerInput) -> None:
        """Tells the pool's placement this worker's cards, as registered now."""
        registration = self._registration
        if registration is None:
            return
        pool = workflow.get_external_workflow_handle(pool_workflow_id(input.pool_name))
        with contextlib.suppress(FailureError):  # no pool yet: asked again on the next beat
            await pool.signal(
                "worker_available",
                WorkerSlotInput(
                    worker_id=input.worker_id,
                    node_name=input.node_name,
                    address=registration.address,
                    task_queue=registration.task_queue,
                    tls=registration.tls,
                    devices=registration.visible_devices,
                    node_gpus=input.node_gpus,
                    images=self._images,
                ),
            )
            self._announced = registration
            self._announced_images = self._images

    async def _serve(self, input: WorkerInput, job: WorkerJobInput) -> WorkerRecord:
        """Available: heartbeats keep it; idle past the pool's minutes winds it down."""
        self._set(input, "available")
        await self._announce(input)
        workflow.logger.info(
            "worker available",
            extra={
                KV_EXTRA: {
                    "worker_id": input.worker_id,
                    "address": self._registration.address if self._registration else None,
                    "pool_name": input.pool_name,
                }
            },
        )
        while True:
            timings = self._settings()
            ttl = timedelta(seconds=timings.record_ttl_seconds)
            idle = timedelta(seconds=timings.idle_seconds)
            window = min(ttl, timedelta(seconds=timings.liveness_seconds))
            seen = (self._beats, self._settings_changes)
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda seen=seen: (
                        (self._beats, self._settings_changes) != seen  # type: ignore[misc]
                        or self._stop
                        or self._job_finished
                        or (self._drain is not None and not self._drain_told)
                    ),
                    timeout=self._next_look(ttl, window),
                )
            if self._stop:
                return await self._stopped(input, job)
            if self._drain is not None:
                drained = await self._drain_step(input, job)
                if drained is not None:
                    return drained
            now = workflow.now()
            if self._beat_at is not None and now - self._beat_at >= ttl:
                return await self._end(input, "expired", "no heartbeat within the record TTL", job)
            falling_silent = self._quiet(window) and not self._silent
            if self._job_finished or falling_silent:
                ended = await self._look_at_job(input, job)
                if ended is not None:
                    return ended
            if falling_silent and self._quiet(window):  # no heartbeat came while it looked
                await self._fall_silent(input, window)
            elif self._silent and not self._quiet(window):
                await self._heard_again(input)
            # Idle is the agent's own word: its latest heartbeat says it has run nothing for the
            # idle minutes. A timer on an older heartbeat would wind down a worker that took
            # tasks since (and kill them).
            idle_since = self._idle_since()
            if idle_since and self._beat_at and self._beat_at - idle_since >= idle:
                return await self._end(input, "stopped", "idle wind-down", job)
            published = self._record.last_heartbeat if self._record else None
            if self._beat_at and (published is None or self._beat_at - published >= PUBLISH):
                self._set(input, "available")  # the memo's heartbeat, at most once a minute
            if self._registration != self._announced:
                # Registered again elsewhere (its tunnel moved), or the pool was missing: the
                # record and the pool both learn the worker's route now.
                self._set(input, "available")
                await self._announce(input)
            elif (
                self._images != self._announced_images
                and not self._silent
                and workflow.patched(CACHE_REPORT)
            ):
                await self._announce(input)  # its node's cache changed: placement prefers it
            long = workflow.info().get_current_history_length() > input.max_history_events
            # Not while a stop waits (it came during the announcement): this run acts on it;
            # nor while silent (the next run would announce it placeable) or draining.
            if long and not self._stop and not self._silent and self._drain is None:
                await workflow.wait_condition(workflow.all_handlers_finished)
                if not self._stop:
                    record = self._record  # the next run's memo: else the first run's start's
                    workflow.continue_as_new(
                        input.model_copy(
                            update={
                                "resume": self._registration,
                                "resume_beat": self._beat,
                                "resume_images": self._images,
                                "timings": self._settings(),
                            }
                        ),
                        memo=None if record is None else {"record": record.model_dump(mode="json")},
                    )

    async def _drain_step(self, input: WorkerInput, job: WorkerJobInput) -> WorkerRecord | None:
        """First the pool takes its tasks back; then, once a heartbeat since says nothing runs,
        its pod leaves the disruption budget and the record ends (the ended record)."""
        reason = self._drain
        assert reason is not None
        kv = {
            "pool_name": input.pool_name,
            "machine": input.node_name,
            "machine_id": input.machine_id,
            "worker_id": input.worker_id,
        }
        if not self._drain_told:
            self._drain_told = True
            self._set(input, "available")
            workflow.logger.info("worker draining", extra={KV_EXTRA: kv | {"reason": reason}})
            boxes = await self._boxes_on_it(input)
            spare = tuple(box.task_id for box in boxes)
            await self._tell_draining(
                input, DrainWorker(worker_id=input.worker_id, reason=reason, spare=spare)
            )
            if boxes:
                await self._stop_boxes(input, boxes, reason)
                # A box whose checkpoint was refused or failed runs on: preempted now.
                await self._tell_draining(
                    input, DrainWorker(worker_id=input.worker_id, reason=reason)
                )
            self._drain_beats = self._beats  # a heartbeat from now on says what still runs
            return None
        beat = self._beat
        if self._beats <= self._drain_beats or beat is None or beat.running_tasks:
            return None
        try:
            labelled = await workflow.execute_activity_method(
                KubeActivities.mark_worker_drained,
                job,
                start_to_close_timeout=KUBE_TIMEOUT,
                retry_policy=KUBE_RETRY,
                summary="drained: its pod leaves the pool's disruption budget",
            )
        except ActivityError as exc:  # (403: a joined cluster's older Role) its Job goes anyway
            workflow.logger.warning(
                "drained worker's pod not labelled",
                extra={KV_EXTRA: kv | {"error": failure_reason(exc)}},
            )
            labelled = 0
        workflow.logger.info("worker drained", extra={KV_EXTRA: kv | {"pods": labelled}})
        drained = f"drained: {reason.removeprefix('preempted: ')}"
        return await self._end(input, "stopped", drained, job)

    async def _tell_draining(self, input: WorkerInput, drain: DrainWorker) -> None:
        pool = workflow.get_external_workflow_handle(pool_workflow_id(input.pool_name))
        with contextlib.suppress(FailureError):  # no pool: nothing is placed on it
            await pool.signal("worker_draining", drain)

    async def _boxes_on_it(self, input: WorkerInput) -> tuple[BoxOnWorker, ...]:
        """The running boxes whose task is on this worker (none when they cannot be listed:
        their tasks are preempted like the others)."""
        try:
            boxes: list[BoxOnWorker] = await workflow.execute_activity_method(
                DrainActivities.boxes_on_worker,
                WorkerBoxes(pool_name=input.pool_name, worker_id=input.worker_id),
                start_to_close_timeout=KUBE_TIMEOUT,
                retry_policy=PROBE_RETRY,
                summary="drain: which boxes run on it?",
            )
        except ActivityError as exc:
            workflow.logger.warning(
                "drain: its boxes could not be listed, their tasks are preempted",
                extra={KV_EXTRA: {"worker_id": input.worker_id, "error": failure_reason(exc)}},
            )
            return ()
        return tuple(boxes)

    async def _stop_boxes(
        self, input: WorkerInput, boxes: tuple[BoxOnWorker, ...], reason: str
    ) -> None:
        """`box stop` of each: a runsc box's task is checkpointed before it ends."""
        why = reason.removeprefix("preempted: ")
        try:
            await workflow.execute_activity_method(
                DrainActivities.stop_boxes,
                StopBoxes(boxes=boxes, reason=why),
                start_to_close_timeout=BOX_STOP_TIMEOUT,
                heartbeat_timeout=BOX_STOP_HEARTBEAT,
                retry_policy=PROBE_RETRY,
                summary=f"drain: box stop of {len(boxes)} box(es), checkpointed where they can be",
            )
        except ActivityError as exc:
            workflow.logger.warning(
                "drain: its boxes could not all be stopped, their tasks are preempted",
                extra={KV_EXTRA: {"worker_id": input.worker_id, "error": failure_reason(exc)}},
            )

    def _quiet(self, window: timedelta) -> bool:
        """Not heard for the liveness window."""
        return self._beat_at is not None and workflow.now() - self._beat_at >= window

    def _next_look(self, ttl: timedelta, window: timedelta) -> timedelta:
        """Until the heartbeats are a liveness window late (the record TTL, once silent)."""
        if self._beat_at is None:
            return window
        due = self._beat_at + (ttl if self._silent else window)
        return max(due - workflow.now(), timedelta(seconds=1))

    async def _look_at_job(self, input: WorkerInput, job: WorkerJobInput) -> WorkerRecord | None:
        """Reads its Job and pod: the ended record when they say the agent is gone."""
        told = self._job_finished
        self._job_finished = False
        try:
            pod: PodState = await workflow.execute_activity_method(
                KubeActivities.describe_worker_pod,
                job,
                start_to_close_timeout=KUBE_TIMEOUT,
                retry_policy=PROBE_RETRY,
                summary="is the worker's agent still there? (its Job finished, or it is silent)",
            )
        except ActivityError:
            if told:  # the pool cache saw the Job finished; a finished Job never runs again
                return await self._end(input, "failed", "its Job failed", job)
            return None
        if not pod.job_exists:
            return await self._end(input, "expired", "its Job was deleted", None)
        if pod.node_gone:
            return await self._end(input, "stopped", node_gone_reason(input.node_name), job)
        if pod.job_failed or pod.phase in FINISHED_PHASES:
            return await self._end(input, "failed", job_failure(pod), job)
        return None

    async def _fall_silent(self, input: WorkerInput, window: timedelta) -> None:
        """No heartbeat for the window, its Job still running: out of placement until heard."""
        self._silent = True
        self._set(input, "available")
        pool = workflow.get_external_workflow_handle(pool_workflow_id(input.pool_name))
        with contextlib.suppress(FailureError):
            await pool.signal("worker_silent", input.worker_id)
        workflow.logger.warning(
            "worker silent: out of placement until it is heard again",
            extra={
                KV_EXTRA: {
                    "worker_id": input.worker_id,
                    "pool_name": input.pool_name,
                    "silent_s": int(window.total_seconds()),
                }
            },
        )

    async def _heard_again(self, input: WorkerInput) -> None:
        self._silent = False
        self._set(input, "available")
        await self._announce(input)  # back in placement, its card ledger kept by the pool
        workflow.logger.info(
            "worker heard again: back in placement",
            extra={KV_EXTRA: {"worker_id": input.worker_id, "pool_name": input.pool_name}},
        )

    async def _leave_placement(self, input: WorkerInput) -> None:
        if self._registration is not None:
            pool = workflow.get_external_workflow_handle(pool_workflow_id(input.pool_name))
            with contextlib.suppress(FailureError):
                await pool.signal("worker_gone", input.worker_id)

    async def _stopped(self, input: WorkerInput, job: WorkerJobInput) -> WorkerRecord:
        request = self._stop_request
        return await self._end(
            input, "stopped", request.reason, job if request.delete_job else None
        )

    def _idle_since(self) -> datetime | None:
        return self._idle_from

    def _set(
        self,
        input: WorkerInput,
        state: str,
        reason: str | None = None,
        condition: str | None = None,
    ) -> None:
        registration = self._registration
        beat = self._beat
        if condition is None and self._silent and state == "available":
            condition = SILENT
        if condition is None and self._drain_told and state == "available":
            condition = DRAINING
        self._record = WorkerRecord(
            pool_name=input.pool_name,
            node_name=input.node_name,
            worker_id=input.worker_id,
            job_name=worker_job_name(input.pool_name, input.worker_id),
            gpus=input.gpus,
            state=state,
            created_at=self._record.created_at if self._record else workflow.now(),
            reason=reason,
            condition=condition,
            address=registration.address if registration else None,
            task_queue=registration.task_queue if registration else None,
            replica_address=registration.replica_address if registration else None,
            tls=registration.tls if registration else False,
            visible_devices=registration.visible_devices if registration else (),
            checkpoint=registration.checkpoint if registration else "",
            last_heartbeat=self._beat_at,
            idle_since=self._idle_since() if registration else None,
            running_tasks=beat.running_tasks if beat else 0,
        )
        # The controlplane starts every record with WorkerState set; one started without it
        # (a namespace without the attribute, the time-skipping test server) keeps the memo only.
        started_with_state = workflow.info().typed_search_attributes.get(WORKER_STATE) is not None
        if state != self._published_state and started_with_state:
            workflow.upsert_search_attributes([WORKER_STATE.value_set(state)])
            self._published_state = state
        workflow.upsert_memo({"record": self._record.model_dump(mode="json")})

    async def _end(
        self, input: WorkerInput, state: str, reason: str, job: WorkerJobInput | None
    ) -> WorkerRecord:
        # Out of placement before its Job goes, so that nothing is placed on a worker that is
        # leaving (a task placed on it meanwhile finds it ended and is placed again).
        await self._leave_placement(input)
        if job is not None:
            await workflow.execute_activity_method(
                KubeActivities.delete_worker_job,
                job,
                start_to_close_timeout=KUBE_TIMEOUT,
                retry_policy=KUBE_RETRY,
                summary=f"delete worker Job ({state}: {reason})",
            )
        self._set(input, state, reason)
        workflow.logger.info(
            "worker record ended",
            extra={
                KV_EXTRA: {
                    "worker_id": input.worker_id,
                    "state": state,
                    "reason": reason,
                    "pool_name": input.pool_name,
                }
            },
        )
        machine = workflow.get_external_workflow_handle(
            machine_workflow_id(input.pool_name, input.node_name)
        )
        # The machine may be gone; its next incarnation counts workers from the cluster.
        with contextlib.suppress(FailureError):
            await machine.signal("worker_ended", input.worker_id)
        assert self._record is not None
        return self._record


def job_failure(pod: PodState) -> str:
    """An available worker's end reason when its Job finished, with the agent's exit."""
    detail = pod.message or "the worker pod failed"
    if pod.exit_code is not None:
        detail += f" (exit code {pod.exit_code})"
    return f"its Job failed: {detail}"
