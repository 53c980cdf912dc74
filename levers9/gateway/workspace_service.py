"""`levers9.v1.Workspaces`: workspaces and their tokens, for `levers9 workspace ...`.

Every call is the operator's but GetWorkspace, which a workspace token makes for its own
workspace (another workspace is NOT_FOUND, as one that does not exist). A workspace token on an
operator call: PERMISSION_DENIED naming the operator. CreateWorkspaceToken makes the token here
(256 random bits), tells the workspace's record only the SHA-256 of its secret, and answers the
token once; it is in no log line, no history, no memo.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from levers9.core.workspaces import (
    MAX_LABEL_CHARS,
    MAX_WEIGHT,
    TOKEN_ID_CHARS,
    WorkspaceLimits,
    WorkspaceState,
    WorkspaceToken,
    name_problem,
    token_digest,
    workspace_token,
)
from levers9.gateway.roles import Authority, Forbidden, operator_only
from levers9.gateway.scope import identify
from levers9.logs import get_logger
from levers9.proto import gateway_pb2, gateway_pb2_grpc, pools_pb2
from levers9.records.disks import TemporalDiskRecords
from levers9.records.volumes import TemporalVolumeRecords
from levers9.records.workspaces import TemporalWorkspaceRecords, WorkspaceExists
from levers9.task_wire import to_message
from levers9.temporal import no_such_pool

MAX_EXPIRY = timedelta(days=3650)
MAX_NAMED = 10
"""The most volumes (and disks) a refused workspace delete names, each with its command."""
Context = grpc.aio.ServicerContext[Any, Any]

log = get_logger(__name__)


def _timestamp(moment: datetime | None) -> Timestamp | None:
    if moment is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(moment.astimezone(UTC))
    return stamp


def token_message(token: WorkspaceToken) -> gateway_pb2.WorkspaceTokenRecord:
    """A token's record as the wire carries it: never its hash."""
    return gateway_pb2.WorkspaceTokenRecord(
        token_id=token.token_id,
        label=token.label,
        created_at=_timestamp(token.created_at),
        expires_at=_timestamp(token.expires_at),
        last_used_at=_timestamp(token.last_used_at),
        revoked_at=_timestamp(token.revoked_at),
    )


class WorkspacesService(gateway_pb2_grpc.WorkspacesServicer):
    def __init__(
        self,
        records: TemporalWorkspaceRecords,
        authority: Authority,
        volumes: TemporalVolumeRecords | None = None,
        disks: TemporalDiskRecords | None = None,
    ) -> None:
        self._records = records
        self._authority = authority
        self._volumes = volumes
        self._disks = disks

    async def _operator(self, context: Context, call: str) -> None:
        identity = await identify(self._authority, context)
        try:
            operator_only(identity, call)
        except Forbidden as exc:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))

    @staticmethod
    async def _name(context: Context, name: str, field: str = "name") -> None:
        problem = name_problem(name)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {problem}")

    async def _state(self, context: Context, name: str) -> WorkspaceState:
        state = await self._records.get(name)
        if state is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no workspace {name}")
        assert state is not None
        return state

    async def _message(
        self, state: WorkspaceState, *, usage: bool = False
    ) -> gateway_pb2.Workspace:
        """The record; with `usage`, its part of each pool it has work in (a query of each
        pool's placement: GetWorkspace's, not a listing's)."""
        now = datetime.now(UTC)
        pools = (
            [
                gateway_pb2.WorkspacePoolUsage(
                    pool_name=pool, usage=to_message(row, pools_pb2.PoolWorkspaceUsage)
                )
                for pool, row in await self._records.pool_usage(state.name)
            ]
            if usage
            else []
        )
        return gateway_pb2.Workspace(
            name=state.name,
            gpu_quota=state.gpu_quota,
            max_queued=state.max_queued,
            created_at=_timestamp(state.created_at),
            live_tokens=sum(1 for t in state.tokens if t.live(now)),
            running_tasks=await self._records.running_tasks(state.name),
            default_pool=state.default_pool,
            weight=state.weight,
            pools=pools,
        )

    async def _default_pool(self, context: Context, pool: str) -> None:
        """INVALID_ARGUMENT naming the field and the pools there are, unless `pool` is ""
        or one of this controlplane's pools."""
        if not pool:
            return
        names = await self._records.pool_names()
        if pool not in names:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"default_pool: {no_such_pool(pool, names)}"
            )

    @staticmethod
    async def _limits(
        context: Context,
        request: gateway_pb2.CreateWorkspaceRequest | gateway_pb2.SetWorkspaceRequest,
    ) -> WorkspaceLimits:
        given: dict[str, int | str] = {}
        for field in ("gpu_quota", "max_queued"):
            if request.HasField(field):
                value = getattr(request, field)
                if value < 0:
                    await context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {value} is below 0"
                    )
                given[field] = value
        if request.HasField("weight"):
            if not 1 <= request.weight <= MAX_WEIGHT:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"weight: {request.weight} is not 1 to {MAX_WEIGHT}",
                )
            given["weight"] = request.weight
        if isinstance(request, gateway_pb2.SetWorkspaceRequest) and request.HasField(
            "default_pool"
        ):
            given["default_pool"] = request.default_pool
        return WorkspaceLimits.model_validate(given)

    async def CreateWorkspace(
        self, request: gateway_pb2.CreateWorkspaceRequest, context: Context
    ) -> gateway_pb2.Workspace:
        await self._operator(context, "creating a workspace")
        await self._name(context, request.name)
        limits = await self._limits(context, request)
        await self._default_pool(context, request.default_pool)
        state = WorkspaceState(
            name=request.name,
            gpu_quota=limits.gpu_quota,
            max_queued=limits.max_queued,
            weight=limits.weight or 1,
            default_pool=request.default_pool,
            created_at=datetime.now(UTC),
        )
        try:
            await self._records.create(state)
        except WorkspaceExists as exc:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
        self._authority.forget(state.name)  # this replica may remember it as absent
        log.info("workspace created", workspace=state.name)
        return await self._message(state)

    async def GetWorkspace(
        self, request: gateway_pb2.GetWorkspaceRequest, context: Context
    ) -> gateway_pb2.Workspace:
        identity = await identify(self._authority, context)
        await self._name(context, request.name)
        if not identity.sees(request.name):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no workspace {request.name}")
        return await self._message(await self._state(context, request.name), usage=True)

    async def ListWorkspaces(
        self, request: gateway_pb2.ListWorkspacesRequest, context: Context
    ) -> gateway_pb2.ListWorkspacesResponse:
        await self._operator(context, "listing workspaces")
        states = await self._records.list()
        return gateway_pb2.ListWorkspacesResponse(
            workspaces=[await self._message(state) for state in states]
        )

    async def SetWorkspace(
        self, request: gateway_pb2.SetWorkspaceRequest, context: Context
    ) -> gateway_pb2.Workspace:
        await self._operator(context, "changing a workspace")
        await self._name(context, request.name)
        limits = await self._limits(context, request)
        if limits == WorkspaceLimits():
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "nothing to set: give gpu_quota, max_queued, weight or default_pool",
            )
        await self._default_pool(context, limits.default_pool or "")
        state = await self._records.set_limits(request.name, limits)
        # This replica's next submit checks the new limits (max-queued), not its cached ones.
        self._authority.forget(request.name)
        if state is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no workspace {request.name}")
        assert state is not None
        log.info(
            "workspace changed",
            workspace=state.name,
            gpu_quota=state.gpu_quota,
            max_queued=state.max_queued,
            weight=state.weight,
            default_pool=state.default_pool,
        )
        return await self._message(state)

    async def DeleteWorkspace(
        self, request: gateway_pb2.DeleteWorkspaceRequest, context: Context
    ) -> gateway_pb2.DeleteWorkspaceResponse:
        await self._operator(context, "deleting a workspace")
        await self._name(context, request.name)
        await self._state(context, request.name)
        running = await self._records.running_tasks(request.name)
        if running:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"workspace {request.name} has {running} running task(s): cancel them first"
                f" (`levers9 task list` shows them), then delete it",
            )
        kept = await self._storage(request.name)
        if kept:
            # A workspace made again under this name would otherwise mount them.
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"workspace {request.name} has {kept}: delete them first, then delete it",
            )
        if not await self._records.delete(request.name):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no workspace {request.name}")
        self._authority.forget(request.name)
        log.info("workspace deleted", workspace=request.name)
        return gateway_pb2.DeleteWorkspaceResponse()

    async def _storage(self, workspace: str) -> str:
        """What storage `workspace` still has, each with the command that deletes it ("":
        none): `1 volume(s) (data: `levers9 volume delete data --workspace W`) and ...`."""
        kinds: list[tuple[str, list[str]]] = []
        if self._volumes is not None:
            volumes = await self._volumes.list(workspace)
            kinds.append(("volume", [v.spec.name for v in volumes]))
        if self._disks is not None:
            disks = await self._disks.list(workspace=workspace)
            kinds.append(("disk", [d.name for d in disks]))
        said = []
        for kind, names in kinds:
            if not names:
                continue
            each = [
                f"{name}: `levers9 {kind} delete {name} --workspace {workspace}`"
                for name in names[:MAX_NAMED]
            ]
            more = len(names) - MAX_NAMED
            if more > 0:
                each.append(f"{more} more: `levers9 {kind} list --workspace {workspace}`")
            said.append(f"{len(names)} {kind}(s) ({'; '.join(each)})")
        return " and ".join(said)

    async def CreateWorkspaceToken(
        self, request: gateway_pb2.CreateWorkspaceTokenRequest, context: Context
    ) -> gateway_pb2.CreateWorkspaceTokenResponse:
        await self._operator(context, "making a workspace token")
        await self._name(context, request.workspace, "workspace")
        if len(request.label) > MAX_LABEL_CHARS or not request.label.isprintable():
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"label: printable text of at most {MAX_LABEL_CHARS} characters",
            )
        if not 0 <= request.expires_in_seconds <= MAX_EXPIRY.total_seconds():
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"expires_in_seconds: 0 (never) to {int(MAX_EXPIRY.total_seconds())}",
            )
        now = datetime.now(UTC)
        secret = secrets.token_urlsafe(32)  # 256 bits
        token_id = secrets.token_hex(TOKEN_ID_CHARS // 2)
        record = WorkspaceToken(
            token_id=token_id,
            label=request.label,
            digest=token_digest(secret),
            created_at=now,
            expires_at=(
                now + timedelta(seconds=request.expires_in_seconds)
                if request.expires_in_seconds
                else None
            ),
        )
        refusal = await self._records.add_token(request.workspace, record)
        if refusal is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no workspace {request.workspace}")
        if refusal:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, refusal)
        log.info(
            "workspace token created",
            workspace=request.workspace,
            token_id=token_id,
            label=request.label,
        )
        return gateway_pb2.CreateWorkspaceTokenResponse(
            token=workspace_token(request.workspace, token_id, secret),
            record=token_message(record),
        )

    async def ListWorkspaceTokens(
        self, request: gateway_pb2.ListWorkspaceTokensRequest, context: Context
    ) -> gateway_pb2.ListWorkspaceTokensResponse:
        await self._operator(context, "listing a workspace's tokens")
        await self._name(context, request.workspace, "workspace")
        state = await self._state(context, request.workspace)
        return gateway_pb2.ListWorkspaceTokensResponse(
            tokens=[token_message(t) for t in state.tokens]
        )

    async def RevokeWorkspaceToken(
        self, request: gateway_pb2.RevokeWorkspaceTokenRequest, context: Context
    ) -> gateway_pb2.RevokeWorkspaceTokenResponse:
        await self._operator(context, "revoking a workspace token")
        await self._name(context, request.workspace, "workspace")
        refusal = await self._records.revoke_token(request.workspace, request.token_id)
        if refusal is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no workspace {request.workspace}")
        if refusal:
            await context.abort(grpc.StatusCode.NOT_FOUND, refusal)
        self._authority.forget(request.workspace)
        log.info("workspace token revoked", workspace=request.workspace, token_id=request.token_id)
        return gateway_pb2.RevokeWorkspaceTokenResponse()

    async def WhoAmI(
        self, request: gateway_pb2.WhoAmIRequest, context: Context
    ) -> gateway_pb2.WhoAmIResponse:
        identity = await identify(self._authority, context)
        # The token checked out against this record a moment ago (the replica's cache).
        state = await self._authority.workspace(identity.own_workspace)
        default_pool = state.default_pool if state is not None else ""
        if identity.workspace is None:
            return gateway_pb2.WhoAmIResponse(
                operator=True, label="operator", default_pool=default_pool
            )
        kept = state.token(identity.token_id) if state is not None else None
        return gateway_pb2.WhoAmIResponse(
            workspace=identity.workspace,
            token_id=identity.token_id,
            label=kept.label if kept is not None else "",
            default_pool=default_pool,
        )

    async def ListPoolNames(
        self, request: gateway_pb2.ListPoolNamesRequest, context: Context
    ) -> gateway_pb2.ListPoolNamesResponse:
        identity = await identify(self._authority, context)
        state = await self._authority.workspace(identity.own_workspace)
        return gateway_pb2.ListPoolNamesResponse(
            pool_names=await self._records.pool_names(),
            default_pool=state.default_pool if state is not None else "",
        )
