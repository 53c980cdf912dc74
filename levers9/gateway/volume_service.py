"""`levers9.v1.Volumes`: workspace volumes (VolumeWorkflow's records), for `levers9 volume ...`.

CreateVolume checks the request, lists the bucket once with the credentials (unless asked not
to: `bucket_problem`), seals the credentials under the controlplane's key (levers9.sealed) and
records only the ciphertext; no answer, log line or error ever holds them. A workspace token
acts on its own workspace's volumes only (levers9.gateway.scope: naming another is
PERMISSION_DENIED);
another workspace's volume is NOT_FOUND in exactly the words of a missing one, since its record
is read under the caller's workspace and no other. The operator acts in `default`, or in the
workspace it names, and lists every workspace's with `*`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import SecretStr

from levers9.core.volumes import (
    Credentials,
    VolumeRecord,
    VolumeSpec,
    endpoint_problem,
    name_problem,
    parse_bucket,
    region_problem,
    sealing_context,
)
from levers9.gateway.buckets import bucket_problem
from levers9.gateway.roles import Authority, Identity
from levers9.gateway.scope import call_workspace, identify
from levers9.logs import get_logger
from levers9.proto import volumes_pb2, volumes_pb2_grpc
from levers9.records.volumes import TemporalVolumeRecords, VolumeExists
from levers9.sealed import seal

Context = grpc.aio.ServicerContext[Any, Any]
BucketCheck = Callable[[VolumeSpec, Credentials], Awaitable[str | None]]
ALL_WORKSPACES = "*"
MAX_KEY_CHARS = 1024

log = get_logger(__name__)


def missing(name: str, workspace: str) -> str:
    """What a volume the caller cannot see is called: the same for one that does not exist."""
    return f"no volume {name} in workspace {workspace}: `levers9 volume list` shows them"


def volume_message(record: VolumeRecord) -> volumes_pb2.Volume:
    spec = record.spec
    created = None
    if spec.created_at is not None:
        created = Timestamp()
        created.FromDatetime(spec.created_at.astimezone(UTC))
    return volumes_pb2.Volume(
        name=spec.name,
        workspace=spec.workspace,
        bucket=spec.bucket,
        endpoint=spec.endpoint,
        region=spec.region,
        created_at=created,
        key_generation=record.sealed.generation,
    )


class VolumesService(volumes_pb2_grpc.VolumesServicer):
    def __init__(
        self,
        records: TemporalVolumeRecords,
        authority: Authority,
        secret: SecretStr,
        key_generation: int = 1,
        check: BucketCheck = bucket_problem,
    ) -> None:
        self._records = records
        self._authority = authority
        self._secret = secret
        self._generation = key_generation
        self._check = check

    async def _workspace(
        self, identity: Identity, asked: str, context: Context, *, must_exist: bool = False
    ) -> str:
        return await call_workspace(
            self._authority, identity, asked, context, objects="volumes", creating=must_exist
        )

    @staticmethod
    async def _name(context: Context, name: str) -> None:
        problem = name_problem(name)
        if problem is not None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"name: {problem}")

    async def _spec(self, request: volumes_pb2.CreateVolumeRequest, context: Context) -> VolumeSpec:
        await self._name(context, request.name)
        try:
            bucket = parse_bucket(request.bucket)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bucket: {exc}")
        for field, problem in (
            ("endpoint", endpoint_problem(request.endpoint)),
            ("region", region_problem(request.region)),
        ):
            if problem is not None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {problem}")
        for field in ("access_key_id", "secret_access_key"):
            value = getattr(request, field)
            if not value:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{field}: missing (--credentials-file: [default] with aws_access_key_id"
                    " and aws_secret_access_key)",
                )
            if len(value) > MAX_KEY_CHARS or any(c.isspace() for c in value):
                # Never quoted: it may be the secret.
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, f"{field}: not one word of printable text"
                )
        return VolumeSpec(
            name=request.name,
            workspace="",
            bucket=bucket.url,
            endpoint=request.endpoint.rstrip("/"),
            region=request.region,
        )

    async def CreateVolume(
        self, request: volumes_pb2.CreateVolumeRequest, context: Context
    ) -> volumes_pb2.CreateVolumeResponse:
        identity = await identify(self._authority, context)
        spec = await self._spec(request, context)
        workspace = await self._workspace(identity, request.workspace, context, must_exist=True)
        spec = spec.model_copy(update={"workspace": workspace, "created_at": datetime.now(UTC)})
        credentials = Credentials(
            access_key_id=request.access_key_id, secret_access_key=request.secret_access_key
        )
        if await self._records.get(workspace, spec.name) is not None:
            await context.abort(
                grpc.StatusCode.ALREADY_EXISTS,
                f"volume {spec.name} exists in workspace {workspace}:"
                f" `levers9 volume delete {spec.name}` first",
            )
        if not request.skip_check:
            problem = await self._check(spec, credentials)
            if problem is not None:
                log.info("volume refused", volume=spec.name, workspace=workspace, problem=problem)
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"volume {spec.name}: {problem}; nothing recorded (fix the credentials or"
                    " the bucket, or --no-check for an endpoint only the workers reach)",
                )
        sealed = seal(
            self._secret.get_secret_value(),
            self._generation,
            credentials,
            sealing_context(workspace, spec.name),
        )
        record = VolumeRecord(spec=spec, sealed=sealed)
        try:
            await self._records.create(record)
        except VolumeExists as exc:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc))
        log.info(
            "volume created",
            volume=spec.name,
            workspace=workspace,
            bucket=spec.bucket,
            checked=not request.skip_check,
        )
        return volumes_pb2.CreateVolumeResponse(volume=volume_message(record))

    async def GetVolume(
        self, request: volumes_pb2.GetVolumeRequest, context: Context
    ) -> volumes_pb2.GetVolumeResponse:
        identity = await identify(self._authority, context)
        await self._name(context, request.name)
        workspace = await self._workspace(identity, request.workspace, context)
        record = await self._records.get(workspace, request.name)
        if record is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, missing(request.name, workspace))
        assert record is not None
        return volumes_pb2.GetVolumeResponse(volume=volume_message(record))

    async def ListVolumes(
        self, request: volumes_pb2.ListVolumesRequest, context: Context
    ) -> volumes_pb2.ListVolumesResponse:
        identity = await identify(self._authority, context)
        workspace: str | None
        if request.workspace == ALL_WORKSPACES and identity.operator:
            workspace = None
        else:
            workspace = await self._workspace(identity, request.workspace, context)
        records = await self._records.list(workspace)
        seen = [r for r in records if identity.sees(r.spec.workspace)]
        return volumes_pb2.ListVolumesResponse(volumes=[volume_message(r) for r in seen])

    async def DeleteVolume(
        self, request: volumes_pb2.DeleteVolumeRequest, context: Context
    ) -> volumes_pb2.DeleteVolumeResponse:
        identity = await identify(self._authority, context)
        await self._name(context, request.name)
        workspace = await self._workspace(identity, request.workspace, context)
        if await self._records.get(workspace, request.name) is None or not (
            await self._records.delete(workspace, request.name)
        ):
            await context.abort(grpc.StatusCode.NOT_FOUND, missing(request.name, workspace))
        log.info("volume deleted", volume=request.name, workspace=workspace)
        return volumes_pb2.DeleteVolumeResponse()
