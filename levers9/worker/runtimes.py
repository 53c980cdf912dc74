"""The runtime registry: the pool's `runtime` setting (the Job's `LEVERS9_RUNTIME`) names the
factory that builds what runs this worker's tasks (`runtime.Runtime`).

What a task that names no image gets (after the pool's `taskDefaults.image`, which the agent
applies first) is each entry's own, written choice, not a fallback:

- `process`: every task runs as a child process of the agent (`process_runtime`), without an
  image and not isolated from the agent; a task that names an image is refused at start (so is
  every task of a pool that also sets `taskDefaults.image`: the values refuse that pair).
- `runc` (the default): a task with an image runs in it under runc (`runc_runtime`); one with
  none runs as a process of the agent, as `process` runs it. A worker that cannot run images
  (no `imagesPath`, runc, umoci or skopeo missing, not root) still starts: its imageless tasks
  run, a task with an image fails to start and says why.
- `runsc` (gVisor) is reserved: refused at start until it is built.

A new runtime is one factory here and its name in `levers9.contract.RUNTIMES` (which the values
check the pool's setting against).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from levers9.contract import runtime_problem
from levers9.logs import get_logger
from levers9.worker.cdi import DRIVER_ROOT
from levers9.worker.driver import DriverSetup
from levers9.worker.images import ImageCache
from levers9.worker.paths import HostPaths
from levers9.worker.process_runtime import ProcessRuntime
from levers9.worker.runc_runtime import RuncRuntime
from levers9.worker.runtime import ByImage, Runtime
from levers9.worker.settings import PREFIX, SettingsError, WorkerSettings

log = get_logger("levers9.worker")


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


RuntimeFactory = Callable[[RuntimeContext], Runtime]
"""Builds a runtime; raises a StartupError (`CdiError`, `SettingsError`) when it cannot."""


def _processes(context: RuntimeContext) -> ProcessRuntime:
    return ProcessRuntime(context.driver, context.env, context.work_dir / "processes")


def process(context: RuntimeContext) -> Runtime:
    return ByImage(
        _processes(context),
        None,
        f"the pool's runtime is process (config.worker.pools.{context.settings.pool_name}"
        ".runtime): its tasks run as processes of the worker, without images; set runtime: runc"
        " to run images",
    )


def runc(context: RuntimeContext) -> Runtime:
    images, unavailable = _runc(context)
    return ByImage(_processes(context), images, unavailable)


def _runc(context: RuntimeContext) -> tuple[RuncRuntime | None, str]:
    """The runc runtime over the node's image cache, or None and why there is none.
    CdiError (a StartupError) when the cards' CDI spec cannot be generated."""
    settings, paths = context.settings, context.paths
    if not settings.images_path:
        return None, "the Job sets no LEVERS9_IMAGES_PATH (the pool's imagesPath)"
    for tool in ("runc", "umoci", "skopeo"):
        if shutil.which(tool) is None:
            return None, f"{tool} is not installed in the worker image"
    if os.geteuid() != 0:
        return (
            None,
            f"runc needs root; the worker runs as uid {os.geteuid()} (its Job is privileged)",
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
    runtime = RuncRuntime(
        cache,
        context.work_dir / "runc",
        dev_root=paths.map("/dev"),
        driver_root=paths.map(DRIVER_ROOT),
        cards=context.cards,
    )
    log.info("CDI spec written", path=str(runtime.cdi_spec), devices=len(context.cards))
    return runtime, ""


RUNTIMES: Mapping[str, RuntimeFactory] = {"process": process, "runc": runc}


def factory(settings: WorkerSettings) -> RuntimeFactory:
    """The factory of the pool's runtime; SettingsError naming the setting and the names this
    agent knows when it is none of them (an unknown name, or one reserved for later)."""
    name = settings.runtime
    problem = runtime_problem(name)
    if problem is None and name not in RUNTIMES:
        problem = f"{name} has no factory in this agent"  # the contract names one not built
    if problem is not None:
        raise SettingsError(
            f"{PREFIX}RUNTIME (the pool's runtime, config.worker.pools.{settings.pool_name}"
            f".runtime): {problem}"
        )
    return RUNTIMES[name]
