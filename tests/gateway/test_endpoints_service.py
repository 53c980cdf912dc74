"""Endpoints through the gateway's Endpoints service, on the dev server with a Temporal worker
hosting EndpointWorkflow and WorkspaceWorkflow (the replicas' environment activity declared by
name: no replica starts, every endpoint here is at zero): a workspace token creates endpoints in
its own workspace only (naming another is PERMISSION_DENIED, nothing started), lists and gets
only its own; another workspace's endpoint answers get and delete exactly as a missing one
(NOT_FOUND) and is told nothing (no signal in its history); the operator sees and deletes all,
and creates in a workspace it names (which must exist). A spec the gateway cannot run is
INVALID_ARGUMENT naming its field. The CLI's path (levers9.cli.endpoint_access, as `levers9
endpoint ...` runs it) does the same with a workspace's token, and `endpoint create`'s curl line
names where the command's token came from.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from pydantic import SecretStr
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.cli.endpoint import curl_lines
from levers9.cli.endpoint_access import EndpointAccess, Refused
from levers9.cli.identity import Identity
from levers9.config import ControlplaneSettings
from levers9.core.endpoints import EndpointSpec, ReplicaEnvironment
from levers9.endpoint_wire import spec_message, view_from_message
from levers9.gateway.server import Gateway
from levers9.gateway.task_records import TemporalTaskRecords
from levers9.models import endpoint_workflow_id
from levers9.proto import endpoints_pb2, endpoints_pb2_grpc, gateway_pb2, gateway_pb2_grpc
from levers9.records.endpoints import TemporalEndpointRecords
from levers9.records.workers import TemporalWorkerRecords
from levers9.records.workspaces import TemporalWorkspaceRecords
from levers9.rpc import bearer
from levers9.temporal import sync_reconcile_schedules
from levers9.tokens import operator_token
from tests.gateway.conftest import LOOPBACK
from tests.waiting import eventually
from workflows import RUNNER
from workflows.endpoint import EndpointWorkflow
from workflows.workspace import WorkspaceWorkflow

if TYPE_CHECKING:
    from levers9.proto.endpoints_pb2_grpc import EndpointsAsyncStub

Metadata = tuple[tuple[str, str], ...]
TIMEOUT_S = 10


@activity.defn(name="replica_environment")
async def replica_environment(input: ReplicaEnvironment) -> dict[str, str]:
    """The replicas' environment as the pool's activity answers for a card of no known kind."""
    return input.env


@dataclass(frozen=True)
class Plane:
    client: Client
    endpoints: EndpointsAsyncStub
    address: str
    operator: Metadata
    a: Metadata
    """workspace `a`'s token"""
    b: Metadata
    workspace_a: str
    workspace_b: str
    pool: str
    settings: ControlplaneSettings
    made: list[str]
    """The endpoints a test made (deleted afterwards)."""

    def token(self, metadata: Metadata) -> str:
        return metadata[0][1].removeprefix("Bearer ")


@pytest.fixture
async def plane(
    dev_env: WorkflowEnvironment, secret: SecretStr, task_queue: str
) -> AsyncIterator[Plane]:
    client = dev_env.client
    records = TemporalEndpointRecords(client, task_queue)
    gateway = Gateway(
        TemporalWorkerRecords(client),
        secret,
        tasks=TemporalTaskRecords(client, task_queue),
        workspaces=TemporalWorkspaceRecords(client, task_queue),
        endpoints=records,
    )
    suffix = uuid.uuid4().hex[:8]
    pool = f"pool-{suffix}"
    made: list[str] = []
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(
            Worker(
                client,
                task_queue=task_queue,
                workflows=[WorkspaceWorkflow, EndpointWorkflow],
                activities=[replica_environment],
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
            made_token = await workspaces.CreateWorkspaceToken(
                gateway_pb2.CreateWorkspaceTokenRequest(workspace=name),
                metadata=operator,
                timeout=TIMEOUT_S,
            )
            tokens.append(bearer.metadata(made_token.token))
        settings = ControlplaneSettings.model_validate(
            {
                "taskQueue": task_queue,
                "reconcileIntervalSeconds": 3600,  # no pass starts while the test runs
                "gatewayAddress": f"127.0.0.1:{port}",
            }
        )
        await sync_reconcile_schedules(client, [pool], settings)
        try:
            yield Plane(
                client,
                endpoints_pb2_grpc.EndpointsStub(channel),
                f"127.0.0.1:{port}",
                operator,
                tokens[0],
                tokens[1],
                f"a-{suffix}",
                f"b-{suffix}",
                pool,
                settings,
                made,
            )
        finally:
            await sync_reconcile_schedules(client, [], settings)
            for name in made:  # their records end while the Temporal worker still runs
                if await records.delete(name):
                    assert await records.ended(name, 30) is not None, name


def _name(plane: Plane, stem: str) -> str:
    name = f"{stem}-{uuid.uuid4().hex[:6]}"
    plane.made.append(name)
    return name


def _spec(plane: Plane, name: str, workspace: str = "") -> EndpointSpec:
    return EndpointSpec(
        name=name, pool_name=plane.pool, command=("true",), port=8080, workspace=workspace
    )


async def _create(
    plane: Plane, metadata: Metadata, stem: str, workspace: str = ""
) -> endpoints_pb2.CreateEndpointResponse:
    request = endpoints_pb2.CreateEndpointRequest(
        spec=spec_message(_spec(plane, _name(plane, stem), workspace))
    )
    return await plane.endpoints.CreateEndpoint(request, metadata=metadata, timeout=TIMEOUT_S)


async def _listed(plane: Plane, metadata: Metadata) -> list[tuple[str, str]]:
    """(name, workspace) of each endpoint listed to `metadata`, among those this test made."""
    reply = await plane.endpoints.ListEndpoints(
        endpoints_pb2.ListEndpointsRequest(), metadata=metadata, timeout=TIMEOUT_S
    )
    return sorted((v.name, v.spec.workspace) for v in reply.views if v.name in plane.made)


async def _until_listed(plane: Plane, metadata: Metadata, wanted: list[tuple[str, str]]) -> None:
    """Until the listing to `metadata` is `wanted` (the visibility store lists a new workflow
    a moment after it started); fails with the last listing."""
    seen: list[list[tuple[str, str]]] = []

    async def listed() -> bool:
        seen.append(await _listed(plane, metadata))
        return seen[-1] == sorted(wanted)

    try:
        await eventually(listed, within=30)
    except TimeoutError:
        raise AssertionError(f"listed {seen[-1]}, not {sorted(wanted)}") from None


async def _refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    return refused.value


async def test_a_workspace_token_creates_in_its_own_workspace_and_lists_only_its_own(
    plane: Plane,
) -> None:
    mine = await _create(plane, plane.a, "mine")
    assert mine.spec.workspace == plane.workspace_a  # implied: the token's own
    named = await _create(plane, plane.a, "named", workspace=plane.workspace_a)
    theirs = await _create(plane, plane.b, "theirs")
    ops = await _create(plane, plane.operator, "ops")
    assert ops.spec.workspace == "default"
    everyone = [
        (mine.spec.name, plane.workspace_a),
        (named.spec.name, plane.workspace_a),
        (theirs.spec.name, plane.workspace_b),
        (ops.spec.name, "default"),
    ]
    await _until_listed(plane, plane.operator, everyone)  # each is listed by now
    assert await _listed(plane, plane.a) == sorted(everyone[:2])
    assert await _listed(plane, plane.b) == [everyone[2]]
    got = await plane.endpoints.GetEndpoint(
        endpoints_pb2.GetEndpointRequest(name=mine.spec.name), metadata=plane.a, timeout=TIMEOUT_S
    )
    view = view_from_message(got.view)
    assert (view.spec.workspace, view.spec.pool_name, view.replicas) == (
        plane.workspace_a,
        plane.pool,
        [],
    )
    # Listed under its workspace, as its replicas are (the Temporal UI's filter).
    listed = [
        execution.id
        async for execution in plane.client.list_workflows(
            f"Levers9Workspace='{plane.workspace_a}' AND WorkflowType='EndpointWorkflow'"
        )
    ]
    assert sorted(listed) == sorted(endpoint_workflow_id(n) for n in plane.made[:2])


async def test_another_workspaces_endpoint_answers_as_a_missing_one_and_is_told_nothing(
    plane: Plane,
) -> None:
    name = (await _create(plane, plane.a, "a-only")).spec.name
    missing = f"nosuch-{uuid.uuid4().hex[:6]}"
    answers = []
    for asked in (name, missing):
        got = await _refused(
            plane.endpoints.GetEndpoint(
                endpoints_pb2.GetEndpointRequest(name=asked), metadata=plane.b, timeout=TIMEOUT_S
            )
        )
        deleted = await _refused(
            plane.endpoints.DeleteEndpoint(
                endpoints_pb2.DeleteEndpointRequest(name=asked, wait_seconds=5),
                metadata=plane.b,
                timeout=TIMEOUT_S,
            )
        )
        answers.append(
            [(e.code(), (e.details() or "").replace(asked, "NAME")) for e in (got, deleted)]
        )
    assert answers[0] == answers[1]
    assert answers[0][0][0] == grpc.StatusCode.NOT_FOUND
    # B's delete of its own endpoint goes through: the call could have changed A's.
    own = (await _create(plane, plane.b, "b-own")).spec.name
    ended = await plane.endpoints.DeleteEndpoint(
        endpoints_pb2.DeleteEndpointRequest(name=own, wait_seconds=30),
        metadata=plane.b,
        timeout=TIMEOUT_S + 30,
    )
    assert ended.ended
    assert view_from_message(ended.view).deleted
    history = await plane.client.get_workflow_handle(endpoint_workflow_id(name)).fetch_history()
    signalled = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
    ]
    assert signalled == []
    still = await plane.endpoints.GetEndpoint(
        endpoints_pb2.GetEndpointRequest(name=name), metadata=plane.a, timeout=TIMEOUT_S
    )
    assert not still.view.deleted
    await _until_listed(plane, plane.operator, [(name, plane.workspace_a)])


async def test_the_operator_gets_and_deletes_a_workspaces_endpoint(plane: Plane) -> None:
    name = (await _create(plane, plane.a, "by-op")).spec.name
    got = await plane.endpoints.GetEndpoint(
        endpoints_pb2.GetEndpointRequest(name=name), metadata=plane.operator, timeout=TIMEOUT_S
    )
    assert got.view.spec.workspace == plane.workspace_a
    ended = await plane.endpoints.DeleteEndpoint(
        endpoints_pb2.DeleteEndpointRequest(name=name, wait_seconds=30),
        metadata=plane.operator,
        timeout=TIMEOUT_S + 30,
    )
    assert ended.ended
    await _until_listed(plane, plane.a, [])


async def test_a_workspace_token_naming_another_workspace_creates_nothing(plane: Plane) -> None:
    refused = await _refused(_create(plane, plane.a, "elsewhere", workspace=plane.workspace_b))
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.details() == (
        f"spec.workspace: a workspace token (workspace {plane.workspace_a}) acts on its own"
        f" workspace's endpoints only, not on workspace {plane.workspace_b!r}; leave"
        " --workspace out, or ask the operator"
    )
    description = plane.client.get_workflow_handle(endpoint_workflow_id(plane.made[-1]))
    with pytest.raises(Exception, match="not found"):
        await description.describe()


async def test_the_operator_creates_in_a_workspace_that_exists(plane: Plane) -> None:
    made = await _create(plane, plane.operator, "for-a", workspace=plane.workspace_a)
    await _until_listed(plane, plane.a, [(made.spec.name, plane.workspace_a)])
    refused = await _refused(_create(plane, plane.operator, "nowhere", workspace="nosuch-ws"))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec.workspace: no workspace nosuch-ws" in (refused.details() or "")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"name": "Bad_Name"}, "spec.name: 'Bad_Name' is not an endpoint name"),
        ({"pool_name": "nosuch"}, "spec.pool_name: no pool nosuch on this controlplane"),
        ({"command": ()}, "spec.command: missing"),
        ({"min_replicas": 3, "max_replicas": 2}, "spec.min_replicas: 3 is not 0 to max_replicas"),
        ({"idle_seconds": float("inf")}, "spec.idle_seconds: inf is not above 0"),
        ({"ready_path": "no-slash"}, "spec.ready_path:"),
        ({"image": "UPPER CASE"}, "spec.image:"),
        ({"env": {"1BAD": "x"}}, "spec.env: '1BAD' is not a variable name"),
        ({"gpus": 65}, "spec.gpus: 65 is not 0 to 64 cards"),
    ],
)
async def test_a_spec_it_cannot_run_is_invalid_naming_the_field(
    plane: Plane, change: dict[str, Any], said: str
) -> None:
    spec = spec_message(_spec(plane, "fine"))
    for key, value in change.items():
        if key == "command":
            del spec.command[:]
        elif key == "env":
            spec.env.update(value)
        else:
            setattr(spec, key, value)
    refused = await _refused(
        plane.endpoints.CreateEndpoint(
            endpoints_pb2.CreateEndpointRequest(spec=spec), metadata=plane.a, timeout=TIMEOUT_S
        )
    )
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert said in (refused.details() or "")


async def test_the_clis_path_with_a_workspace_token_reaches_only_its_own(plane: Plane) -> None:
    """`levers9 endpoint create|list|get|delete` as the CLI runs them (EndpointAccess), with
    workspace A's token, and B's."""

    def access(metadata: Metadata) -> EndpointAccess:
        token = SecretStr(plane.token(metadata))
        return EndpointAccess(plane.settings.model_copy(update={"api_token": token}))

    as_a, as_b = access(plane.a), access(plane.b)
    name = _name(plane, "cli")
    created = await as_a.create(_spec(plane, name))
    assert created.workspace == plane.workspace_a

    async def listed_to_a() -> bool:
        return [v.name for v in (await as_a.listing()).views] == [name]

    await eventually(listed_to_a, within=30)
    assert [v.name for v in (await as_b.listing()).views] == []
    assert (await as_b.get(name)).views == []
    assert not await as_b.delete(name)
    assert [v.spec.workspace for v in (await as_a.get(name)).views] == [plane.workspace_a]
    with pytest.raises(Refused, match="PERMISSION_DENIED"):
        await as_a.create(_spec(plane, _name(plane, "cli-b"), plane.workspace_b))
    assert await as_a.delete(name)
    gone = await as_a.deleted(name, 30)
    assert gone.ended
    assert (await as_a.get(name)).views == []


def test_the_curl_line_names_where_the_token_came_from() -> None:
    url = "http://127.0.0.1:1/e/"
    settings = ControlplaneSettings.model_validate({"apiToken": "t"})

    def lines(source: str, profile: str | None = None, **update: Any) -> list[str]:
        identity = Identity(settings.model_copy(update=update), profile, source, "test")
        return curl_lines(identity, url, public=False)

    assert lines("LEVERS9_TOKEN") == [
        f'curl -m 1500 -H "Authorization: Bearer $LEVERS9_TOKEN" {url}'
    ]
    assert "Bearer $LEVERS9_API_TOKEN" in lines("LEVERS9_API_TOKEN")[0]
    from_file = lines("LEVERS9_API_TOKEN_FILE", api_token=None, api_token_file="/run/tok")
    assert from_file == [f'curl -m 1500 -H "Authorization: Bearer $(cat /run/tok)" {url}']
    profiled = lines("profile team-a", "team-a")
    assert "Bearer $TOKEN" in profiled[0]
    assert profiled[1] == (
        "TOKEN: the token of profile team-a (`levers9 --profile team-a whoami` says whose)"
    )
    assert curl_lines(Identity(settings, None, "LEVERS9_TOKEN", "test"), url, public=True) == [
        f"curl -m 1500 {url}"
    ]
