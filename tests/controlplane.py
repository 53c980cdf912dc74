"""A controlplane against the sandbox, in-process: the sandbox cluster (HTTPS API + kubelets),
the dev pool's values pointing at it, and a Temporal worker hosting the real workflows and
activities on the dev server. What `levers9 dev up` runs as processes, here as parts a test
holds.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from pydantic import SecretStr
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.kube import job_selector
from activities.kube_clients import KubeClients
from activities.pool_cache import PoolCaches
from levers9 import telemetry
from levers9.config import ControlplaneSettings, PoolConfig, parse_pool
from levers9.dashboard.app import Dashboard
from levers9.devstack import values as devvalues
from levers9.gateway.endpoint_proxy import EndpointProxy
from levers9.gateway.server import Gateway
from levers9.models import RECONCILE_POOL_WORKFLOW
from levers9.records.listing import list_worker_records
from levers9.rpc import tls
from levers9.temporal import sync_reconcile_schedules
from levers9.tokens import operator_token
from sandbox import registries, task_images, worker_image
from sandbox.scenario import Images, Scenario
from sandbox.serve import RunningSandbox, start
from tests.factories import free_port, run_levers9
from tests.waiting import eventually
from worker_main import serving

POOL = devvalues.POOL_NAME
TOKEN_SECRET = "test-token-secret-0123456789"


WORKER_IMAGE_HOST = "us-central1-docker.pkg.dev"
"""The registry host of the pool's `workerImage` (the project's Artifact Registry)."""


def push_worker_image(directory: Path, registry: str) -> None:
    """The worker image the pool's Jobs name, built runnable (sandbox.worker_image on the Python
    task image), pushed to `registry` standing in for the project's (`WORKER_IMAGE_HOST`)."""
    base, _ = task_images.python_image()
    image = worker_image.build(directory / "worker-image", base=base)
    worker_image.push(image, registry, f"{devvalues.PROJECT}/{worker_image.REPOSITORY}")


@contextmanager
def worker_image_registry(directory: Path) -> Iterator[dict[str, Any]]:
    """A real registry standing in for the project's, holding the worker image
    (`push_worker_image`): there a task that names no image runs in a container of the worker's
    own image, as on a real pool without `taskDefaults.image`. Yields the controlplane settings
    that reach it (the pool's `registryMirrors` and `insecureRegistries`)."""
    with registries.LocalRegistry(directory / "gar") as gar:
        push_worker_image(directory, gar.address)
        yield {
            "registryMirrors": f"{WORKER_IMAGE_HOST}={gar.address}",
            "insecureRegistries": gar.address,
        }


def quick_scenario(*, process_tasks: bool = False) -> Scenario:
    """The default scenario as attach leaves it (the egress IP on the authorized networks),
    with image pulls that take a moment, not seconds, and the pods of a deleted node collected
    after 1 to 2 s, not GKE's 40 to 60 s. With `process_tasks`, the sandbox's knob that no pool
    value can express (`images.processTasks`): the agents run tasks that name no image as
    processes of their own, outside any container; only for modules whose point is the
    controlplane, each saying why in its docstring."""
    base = Scenario.load()
    images = Images(
        pull_seconds=0.2,
        present=base.images.present,
        process=base.images.process,
        process_tasks=process_tasks,
    )
    network = base.network.model_copy(
        update={"authorized_networks": (*base.network.authorized_networks, "127.0.0.1/32")}
    )
    timing = base.timing.model_copy(
        update={"orphan_pod_quarantine_seconds": 1.0, "pod_gc_period_seconds": 1.0}
    )
    return base.model_copy(update={"images": images, "network": network, "timing": timing})


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """This process's environment with `values` set while the block runs, then as it was."""
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def trusting(sandbox: RunningSandbox) -> contextlib.AbstractContextManager[None]:
    """google-auth and the Google clients (requests underneath) trust the sandbox's token
    endpoints and APIs while the block runs: the bundle the sandbox writes (certifi's roots
    and its CA)."""
    return environment({"REQUESTS_CA_BUNDLE": str(sandbox.state.dir / "ca-bundle.pem")})


def admin_api(sandbox: RunningSandbox) -> k8s.ApiClient:
    """The kubeconfig's admin identity (the person at the laptop), not the pool's key."""
    configuration = k8s.Configuration()
    configuration.host = sandbox.sandbox.url
    configuration.ssl_ca_cert = str(sandbox.state.dir / "ca.crt")
    configuration.api_key = {"authorization": f"Bearer {sandbox.sandbox.admin_token}"}
    return k8s.ApiClient(configuration)


def list_worker_jobs(sandbox: RunningSandbox) -> list[dict[str, Any]]:
    """The dev pool's worker Jobs, as the admin lists them (blocking: call it off the loop)."""
    raw: Any = k8s.BatchV1Api(admin_api(sandbox)).list_namespaced_job(
        "levers9", label_selector=job_selector(POOL), _preload_content=False
    )
    jobs: list[dict[str, Any]] = json.loads(raw.data)["items"]
    return jobs


@dataclass
class Controlplane:
    sandbox: RunningSandbox
    pool: PoolConfig
    clients: KubeClients
    settings: ControlplaneSettings
    gateway: Gateway | None = None
    caches: PoolCaches | None = None
    """The running worker's watch-fed pool caches."""
    endpoints: EndpointProxy | None = None
    dashboard: Dashboard | None = None

    def cli_env(self) -> dict[str, str]:
        """A user's shell: this controlplane's Temporal and task queue, the gateway and the
        operator token, and no dev stack's env file."""
        return {
            **os.environ,
            "TEMPORAL_ADDRESS": self.settings.temporal_address,
            "LEVERS9_TASK_QUEUE": self.settings.task_queue,
            "LEVERS9_GATEWAY_ADDRESS": self.settings.gateway_advertised_address,
            "LEVERS9_API_TOKEN": operator_token(TOKEN_SECRET),
            "LEVERS9_ENDPOINTS_URL": self.settings.endpoints_base_url(),
            "LEVERS9_HOME": str(self.sandbox.state.dir.parent / "no-dev-stack"),
            **(
                {"LEVERS9_GATEWAY_TLS_CA_FILE": str(self.settings.gateway_tls_ca_file)}
                if self.settings.gateway_tls_ca_file
                else {}
            ),
        }

    async def cli(self, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
        """The `levers9` CLI in its own process, as that user runs it; `token`: with that
        token (a workspace's) instead of the operator's."""
        env = self.cli_env()
        if token is not None:
            env["LEVERS9_API_TOKEN"] = token
        return await run_levers9(env, *args)

    def admin_api(self) -> k8s.ApiClient:
        return admin_api(self.sandbox)

    async def worker_jobs(self) -> list[dict[str, Any]]:
        """Our worker Jobs, as the admin lists them (off the event loop: the sandbox is on it)."""
        return await asyncio.to_thread(self._worker_jobs)

    async def kubectl(self, *args: str) -> str:
        """The real kubectl, as the admin at the laptop (off the event loop the sandbox is on)."""
        done = await asyncio.to_thread(
            subprocess.run,
            ["kubectl", "--kubeconfig", str(self.sandbox.state.dir / "kubeconfig"), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout

    async def admin(self, call: Callable[[k8s.ApiClient], object]) -> None:
        """Runs a synchronous client call as the admin, off the event loop the sandbox serves on."""
        await asyncio.to_thread(call, self.admin_api())

    def _worker_jobs(self) -> list[dict[str, Any]]:
        return list_worker_jobs(self.sandbox)

    @asynccontextmanager
    async def worker(self, client: Client, *, keep_records: bool = False) -> AsyncIterator[Worker]:
        """The Temporal workers (the shared queue and this replica's) and the gateway, with
        its tunnel hub, as worker_main runs them. Afterwards the records are ended, unless
        `keep_records` (the controlplane restarts, with other settings say)."""
        served = serving(
            client,
            self.clients,
            self.settings,
            SecretStr(TOKEN_SECRET),
            # worker_main's client carries these; the tests' shared client does not.
            interceptors=telemetry.interceptors(),
        )
        gateway = served.gateway
        await gateway.start(
            self.settings.gateway_listen, tls.gateway_server_credentials(self.settings)
        )
        self.gateway = gateway
        self.endpoints = served.endpoints
        try:
            await served.endpoints.start(
                self.settings.endpoints_listen, tls.endpoints_ssl_context(self.settings)
            )
            async with served.caches, served.worker, served.replica, served.dashboard:
                self.caches = served.caches
                self.dashboard = served.dashboard
                yield served.worker
        finally:
            await served.endpoints.stop()
            await (self.gateway or gateway).stop(grace=1)  # a test may have restarted it
            if not keep_records:
                await _terminate_running(client, self.settings.task_queue)


async def _terminate_running(client: Client, task_queue: str) -> None:
    """Ends this controlplane's records, so the next test's machines (same node names, same
    workflow ids) start afresh instead of signalling workflows nobody polls any more."""
    query = f"TaskQueue='{task_queue}' AND ExecutionStatus='Running'"
    async for listed in client.list_workflows(query):
        with contextlib.suppress(RPCError):
            await client.get_workflow_handle(listed.id, run_id=listed.run_id).terminate(
                "test module done"
            )


@asynccontextmanager
async def controlplane(
    directory: Path,
    temporal_address: str,
    task_queue: str,
    *,
    scenario: Scenario | None = None,
    settings: Mapping[str, object] | None = None,
    tunnel: bool = False,
    pool_settings: Mapping[str, object] | None = None,
) -> AsyncIterator[Controlplane]:
    """The sandbox (default scenario) and the pool, clients and settings that reach it;
    `pool_settings` are added to the spec's pool block (e.g. `taskDefaults`), which says
    `simulatedGpus: true` as the dev stack's does (the sandbox has no card)."""
    key_file = directory / "gke-sa.json"
    running = await start(
        scenario or quick_scenario(), directory / "sandbox", controlplane_key=key_file
    )
    ca_pem = running.sandbox.ca.ca_pem
    block = devvalues.pool_block(
        base64.b64encode(ca_pem).decode(), running.sandbox.url, tunnel=tunnel
    )
    block["kubernetes"]["credentials"] = key_file.read_text()
    block.update({"simulatedGpus": True, **(pool_settings or {})})
    pool = parse_pool(POOL, block)
    gateway_port = free_port()
    values = ControlplaneSettings.model_validate(
        {
            "temporalAddress": temporal_address,
            "taskQueue": task_queue,
            "reconcileIntervalSeconds": 1,
            "workerTokenSecret": TOKEN_SECRET,
            "gatewayListen": f"127.0.0.1:{gateway_port}",
            "gatewayAdvertisedAddress": f"127.0.0.1:{gateway_port}",
            "endpointsListen": f"127.0.0.1:{free_port()}",
            **(settings or {}),
        }
    )
    clients = KubeClients({POOL: pool})
    try:
        with trusting(running):
            yield Controlplane(running, pool, clients, values)
    finally:
        clients.close()
        await running.close()


@asynccontextmanager
async def reconciling(
    client: Client,
    directory: Path,
    scenario: Scenario | None = None,
    tunnel: bool = False,
    pool_settings: Mapping[str, object] | None = None,
    *,
    containers: bool = False,
    **settings: object,
) -> AsyncIterator[Controlplane]:
    """A controlplane on the sandbox with its Temporal worker, gateway and reconcile schedule
    running, on a task queue of its own; everything stopped and ended afterwards. With
    `containers`, the worker image in a registry of its own (`worker_image_registry`): tasks
    that name no image run in containers of it, as a user's do on a real pool."""
    address = client.service_client.config.target_host
    task_queue = f"tq-{uuid.uuid4()}"
    with contextlib.ExitStack() as stack:
        if containers:
            settings = {**stack.enter_context(worker_image_registry(directory)), **settings}
        async with _reconciling(
            client, directory, address, task_queue, scenario, tunnel, pool_settings, settings
        ) as plane:
            yield plane


@asynccontextmanager
async def _reconciling(
    client: Client,
    directory: Path,
    address: str,
    task_queue: str,
    scenario: Scenario | None,
    tunnel: bool,
    pool_settings: Mapping[str, object] | None,
    settings: Mapping[str, object],
) -> AsyncIterator[Controlplane]:
    async with (
        controlplane(
            directory,
            address,
            task_queue,
            scenario=scenario,
            settings=settings,
            tunnel=tunnel,
            pool_settings=pool_settings,
        ) as plane,
        plane.worker(client),
    ):
        simulated = [POOL] if plane.pool.simulated_gpus else []
        # The schedule's memo says which runtimes the pool's tasks may name, as worker_main
        # syncs it from the values (`pool_settings` `runtimes`: runsc beside runc).
        await sync_reconcile_schedules(
            client,
            [POOL],
            plane.settings,
            simulated_gpus=simulated,
            runtimes={POOL: plane.pool.offered_runtimes},
        )
        try:
            yield plane
        finally:
            await sync_reconcile_schedules(client, [], plane.settings)


async def workers_available(plane: Controlplane, count: int = 3) -> bool:
    """Exactly `count` live worker records, every one `available`."""
    records = await list_worker_records(plane.settings, POOL, include_ended=False)
    return len(records) == count and all(r.state == "available" for r in records)


async def completed_passes(client: Client, plane: Controlplane, since: datetime) -> int:
    """Reconcile passes of this controlplane that started after `since` and completed."""
    query = (
        f"WorkflowType='{RECONCILE_POOL_WORKFLOW}' AND TaskQueue='{plane.settings.task_queue}'"
        f" AND ExecutionStatus='Completed' AND StartTime > '{since.isoformat()}'"
    )
    return len([run async for run in client.list_workflows(query)])


async def passes_completed(
    client: Client, plane: Controlplane, since: datetime, count: int = 2, within: float = 30
) -> None:
    """Waits until `count` reconcile passes that started after `since` have completed: the proof
    a test needs before it asserts that a pass did not do something."""

    async def enough() -> bool:
        return await completed_passes(client, plane, since) >= count

    await eventually(enough, within=within)
