"""The Job controller (batch/v1), for NonIndexed Jobs, with the tracking of kube 1.26+.

Pods are made from `spec.template` as `<job>-<5 random>` with the Job's labels, a controller
reference and the `batch.kubernetes.io/job-tracking` finalizer. A pod that finishes is first
listed in `status.uncountedTerminatedPods`, then its finalizer is removed, then it is counted
in `succeeded`/`failed`, so a pod deleted right after it ended is still counted (and a pod
deleted while running counts as failed, as with `podReplacementPolicy: TerminatingOrFailed`).

Active pods are kept at `parallelism` (bounded by the completions still missing); a failed
pod is replaced after a back-off that doubles per failure, until failures exceed
`backoffLimit`: then `FailureTarget`, the active pods are deleted, and `Failed`
(`BackoffLimitExceeded`) once none is left. `activeDeadlineSeconds` ends a Job the same way
(`DeadlineExceeded`). Enough successes give `SuccessCriteriaMet`, then `Complete` with
`completionTime`. `suspend` deletes the active pods. `ttlSecondsAfterFinished` deletes a
finished Job (in the foreground, as the TTL controller does). Indexed Jobs and pod failure
policies are not emulated.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sandbox import errors
from sandbox.cluster.controller import Controller, Watched
from sandbox.cluster.events import EventRecorder
from sandbox.cluster.objects import (
    Obj,
    condition,
    condition_true,
    is_active,
    is_terminal,
    is_terminating,
    meta,
    name_of,
    owner_reference,
    phase_of,
    pod_ready,
    set_condition,
    uid_of,
)
from sandbox.cluster.owned import create_pod, delete_pod, owned, owners_named
from sandbox.options import DeleteOptions
from sandbox.patch import PatchType
from sandbox.resources import JOBS, PODS
from sandbox.scenario import Timing
from sandbox.store import StoredEvent, rfc3339

if TYPE_CHECKING:
    from sandbox.registry import Registry

TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
Key = tuple[str, str, str]  # ("job" | "pod", namespace, name)

_COMPLETED = ("CompletionsReached", "Reached expected number of succeeded pods")
_BACKOFF = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
_DEADLINE = ("DeadlineExceeded", "Job was active longer than specified deadline")
_TARGET_OF = {"Failed": "FailureTarget", "Complete": "SuccessCriteriaMet"}
"""The condition each end of a Job is set as first, while its pods still stop."""


def _finished_as(pod: Obj) -> str | None:
    """ "succeeded", "failed" (Failed, or deleted before it succeeded), or None (still on)."""
    phase = phase_of(pod)
    if phase == "Succeeded":
        return "succeeded"
    if phase == "Failed" or is_terminating(pod):
        return "failed"
    return None


def _parse(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


class JobController(Controller[Key]):
    name = "job-controller"

    def __init__(self, registry: Registry, timing: Timing) -> None:
        super().__init__(registry, timing.resync_seconds)
        self._timing = timing
        self._events = EventRecorder(registry, "job-controller")
        self._failed_at: dict[str, tuple[int, float]] = {}  # job uid -> (failures, loop time)

    def watched(self) -> list[Watched]:
        return [Watched(JOBS, self._on_job), Watched(PODS, self._on_pod)]

    def resync_keys(self) -> Iterable[Key]:
        for job in self.registry.list(JOBS).items():
            yield ("job", job["metadata"]["namespace"], name_of(job))

    def _on_job(self, event: StoredEvent) -> None:
        if event.type == "DELETED":
            self._failed_at.pop(event.uid, None)
        self.queue.add(("job", event.namespace, event.name))

    def _on_pod(self, event: StoredEvent) -> None:
        pod = event.object()
        for name in owners_named(pod, "Job"):
            self.queue.add(("job", event.namespace, name))
        if event.type != "DELETED" and TRACKING_FINALIZER in (meta(pod).get("finalizers") or ()):
            self.queue.add(("pod", event.namespace, event.name))

    def reconcile(self, key: Key) -> float | None:
        kind, namespace, name = key
        if kind == "pod":
            self._release_orphan(namespace, name)
            return None
        job = self.registry.find(JOBS, namespace, name)
        if job is None:
            return None
        pods = owned(self.registry, PODS, job)
        if is_terminating(job):
            for pod in pods:
                self._release(pod)
            return None
        return self._sync(job, pods)

    # -- one Job -----------------------------------------------------------------------------

    def _sync(self, job: Obj, pods: list[Obj]) -> float | None:
        spec = job.get("spec") or {}
        status = copy.deepcopy(job.get("status") or {})
        now = rfc3339(self.registry.store.now())
        job = self._track(job, status, pods)
        if _is_finished(status):
            for pod in pods:
                self._release(pod)
            return self._expire(job, status)
        suspended = bool(spec.get("suspend"))
        if not suspended and not status.get("startTime"):
            status["startTime"] = now
        active = [p for p in pods if is_active(p)]
        terminating = [p for p in pods if is_terminating(p) and not is_terminal(p)]
        # Pods listed as uncounted have finished: they count toward the decisions already.
        uncounted = status.get("uncountedTerminatedPods") or {}
        succeeded = int(status.get("succeeded", 0)) + len(uncounted.get("succeeded", ()))
        failed = int(status.get("failed", 0)) + len(uncounted.get("failed", ()))
        completions = spec.get("completions")
        conditions = status.setdefault("conditions", [])
        again: float | None = None
        ending = self._ending(job, status, failed)
        if ending is not None:
            if self._finish(job, status, active, terminating, now, "Failed", ending):
                self._events.warning(job, ending[0], ending[1])
            active = []
        elif (completions is not None and succeeded >= int(completions)) or (
            completions is None and succeeded > 0 and not active
        ):
            if self._finish(job, status, active, terminating, now, "Complete", _COMPLETED):
                status["completionTime"] = now
                self._events.normal(job, "Completed", "Job completed")
            active = []
        else:
            wanted = 0 if suspended else int(spec.get("parallelism", 1))
            if completions is not None:
                wanted = min(wanted, int(completions) - succeeded)
            elif succeeded:
                wanted = len(active)  # a work queue: once one succeeded, the rest finish
            if suspended and active:
                set_condition(
                    conditions,
                    "Suspended",
                    "True",
                    now,
                    reason="JobSuspended",
                    message="Job suspended",
                )
            elif not suspended and condition_true(job, "Suspended"):
                set_condition(
                    conditions,
                    "Suspended",
                    "False",
                    now,
                    reason="JobResumed",
                    message="Job resumed",
                )
            if len(active) > wanted:
                surplus = sorted(active, key=lambda p: p["metadata"]["creationTimestamp"])
                self._delete_pods(job, surplus[wanted:])
                active = surplus[:wanted]
            elif len(active) < wanted:
                wait = self._backoff_left(job, failed)
                if wait > 0:
                    again = wait
                else:
                    active += [self._create_pod(job) for _ in range(wanted - len(active))]
            deadline = spec.get("activeDeadlineSeconds")
            started = _parse(status.get("startTime"))
            if deadline is not None and started is not None and not suspended:
                left = started.timestamp() + int(deadline) - self.registry.store.now().timestamp()
                again = left if again is None else min(again, left)
        status["active"] = len(active)
        status["ready"] = sum(1 for p in active if pod_ready(p))
        status["terminating"] = len(terminating)
        status.setdefault("succeeded", 0)
        status.setdefault("failed", 0)
        status.setdefault("uncountedTerminatedPods", {})
        if not conditions:
            status.pop("conditions")
        self._write(job, status)
        return None if again is None else max(again, 0.01)

    def _track(self, job: Obj, status: dict[str, Any], pods: list[Obj]) -> Obj:
        """uncounted ← newly finished pods; finalizers off; counters ← uncounted."""
        uncounted = status.setdefault("uncountedTerminatedPods", {})
        listed = {uid for uids in uncounted.values() for uid in uids}
        fresh = [
            (pod, outcome)
            for pod in pods
            if TRACKING_FINALIZER in (meta(pod).get("finalizers") or ())
            and (outcome := _finished_as(pod)) is not None
            and uid_of(pod) not in listed
        ]
        if fresh:
            for pod, outcome in fresh:
                uncounted.setdefault(outcome, []).append(uid_of(pod))
            job = self._write(job, status)
        released = {uid_of(pod) for pod, _ in fresh if self._release(pod)}
        by_uid = {uid_of(p): p for p in pods}
        for outcome in ("succeeded", "failed"):
            done = [
                u
                for u in uncounted.get(outcome, ())
                if u in released or not _tracked(by_uid.get(u))
            ]
            if not done:
                continue
            status[outcome] = int(status.get(outcome, 0)) + len(done)
            uncounted[outcome] = [u for u in uncounted[outcome] if u not in done]
            if not uncounted[outcome]:
                del uncounted[outcome]
            if outcome == "failed":
                loop = asyncio.get_running_loop()
                self._failed_at[uid_of(job)] = (status["failed"], loop.time())
        return job

    def _finish(
        self,
        job: Obj,
        status: dict[str, Any],
        active: list[Obj],
        terminating: list[Obj],
        now: str,
        final: str,
        why: tuple[str, str],
    ) -> bool:
        """The Job's end in the controller's two steps: its target condition (FailureTarget
        before Failed, SuccessCriteriaMet before Complete) with its active pods deleted, then
        `final` once no pod is terminating or uncounted. True when `final` is set now."""
        conditions = status.setdefault("conditions", [])
        reason, message = why
        target = _TARGET_OF[final]
        set_condition(conditions, target, "True", now, reason=reason, message=message)
        self._delete_pods(job, active)
        return (
            not terminating
            and not _uncounted(status)
            and set_condition(conditions, final, "True", now, reason=reason, message=message)
        )

    def _ending(self, job: Obj, status: dict[str, Any], failed: int) -> tuple[str, str] | None:
        target = condition(job, "FailureTarget")
        if target is not None and target.get("status") == "True":
            return str(target.get("reason")), str(target.get("message"))
        spec = job.get("spec") or {}
        if failed > int(spec.get("backoffLimit", 6)):
            return _BACKOFF
        deadline = spec.get("activeDeadlineSeconds")
        started = _parse(status.get("startTime"))
        if (
            deadline is not None
            and started is not None
            and not spec.get("suspend")
            and (self.registry.store.now() - started).total_seconds() >= int(deadline)
        ):
            return _DEADLINE
        return None

    def _backoff_left(self, job: Obj, failed: int) -> float:
        if failed == 0:
            return 0.0
        seen = self._failed_at.get(uid_of(job))
        if seen is None:
            return 0.0
        timing = self._timing
        delay = timing.backoff(
            timing.job_backoff_seconds, timing.job_backoff_max_seconds, failed - 1
        )
        return seen[1] + delay - asyncio.get_running_loop().time()

    def _create_pod(self, job: Obj) -> Obj:
        template = copy.deepcopy((job.get("spec") or {}).get("template") or {})
        tmeta = template.get("metadata") or {}
        namespace = meta(job)["namespace"]
        pod = {
            "metadata": {
                "generateName": f"{name_of(job)}-",
                "namespace": namespace,
                "labels": tmeta.get("labels") or {},
                "annotations": tmeta.get("annotations") or {},
                "ownerReferences": [owner_reference(JOBS, job)],
                "finalizers": [TRACKING_FINALIZER],
            },
            "spec": template.get("spec") or {},
        }
        if not pod["metadata"]["annotations"]:
            del pod["metadata"]["annotations"]
        return create_pod(self.registry, self._events, job, pod)

    def _delete_pods(self, job: Obj, pods: list[Obj]) -> None:
        for pod in pods:
            delete_pod(self.registry, self._events, job, pod)

    def _expire(self, job: Obj, status: dict[str, Any]) -> float | None:
        ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
        if ttl is None:
            return None
        finished = _parse(status.get("completionTime")) or _parse(
            (condition({"status": status}, "Failed") or {}).get("lastTransitionTime")
        )
        if finished is None:
            return None
        left = finished.timestamp() + int(ttl) - self.registry.store.now().timestamp()
        if left > 0:
            return left
        try:
            self.registry.delete(
                JOBS,
                meta(job)["namespace"],
                name_of(job),
                DeleteOptions(propagation_policy="Foreground", precondition_uid=uid_of(job)),
            )
        except errors.ApiError as error:
            if error.code not in (404, 409):
                raise
        return None

    def _write(self, job: Obj, status: dict[str, Any]) -> Obj:
        if status == (job.get("status") or {}):
            return job
        job["status"] = copy.deepcopy(status)
        updated: Obj = self.registry.replace(JOBS, job, subresource="status")
        return updated

    # -- finalizers --------------------------------------------------------------------------

    def _release(self, pod: Obj) -> bool:
        """Removes the tracking finalizer; whether the pod no longer carries it."""
        finalizers = meta(pod).get("finalizers") or []
        if TRACKING_FINALIZER not in finalizers:
            return True
        rest = [f for f in finalizers if f != TRACKING_FINALIZER]
        patch = {
            "metadata": {
                "finalizers": rest or None,
                "resourceVersion": meta(pod)["resourceVersion"],
            }
        }
        try:
            self.registry.patch(PODS, meta(pod)["namespace"], name_of(pod), patch, PatchType.MERGE)
        except errors.ApiError as error:
            if error.code != 404:
                raise  # 409: the pod moved on; the next look sees it as it is now
        return True

    def _release_orphan(self, namespace: str, name: str) -> None:
        """A tracked pod whose Job is gone (or is another Job now) keeps no finalizer."""
        pod = self.registry.find(PODS, namespace, name)
        if pod is None:
            return
        ref = next(
            (
                r
                for r in meta(pod).get("ownerReferences") or ()
                if r.get("controller") and r.get("kind") == "Job"
            ),
            None,
        )
        if ref is not None:
            job = self.registry.find(JOBS, namespace, str(ref.get("name")))
            if job is not None and uid_of(job) == ref.get("uid") and not is_terminating(job):
                return  # its Job tracks it
        self._release(pod)


def _tracked(pod: Obj | None) -> bool:
    return pod is not None and TRACKING_FINALIZER in (meta(pod).get("finalizers") or ())


def _uncounted(status: dict[str, Any]) -> bool:
    return any((status.get("uncountedTerminatedPods") or {}).values())


def _is_finished(status: dict[str, Any]) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in status.get("conditions") or ()
    )
