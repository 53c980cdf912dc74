"""The runtime registry: the pool's `runtime` setting (the Job's `LEVERS9_RUNTIME`) names the
factory that builds what runs this worker's tasks (`runtime.Runtime`); the pool's `runtimes`
(`LEVERS9_RUNTIMES`) the others it offers, which a task names (`levers9 run --runtime`).

What a task that names no image gets (after the pool's `taskDefaults.image`, which the agent
applies first) is each entry's own, written choice, not a fallback:

- `runc` (the default): a task runs in its image under runc (`runc_runtime`); one that names
  none has the pool's `taskDefaults.image`, else the worker's own image (the Job's
  `LEVERS9_WORKER_IMAGE`), so no task runs outside a container. A worker that cannot run
  images (no `imagesPath`, runc, umoci or skopeo missing, not root) still starts: its tasks
  fail to start and say why.
- `process`: the agent's own tests' runtime, never a pool's (the values refuse it) and taken
  only under their knob (`LEVERS9_PROCESS_TASKS`, which no Job sets): every task runs as a
  child process of the agent (`process_runtime`), without an image and not isolated from it;
  under that knob a runc worker's tasks that name no image run so too.
- `runsc`: a task runs in its image in a gVisor sandbox (`runsc_runtime`); one with none, or
  one asking for cards or ports (which this gVisor cannot give), is refused at start naming
  the fix. A worker without runsc (or without images) still starts; its runsc tasks fail to
  start and say why.

runc and runsc share the node's image cache (one pull per digest whichever runs it).
A new runtime is one factory here and its name in `levers9.contract.RUNTIMES` (which the values
check the pool's setting against).
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from levers9.agent.cdi import DRIVER_ROOT
from levers9.agent.disks import DiskStore
from levers9.agent.driver import DriverSetup
from levers9.agent.id_ranges import IdRanges
from levers9.agent.images import ImageCache
from levers9.agent.paths import HostPaths
from levers9.agent.process_runtime import ProcessRuntime
from levers9.agent.runc_runtime import RuncRuntime
from levers9.agent.runsc_runtime import RunscRuntime
from levers9.agent.runtime import ByImage, ByRuntime, Container, ContainerSpec, Runtime, StartError
from levers9.agent.seccomp import SeccompProfileError, load_profile
from levers9.agent.settings import PREFIX, SettingsError, WorkerSettings
from levers9.agent.task_network import TaskNetworks
from levers9.agent.task_storage import TaskStorage
from levers9.contract import runtime_problem
from levers9.logs import get_logger

log = get_logger("levers9.agent")


@dataclass(frozen=True)
class RuntimeContext:
    """What the agent found at start, which a factory builds its runtime from."""

    settings: WorkerSettings
    paths: HostPaths
    env: Mapping[str, str]
    """The agent's environment (a process task inherits a few neutral variables of it)."""
    driver: DriverSetup
    work_dir: Path
    cards: Sequence[int]
    """The node indices of this worker's cards."""

    @functools.cached_property
    def images(self) -> tuple[ImageCache | None, str]:
        """The node's image cache, one for every runtime of this worker, or None and why this
        worker cannot run images (no imagesPath, a tool missing, not root)."""
        settings, paths = self.settings, self.paths
        if not settings.images_path:
            return None, "the Job sets no LEVERS9_IMAGES_PATH (the pool's imagesPath)"
        for tool in ("umoci", "skopeo"):
            if shutil.which(tool) is None:
                return None, f"{tool} is not installed in the worker image"
        if os.geteuid() != 0:
            return (
                None,
                f"containers need root; the worker runs as uid {os.geteuid()} (its Job is"
                " privileged)",
            )
        cache = ImageCache(
            paths.map(settings.images_path),
            max_bytes=settings.image_cache_bytes,
            mirrors=settings.mirrors(),
            insecure=sorted(settings.insecure()),
        )
        log.info(
            "image cache ready",
            images_path=settings.images_path,
            cached=len(cache.cached()),
            max_bytes=settings.image_cache_bytes,
        )
        return cache, ""

    @functools.cached_property
    def storage(self) -> TaskStorage:
        """The tasks' volumes (under the work dir) and durable disks (under the pool's
        durableDisksPath, when the Job gives one), one for every runtime of this worker."""
        path = self.settings.durable_disks_path
        disks = DiskStore(self.paths.map(path)) if path else None
        return TaskStorage(self.work_dir / "volumes", disks)

    @functools.cached_property
    def processes(self) -> ProcessRuntime:
        """The one process runtime of this worker (its tasks without images, as runc runs them)."""
        return ProcessRuntime(self.driver, self.env, self.work_dir / "processes")


RuntimeFactory = Callable[[RuntimeContext], Runtime]
"""Builds a runtime; raises a StartupError (`CdiError`, `SettingsError`) when it cannot."""


class Unavailable:
    """A runtime this worker offers but cannot run: its tasks fail to start saying why."""

    def __init__(self, host: str, why: str) -> None:
        self.host = host
        self._why = why

    def host_for(self, image: str, runtime: str = "") -> str:
        return self.host

    async def start(self, spec: ContainerSpec, output: Callable[[bytes], None]) -> Container:
        raise StartError(f"this worker cannot run {self.host} tasks: {self._why}")

    async def exec(
        self, container: Container, command: Sequence[str], terminal: int | None = None
    ) -> asyncio.subprocess.Process:
        raise StartError(f"this worker cannot run {self.host} tasks: {self._why}")

    async def adopt(
        self, task_id: str, output: Callable[[bytes], None], offset: int
    ) -> Container | None:
        return None

    async def sweep(self, keep: Collection[str]) -> list[str]:
        return []


def process(context: RuntimeContext) -> Runtime:
    if not context.settings.process_tasks:
        raise SettingsError(
            f"{PREFIX}RUNTIME=process runs tasks outside any container: only the agent's own"
            f" tests take it, with {PREFIX}PROCESS_TASKS set (the pool's runtime, config.worker"
            f".pools.{context.settings.pool_name}.runtime, is runc or runsc)"
        )
    return ByImage(
        context.processes,
        None,
        f"the pool's runtime is process (config.worker.pools.{context.settings.pool_name}"
        ".runtime): its tasks run as processes of the worker, without images; set runtime: runc"
        " to run images",
    )


def runc(context: RuntimeContext) -> Runtime:
    images, unavailable = _runc(context)
    processes = context.processes if context.settings.process_tasks else None
    return ByImage(processes, images, unavailable)


def _runc(context: RuntimeContext) -> tuple[RuncRuntime | None, str]:
    """The runc runtime over the node's image cache, or None and why there is none.
    CdiError (a StartupError) when the cards' CDI spec cannot be generated."""
    cache, unavailable = context.images
    if cache is None:
        return None, unavailable
    for tool in ("runc", "slirp4netns", "nft"):
        if shutil.which(tool) is None:
            return None, f"{tool} is not installed in the worker image"
    runtime = RuncRuntime(
        cache,
        context.work_dir / "runc",
        dev_root=context.paths.map("/dev"),
        driver_root=context.paths.map(DRIVER_ROOT),
        cards=context.cards,
        networks=_networks(context),
        storage=context.storage,
        seccomp_profile=_seccomp_profile(context),
        # The node's: every agent of the node takes its tasks' id ranges from the same slots.
        id_ranges=IdRanges(cache.root / "userns"),
    )
    log.info("CDI spec written", path=str(runtime.cdi_spec), devices=len(context.cards))
    return runtime, ""


def _seccomp_profile(context: RuntimeContext) -> Path | None:
    """The pool's `taskSeccompProfile` (None: the default), checked here: SettingsError naming
    the setting when it is not a profile."""
    settings = context.settings
    if not settings.task_seccomp_profile:
        return None
    path = context.paths.map(settings.task_seccomp_profile)
    try:
        load_profile(path)
    except SeccompProfileError as error:
        raise SettingsError(
            f"{PREFIX}TASK_SECCOMP_PROFILE (the pool's taskSeccompProfile, config.worker.pools."
            f"{settings.pool_name}.taskSeccompProfile): {error}"
        ) from None
    log.info("task seccomp profile", path=settings.task_seccomp_profile)
    return path


def _networks(context: RuntimeContext) -> TaskNetworks:
    """The tasks' own networks: what the pool allows them (`taskNetwork.allow`), the node's
    addresses refused (its IP too when the agent is on the pod network). SettingsError."""
    settings = context.settings
    allowed = settings.task_network_allowed()
    node = (settings.host_ip, settings.advertised_host)
    log.info("task networks", allow=[str(n) for n in allowed], node=[a for a in node if a])
    return TaskNetworks(context.work_dir / "networks", allow=allowed, node=node)


def runsc(context: RuntimeContext) -> Runtime:
    cache, unavailable = context.images
    if cache is None:
        return Unavailable("runsc", unavailable)
    if shutil.which("runsc") is None:
        return Unavailable("runsc", "runsc (gVisor) is not installed in the worker image")
    return RunscRuntime(
        cache,
        context.work_dir / "runsc",
        storage=context.storage,
        dev_root=context.paths.map("/dev"),
        driver_root=context.paths.map(DRIVER_ROOT),
    )


RUNTIMES: Mapping[str, RuntimeFactory] = {"process": process, "runc": runc, "runsc": runsc}


def factory(settings: WorkerSettings) -> RuntimeFactory:
    """The factory of the pool's runtimes: its `runtime` (what a task that names none runs in)
    and the others it offers (`runtimes`), each task in the one it names. SettingsError naming
    the setting and the names this agent knows when one is none of them."""
    for variable, setting, names in (
        ("RUNTIME", "runtime", (settings.runtime,)),
        ("RUNTIMES", "runtimes", settings.offered_runtimes()),
    ):
        for name in names:
            problem = runtime_problem(name)
            if problem is None and name not in RUNTIMES:
                problem = f"{name} has no factory in this agent"  # the contract names one not built
            if problem is not None:
                raise SettingsError(
                    f"{PREFIX}{variable} (the pool's {setting}, config.worker.pools."
                    f"{settings.pool_name}.{setting}): {problem}"
                )
    offered = settings.offered_runtimes()

    def build(context: RuntimeContext) -> Runtime:
        return ByRuntime({name: RUNTIMES[name](context) for name in offered}, settings.runtime)

    return build
