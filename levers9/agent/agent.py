"""The agent: discovery at start, then WorkerService and the gateway until told to stop.

At start, in this order (each a line in the worker's log): the host driver is registered with
the loader, the pod's cards are resolved from the kubelet checkpoint, WorkerService starts on
the advertised host, and the worker registers with the gateway. Anything that stops discovery
(no checkpoint entry for this pod, UUIDs without nvidia-smi) is raised as `StartupError`, so
the Job fails visibly instead of serving with the wrong cards. On stop (SIGTERM from the
kubelet), running tasks are killed and reported LOST, within the pod's termination grace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path

import grpc

from levers9.agent import checkpoints, runtimes
from levers9.agent.cdi import CdiError
from levers9.agent.devices import DeviceError, resolve_visible_devices
from levers9.agent.driver import register_driver_libraries
from levers9.agent.gateway import GatewayClient, Registration
from levers9.agent.paths import HostPaths
from levers9.agent.process_runtime import start_ticks
from levers9.agent.runtimes import RuntimeContext
from levers9.agent.server import ServeError, WorkerServer
from levers9.agent.service import WorkerService
from levers9.agent.settings import SettingsError, WorkerSettings
from levers9.agent.smi import NvidiaSmi, NvidiaSmiError
from levers9.agent.supervisor import TaskManager
from levers9.agent.tunnel import TunnelClient
from levers9.contract import AGENT_FILE, WORK_ROOT
from levers9.core.placement import MAX_CACHED_IMAGES
from levers9.logs import get_logger
from levers9.rpc.channel import gateway_channel

log = get_logger("levers9.agent")

DISTRIBUTION = "levers9-pools"
# The pod gets 30 s between SIGTERM and SIGKILL: tasks get 10 to stop, reports 10 to land.
TASK_STOP_GRACE_S = 10.0
REPORT_DRAIN_S = 10.0
SERVER_STOP_GRACE_S = 2.0

StartupError = (SettingsError, DeviceError, ServeError, CdiError)
"""What stops the worker before it serves; the message says why."""


class Agent:
    def __init__(
        self,
        settings: WorkerSettings,
        paths: HostPaths,
        env: Mapping[str, str],
        *,
        gateway_credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        self._settings = settings
        self._paths = paths
        self._env = env
        self._credentials = gateway_credentials
        self.gateway: GatewayClient | None = None
        self.server: WorkerServer | None = None
        self.tunnel: TunnelClient | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Serves until `stop` is set; raises a `StartupError` when the worker cannot start."""
        settings = self._settings
        make_runtime = runtimes.factory(settings)  # an unknown runtime stops it before anything
        host = "" if settings.tunnel else settings.address_to_advertise()
        serving_tls = settings.worker_credentials()
        # ldconfig blocks for a moment; the loop may already serve others (tests, sandbox).
        driver = await asyncio.to_thread(register_driver_libraries, self._paths)
        smi = NvidiaSmi.find(driver.bin_dirs)
        visible = await resolve_visible_devices(self._paths, settings.pod_uid, settings.gpus, smi)
        log.info(
            "resolved NVIDIA_VISIBLE_DEVICES for GPU filtering",
            resolved_visible_devices=",".join(str(i) for i in visible),
        )
        product = await self._gpu_product(smi, visible)
        lib_dirs = tuple(Path(d) for d in (*driver.registered, *map(str, driver.library_path)))
        capability = await checkpoints.detect(driver_lib_dirs=lib_dirs)
        log.info("checkpoint capability", checkpoint=capability.summary(), **capability.detail())
        with contextlib.ExitStack() as cleanup:
            work_dir = self._work_dir(cleanup)
            channel = gateway_channel(settings.gateway_address, self._credentials)
            token = settings.worker_token.get_secret_value()
            context = RuntimeContext(settings, self._paths, self._env, driver, work_dir, visible)
            gateway = GatewayClient(
                channel,
                token,
                settings.pool_name,
                settings.worker_id,
                cache=cache_report(context) if settings.image_cache_report else None,
            )
            runtime = make_runtime(context)
            service_disks = context.storage.disks
            log.info("task runtime ready", runtime=settings.runtime)
            tasks = TaskManager(
                runtime,
                visible,
                work_dir,
                gateway.report,
                defaults=settings.task_defaults(),
                task_host=settings.task_host(),
                pool_name=settings.pool_name,
                checkpoints_root=_checkpoints_root(settings, self._paths),
                cuda_problem=capability.cuda,
            )
            # Before serving: GetTask answers for what an agent before this one left running.
            await tasks.adopt()
            tunnel: TunnelClient | None = None
            if settings.tunnel:
                # A short private path: a unix socket's name has a 107-byte limit.
                sockets = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="l9-")))
                socket_path = sockets / "worker.sock"
                server = await WorkerServer.start_unix(
                    WorkerService(tasks, service_disks),
                    token,
                    str(socket_path),
                    settings.command_digest,
                )
                tunnel = TunnelClient(
                    channel, token, settings.pool_name, settings.worker_id, socket_path
                )
            else:
                server = await WorkerServer.start(
                    WorkerService(tasks, service_disks),
                    token,
                    host,
                    settings.worker_port,
                    serving_tls,
                    command_digest=settings.command_digest,
                )
            self.gateway, self.server, self.tunnel = gateway, server, tunnel
            log.info(
                "serving WorkerService",
                address=server.advertised_address,
                tls=serving_tls is not None,
            )
            registration = Registration(
                node_name=settings.node_name,
                pod_uid=settings.pod_uid,
                advertised_address="" if tunnel else server.advertised_address,
                visible_devices=visible,
                gpu_product=product,
                agent_version=_version(),
                tunnel=tunnel is not None,
                tls=serving_tls is not None,
                checkpoint=capability.summary(),
            )
            registering = asyncio.create_task(self._serve(gateway, registration, tasks))
            try:
                await _until(stop, registering)
                log.info("worker shutting down", running_tasks=tasks.running)
            finally:
                # On every way out: tasks run in sessions of their own and would outlive us.
                await server.health.enter_graceful_shutdown()
                await tasks.shutdown(TASK_STOP_GRACE_S)
                await gateway.drain(REPORT_DRAIN_S)
                registering.cancel()
                await asyncio.gather(registering, return_exceptions=True)
                await server.stop(SERVER_STOP_GRACE_S)
                await channel.close()

    async def _serve(
        self, gateway: GatewayClient, registration: Registration, tasks: TaskManager
    ) -> None:
        """Registers and heartbeats; through the tunnel, once it is ready (and again each time
        it is re-homed)."""
        tunnel = self.tunnel
        if tunnel is None:
            await gateway.run(registration, tasks)
            return

        async def on_ready() -> None:
            gateway.reregister()

        holding = asyncio.create_task(tunnel.run(on_ready))
        try:
            await tunnel.ready.wait()
            await gateway.run(registration, tasks)
        finally:
            holding.cancel()
            await asyncio.gather(holding, return_exceptions=True)

    def _work_dir(self, cleanup: contextlib.ExitStack) -> Path:
        """`LEVERS9_WORK_DIR`, else this worker's under the node's WORK_ROOT (removed when the
        agent ends cleanly: its tasks are stopped by then). Either way an agent started after a
        killed one finds what it left there (`TaskManager.adopt`)."""
        work_dir = self._settings.work_dir
        if work_dir is None:
            work_dir = self._paths.map(WORK_ROOT) / self._settings.worker_id
            cleanup.callback(_remove_if_idle, work_dir)
        work_dir.mkdir(parents=True, exist_ok=True)
        (work_dir / AGENT_FILE).write_text(
            json.dumps({"pid": os.getpid(), "start": start_ticks(os.getpid())})
        )
        return work_dir

    async def _gpu_product(self, smi: NvidiaSmi | None, visible: Sequence[int]) -> str:
        """The cards' name from nvidia-smi, else what the environment says, else ""."""
        if smi is not None and visible:
            try:
                names = await smi.names()
            except NvidiaSmiError as error:
                log.warning("nvidia-smi did not name the cards", error=str(error))
            else:
                if visible[0] in names:
                    return names[visible[0]]
        return self._settings.gpu_product


async def _until(stop: asyncio.Event, registering: asyncio.Task[None]) -> None:
    """Waits for `stop`; a registration loop that dies (a bug) is raised, not ignored."""
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({stopped, registering}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if registering.done() and not stop.is_set():
        registering.result()


def _remove_if_idle(work_dir: Path) -> None:
    """Removes the work dir unless a container's record is left in it (one this agent did not
    end: it failed to start, say, before adopting what the one before it left)."""
    if not any(p for kind in ("containers", "processes") for p in (work_dir / kind).glob("*.json")):
        shutil.rmtree(work_dir, ignore_errors=True)


def _version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return ""


def cache_report(context: RuntimeContext) -> Callable[[], Sequence[str]]:
    """What heartbeats report with the pool's `cache.enabled`: the references the node's image
    cache holds, most recently used first (none while the worker runs no images)."""

    def held() -> Sequence[str]:
        cache, _ = context.images
        return cache.references(MAX_CACHED_IMAGES) if cache is not None else ()

    return held


def _checkpoints_root(settings: WorkerSettings, paths: HostPaths) -> Path | None:
    """Where tasks' checkpoints go: `checkpoints/` of the pool's durableDisksPath (on the
    node's disk, beside its durable disks); None: the work dir's."""
    if not settings.durable_disks_path:
        return None
    return paths.map(settings.durable_disks_path) / "checkpoints"
