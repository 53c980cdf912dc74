"""Workspace volumes through the gateway's Volumes service, on the dev server with a Temporal
worker hosting VolumeWorkflow and WorkspaceWorkflow, against moto's S3 checking credentials
(tests/buckets.py): the operator creates, lists, gets and deletes a volume of a bucket that
exists; a missing bucket, a wrong secret, an unknown key and a key without S3 rights are refused
at create with S3's code (NoSuchBucket, SignatureDoesNotMatch, InvalidAccessKeyId,
AccessDenied) and nothing recorded; a workspace token acts on its own volumes only, another
workspace's volume answers get and delete exactly as a missing one and is told nothing; the
record holds the credentials sealed only (its history, memo and search attributes scanned for
the key: absent); a task naming a volume its workspace does not have is refused at submit with
nothing started; and the run_task activity sends the agent (a recording WorkerService) the
volume's bucket with the credentials unsealed, in that call alone. `levers9 volume create` with a
malformed credentials file is refused naming the field, never the secret.
"""

from __future__ import annotations

import io
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from pydantic import SecretStr
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker
from typer.testing import CliRunner

from activities.dispatch import TaskActivities
from levers9.cli.volume import app as volume_app
from levers9.config import ControlplaneSettings
from levers9.contract import COMMAND_TOKEN_HEADER
from levers9.core.storage import TaskMount
from levers9.core.volumes import Credentials, volume_workflow_id
from levers9.gateway.server import Gateway
from levers9.gateway.task_records import TemporalTaskRecords
from levers9.models import TaskInput, WorkerTaskInput
from levers9.proto import (
    gateway_pb2,
    gateway_pb2_grpc,
    volumes_pb2,
    volumes_pb2_grpc,
    worker_pb2,
    worker_pb2_grpc,
)
from levers9.records.found import or_none
from levers9.records.volumes import TemporalVolumeRecords
from levers9.records.workers import TemporalWorkerRecords
from levers9.records.workspaces import TemporalWorkspaceRecords
from levers9.rpc import bearer
from levers9.task_wire import submit_request
from levers9.tokens import command_token, operator_token
from sandbox import aws
from tests.buckets import CheckingS3, checking_s3
from tests.factories import run_levers9
from tests.gateway.conftest import LOOPBACK
from tests.reliability.secrets_scan import corpus_of_json
from tests.waiting import eventually
from workflows import RUNNER
from workflows.volume import VolumeWorkflow
from workflows.workspace import WorkspaceWorkflow

if TYPE_CHECKING:
    from levers9.proto.gateway_pb2_grpc import TasksAsyncStub
    from levers9.proto.volumes_pb2_grpc import VolumesAsyncStub

Metadata = tuple[tuple[str, str], ...]
TIMEOUT_S = 30


@dataclass
class Plane:
    client: Client
    volumes: VolumesAsyncStub
    tasks: TasksAsyncStub
    operator: Metadata
    a: Metadata
    b: Metadata
    workspace_a: str
    workspace_b: str
    endpoint: str
    bucket: str
    secret: SecretStr
    task_queue: str
    address: str
    channel: grpc.aio.Channel
    key_id: str
    key: str
    denied: Credentials
    """A key S3 knows whose user may not list the bucket."""

    def token(self, metadata: Metadata) -> str:
        return metadata[0][1].removeprefix("Bearer ")

    def create(
        self, name: str, workspace: str = "", bucket: str = "", **fields: Any
    ) -> volumes_pb2.CreateVolumeRequest:
        values: dict[str, Any] = {
            "name": name,
            "workspace": workspace,
            "bucket": bucket or f"s3://{self.bucket}/runs",
            "endpoint": self.endpoint,
            "region": aws.REGION,
            "access_key_id": self.key_id,
            "secret_access_key": self.key,
        }
        return volumes_pb2.CreateVolumeRequest(**(values | fields))


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CheckingS3]:
    with checking_s3(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture
async def plane(
    dev_env: WorkflowEnvironment, secret: SecretStr, task_queue: str, s3: CheckingS3
) -> AsyncIterator[Plane]:
    client = dev_env.client
    bucket = f"levers9-test-{uuid.uuid4().hex[:8]}"
    s3.client().create_bucket(Bucket=bucket)
    gateway = Gateway(
        TemporalWorkerRecords(client),
        secret,
        tasks=TemporalTaskRecords(client, task_queue),
        workspaces=TemporalWorkspaceRecords(client, task_queue),
        volumes=TemporalVolumeRecords(client, task_queue),
        volume_key_generation=2,
    )
    suffix = uuid.uuid4().hex[:8]
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(
            Worker(
                client,
                task_queue=task_queue,
                workflows=[WorkspaceWorkflow, VolumeWorkflow],
                workflow_runner=RUNNER,
            )
        )
        port = await gateway.start(LOOPBACK)
        stack.push_async_callback(gateway.stop, 0)
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
        operator = bearer.metadata(operator_token(secret.get_secret_value()))
        workspaces = gateway_pb2_grpc.WorkspacesStub(channel)
        tokens = []
        for name in (f"a-{suffix}", f"b-{suffix}"):
            await workspaces.CreateWorkspace(
                gateway_pb2.CreateWorkspaceRequest(name=name), metadata=operator, timeout=TIMEOUT_S
            )
            made = await workspaces.CreateWorkspaceToken(
                gateway_pb2.CreateWorkspaceTokenRequest(workspace=name),
                metadata=operator,
                timeout=TIMEOUT_S,
            )
            tokens.append(bearer.metadata(made.token))
        yield Plane(
            client,
            volumes_pb2_grpc.VolumesStub(channel),
            gateway_pb2_grpc.TasksStub(channel),
            operator,
            tokens[0],
            tokens[1],
            f"a-{suffix}",
            f"b-{suffix}",
            s3.endpoint,
            bucket,
            secret,
            task_queue,
            f"127.0.0.1:{port}",
            channel,
            s3.allowed.access_key_id,
            s3.allowed.secret_access_key,
            s3.denied,
        )


@dataclass(frozen=True)
class Refusal:
    code: grpc.StatusCode
    details: str


async def _refused(call: Any) -> Refusal:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    return Refusal(refused.value.code(), refused.value.details() or "")


async def test_the_operator_creates_lists_gets_and_deletes_a_volume(plane: Plane) -> None:
    name = f"data-{uuid.uuid4().hex[:6]}"
    made = await plane.volumes.CreateVolume(
        plane.create(name), metadata=plane.operator, timeout=TIMEOUT_S
    )
    assert (made.volume.name, made.volume.workspace) == (name, "default")
    assert made.volume.bucket == f"s3://{plane.bucket}/runs"
    assert made.volume.key_generation == 2
    listed = await plane.volumes.ListVolumes(
        volumes_pb2.ListVolumesRequest(), metadata=plane.operator, timeout=TIMEOUT_S
    )
    assert [v.name for v in listed.volumes].count(name) == 1
    got = await plane.volumes.GetVolume(
        volumes_pb2.GetVolumeRequest(name=name), metadata=plane.operator, timeout=TIMEOUT_S
    )
    assert got.volume.endpoint == plane.endpoint
    again = await _refused(
        plane.volumes.CreateVolume(plane.create(name), metadata=plane.operator, timeout=TIMEOUT_S)
    )
    assert again.code == grpc.StatusCode.ALREADY_EXISTS
    await plane.volumes.DeleteVolume(
        volumes_pb2.DeleteVolumeRequest(name=name), metadata=plane.operator, timeout=TIMEOUT_S
    )
    gone = await _refused(
        plane.volumes.GetVolume(
            volumes_pb2.GetVolumeRequest(name=name), metadata=plane.operator, timeout=TIMEOUT_S
        )
    )
    assert gone.code == grpc.StatusCode.NOT_FOUND
    assert (
        gone.details == f"no volume {name} in workspace default: `levers9 volume list` shows them"
    )


async def test_a_missing_bucket_is_refused_with_s3s_code_and_nothing_recorded(plane: Plane) -> None:
    name = f"nob-{uuid.uuid4().hex[:6]}"
    refused = await _refused(
        plane.volumes.CreateVolume(
            plane.create(name, bucket="s3://levers9-no-such-bucket-here"),
            metadata=plane.operator,
            timeout=TIMEOUT_S,
        )
    )
    assert refused.code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"volume {name}: NoSuchBucket on s3://levers9-no-such-bucket-here" in refused.details
    assert plane.key not in refused.details
    assert plane.key_id not in refused.details
    records = TemporalVolumeRecords(plane.client, plane.task_queue)
    assert await records.get("default", name) is None
    handle = plane.client.get_workflow_handle(volume_workflow_id("default", name))
    assert await or_none(handle.describe()) is None


@pytest.mark.parametrize(
    ("key", "code"),
    [
        ("wrong-secret", "SignatureDoesNotMatch"),
        ("unknown-key", "InvalidAccessKeyId"),
        ("denied", "AccessDenied"),
    ],
)
async def test_bad_credentials_are_refused_with_s3s_code_and_nothing_recorded(
    plane: Plane, key: str, code: str
) -> None:
    wrong = f"wrong-{uuid.uuid4().hex}"
    key_id, secret = {
        "wrong-secret": (plane.key_id, wrong),
        "unknown-key": ("AKIANOSUCHKEY0000000", wrong),
        "denied": (plane.denied.access_key_id, plane.denied.secret_access_key),
    }[key]
    name = f"bad-{uuid.uuid4().hex[:6]}"
    refused = await _refused(
        plane.volumes.CreateVolume(
            plane.create(name, access_key_id=key_id, secret_access_key=secret),
            metadata=plane.a,
            timeout=TIMEOUT_S,
        )
    )
    assert refused.code == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.details.startswith(f"volume {name}: {code} on s3://{plane.bucket}/runs")
    assert secret not in refused.details
    records = TemporalVolumeRecords(plane.client, plane.task_queue)
    assert await records.get(plane.workspace_a, name) is None


async def test_another_workspaces_volume_is_not_found_and_untouched(plane: Plane) -> None:
    name = f"data-{uuid.uuid4().hex[:6]}"
    await plane.volumes.CreateVolume(plane.create(name), metadata=plane.a, timeout=TIMEOUT_S)
    own = await plane.volumes.GetVolume(
        volumes_pb2.GetVolumeRequest(name=name), metadata=plane.a, timeout=TIMEOUT_S
    )
    assert own.volume.workspace == plane.workspace_a
    missing = await _refused(
        plane.volumes.GetVolume(
            volumes_pb2.GetVolumeRequest(name="never-made"), metadata=plane.b, timeout=TIMEOUT_S
        )
    )
    for call in (
        plane.volumes.GetVolume(
            volumes_pb2.GetVolumeRequest(name=name), metadata=plane.b, timeout=TIMEOUT_S
        ),
        plane.volumes.DeleteVolume(
            volumes_pb2.DeleteVolumeRequest(name=name), metadata=plane.b, timeout=TIMEOUT_S
        ),
    ):
        refused = await _refused(call)
        assert refused.code == missing.code == grpc.StatusCode.NOT_FOUND
        assert refused.details == missing.details.replace("never-made", name)
    naming = await _refused(
        plane.volumes.GetVolume(
            volumes_pb2.GetVolumeRequest(name=name, workspace=plane.workspace_a),
            metadata=plane.b,
            timeout=TIMEOUT_S,
        )
    )
    assert naming.code == grpc.StatusCode.PERMISSION_DENIED
    assert "leave --workspace out" in naming.details, naming.details
    # The same words whether or not the named workspace exists: nothing of it is told.
    nowhere = await _refused(
        plane.volumes.GetVolume(
            volumes_pb2.GetVolumeRequest(name=name, workspace="no-such-team"),
            metadata=plane.b,
            timeout=TIMEOUT_S,
        )
    )
    assert nowhere.code == naming.code
    assert nowhere.details == naming.details.replace(plane.workspace_a, "no-such-team")
    listed = await plane.volumes.ListVolumes(
        volumes_pb2.ListVolumesRequest(), metadata=plane.b, timeout=TIMEOUT_S
    )
    assert name not in [v.name for v in listed.volumes]
    # Untouched: no update reached its record, and the owner still reads it.
    handle = plane.client.get_workflow_handle(volume_workflow_id(plane.workspace_a, name))
    events = [e async for e in handle.fetch_history_events()]
    assert not [
        e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    ]
    await plane.volumes.GetVolume(
        volumes_pb2.GetVolumeRequest(name=name), metadata=plane.a, timeout=TIMEOUT_S
    )
    listed_by_operator = await plane.volumes.ListVolumes(
        volumes_pb2.ListVolumesRequest(workspace="*"), metadata=plane.operator, timeout=TIMEOUT_S
    )
    assert [(v.workspace, v.name) for v in listed_by_operator.volumes].count(
        (plane.workspace_a, name)
    ) == 1


async def test_the_record_holds_the_credentials_sealed_only(
    plane: Plane, log_lines: io.StringIO
) -> None:
    name = f"data-{uuid.uuid4().hex[:6]}"
    await plane.volumes.CreateVolume(plane.create(name), metadata=plane.a, timeout=TIMEOUT_S)
    handle = plane.client.get_workflow_handle(volume_workflow_id(plane.workspace_a, name))
    described = await handle.describe()
    memo = json.dumps(await described.memo())
    attributes = str(described.raw_description.workflow_execution_info.search_attributes)
    history = corpus_of_json((await handle.fetch_history()).to_json())
    assert "ciphertext" in memo
    assert "ciphertext" in history
    assert plane.workspace_a in attributes
    for text in (memo, attributes, history):
        assert plane.key not in text
        assert plane.key_id not in text
    # Deleted, its record's last memo holds nothing more either.
    await plane.volumes.DeleteVolume(
        volumes_pb2.DeleteVolumeRequest(name=name), metadata=plane.a, timeout=TIMEOUT_S
    )
    await handle.result()
    history = corpus_of_json((await handle.fetch_history()).to_json())
    assert "deleting" in history
    logged = log_lines.getvalue()
    assert f"volume={name}" in logged  # the gateway logged the create and the delete
    assert plane.key not in logged
    assert plane.key_id not in logged
    assert plane.key not in history
    assert plane.key_id not in history


async def test_a_task_naming_an_unknown_volume_is_refused_at_submit(plane: Plane) -> None:
    own = f"data-{uuid.uuid4().hex[:6]}"
    await plane.volumes.CreateVolume(plane.create(own), metadata=plane.b, timeout=TIMEOUT_S)
    task = TaskInput(
        task_id=uuid.uuid4().hex[:12],
        pool_name="gke-rtx6000",
        command=("true",),
        gpus=0,
        mounts=(TaskMount(kind="volume", name=own, path="/data"),),
    )
    refused = await _refused(
        plane.tasks.SubmitTask(submit_request(task), metadata=plane.a, timeout=TIMEOUT_S)
    )
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"no volume {own} in workspace {plane.workspace_a}" in refused.details
    handle = plane.client.get_workflow_handle(f"task:{task.task_id}")
    assert await or_none(handle.describe()) is None


class RecordingAgent(worker_pb2_grpc.WorkerServiceServicer):
    """A WorkerService that keeps every RunTaskRequest and the metadata it came with."""

    def __init__(self) -> None:
        self.requests: list[tuple[worker_pb2.RunTaskRequest, dict[str, str]]] = []

    async def RunTask(
        self, request: worker_pb2.RunTaskRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> worker_pb2.RunTaskResponse:
        metadata = {k: str(v) for k, v in context.invocation_metadata() or ()}
        self.requests.append((request, metadata))
        return worker_pb2.RunTaskResponse(task_id=request.task.task_id)


async def test_run_task_sends_the_agent_the_volumes_credentials_unsealed(plane: Plane) -> None:
    name = f"data-{uuid.uuid4().hex[:6]}"
    await plane.volumes.CreateVolume(plane.create(name), metadata=plane.a, timeout=TIMEOUT_S)
    agent = RecordingAgent()  # type: ignore[abstract]
    server = grpc.aio.server()
    worker_pb2_grpc.add_WorkerServiceServicer_to_server(agent, server)
    port = server.add_insecure_port(LOOPBACK)
    await server.start()
    settings = ControlplaneSettings.model_validate(
        {"taskQueue": plane.task_queue, "workerTokenSecret": plane.secret.get_secret_value()}
    )
    task = TaskInput(
        task_id=uuid.uuid4().hex[:12],
        pool_name="gke-rtx6000",
        command=("true",),
        gpus=0,
        workspace=plane.workspace_a,
        mounts=(TaskMount(kind="volume", name=name, path="/data", read_only=True),),
    )
    work = WorkerTaskInput(
        pool_name="gke-rtx6000", worker_id="w-1", address=f"127.0.0.1:{port}", task=task
    )
    activities = TaskActivities(plane.client, settings)
    try:
        result = await ActivityEnvironment().run(activities.run_task, work)
    finally:
        await server.stop(0)
    assert result is False
    assert plane.key not in work.model_dump_json()
    assert plane.key not in repr(result)
    [(request, metadata)] = agent.requests
    expected = command_token(plane.secret.get_secret_value(), "w-1")
    assert metadata[COMMAND_TOKEN_HEADER] == expected
    [access] = request.volumes
    assert (access.name, access.bucket, access.endpoint, access.region) == (
        name,
        f"s3://{plane.bucket}/runs",
        plane.endpoint,
        aws.REGION,
    )
    assert (access.access_key_id, access.secret_access_key) == (plane.key_id, plane.key)
    assert [(m.name, m.path, m.read_only) for m in request.task.mounts] == [(name, "/data", True)]


async def test_run_task_fails_the_task_naming_a_volume_deleted_since_the_submit(
    plane: Plane,
) -> None:
    settings = ControlplaneSettings.model_validate(
        {"taskQueue": plane.task_queue, "workerTokenSecret": plane.secret.get_secret_value()}
    )
    task = TaskInput(
        task_id=uuid.uuid4().hex[:12],
        pool_name="gke-rtx6000",
        command=("true",),
        workspace=plane.workspace_b,
        mounts=(TaskMount(kind="volume", name="gone", path="/data"),),
    )
    work = WorkerTaskInput(
        pool_name="gke-rtx6000", worker_id="w-1", address="127.0.0.1:9", task=task
    )
    with pytest.raises(ApplicationError) as failed:
        await ActivityEnvironment().run(TaskActivities(plane.client, settings).run_task, work)
    assert failed.value.non_retryable
    assert failed.value.message.startswith(
        f"volume gone: no volume gone in workspace {plane.workspace_b}"
    )


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[default]\naws_access_key_id = AKIAX\n", "[default] has no aws_secret_access_key"),
        ("[default]\naws_access_key_id AKIAX\nSECRETMARKER\n", "line 2: neither"),
    ],
)
def test_volume_create_refuses_a_malformed_credentials_file_naming_the_field(
    tmp_path: Path, text: str, says: str
) -> None:
    credentials = tmp_path / "credentials"
    credentials.write_text(text + "aws_secret_access_key_x = SECRETMARKER\n")
    result = CliRunner().invoke(
        volume_app,
        ["create", "data", "--bucket", "s3://b1x", "--credentials-file", str(credentials)],
        env={"LEVERS9_API_TOKEN": "l9o1.unused", "COLUMNS": "200"},
    )
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split())
    assert "SECRETMARKER" not in result.output


async def test_the_cli_creates_lists_gets_and_deletes_with_a_workspaces_token(
    plane: Plane, tmp_path: Path
) -> None:
    """`levers9 volume ...` and `levers9 run --volume` as a team runs them, with its token."""
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = {plane.key_id}\naws_secret_access_key = {plane.key}\n"
    )
    token = plane.token(plane.a)
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": "127.0.0.1:1",  # the workspace's CLI has no way into Temporal
        "LEVERS9_TASK_QUEUE": plane.task_queue,
        "LEVERS9_GATEWAY_ADDRESS": plane.address,
        "LEVERS9_TOKEN": token,
        "LEVERS9_HOME": str(tmp_path),
        "COLUMNS": "400",
    }
    name = f"data-{uuid.uuid4().hex[:6]}"
    bucket = f"s3://{plane.bucket}/cli"
    made = await run_levers9(
        env,
        *("volume", "create", name, "--bucket", bucket, "--endpoint", plane.endpoint),
        *("--credentials-file", str(credentials)),
    )
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"volume {name} created in workspace {plane.workspace_a}: {bucket}" in made.stdout
    listed = await run_levers9(env, "volume", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["name"], r["workspace"], r["bucket"]) for r in rows] == [
        (name, plane.workspace_a, bucket)
    ]
    got = await run_levers9(env, "volume", "get", name)
    assert got.returncode == 0, got.stderr
    assert plane.endpoint in got.stdout
    unknown = await run_levers9(
        env,
        "run",
        "--pool",
        "gke-rtx6000",
        "--gpus",
        "0",
        "--detach",
        "--volume",
        "nope:/data",
        "--",
        "true",
    )
    assert unknown.returncode != 0
    assert f"no volume nope in workspace {plane.workspace_a}" in unknown.stderr
    other = await run_levers9({**env, "LEVERS9_TOKEN": plane.token(plane.b)}, "volume", "get", name)
    assert other.returncode == 1
    assert f"no volume {name} in workspace {plane.workspace_b}" in other.stderr
    deleted = await run_levers9(env, "volume", "delete", name)
    assert deleted.returncode == 0, deleted.stderr
    for done in (made, listed, got, unknown, other, deleted):
        assert plane.key not in done.stdout + done.stderr


async def test_a_workspace_with_volumes_is_not_deleted_until_they_are(plane: Plane) -> None:
    """Else a workspace made again under its name would mount the old one's buckets."""
    name = f"data-{uuid.uuid4().hex[:6]}"
    await plane.volumes.CreateVolume(plane.create(name), metadata=plane.b, timeout=TIMEOUT_S)
    records = TemporalVolumeRecords(plane.client, plane.task_queue)

    async def counted() -> bool:
        return await records.count(plane.workspace_b) == 1

    await eventually(counted, within=10)
    workspaces = gateway_pb2_grpc.WorkspacesStub(plane.channel)
    delete = gateway_pb2.DeleteWorkspaceRequest(name=plane.workspace_b)
    refused = await _refused(
        workspaces.DeleteWorkspace(delete, metadata=plane.operator, timeout=TIMEOUT_S)
    )
    assert refused.code == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.details.startswith(f"workspace {plane.workspace_b} has 1 volume(s)")
    await plane.volumes.GetVolume(  # its team still has it, and its workspace
        volumes_pb2.GetVolumeRequest(name=name), metadata=plane.b, timeout=TIMEOUT_S
    )
    await plane.volumes.DeleteVolume(
        volumes_pb2.DeleteVolumeRequest(name=name), metadata=plane.b, timeout=TIMEOUT_S
    )

    async def none() -> bool:
        return await records.count(plane.workspace_b) == 0

    await eventually(none, within=10)
    await workspaces.DeleteWorkspace(delete, metadata=plane.operator, timeout=TIMEOUT_S)
