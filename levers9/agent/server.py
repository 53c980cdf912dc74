"""The agent's gRPC server: WorkerService behind the token check, plus the standard health
service, on an address the controlplane can dial.

The advertised host is the node's external IP (given by the controlplane). The server binds to
it when it is one of this machine's addresses (on the host network it is; in the sandbox it is
a bindable loopback address), else to every interface (a NATed external IP). The port is
ephemeral unless configured, because two workers may share a node's network; the advertised
address carries the port actually bound.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import grpc
from grpc import aio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from levers9.agent.auth import TokenInterceptor
from levers9.agent.service import WorkerService
from levers9.proto import worker_pb2, worker_pb2_grpc
from levers9.rpc.malformed import MalformedRequests

SERVICE_NAME: str = worker_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name


class ServeError(RuntimeError):
    """WorkerService cannot listen where it should."""


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def bind_host(host: str) -> str:
    """`host` when this machine can bind it, else the wildcard of its family."""
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
    except OSError:
        return "::" if family == socket.AF_INET6 else "0.0.0.0"
    return host


@dataclass
class WorkerServer:
    server: aio.Server
    health: health_aio.HealthServicer
    advertised_address: str

    @classmethod
    async def start(
        cls,
        service: WorkerService,
        token: str,
        advertised_host: str,
        port: int = 0,
        credentials: grpc.ServerCredentials | None = None,
        *,
        command_digest: str = "",
    ) -> WorkerServer:
        """Serves on `advertised_host` (or what binds there): TLS with `credentials`."""
        server = aio.server(
            interceptors=[
                TokenInterceptor(token, [f"/{SERVICE_NAME}/"], command_digest),
                MalformedRequests(),
            ]
        )
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(service, server)
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        listen = join_host_port(bind_host(advertised_host), port)
        try:
            if credentials is None:
                bound = server.add_insecure_port(listen)
            else:
                bound = server.add_secure_port(listen, credentials)
        except RuntimeError as error:
            raise ServeError(
                f"WorkerService cannot listen on {listen}: {error} (LEVERS9_WORKER_PORT taken?)"
            ) from None
        await server.start()
        for name in ("", SERVICE_NAME):
            await health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return cls(server, health, join_host_port(advertised_host, bound))

    @classmethod
    async def start_unix(
        cls, service: WorkerService, token: str, path: str, command_digest: str = ""
    ) -> WorkerServer:
        """Tunnel mode: on a unix socket only, which nothing outside the pod can dial; the
        tunnel's `worker` target connects to it."""
        server = aio.server(
            interceptors=[
                TokenInterceptor(token, [f"/{SERVICE_NAME}/"], command_digest),
                MalformedRequests(),
            ]
        )
        worker_pb2_grpc.add_WorkerServiceServicer_to_server(service, server)
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        try:
            server.add_insecure_port(f"unix:{path}")
        except RuntimeError as error:
            raise ServeError(f"WorkerService cannot listen on unix:{path}: {error}") from None
        await server.start()
        for name in ("", SERVICE_NAME):
            await health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return cls(server, health, f"unix:{path}")

    async def stop(self, grace_s: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
