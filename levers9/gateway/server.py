"""`Gateway`: the gRPC server workers dial, with the standard health service beside it.

The controlplane process starts one (`worker_main.py`, `levers9 dev up`):

    tasks = TemporalTaskRecords(client, settings.task_queue)
    gateway = Gateway(TemporalWorkerRecords(client), secret, tasks=tasks)
    port = await gateway.start(settings.gateway_listen)
    try:
        ...
    finally:
        await gateway.stop(grace=5)
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from pydantic import SecretStr

from levers9.gateway.box_service import BoxesService
from levers9.gateway.clusters import ClusterHub
from levers9.gateway.disk_service import DisksService
from levers9.gateway.endpoint_service import EndpointsService
from levers9.gateway.pool_service import PoolsService
from levers9.gateway.roles import Authority
from levers9.gateway.service import GatewayService
from levers9.gateway.task_records import TaskRecords
from levers9.gateway.task_service import TasksService
from levers9.gateway.task_upstream import Replicas
from levers9.gateway.tunnel import TunnelHub
from levers9.gateway.volume_service import VolumesService
from levers9.gateway.workspace_service import WorkspacesService
from levers9.logs import get_logger
from levers9.proto import (
    boxes_pb2_grpc,
    disks_pb2_grpc,
    endpoints_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    pools_pb2_grpc,
    volumes_pb2_grpc,
)
from levers9.records.boxes import TemporalBoxRecords
from levers9.records.disks import TemporalDiskRecords
from levers9.records.endpoints import TemporalEndpointRecords
from levers9.records.pools import TemporalPoolRecords
from levers9.records.volumes import TemporalVolumeRecords
from levers9.records.workers import WorkerRecords
from levers9.records.workspaces import TemporalWorkspaceRecords
from levers9.rpc.malformed import MalformedRequests

SERVICE_NAME = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name
HEARTBEAT_SECONDS = 10
# Far above any honest request (a task report is bounded at a few hundred KiB); a bigger one is
# refused by gRPC with RESOURCE_EXHAUSTED before it is buffered whole.
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# Every worker holds one channel; this bounds what a flood of calls can make us hold at once.
MAX_CONCURRENT_RPCS = 1000
STOP_GRACE_S = 5.0

log = get_logger(__name__)


class GatewayError(Exception):
    """The gateway cannot serve (e.g. its address is taken); the message says what to change."""


class Gateway:
    """The `levers9.v1.Gateway` service and health, on one address; start once, stop once."""

    def __init__(
        self,
        records: WorkerRecords,
        secret: SecretStr,
        *,
        tasks: TaskRecords | None = None,
        tunnels: TunnelHub | None = None,
        replicas: Replicas | None = None,
        tunnelled: Mapping[str, bool] | None = None,
        clusters: ClusterHub | None = None,
        workspaces: TemporalWorkspaceRecords | None = None,
        pools: TemporalPoolRecords | None = None,
        endpoints: TemporalEndpointRecords | None = None,
        volumes: TemporalVolumeRecords | None = None,
        disks: TemporalDiskRecords | None = None,
        boxes: TemporalBoxRecords | None = None,
        volume_key_generation: int = 1,
        operator_generation: int = 1,
        ca_generation: int = 1,
        token_generation: int = 1,
        heartbeat_seconds: int = HEARTBEAT_SECONDS,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        """`tunnelled`: each loaded pool's `kubernetes.tunnel`, which says how its workers
        must register (None: as they say, for a gateway that serves no pool's values)."""
        if not secret.get_secret_value():
            raise GatewayError(
                "the worker token secret is empty: set workerTokenSecret or workerTokenSecretFile"
            )
        if heartbeat_seconds < 1:
            raise GatewayError(f"heartbeat_seconds must be at least 1, not {heartbeat_seconds}")
        self._service = GatewayService(
            records,
            secret,
            heartbeat_seconds,
            tunnels,
            tunnelled,
            token_generation,
            load_pool=clusters.load if clusters is not None else None,
        )
        self.records, self.task_records, self.tunnels = records, tasks, tunnels
        self.clusters = clusters
        self.authority = Authority(secret, operator_generation, workspaces)
        """Who calls the CLI's services: the operator, or a workspace by its token."""
        self._workspaces = (
            WorkspacesService(workspaces, self.authority, volumes, disks)
            if workspaces is not None
            else None
        )
        self._pools = PoolsService(pools, self.authority) if pools is not None else None
        self._endpoints = (
            EndpointsService(endpoints, self.authority) if endpoints is not None else None
        )
        self._disks = DisksService(disks, self.authority) if disks is not None else None
        self._volumes = (
            VolumesService(volumes, self.authority, secret, volume_key_generation)
            if volumes is not None
            else None
        )
        self._tasks = (
            TasksService(
                tasks,
                secret,
                replicas,
                authority=self.authority,
                volumes=volumes,
                disks=disks,
                boxes=boxes,
                operator_generation=operator_generation,
                ca_generation=ca_generation,
                token_generation=token_generation,
            )
            if tasks is not None
            else None
        )
        self.tasks_service = self._tasks
        self._boxes = (
            BoxesService(boxes, self._tasks, self.authority)
            if boxes is not None and self._tasks is not None
            else None
        )
        """The CLI's service (the endpoints' proxy opens replicas' ports through it)."""
        self.pools_service, self.endpoints_service = self._pools, self._endpoints
        self.workspaces_service = self._workspaces
        self.boxes_service = self._boxes
        """The CLI's other services, which the dashboard (`levers9.dashboard`) calls too."""
        self._max_message_bytes = max_message_bytes
        self._server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None

    async def start(self, listen: str, tls: grpc.ServerCredentials | None = None) -> int:
        """Serves on `listen` (`host:port`, port 0 for any), with TLS when `tls` is given;
        returns the bound port."""
        if self._server is not None:
            raise GatewayError("the gateway is already started")
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self._max_message_bytes),
                # Without this a second controlplane on the same port would silently share it.
                ("grpc.so_reuseport", 0),
                # Agents may ping to keep NAT paths open; do not answer that with GOAWAY.
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
            ],
            maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
            interceptors=[MalformedRequests()],
        )
        checker = health.aio.HealthServicer()
        gateway_pb2_grpc.add_GatewayServicer_to_server(self._service, server)
        if self._tasks is not None:
            gateway_pb2_grpc.add_TasksServicer_to_server(self._tasks, server)
        if self.clusters is not None:
            gateway_pb2_grpc.add_ClustersServicer_to_server(self.clusters, server)
        if self._workspaces is not None:
            gateway_pb2_grpc.add_WorkspacesServicer_to_server(self._workspaces, server)
        if self._endpoints is not None:
            endpoints_pb2_grpc.add_EndpointsServicer_to_server(self._endpoints, server)
        if self._pools is not None:
            pools_pb2_grpc.add_PoolsServicer_to_server(self._pools, server)
        if self._volumes is not None:
            volumes_pb2_grpc.add_VolumesServicer_to_server(self._volumes, server)
        if self._disks is not None:
            disks_pb2_grpc.add_DisksServicer_to_server(self._disks, server)
        if self._boxes is not None:
            boxes_pb2_grpc.add_BoxesServicer_to_server(self._boxes, server)
        health_pb2_grpc.add_HealthServicer_to_server(checker, server)
        port = _bind(server, listen, tls)
        await server.start()
        if self.clusters is not None:
            await self.clusters.prepare()
        await checker.set(SERVICE_NAME, health_pb2.HealthCheckResponse.SERVING)
        self._server, self._health = server, checker
        log.info("gateway listening", address=listen, port=port, tls=tls is not None)
        return port

    async def stop(self, grace: float | None = STOP_GRACE_S) -> None:
        """Reports NOT_SERVING, lets calls in flight finish for `grace` seconds, then closes."""
        server, checker = self._server, self._health
        if server is None or checker is None:
            return
        await checker.enter_graceful_shutdown()
        if self.tunnels is not None:
            await self.tunnels.close()  # tunnel streams never end on their own
        if self.clusters is not None:
            await self.clusters.close()
        await server.stop(grace)
        log.info("gateway stopped")


def _bind(server: grpc.aio.Server, listen: str, tls: grpc.ServerCredentials | None) -> int:
    try:
        if tls is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, tls)
    except RuntimeError:
        port = 0
    if port == 0:
        raise GatewayError(
            f"the gateway cannot listen on {listen}: the address is taken or not local"
            " (set gatewayListen / LEVERS9_GATEWAY_LISTEN)"
        )
    return port
