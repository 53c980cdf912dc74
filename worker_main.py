"""The Temporal worker: loads the values, keeps the schedules, hosts workflows and activities.

Wiring only: every piece it starts lives in `levers9/`, `workflows/` or `activities/`.

    python -m worker_main --values values.yaml --values private.json
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from pydantic import SecretStr
from temporalio.client import Client
from temporalio.worker import Interceptor, Worker

import levers9
from activities.joined_pools import LoadJoinedPools
from activities.kube_clients import KubeClients
from activities.pool_cache import PoolCaches
from activities.registry import controlplane_activities, replica_activities
from levers9 import logs, telemetry
from levers9.config import ConfigError, ControlplaneSettings, Values, joined_pool, load
from levers9.dashboard.app import Dashboard
from levers9.dashboard.views import Temporal
from levers9.gateway.box_front import BoxFront
from levers9.gateway.cluster_relay import TemporalClusterRoutes
from levers9.gateway.clusters import ClusterHub, TemporalClusterRecords
from levers9.gateway.endpoint_connections import FrontLimits
from levers9.gateway.endpoint_proxy import EndpointProxy
from levers9.gateway.endpoint_views import TemporalEndpointBook
from levers9.gateway.server import Gateway
from levers9.gateway.task_records import TemporalTaskRecords
from levers9.gateway.task_upstream import Replicas
from levers9.gateway.tunnel import TunnelHub
from levers9.operations import start_pool_removal
from levers9.process import exit_now
from levers9.providers.joined import ClusterState, pool_block
from levers9.records.boxes import TemporalBoxRecords
from levers9.records.clusters import joined_clusters
from levers9.records.disks import TemporalDiskRecords
from levers9.records.endpoints import TemporalEndpointRecords
from levers9.records.pools import TemporalPoolRecords
from levers9.records.volumes import TemporalVolumeRecords
from levers9.records.workers import TemporalWorkerRecords
from levers9.records.workspaces import TemporalWorkspaceRecords
from levers9.rpc import tls
from levers9.temporal import (
    connect,
    ensure_reconcile_schedule,
    ensure_search_attributes,
    sync_reconcile_schedules,
)
from workflows import RUNNER, WORKFLOWS

GRACEFUL_SHUTDOWN = timedelta(seconds=10)
GATEWAY_GRACE_S = 5.0


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="worker_main", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--values", "-f", action="append", type=Path, default=[], help="values file (repeatable)"
    )
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def _log_pools(values: Values) -> None:
    log = logs.get_logger("levers9.controlplane")
    for problem in values.problems:
        log.error("unable to load controller", error=problem.error, pool_name=problem.pool_name)
    for name, pool in values.pools.items():
        log.info("loaded controller", gpu_type=pool.gpu_type, mode=pool.mode, pool_name=name)


def replicas(settings: ControlplaneSettings) -> Replicas:
    """How this replica relays a stream to another one: its queue, and TLS as the CLI dials
    the gateway, checking the certificate's name (the advertised host), not the pod's IP."""
    credentials = tls.gateway_client_credentials(settings)
    host = settings.gateway_advertised_address.rpartition(":")[0].strip("[]")
    return Replicas(
        task_queue=settings.replica_task_queue,
        credentials=credentials,
        server_name=host if credentials is not None else None,
    )


@dataclass
class Serving:
    """What one controlplane process runs: start the gateway, then `async with caches,
    worker, replica`."""

    worker: Worker
    replica: Worker
    gateway: Gateway
    caches: PoolCaches
    endpoints: EndpointProxy
    dashboard: Dashboard
    """Served by `endpoints` at `/ui/`; `async with` it samples the pools for its chart."""


def serving(
    client: Client,
    clients: KubeClients,
    settings: ControlplaneSettings,
    secret: SecretStr,
    *,
    interceptors: Sequence[Interceptor] = (),
    graceful_shutdown: timedelta = timedelta(0),
) -> Serving:
    """What a controlplane process serves: the Temporal worker on the shared task queue, the
    one on this replica's own queue (calls to the workers whose tunnels it holds), the
    gateway with the tunnel hub both share, and the watch-fed caches of the pools (each
    replica its own) that the passes read and whose events start passes."""
    caches = PoolCaches(clients, clients.names(), client)
    tunnelled = {name: clients.pool(name).kubernetes.tunnel for name in clients.names()}
    log = logs.get_logger("levers9.controlplane")

    async def joined(state: ClusterState) -> None:
        """A joined cluster's pool, loaded now: its agent connected here for the first time, or
        a call here named it (its agent's session held by another replica)."""
        name = state.spec.name
        if name in clients.names() and not clients.joined(name):
            # The values define this pool: the join never takes it (its schedule, workers and
            # client stay the values'); `cluster join` refuses such a name, older joins end here.
            log.error(
                "unable to load controller",
                pool_name=name,
                error="a joined cluster has the name of a pool of the values: the values' pool"
                " is loaded; `levers9 cluster leave` the joined one and join under another name",
            )
            return
        if name not in clients.names():
            clients.add(name, joined_pool(name, pool_block(state.spec)))
            log.info(
                "loaded controller", gpu_type=state.spec.gpu_type, mode="external", pool_name=name
            )
        tunnelled[name] = True
        caches.add(name)
        await ensure_reconcile_schedule(
            client, name, settings, simulated_gpus=state.spec.simulated_gpus
        )

    relaying = replicas(settings)
    clusters = ClusterHub(
        TemporalClusterRecords(client),
        secret,
        on_joined=joined,
        routes=TemporalClusterRoutes(client, settings.task_queue),
        replicas=relaying,
        replica_address=settings.replica_gateway(),
        operator_generation=settings.operator_token_generation,
    )
    clients.set_joined(clusters.url)
    tunnels = TunnelHub(
        secret,
        settings.replica_task_queue,
        settings.replica_gateway(),
        token_generation=settings.worker_token_generation,
    )
    worker = Worker(
        client,
        task_queue=settings.task_queue,
        workflows=WORKFLOWS,
        workflow_runner=RUNNER,
        activities=controlplane_activities(clients, client, settings, tunnels, caches),
        interceptors=[*interceptors, LoadJoinedPools(clients.loaded, clusters.load)],
        graceful_shutdown_timeout=graceful_shutdown,
    )
    replica = Worker(
        client,
        task_queue=settings.replica_task_queue,
        activities=replica_activities(client, settings, tunnels),
        interceptors=interceptors,
        graceful_shutdown_timeout=graceful_shutdown,
    )
    tasks = TemporalTaskRecords(client, settings.task_queue)
    gateway = Gateway(
        TemporalWorkerRecords(client),
        secret,
        tasks=tasks,
        tunnels=tunnels,
        replicas=relaying,
        tunnelled=tunnelled,
        clusters=clusters,
        workspaces=TemporalWorkspaceRecords(client, settings.task_queue),
        pools=TemporalPoolRecords(client, settings.task_queue),
        endpoints=TemporalEndpointRecords(client, settings.task_queue),
        volumes=TemporalVolumeRecords(client, settings.task_queue),
        disks=TemporalDiskRecords(client, settings.task_queue),
        boxes=TemporalBoxRecords(client, settings.task_queue),
        volume_key_generation=settings.volume_key_generation,
        operator_generation=settings.operator_token_generation,
        ca_generation=settings.worker_ca_generation,
        token_generation=settings.worker_token_generation,
    )
    assert gateway.tasks_service is not None
    dashboard = Dashboard.of(
        gateway,
        secret,
        settings.endpoints_base_url(),
        Temporal(settings.temporal_ui_url, settings.temporal_namespace),
        pools=TemporalPoolRecords(client, settings.task_queue),
    )
    endpoints = EndpointProxy(
        TemporalEndpointBook(client),
        gateway.tasks_service,
        secret,
        settings.replica_id,
        operator_generation=settings.operator_token_generation,
        limits=FrontLimits.of(settings),
        ui=dashboard.handle,
        box=BoxFront(
            TemporalBoxRecords(client, settings.task_queue),
            gateway.tasks_service,
            secret,
            settings.operator_token_generation,
        ).handle,
    )
    return Serving(worker, replica, gateway, caches, endpoints, dashboard)


async def run(values: Values, stop: asyncio.Event) -> None:
    """Serves until `stop` is set, then finishes in-flight tasks and returns."""
    log = logs.get_logger("levers9.controlplane")
    settings = values.settings
    provider = telemetry.setup_tracing()
    if provider is not None:
        log.info("tracing to OTLP", service=provider.resource.attributes.get("service.name"))
    client = await connect(settings, telemetry.runtime())
    added = await ensure_search_attributes(client, settings.temporal_namespace)
    if added:
        log.info("added search attributes", names=added)
    joined = []
    for state in await joined_clusters(client):
        if state.spec.name in values.pools:
            log.error(
                "unable to load controller",
                pool_name=state.spec.name,
                error="a joined cluster has the name of a pool of the values: the values' pool"
                " is loaded; remove its block, or `levers9 cluster leave` the joined one",
            )
            continue
        joined.append(state)
    sync = await sync_reconcile_schedules(
        client,
        [*values.pools, *(s.spec.name for s in joined)],
        settings,
        keep=[p.pool_name for p in values.problems],
        joined=[s.spec.name for s in joined],
        simulated_gpus=[
            *(name for name, pool in values.pools.items() if pool.simulated_gpus),
            *(s.spec.name for s in joined if s.spec.simulated_gpus),
        ],
        runtimes={name: pool.offered_runtimes for name, pool in values.pools.items()},
    )
    log.info(
        "reconcile schedules in place",
        created=sync.created,
        updated=sync.updated,
        deleted=sync.deleted,
    )
    for schedule_id in sync.deleted:
        # Its block left the values: end its records (the cluster is out of reach now).
        pool_name = schedule_id.removeprefix("reconcile:")
        handle = await start_pool_removal(
            client, settings, pool_name, reason="pool removed from the values"
        )
        log.info("removing pool", pool_name=pool_name, workflow_id=handle.id)
    clients = KubeClients(values.pools)
    for state in joined:  # pools joined by `levers9 cluster join`
        name = state.spec.name
        clients.add(name, joined_pool(name, pool_block(state.spec)))
        log.info("loaded controller", gpu_type=state.spec.gpu_type, mode="external", pool_name=name)
    secret = settings.token_secret()
    assert secret is not None  # main() refuses to start without one
    served = serving(client, clients, settings, secret, graceful_shutdown=GRACEFUL_SHUTDOWN)
    gateway = served.gateway
    credentials = tls.gateway_server_credentials(settings)
    if credentials is None:
        log.warning(
            "gateway serves plaintext: worker tokens and task output cross the network"
            " unencrypted; set gatewayTlsCertFile and gatewayTlsKeyFile",
            listen=settings.gateway_listen,
        )
    await gateway.start(settings.gateway_listen, credentials)
    try:
        await served.endpoints.start(settings.endpoints_listen, tls.endpoints_ssl_context(settings))
        async with served.caches, served.worker, served.replica, served.dashboard:
            log.info("temporal worker started", task_queue=settings.task_queue)
            await stop.wait()
            log.info("shutting down")
    finally:
        await served.endpoints.stop()
        await gateway.stop(grace=GATEWAY_GRACE_S)
        clients.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    logs.setup(args.log_level)
    try:
        values = load(args.values)
    except ConfigError as exc:
        for line in exc.errors:
            logs.get_logger("levers9.controlplane").error("invalid values", error=line)
        return 2
    _log_pools(values)
    if values.settings.token_secret() is None:
        logs.get_logger("levers9.controlplane").error(
            "invalid values",
            error="config.controlplane.workerTokenSecret: required to start workers"
            " (or workerTokenSecretFile; LEVERS9_WORKER_TOKEN_SECRET[_FILE])",
        )
        return 2
    try:
        tls.check_gateway_settings(values.settings)
    except tls.TlsError as exc:
        logs.get_logger("levers9.controlplane").error("invalid values", error=str(exc))
        return 2

    if not levers9.GRPC_TUNED:
        logs.get_logger("levers9.controlplane").warning(
            "gRPC runs untuned: GRPC_EXPERIMENTS was not set before grpc was imported",
            fix=f"GRPC_EXPERIMENTS={levers9.GRPC_EXPERIMENTS} in its environment (as in its image)",
        )

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(values, stop)

    asyncio.run(_main())
    return 0


if __name__ == "__main__":
    exit_now(main())
