"""The dashboard's way to the controlplane: the gateway's own services (`levers9.v1.Tasks`,
`Pools`, `Endpoints`, `Workspaces`, `Boxes`), called in this process with the signed-in user's
token as the call's bearer token. Each call is authorised by the gateway's `Authority` and
scoped by the service exactly as the CLI's call is: another workspace's task is NOT_FOUND here
as there, a workspace token on an operator call PERMISSION_DENIED. The page keeps no rules of
its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import grpc

from levers9.gateway.box_service import BoxesService
from levers9.gateway.endpoint_service import EndpointsService
from levers9.gateway.errors import Unauthenticated
from levers9.gateway.pool_service import PoolsService
from levers9.gateway.task_service import TasksService
from levers9.gateway.workspace_service import WorkspacesService
from levers9.proto import (
    boxes_pb2,
    endpoints_pb2,
    gateway_pb2,
    pools_pb2,
    worker_pb2,
)
from levers9.rpc import bearer


class Refused(Exception):
    """The service's answer was no: its status code and its own message."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _Call:
    """What the services read of a call's context: its metadata, and `abort`."""

    def __init__(self, token: str) -> None:
        self._metadata = bearer.metadata(token)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise Refused(code, details)

    async def send_initial_metadata(self, metadata: object) -> None:
        return None


def _context(token: str) -> Any:
    return cast(Any, _Call(token))


@dataclass(frozen=True)
class Services:
    """The gateway's services the dashboard reads and acts through (None: not served here)."""

    tasks: TasksService | None
    pools: PoolsService | None
    endpoints: EndpointsService | None
    workspaces: WorkspacesService | None
    boxes: BoxesService | None = None


class Calls:
    """One user's calls (their token), each a `Refused` when the service says no."""

    def __init__(self, services: Services, token: str) -> None:
        self._services = services
        self._token = token

    def _tasks(self) -> TasksService:
        if self._services.tasks is None:
            raise Refused(grpc.StatusCode.UNIMPLEMENTED, "this controlplane serves no tasks")
        return self._services.tasks

    def _pools(self) -> PoolsService:
        if self._services.pools is None:
            raise Refused(grpc.StatusCode.UNIMPLEMENTED, "this controlplane serves no pools")
        return self._services.pools

    def _endpoints(self) -> EndpointsService:
        if self._services.endpoints is None:
            raise Refused(grpc.StatusCode.UNIMPLEMENTED, "this controlplane serves no endpoints")
        return self._services.endpoints

    def _workspaces(self) -> WorkspacesService:
        if self._services.workspaces is None:
            raise Refused(grpc.StatusCode.UNIMPLEMENTED, "this controlplane has no workspaces")
        return self._services.workspaces

    def _boxes(self) -> BoxesService:
        if self._services.boxes is None:
            raise Refused(grpc.StatusCode.UNIMPLEMENTED, "this controlplane serves no boxes")
        return self._services.boxes

    # -- who ----------------------------------------------------------------------------------

    async def whoami(self) -> gateway_pb2.WhoAmIResponse:
        """Who the token makes the caller (WhoAmI; a gateway without workspaces: its
        Authority, which knows the operator's token only)."""
        if self._services.workspaces is not None:
            request = gateway_pb2.WhoAmIRequest()
            return await self._services.workspaces.WhoAmI(request, _context(self._token))
        try:
            identity = await self._tasks().authority.identify(bearer.metadata(self._token))
        except Unauthenticated as exc:
            raise Refused(grpc.StatusCode.UNAUTHENTICATED, exc.message) from None
        return gateway_pb2.WhoAmIResponse(
            operator=identity.operator,
            workspace=identity.workspace or "",
            token_id=identity.token_id,
            label="operator" if identity.operator else identity.token_id,
        )

    # -- tasks --------------------------------------------------------------------------------

    async def list_tasks(
        self, pool_name: str, page_size: int, page_token: bytes
    ) -> gateway_pb2.ListTasksResponse:
        request = gateway_pb2.ListTasksRequest(
            pool_name=pool_name, page_size=page_size, page_token=page_token
        )
        return await self._tasks().ListTasks(request, _context(self._token))

    async def task(self, task_id: str) -> gateway_pb2.TaskRecord:
        request = gateway_pb2.GetTaskRecordRequest(task_id=task_id)
        answer = await self._tasks().GetTaskRecord(request, _context(self._token))
        return answer.record

    async def cancel(self, task_id: str, reason: str) -> None:
        request = gateway_pb2.CancelTaskRecordRequest(task_id=task_id, reason=reason)
        await self._tasks().CancelTask(request, _context(self._token))

    def logs(
        self, task_id: str, follow: bool, offset: int = 0
    ) -> AsyncIterator[worker_pb2.LogChunk]:
        """The task's output as `levers9 task logs -f` streams it (the gateway relays it from
        the task's worker, or through the replica that holds its tunnel)."""
        request = gateway_pb2.StreamTaskLogsRequest(task_id=task_id, follow=follow, offset=offset)
        return self._tasks().StreamTaskLogs(request, _context(self._token))

    # -- pools --------------------------------------------------------------------------------

    async def pools(self) -> list[pools_pb2.Pool]:
        answer = await self._pools().ListPools(pools_pb2.ListPoolsRequest(), _context(self._token))
        return list(answer.pools)

    async def pool(self, name: str) -> pools_pb2.GetPoolResponse:
        return await self._pools().GetPool(
            pools_pb2.GetPoolRequest(name=name), _context(self._token)
        )

    async def machines(self, pool_name: str = "") -> list[pools_pb2.Machine]:
        request = pools_pb2.ListMachinesRequest(pool_name=pool_name)
        answer = await self._pools().ListMachines(request, _context(self._token))
        return list(answer.machines)

    # -- endpoints ----------------------------------------------------------------------------

    async def endpoints(self) -> list[endpoints_pb2.EndpointView]:
        request = endpoints_pb2.ListEndpointsRequest()
        answer = await self._endpoints().ListEndpoints(request, _context(self._token))
        return list(answer.views)

    # -- boxes ------------------------------------------------------------------------------

    async def boxes(self) -> list[boxes_pb2.Box]:
        """The caller's boxes (the operator's: every workspace's), as `levers9 box list`."""
        answer = await self._boxes().ListBoxes(boxes_pb2.ListBoxesRequest(), _context(self._token))
        return list(answer.boxes)

    # -- workspaces ---------------------------------------------------------------------------

    async def workspaces(self) -> list[gateway_pb2.Workspace]:
        request = gateway_pb2.ListWorkspacesRequest()
        answer = await self._workspaces().ListWorkspaces(request, _context(self._token))
        return list(answer.workspaces)

    async def workspace(self, name: str) -> gateway_pb2.Workspace:
        request = gateway_pb2.GetWorkspaceRequest(name=name)
        return await self._workspaces().GetWorkspace(request, _context(self._token))

    async def create_workspace(
        self, name: str, gpu_quota: int | None, max_queued: int | None
    ) -> gateway_pb2.Workspace:
        request = gateway_pb2.CreateWorkspaceRequest(
            name=name, gpu_quota=gpu_quota, max_queued=max_queued
        )
        return await self._workspaces().CreateWorkspace(request, _context(self._token))

    async def tokens(self, workspace: str) -> list[gateway_pb2.WorkspaceTokenRecord]:
        request = gateway_pb2.ListWorkspaceTokensRequest(workspace=workspace)
        answer = await self._workspaces().ListWorkspaceTokens(request, _context(self._token))
        return list(answer.tokens)

    async def create_token(
        self, workspace: str, label: str, expires_in_seconds: int
    ) -> gateway_pb2.CreateWorkspaceTokenResponse:
        request = gateway_pb2.CreateWorkspaceTokenRequest(
            workspace=workspace, label=label, expires_in_seconds=expires_in_seconds
        )
        return await self._workspaces().CreateWorkspaceToken(request, _context(self._token))

    async def revoke_token(self, workspace: str, token_id: str) -> None:
        request = gateway_pb2.RevokeWorkspaceTokenRequest(workspace=workspace, token_id=token_id)
        await self._workspaces().RevokeWorkspaceToken(request, _context(self._token))
