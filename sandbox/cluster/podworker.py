"""One pod's life on its node, as the kubelet's pod worker lives it.

Admitted (by the kubelet, which also assigns its GPUs), the pod gets its IP and start time,
then each container its image: present images pull after the scenario's delay; absent ones
show `ErrImagePull`, then `ImagePullBackOff`, and are retried with the kubelet's doubling
back-off, so an image added meanwhile gets pulled. Init containers run in order, then the
containers start. A container of a process image runs its command as a local process (see
`runtime` and `podenv`); any other image runs until the pod is deleted. Exits follow the
restart policy (`CrashLoopBackOff` between restarts); a pod whose containers are all done
ends Succeeded or Failed and gives back its cards and its IP.

Deletion (a `deletionTimestamp`, or the object gone) stops the containers: SIGTERM to each
process group, SIGKILL once the grace period is over; the kubelet then confirms with a
grace-0 delete, which removes the pod object.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from levers9.logs import get_logger
from sandbox import errors
from sandbox.cluster import podenv, podstatus
from sandbox.cluster.images import PROCESS_TASKS_ENV
from sandbox.cluster.objects import Obj, is_terminal, meta, name_of, namespace_of, uid_of
from sandbox.cluster.runtime import ContainerProcess, StartError
from sandbox.options import DeleteOptions
from sandbox.resources import PODS
from sandbox.store import rfc3339

if TYPE_CHECKING:
    from sandbox.cluster.kubelet import Kubelet

log = get_logger("sandbox.kubelet")

_STATUS_RETRIES = 5
_UNKNOWN = MappingProxyType(
    {
        "exitCode": 137,
        "reason": "ContainerStatusUnknown",
        "message": "The container could not be located when the pod was terminated",
    }
)


class PodWorker:
    """Runs one pod (see module doc); `update` feeds it the pod as the API changes it."""

    def __init__(self, kubelet: Kubelet, pod: Obj) -> None:
        self._kubelet = kubelet
        self.uid = uid_of(pod)
        self.namespace = namespace_of(pod)
        self.name = name_of(pod)
        self._pod = pod
        self._stop = asyncio.Event()
        self._grace_s = float((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        self._removed = False
        self._terminal = is_terminal(pod)
        self._processes: dict[str, ContainerProcess] = {}
        self._init: dict[str, dict[str, Any]] = {}
        self._main: dict[str, dict[str, Any]] = {}
        self._pod_ip: str | None = None
        self._start_time: str | None = None
        self.task: asyncio.Task[None] | None = None

    @property
    def terminal(self) -> bool:
        return self._terminal

    @property
    def _spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self._pod.get("spec") or {}
        return spec

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"pod {self.namespace}/{self.name}")

    def update(self, pod: Obj) -> None:
        self._pod = pod
        grace = meta(pod).get("deletionGracePeriodSeconds")
        if meta(pod).get("deletionTimestamp"):
            self.request_stop(None if grace is None else float(grace))

    def removed(self) -> None:
        """The pod object is gone (force-deleted, or confirmed): stop without confirming."""
        self._removed = True
        # A pod removed without going through graceful deletion still gets the kubelet's
        # minimum grace before SIGKILL.
        self.request_stop(min(self._grace_s, 1.0))

    def request_stop(self, grace_s: float | None) -> None:
        if grace_s is not None and (not self._stop.is_set() or grace_s < self._grace_s):
            self._grace_s = grace_s
        self._stop.set()

    async def abandon(self, grace_s: float) -> None:
        """The node is going away: stop the processes, write nothing more."""
        self._removed = True
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        await asyncio.gather(*(p.stop(grace_s) for p in self._processes.values()))
        self._release()

    # -- the life --------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._live()
        except Exception:
            # A bug here must not leave processes running behind a pod nobody tends.
            log.exception("pod worker failed", pod=f"{self.namespace}/{self.name}")
            await asyncio.gather(*(p.stop(self._grace_s) for p in self._processes.values()))
            self._processes.clear()
            self._release()

    async def _live(self) -> None:
        if not self._terminal:
            self._start_time = rfc3339(self._kubelet.registry.store.now())
            self._pod_ip = self._kubelet.assign_ip(self.uid, self._spec)
            self._prepare_statuses()
            self._publish()
            if await self._run_init_containers():
                await asyncio.gather(*(self._run_container(c) for c in self._spec["containers"]))
            await self._terminate()
        await self._stop.wait()
        self._confirm_deletion()
        shutil.rmtree(self._kubelet.pod_dir(self.uid), ignore_errors=True)

    def _prepare_statuses(self) -> None:
        for group, target in (("initContainers", self._init), ("containers", self._main)):
            for container in self._spec.get(group) or ():
                target[container["name"]] = {
                    "name": container["name"],
                    "state": {
                        "waiting": {
                            "reason": "PodInitializing"
                            if group == "containers" and self._spec.get("initContainers")
                            else "ContainerCreating"
                        }
                    },
                    "lastState": {},
                    "ready": False,
                    "restartCount": 0,
                    "image": container.get("image", ""),
                    "imageID": "",
                    "started": False,
                }

    async def _run_init_containers(self) -> bool:
        for container in self._spec.get("initContainers") or ():
            status = self._init[container["name"]]
            while True:
                code = await self._run_once(container, status, init=True)
                if code is None:
                    return False
                if code == 0:
                    break
                if self._spec.get("restartPolicy") == "Never":
                    return False
                if not await self._crash_backoff(container, status):
                    return False
        return True

    async def _run_container(self, container: dict[str, Any]) -> None:
        status = self._main[container["name"]]
        policy = self._spec.get("restartPolicy", "Always")
        while True:
            code = await self._run_once(container, status, init=False)
            if code is None:
                return
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                return
            if not await self._crash_backoff(container, status):
                return

    async def _run_once(
        self, container: dict[str, Any], status: dict[str, Any], *, init: bool
    ) -> int | None:
        """Pulls, starts and waits for one run; the exit code, or None when stopping."""
        if not await self._pull(container, status):
            return None
        process_image = self._kubelet.images.process_image(container["image"])
        if process_image is None:
            return await self._run_pseudo(container, status, init=init)
        launch = await self._configure(container, status)
        if launch is None:
            return None
        name = container["name"]
        started = rfc3339(self._kubelet.registry.store.now())
        container_id = f"containerd://{secrets.token_hex(32)}"
        events = self._kubelet.events
        events.normal(self._pod, "Created", f"Created container: {name}")
        try:
            process = await ContainerProcess.start(
                launch.argv,
                launch.env,
                launch.cwd,
                lambda text: self._kubelet.logs.write(self.namespace, self.name, name, text),
            )
        except StartError as error:
            events.warning(self._pod, "Failed", f"Error: {error}")
            self._terminated(status, 128, "StartError", started, container_id, str(error))
            return 128
        self._processes[name] = process
        events.normal(self._pod, "Started", f"Started container {name}")
        status["state"] = {"running": {"startedAt": started}}
        status.update(ready=not init, started=True, containerID=container_id)
        self._publish()
        exit_wait = asyncio.ensure_future(process.wait())
        stop_wait = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({exit_wait, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()
            exited = exit_wait.done()
            if not exited:
                exit_wait.cancel()
        if not exited:
            return None  # `_terminate` stops the process within the grace period
        del self._processes[name]
        self._kubelet.logs.finish(self.namespace, self.name, name)
        code = exit_wait.result()
        self._terminated(status, code, "Completed" if code == 0 else "Error", started, container_id)
        return code

    async def _run_pseudo(
        self, container: dict[str, Any], status: dict[str, Any], *, init: bool
    ) -> int | None:
        """An image the sandbox does not execute: it starts, and runs until the pod stops
        (an init container of one completes at once, or the pod would never start)."""
        started = rfc3339(self._kubelet.registry.store.now())
        container_id = f"containerd://{secrets.token_hex(32)}"
        self._kubelet.events.normal(self._pod, "Created", f"Created container: {container['name']}")
        self._kubelet.events.normal(self._pod, "Started", f"Started container {container['name']}")
        if init:
            self._terminated(status, 0, "Completed", started, container_id)
            return 0
        status["state"] = {"running": {"startedAt": started}}
        status.update(ready=True, started=True, containerID=container_id)
        self._publish()
        await self._stop.wait()
        return None

    def _terminated(
        self,
        status: dict[str, Any],
        code: int,
        reason: str,
        started: str,
        container_id: str,
        message: str | None = None,
    ) -> None:
        state: dict[str, Any] = {"exitCode": code, "reason": reason}
        if message:
            state["message"] = message
        state.update(
            startedAt=started,
            finishedAt=rfc3339(self._kubelet.registry.store.now()),
            containerID=container_id,
        )
        status["state"] = {"terminated": state}
        status.update(ready=False, started=False, containerID=container_id)
        self._publish()

    async def _pull(self, container: dict[str, Any], status: dict[str, Any]) -> bool:
        image = str(container.get("image", ""))
        pulled = await self._kubelet.puller.pull(
            self._pod,
            image,
            str(container.get("imagePullPolicy", "IfNotPresent")),
            lambda reason, message: self._waiting(status, reason, message),
            self._sleep,
        )
        if pulled is None:
            return False
        status["imageID"] = pulled
        return True

    async def _configure(self, container: dict[str, Any], status: dict[str, Any]) -> _Launch | None:
        """Volumes, environment, argv and working directory, retried while a Secret,
        ConfigMap or host path is missing; None when stopping."""
        kubelet = self._kubelet
        attempt = 0
        while not self._stop.is_set():
            ctx = podenv.PodContext(
                kubelet.registry,
                self._pod,
                kubelet.node_object(),
                kubelet.root,
                kubelet.pod_dir(self.uid),
                kubelet.api_address,
            )
            try:
                mounts = podenv.volume_mounts(ctx, container)
                env = podenv.container_env(ctx, container, mounts)
            except podenv.MountError as error:
                self._kubelet.events.warning(self._pod, "FailedMount", str(error))
                self._waiting(status, "ContainerCreating", None)
            except podenv.ConfigError as error:
                self._kubelet.events.warning(self._pod, "Failed", f"Error: {error}")
                self._waiting(status, "CreateContainerConfigError", str(error))
            else:
                env.update(kubelet.device_env(self.uid, container["name"]))
                if kubelet.images.process_tasks:
                    env.update(PROCESS_TASKS_ENV)
                scratch = kubelet.pod_dir(self.uid) / "containers" / container["name"]
                scratch.mkdir(parents=True, exist_ok=True)
                env.setdefault("HOME", str(scratch))
                image = kubelet.images.process_image(container["image"])
                assert image is not None
                argv = [
                    podenv.expand(a, env)
                    for a in image.argv(container.get("command") or (), container.get("args"))
                ]
                return _Launch(argv, env, podenv.working_dir(container, mounts, scratch))
            backoff = kubelet.timing.backoff(
                kubelet.timing.image_pull_backoff_seconds,
                kubelet.timing.image_pull_backoff_max_seconds,
                attempt,
            )
            attempt += 1
            if await self._sleep(backoff):
                return None
        return None

    async def _crash_backoff(self, container: dict[str, Any], status: dict[str, Any]) -> bool:
        timing = self._kubelet.timing
        delay = timing.backoff(
            timing.crash_loop_backoff_seconds,
            timing.crash_loop_backoff_max_seconds,
            status["restartCount"],
        )
        status["lastState"] = status["state"]
        status["restartCount"] += 1
        name = container["name"]
        self._waiting(
            status,
            "CrashLoopBackOff",
            f"back-off {delay:g}s restarting failed container={name} "
            f"pod={self.name}_{self.namespace}({self.uid})",
        )
        self._kubelet.events.warning(
            self._pod,
            "BackOff",
            f"Back-off restarting failed container "
            f"{name} in pod {self.name}_{self.namespace}({self.uid})",
        )
        return not await self._sleep(delay)

    def _waiting(self, status: dict[str, Any], reason: str, message: str | None) -> None:
        waiting = {"reason": reason} if message is None else {"reason": reason, "message": message}
        status["state"] = {"waiting": waiting}
        status.update(ready=False, started=False)
        self._publish()

    async def _sleep(self, seconds: float) -> bool:
        """Waits `seconds`; True when the pod is told to stop meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), max(seconds, 0))
        return self._stop.is_set()

    async def _terminate(self) -> None:
        """Stops what still runs, records how every container ended, and releases the pod's
        cards and IP."""
        grace = self._grace_s
        running = dict(self._processes)
        for name, status in self._main.items():
            if "running" in status["state"]:
                self._kubelet.events.normal(self._pod, "Killing", f"Stopping container {name}")
        if running:
            codes = await asyncio.gather(*(p.stop(grace) for p in running.values()))
            for name, code in zip(running, codes, strict=True):
                self._processes.pop(name, None)
                self._kubelet.logs.finish(self.namespace, self.name, name)
                status = self._main.get(name) or self._init[name]
                state = status["state"].get("running") or {}
                self._terminated(
                    status,
                    code,
                    "Completed" if code == 0 else "Error",
                    state.get("startedAt", ""),
                    status.get("containerID", ""),
                )
        now = rfc3339(self._kubelet.registry.store.now())
        for status in self._main.values():
            state = status["state"]
            if "running" in state:  # a pseudo container: it shuts down cleanly
                self._terminated(
                    status,
                    0,
                    "Completed",
                    state["running"]["startedAt"],
                    status.get("containerID", ""),
                )
            elif "waiting" in state and self._stop.is_set():
                status["state"] = {"terminated": {**_UNKNOWN, "finishedAt": now}}
        self._terminal = True
        self._release()
        self._publish()

    def _release(self) -> None:
        self._kubelet.release(self.uid)

    def _confirm_deletion(self) -> None:
        if self._removed:
            return
        self._removed = True
        options = DeleteOptions(grace_period_seconds=0, precondition_uid=self.uid)
        try:
            self._kubelet.registry.delete(PODS, self.namespace, self.name, options)
        except errors.ApiError as error:
            if error.code not in (404, 409):
                raise

    # -- status ------------------------------------------------------------------------------

    def _publish(self) -> None:
        """Writes the status the worker knows, if it differs from the stored one."""
        if self._removed:
            return
        registry = self._kubelet.registry
        for _ in range(_STATUS_RETRIES):
            pod = registry.find(PODS, self.namespace, self.name)
            if pod is None or uid_of(pod) != self.uid:
                return
            status = self._status(pod.get("status") or {})
            if status == pod.get("status"):
                return
            pod["status"] = status
            try:
                self._pod = registry.replace(PODS, pod, subresource="status")
                return
            except errors.ApiError as error:
                if error.code == 404:
                    return
                if error.code != 409:
                    raise

    def _status(self, existing: dict[str, Any]) -> dict[str, Any]:
        spec = self._spec
        return podstatus.pod_status(
            existing,
            spec,
            [self._init[c["name"]] for c in spec.get("initContainers") or ()],
            [self._main[c["name"]] for c in spec.get("containers") or ()],
            terminal=self._terminal,
            host_ip=self._kubelet.host_ip,
            pod_ip=self._pod_ip,
            start_time=self._start_time,
            now=rfc3339(self._kubelet.registry.store.now()),
        )


@dataclass(frozen=True)
class _Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: Path
