"""How the endpoint commands reach the endpoints: the controlplane's gateway (Endpoints) when the
command holds a token, the operator's or a workspace's; else, or when the gateway cannot be
reached with the operator's token (said once, on stderr), Temporal straight. A workspace token
has the gateway alone: its endpoints are what the gateway shows it, never Temporal's namespace.

From Temporal, a query no Temporal worker answers makes the command show the endpoints as
created (their memos) and say the controlplane is down (`Shown.down`).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import grpc

from levers9.cli.gateway_api import (
    CALL_TIMEOUT_S,
    GatewayRefused,
    GatewayUnavailable,
    gateway_stub,
)
from levers9.cli.output import errors
from levers9.cli.unreachable import no_temporal_worker, unreachable
from levers9.config import ControlplaneSettings
from levers9.core.endpoints import EndpointSpec, EndpointView
from levers9.core.workspaces import DEFAULT_WORKSPACE, parse_token
from levers9.endpoint_wire import spec_from_message, spec_message, view_from_message
from levers9.errors import ControlplaneUnreachable
from levers9.proto import endpoints_pb2, endpoints_pb2_grpc

if TYPE_CHECKING:
    from temporalio.client import Client

    from levers9.records.endpoints import RecordedEndpoint

T = TypeVar("T")
Metadata = tuple[tuple[str, str]]


class Refused(Exception):
    """The endpoint cannot be made or reached as asked; the message says why (one line)."""


@dataclass(frozen=True)
class Shown:
    """What a command shows: the endpoints now; or, when the controlplane did not answer
    (`down`), those Temporal recorded as created."""

    views: list[EndpointView] = field(default_factory=list)
    recorded: list[RecordedEndpoint] = field(default_factory=list)
    down: ControlplaneUnreachable | None = None


@dataclass(frozen=True)
class Deleted:
    """A delete told; `ended`: its record ended (its replicas stopped) within the wait, as
    `view` (None: it had ended before it was asked again)."""

    ended: bool = False
    view: EndpointView | None = None
    took_s: float = 0.0


class EndpointAccess:
    def __init__(self, settings: ControlplaneSettings) -> None:
        self._settings = settings
        token = settings.operator_token()
        self._gateway = token is not None
        self._workspace = token is not None and parse_token(token.get_secret_value()) is not None
        self._gateway_failed = False
        self._client: Client | None = None

    async def _ask(
        self,
        through_gateway: Callable[[endpoints_pb2_grpc.EndpointsAsyncStub, Metadata], Awaitable[T]],
        through_temporal: Callable[[], Awaitable[T]],
    ) -> T:
        if self._gateway:
            try:
                async with gateway_stub(self._settings, endpoints_pb2_grpc.EndpointsStub) as (
                    stub,
                    metadata,
                ):
                    return await through_gateway(stub, metadata)
            except GatewayRefused as exc:
                raise Refused(str(exc)) from None
            except GatewayUnavailable as exc:
                if self._workspace:  # a workspace has nowhere else to ask
                    raise Refused(str(exc)) from None
                errors.print(f"asking Temporal directly: {exc}", highlight=False)
                self._gateway = False
                self._gateway_failed = True
        return await through_temporal()

    async def _temporal(self) -> Client:
        if self._client is None:
            from levers9.temporal import connect

            self._client = await connect(self._settings)
        return self._client

    def _unreachable(self, exc: Exception) -> ControlplaneUnreachable:
        problems = ["its gateway did not answer"] if self._gateway_failed else []
        problems.append(no_temporal_worker(self._settings, str(exc)))
        return unreachable(self._settings, *problems)

    # -- create ------------------------------------------------------------------------------

    async def create(self, spec: EndpointSpec) -> EndpointSpec:
        """Starts the endpoint's record; its spec as created (its workspace filled in).
        `spec.workspace` "": the caller's own."""

        async def gateway(
            stub: endpoints_pb2_grpc.EndpointsAsyncStub, md: Metadata
        ) -> EndpointSpec:
            request = endpoints_pb2.CreateEndpointRequest(spec=spec_message(spec))
            reply = await stub.CreateEndpoint(request, metadata=md, timeout=CALL_TIMEOUT_S)
            return spec_from_message(reply.spec)

        return await self._ask(gateway, lambda: self._create_in_temporal(spec))

    async def _create_in_temporal(self, spec: EndpointSpec) -> EndpointSpec:
        from levers9.records.endpoints import EndpointExists, create_endpoint
        from levers9.records.workspaces import TemporalWorkspaceRecords
        from levers9.temporal import list_reconcile_schedules, no_such_pool

        spec = spec.model_copy(update={"workspace": spec.workspace or DEFAULT_WORKSPACE})
        client = await self._temporal()
        pools = {row.pool for row in await list_reconcile_schedules(self._settings)}
        if spec.pool_name not in pools:
            raise Refused(no_such_pool(spec.pool_name, pools))
        if spec.workspace != DEFAULT_WORKSPACE:
            records = TemporalWorkspaceRecords(client, self._settings.task_queue)
            if await records.get(spec.workspace) is None:
                raise Refused(f"no workspace {spec.workspace} (`levers9 workspace list`)")
        try:
            await create_endpoint(client, self._settings.task_queue, spec)
        except EndpointExists as exc:
            raise Refused(str(exc)) from None
        return spec

    # -- read --------------------------------------------------------------------------------

    async def listing(self) -> Shown:
        async def gateway(stub: endpoints_pb2_grpc.EndpointsAsyncStub, md: Metadata) -> Shown:
            request = endpoints_pb2.ListEndpointsRequest()
            reply = await stub.ListEndpoints(request, metadata=md, timeout=CALL_TIMEOUT_S)
            return Shown([view_from_message(v) for v in reply.views])

        return await self._ask(gateway, self._listing_in_temporal)

    async def _listing_in_temporal(self) -> Shown:
        from levers9.records.endpoints import endpoint_view, list_endpoints, recorded_endpoints
        from levers9.records.found import QUERY_WITHIN_S, NoQueryAnswer

        client = await self._temporal()
        try:
            views = [
                await endpoint_view(client, name, within=QUERY_WITHIN_S)
                for name in await list_endpoints(client)
            ]
        except NoQueryAnswer as exc:
            return Shown([], await recorded_endpoints(client), self._unreachable(exc))
        return Shown([v for v in views if v is not None])

    async def get(self, name: str) -> Shown:
        """The endpoint (`views`: none when there is no such endpoint, or another
        workspace's)."""

        async def gateway(stub: endpoints_pb2_grpc.EndpointsAsyncStub, md: Metadata) -> Shown:
            request = endpoints_pb2.GetEndpointRequest(name=name)
            try:
                reply = await stub.GetEndpoint(request, metadata=md, timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return Shown()
                raise
            return Shown([view_from_message(reply.view)])

        return await self._ask(gateway, lambda: self._get_in_temporal(name))

    async def _get_in_temporal(self, name: str) -> Shown:
        from levers9.records.endpoints import endpoint_view, recorded_endpoints
        from levers9.records.found import QUERY_WITHIN_S, NoQueryAnswer

        client = await self._temporal()
        try:
            view = await endpoint_view(client, name, within=QUERY_WITHIN_S)
        except NoQueryAnswer as exc:
            return Shown([], await recorded_endpoints(client, name), self._unreachable(exc))
        return Shown([view] if view is not None else [])

    # -- delete ------------------------------------------------------------------------------

    async def delete(self, name: str) -> bool:
        """Tells the endpoint to delete itself (its replicas stop); False when there is no such
        endpoint (or it is another workspace's)."""

        async def gateway(stub: endpoints_pb2_grpc.EndpointsAsyncStub, md: Metadata) -> bool:
            request = endpoints_pb2.DeleteEndpointRequest(name=name)
            try:
                await stub.DeleteEndpoint(request, metadata=md, timeout=CALL_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return False
                raise
            return True

        async def temporal() -> bool:
            from levers9.records.endpoints import delete_endpoint

            return await delete_endpoint(await self._temporal(), name)

        return await self._ask(gateway, temporal)

    async def deleted(self, name: str, wait_s: float) -> Deleted:
        """Once the endpoint's record ended (its replicas stopped), or `wait_s` passed."""
        started = time.monotonic()

        async def gateway(stub: endpoints_pb2_grpc.EndpointsAsyncStub, md: Metadata) -> Deleted:
            # Telling it again is as telling it once; NOT_FOUND: it ended meanwhile.
            request = endpoints_pb2.DeleteEndpointRequest(name=name, wait_seconds=wait_s)
            try:
                reply = await stub.DeleteEndpoint(
                    request, metadata=md, timeout=CALL_TIMEOUT_S + wait_s
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return Deleted(ended=True, took_s=time.monotonic() - started)
                raise
            view = view_from_message(reply.view) if reply.ended else None
            return Deleted(reply.ended, view, time.monotonic() - started)

        async def temporal() -> Deleted:
            from levers9.records.endpoints import TemporalEndpointRecords

            records = TemporalEndpointRecords(await self._temporal(), self._settings.task_queue)
            view = await records.ended(name, wait_s)
            return Deleted(view is not None, view, time.monotonic() - started)

        return await self._ask(gateway, temporal)
