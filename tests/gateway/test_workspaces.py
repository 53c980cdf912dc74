"""Workspaces and their tokens through the gateway's Workspaces service, on the dev server with a
Temporal worker hosting WorkspaceWorkflow: create, get, list, set, delete, each name checked as
a DNS label; a token printed once, kept as the SHA-256 of its secret only (no token in the
workspace's history, memo or the gateway's log lines); the two roles (a workspace token on an
operator call is PERMISSION_DENIED naming the operator, another workspace is NOT_FOUND); a
revoked token refused by both replicas of a two-replica gateway within the cache's bound, an
expired one at once.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
import typer
from google.protobuf.json_format import MessageToJson
from pydantic import SecretStr
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from levers9.config import ControlplaneSettings
from levers9.core.workspaces import (
    WORKSPACE_WORKFLOW,
    WorkspaceState,
    parse_token,
    workspace_workflow_id,
)
from levers9.gateway.roles import TOKEN_CACHE_TTL_S
from levers9.gateway.server import Gateway
from levers9.gateway.task_records import TemporalTaskRecords
from levers9.models import WorkspaceInput
from levers9.proto import gateway_pb2, gateway_pb2_grpc, worker_pb2
from levers9.records.workers import TemporalWorkerRecords
from levers9.records.workspaces import TemporalWorkspaceRecords
from levers9.rpc import bearer
from levers9.tokens import operator_token
from tests.gateway.conftest import LOOPBACK
from tests.waiting import eventually, signals_handled
from workflows import RUNNER
from workflows.workspace import WorkspaceWorkflow

if TYPE_CHECKING:
    from levers9.proto.gateway_pb2_grpc import TasksAsyncStub, WorkspacesAsyncStub

Metadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Replica:
    workspaces: WorkspacesAsyncStub
    tasks: TasksAsyncStub
    address: str


@dataclass(frozen=True)
class Plane:
    """Two gateway replicas over one Temporal namespace and task queue, and the operator's
    metadata."""

    client: Client
    replicas: tuple[Replica, Replica]
    operator: Metadata
    task_queue: str

    @property
    def first(self) -> Replica:
        return self.replicas[0]


@asynccontextmanager
async def _replica(client: Client, secret: SecretStr, task_queue: str) -> AsyncIterator[Replica]:
    gateway = Gateway(
        TemporalWorkerRecords(client),
        secret,
        tasks=TemporalTaskRecords(client, task_queue),
        workspaces=TemporalWorkspaceRecords(client, task_queue),
    )
    port = await gateway.start(LOOPBACK)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Replica(
                gateway_pb2_grpc.WorkspacesStub(channel),
                gateway_pb2_grpc.TasksStub(channel),
                f"127.0.0.1:{port}",
            )
    finally:
        await gateway.stop(grace=0)


@pytest.fixture
async def plane(
    dev_env: WorkflowEnvironment, secret: SecretStr, task_queue: str
) -> AsyncIterator[Plane]:
    client = dev_env.client
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(
            Worker(
                client,
                task_queue=task_queue,
                workflows=[WorkspaceWorkflow],
                workflow_runner=RUNNER,
            )
        )
        first = await stack.enter_async_context(_replica(client, secret, task_queue))
        second = await stack.enter_async_context(_replica(client, secret, task_queue))
        yield Plane(
            client,
            (first, second),
            bearer.metadata(operator_token(secret.get_secret_value())),
            task_queue,
        )


def decoded_history(history_json: str) -> str:
    """The history's JSON with every payload's data decoded beside it (payloads are base64
    in the JSON: a scan of the raw text alone would miss a token inside one)."""
    texts = [history_json]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "data" and isinstance(value, str):
                    texts.append(base64.b64decode(value).decode("utf-8", "replace"))
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(json.loads(history_json))
    return "\n".join(texts)


def _name() -> str:
    return f"team-{uuid.uuid4().hex[:8]}"


async def _status(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value


async def _refusal(call: Any) -> bool:
    """Whether the call is refused (any status); its answer otherwise dropped."""
    try:
        await call
    except grpc.aio.AioRpcError:
        return True
    return False


async def _create(plane: Plane, **limits: int) -> str:
    name = _name()
    request = gateway_pb2.CreateWorkspaceRequest(
        name=name, gpu_quota=limits.get("gpu_quota"), max_queued=limits.get("max_queued")
    )
    await plane.first.workspaces.CreateWorkspace(request, metadata=plane.operator, timeout=10)
    return name


async def _token(plane: Plane, workspace: str, **fields: Any) -> str:
    request = gateway_pb2.CreateWorkspaceTokenRequest(workspace=workspace, **fields)
    reply = await plane.first.workspaces.CreateWorkspaceToken(
        request, metadata=plane.operator, timeout=10
    )
    return reply.token


async def test_a_workspace_is_created_read_listed_changed_and_deleted(plane: Plane) -> None:
    ws, op = plane.first.workspaces, plane.operator
    name = await _create(plane, gpu_quota=2)
    got = await ws.GetWorkspace(gateway_pb2.GetWorkspaceRequest(name=name), metadata=op, timeout=10)
    assert (got.name, got.gpu_quota, got.HasField("max_queued"), got.running_tasks) == (
        name,
        2,
        False,
        0,
    )
    changed = await ws.SetWorkspace(
        gateway_pb2.SetWorkspaceRequest(name=name, gpu_quota=4, max_queued=10),
        metadata=op,
        timeout=10,
    )
    assert (changed.gpu_quota, changed.max_queued, changed.weight) == (4, 10, 1)
    weighted = await ws.SetWorkspace(
        gateway_pb2.SetWorkspaceRequest(name=name, weight=3), metadata=op, timeout=10
    )
    assert (weighted.gpu_quota, weighted.weight) == (4, 3), "only the weight changed"
    for bad in (0, 1001):
        refused = await _status(
            ws.SetWorkspace(
                gateway_pb2.SetWorkspaceRequest(name=name, weight=bad), metadata=op, timeout=10
            )
        )
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"weight: {bad} is not 1 to 1000" in (refused.details() or "")
    listed = await ws.ListWorkspaces(gateway_pb2.ListWorkspacesRequest(), metadata=op, timeout=10)
    assert [w.name for w in listed.workspaces].count(name) == 1
    again = await _status(
        ws.CreateWorkspace(gateway_pb2.CreateWorkspaceRequest(name=name), metadata=op, timeout=10)
    )
    assert again.code() == grpc.StatusCode.ALREADY_EXISTS
    await ws.DeleteWorkspace(gateway_pb2.DeleteWorkspaceRequest(name=name), metadata=op, timeout=10)
    gone = await _status(
        ws.GetWorkspace(gateway_pb2.GetWorkspaceRequest(name=name), metadata=op, timeout=10)
    )
    assert gone.code() == grpc.StatusCode.NOT_FOUND
    listed = await ws.ListWorkspaces(gateway_pb2.ListWorkspacesRequest(), metadata=op, timeout=10)
    assert name not in [w.name for w in listed.workspaces]


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "name: missing"),
        ("Team_A", "name: 'Team_A' is not a DNS label"),
        ("-a", "name: '-a' is not a DNS label"),
        ("a" * 41, "name: aaaa"),
        ("a' OR 'b", "is not a DNS label"),
    ],
)
async def test_a_name_that_is_no_dns_label_is_refused_naming_the_field(
    plane: Plane, name: str, problem: str
) -> None:
    refused = await _status(
        plane.first.workspaces.CreateWorkspace(
            gateway_pb2.CreateWorkspaceRequest(name=name), metadata=plane.operator, timeout=10
        )
    )
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert problem in (refused.details() or "")


async def test_a_token_is_given_once_and_only_its_hash_is_kept(
    plane: Plane, log_stream: io.StringIO
) -> None:
    name = await _create(plane)
    token = await _token(plane, name, label="ci", expires_in_seconds=3600)
    parsed = parse_token(token)
    assert parsed is not None
    workspace, token_id, secret = parsed
    assert workspace == name
    assert len(secret) >= 43  # 256 bits, URL-safe base64
    mine = bearer.metadata(token)
    await plane.first.tasks.ListTasks(gateway_pb2.ListTasksRequest(), metadata=mine, timeout=10)
    listed = await plane.first.workspaces.ListWorkspaceTokens(
        gateway_pb2.ListWorkspaceTokensRequest(workspace=name), metadata=plane.operator, timeout=10
    )
    assert [(t.token_id, t.label) for t in listed.tokens] == [(token_id, "ci")]
    assert listed.tokens[0].HasField("expires_at")

    async def last_use_recorded() -> bool:
        state = await TemporalWorkspaceRecords(plane.client, "unused").get(name)
        return state is not None and state.tokens[0].last_used_at is not None

    await eventually(last_use_recorded, within=10)
    await plane.first.workspaces.RevokeWorkspaceToken(
        gateway_pb2.RevokeWorkspaceTokenRequest(workspace=name, token_id=token_id),
        metadata=plane.operator,
        timeout=10,
    )
    handle = plane.client.get_workflow_handle(workspace_workflow_id(name))
    history = decoded_history((await handle.fetch_history()).to_json())
    description = await handle.describe()
    memo = json.dumps(await description.memo())
    searchable = str(description.typed_search_attributes)
    for where, text in (
        ("history", history),
        ("memo", memo),
        ("search attributes", searchable),
        ("log lines", log_stream.getvalue()),
        ("token list", MessageToJson(listed)),
    ):
        assert token not in text, where
        assert secret not in text, where
    assert token_id in history  # the record is there: the check above could have failed


async def test_a_workspace_token_on_an_operator_call_is_permission_denied(plane: Plane) -> None:
    name = await _create(plane)
    mine = bearer.metadata(await _token(plane, name))
    ws = plane.first.workspaces
    calls = [
        ws.CreateWorkspace(gateway_pb2.CreateWorkspaceRequest(name=_name()), metadata=mine),
        ws.ListWorkspaces(gateway_pb2.ListWorkspacesRequest(), metadata=mine),
        ws.SetWorkspace(gateway_pb2.SetWorkspaceRequest(name=name, gpu_quota=8), metadata=mine),
        ws.DeleteWorkspace(gateway_pb2.DeleteWorkspaceRequest(name=name), metadata=mine),
        ws.CreateWorkspaceToken(
            gateway_pb2.CreateWorkspaceTokenRequest(workspace=name), metadata=mine
        ),
        ws.ListWorkspaceTokens(
            gateway_pb2.ListWorkspaceTokensRequest(workspace=name), metadata=mine
        ),
        ws.RevokeWorkspaceToken(
            gateway_pb2.RevokeWorkspaceTokenRequest(workspace=name, token_id="x"), metadata=mine
        ),
    ]
    for call in calls:
        refused = await _status(call)
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "operator" in (refused.details() or "")
    own = await ws.GetWorkspace(gateway_pb2.GetWorkspaceRequest(name=name), metadata=mine)
    assert own.name == name
    assert not own.HasField("gpu_quota")  # the set above changed nothing


async def test_another_workspace_answers_as_one_that_does_not_exist(plane: Plane) -> None:
    mine = bearer.metadata(await _token(plane, await _create(plane)))
    other = await _create(plane)
    ws = plane.first.workspaces
    theirs = await _status(
        ws.GetWorkspace(gateway_pb2.GetWorkspaceRequest(name=other), metadata=mine)
    )
    missing = _name()
    none = await _status(
        ws.GetWorkspace(gateway_pb2.GetWorkspaceRequest(name=missing), metadata=mine)
    )
    assert theirs.code() == none.code() == grpc.StatusCode.NOT_FOUND
    assert theirs.details() == (none.details() or "").replace(missing, other)


async def test_a_revoked_token_is_refused_by_every_replica_within_the_bound(plane: Plane) -> None:
    name = await _create(plane)
    token = await _token(plane, name)
    parsed = parse_token(token)
    assert parsed is not None
    mine = bearer.metadata(token)
    request = gateway_pb2.ListTasksRequest()
    for replica in plane.replicas:  # both have read (and cached) the record
        await replica.tasks.ListTasks(request, metadata=mine, timeout=10)
    await plane.first.workspaces.RevokeWorkspaceToken(
        gateway_pb2.RevokeWorkspaceTokenRequest(workspace=name, token_id=parsed[1]),
        metadata=plane.operator,
        timeout=10,
    )
    for replica in plane.replicas:

        async def refused(replica: Replica = replica) -> bool:
            return await _refusal(replica.tasks.ListTasks(request, metadata=mine, timeout=10))

        await eventually(refused, within=TOKEN_CACHE_TTL_S + 3, what="revoked token refused")
        refusal = await _status(replica.tasks.ListTasks(request, metadata=mine, timeout=10))
        assert refusal.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "revoked" in (refusal.details() or "")
        assert token not in (refusal.details() or "")


async def test_an_expired_token_is_refused_and_a_forged_one_too(plane: Plane) -> None:
    name = await _create(plane)
    expired = await _token(plane, name, expires_in_seconds=1)
    request = gateway_pb2.ListTasksRequest()

    async def refused_as_expired() -> bool:
        call = plane.first.tasks.ListTasks(request, metadata=bearer.metadata(expired), timeout=10)
        return await _refusal(call)

    await eventually(refused_as_expired, within=10)
    refusal = await _status(
        plane.first.tasks.ListTasks(request, metadata=bearer.metadata(expired), timeout=10)
    )
    assert refusal.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "expired" in (refusal.details() or "")
    good = await _token(plane, name)
    parsed = parse_token(good)
    assert parsed is not None
    forged = good[:-4] + ("AAAA" if not good.endswith("AAAA") else "BBBB")
    elsewhere = good.replace(f".{name}.", f".{_name()}.")
    for token in (forged, elsewhere, "l9k1.garbage"):
        refused = await _status(
            plane.first.tasks.ListTasks(request, metadata=bearer.metadata(token), timeout=10)
        )
        assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
        assert token not in (refused.details() or "")


async def test_the_record_continues_as_new_and_keeps_its_tokens(
    plane: Plane, task_queue: str
) -> None:
    """A history cap of 20 events: tokens added and used in bursts (each handled before the
    next) make it continue as new several times; the record keeps every token and the last
    use, and the gateway still checks them against it."""
    name = _name()
    state = WorkspaceState(name=name, gpu_quota=1, created_at=datetime.now(UTC))
    await plane.client.start_workflow(
        WORKSPACE_WORKFLOW,
        WorkspaceInput(state=state, max_history_events=20),
        id=workspace_workflow_id(name),
        task_queue=task_queue,
        memo={"record": state.model_dump(mode="json")},
    )
    tokens = [await _token(plane, name, label=f"t{i}") for i in range(3)]
    handle = plane.client.get_workflow_handle(workspace_workflow_id(name))
    for _burst in range(4):
        for token in tokens:
            parsed = parse_token(token)
            assert parsed is not None
            await handle.signal("token_used", parsed[1])
        await signals_handled(plane.client, handle.id)
    runs = [e async for e in plane.client.list_workflows(f"WorkflowId = '{handle.id}'")]
    assert len(runs) > 2
    kept = await TemporalWorkspaceRecords(plane.client, task_queue).get(name)
    assert kept is not None
    assert [t.label for t in kept.tokens] == ["t0", "t1", "t2"]
    assert all(t.last_used_at is not None for t in kept.tokens)
    assert kept.gpu_quota == 1
    for token in tokens:
        await plane.first.tasks.ListTasks(
            gateway_pb2.ListTasksRequest(), metadata=bearer.metadata(token), timeout=10
        )


@pytest.mark.parametrize(
    ("workspace", "problem"),
    [("no-such-team", "task.workspace: no workspace no-such-team"), ("Team", "task.workspace: ")],
)
async def test_the_operator_submits_only_into_a_workspace_that_exists(
    plane: Plane, workspace: str, problem: str
) -> None:
    spec = worker_pb2.TaskSpec(task_id=f"t-{uuid.uuid4().hex[:8]}", command=["true"])
    spec.workspace = workspace
    request = gateway_pb2.SubmitTaskRequest(pool_name="gke-rtx6000", task=spec)
    refused = await _status(
        plane.first.tasks.SubmitTask(request, metadata=plane.operator, timeout=10)
    )
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (refused.details() or "").startswith(problem)


async def test_whoami_names_the_operator_or_the_workspace_and_the_tokens_label(
    plane: Plane,
) -> None:
    ws = plane.first.workspaces
    me = await ws.WhoAmI(gateway_pb2.WhoAmIRequest(), metadata=plane.operator, timeout=10)
    assert (me.operator, me.workspace, me.token_id, me.label) == (True, "", "", "operator")
    name = await _create(plane)
    token = await _token(plane, name, label="alice")
    parsed = parse_token(token)
    assert parsed is not None
    them = await ws.WhoAmI(gateway_pb2.WhoAmIRequest(), metadata=bearer.metadata(token))
    assert (them.operator, them.workspace, them.token_id, them.label) == (
        False,
        name,
        parsed[1],
        "alice",
    )
    forged = token.rsplit(".", 1)[0] + ".forged"
    refused = await _status(
        ws.WhoAmI(gateway_pb2.WhoAmIRequest(), metadata=bearer.metadata(forged))
    )
    assert refused.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "forged" not in (refused.details() or "")


async def test_any_token_lists_the_pools_and_run_takes_the_only_one(plane: Plane) -> None:
    """ListPoolNames answers the reconcile schedules of this controlplane to a workspace token
    too; the CLI's --pool default takes the only one, and names them all when there are more."""
    from levers9.cli.pool_choice import chosen_pool
    from levers9.config import ControlplaneSettings
    from levers9.temporal import sync_reconcile_schedules

    mine = bearer.metadata(await _token(plane, await _create(plane)))
    ws = plane.first.workspaces
    settings = ControlplaneSettings.model_validate(
        {
            "taskQueue": plane.task_queue,
            "reconcileIntervalSeconds": 3600,  # no pass starts while the test runs
            "gatewayAddress": plane.first.address,
            "apiToken": mine[0][1].removeprefix("Bearer "),
        }
    )

    async def listed() -> list[str]:
        reply = await ws.ListPoolNames(gateway_pb2.ListPoolNamesRequest(), metadata=mine)
        return list(reply.pool_names)

    assert await listed() == []
    with pytest.raises(typer.BadParameter, match="has no pool yet"):
        await asyncio.to_thread(chosen_pool, settings, None)
    suffix = uuid.uuid4().hex[:8]
    only, other = f"only-{suffix}", f"other-{suffix}"
    try:
        await sync_reconcile_schedules(plane.client, [only], settings)
        await eventually(lambda: _equal(listed(), [only]), within=30)
        assert await asyncio.to_thread(chosen_pool, settings, None) == only
        await sync_reconcile_schedules(plane.client, [only, other], settings)
        await eventually(lambda: _equal(listed(), [only, other]), within=30)
        with pytest.raises(typer.BadParameter) as refused:
            await asyncio.to_thread(chosen_pool, settings, None)
        assert f"give --pool NAME, one of this controlplane's pools: {only}, {other}" in str(
            refused.value
        )
        assert await asyncio.to_thread(chosen_pool, settings, other) == other
    finally:
        await sync_reconcile_schedules(plane.client, [], settings)


async def _equal(got: Any, wanted: list[str]) -> bool:
    return bool(await got == wanted)


async def test_a_default_pool_is_checked_shown_and_taken_by_run_without_pool(
    plane: Plane, tmp_path: Path
) -> None:
    """`workspace create|set --default-pool` names one of the controlplane's pools (else the
    refusal names the field and the pools there are; "" clears it); get, list and WhoAmI show
    it; `levers9 run` without --pool on a two-pool controlplane submits into it, and with it
    cleared is refused naming both pools."""
    from levers9.search_attributes import POOL_NAME
    from levers9.temporal import sync_reconcile_schedules
    from tests.factories import run_levers9

    ws, op = plane.first.workspaces, plane.operator
    suffix = uuid.uuid4().hex[:8]
    first, second = f"first-{suffix}", f"second-{suffix}"
    settings = ControlplaneSettings.model_validate(
        {"taskQueue": plane.task_queue, "reconcileIntervalSeconds": 3600}
    )
    await sync_reconcile_schedules(plane.client, [first, second], settings)
    try:

        async def listed() -> bool:
            reply = await ws.ListPoolNames(gateway_pb2.ListPoolNamesRequest(), metadata=op)
            return list(reply.pool_names) == [first, second]

        await eventually(listed, within=30)
        name = _name()
        refused = await _status(
            ws.CreateWorkspace(
                gateway_pb2.CreateWorkspaceRequest(name=name, default_pool="nowhere"),
                metadata=op,
            )
        )
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (
            f"default_pool: no pool nowhere on this controlplane (`levers9 pool list` shows"
            f" {first}, {second})" in (refused.details() or "")
        )
        created = await ws.CreateWorkspace(
            gateway_pb2.CreateWorkspaceRequest(name=name, default_pool=second), metadata=op
        )
        assert created.default_pool == second
        token = await _token(plane, name)
        mine = bearer.metadata(token)
        who = await ws.WhoAmI(gateway_pb2.WhoAmIRequest(), metadata=mine)
        assert (who.workspace, who.default_pool) == (name, second)
        listed_all = await ws.ListWorkspaces(gateway_pb2.ListWorkspacesRequest(), metadata=op)
        assert [w.default_pool for w in listed_all.workspaces if w.name == name] == [second]

        env = {
            **os.environ,
            "TEMPORAL_ADDRESS": "127.0.0.1:1",  # the workspace's CLI has no way into Temporal
            "LEVERS9_TASK_QUEUE": plane.task_queue,
            "LEVERS9_GATEWAY_ADDRESS": plane.first.address,
            "LEVERS9_TOKEN": token,
            "LEVERS9_HOME": str(tmp_path),  # no profile, no dev stack's env file
            "COLUMNS": "400",  # the refusal on one line
        }
        done = await run_levers9(env, "run", "--gpus", "0", "--detach", "--", "true")
        assert done.returncode == 0, done.stdout + done.stderr
        task_id = done.stdout.strip().splitlines()[-1]
        described = await plane.client.get_workflow_handle(f"task:{task_id}").describe()
        assert described.typed_search_attributes.get(POOL_NAME) == second
        await plane.client.get_workflow_handle(f"task:{task_id}").terminate("test done")

        cleared = await ws.SetWorkspace(
            gateway_pb2.SetWorkspaceRequest(name=name, default_pool=""), metadata=op
        )
        assert cleared.default_pool == ""
        refused_set = await _status(
            ws.SetWorkspace(
                gateway_pb2.SetWorkspaceRequest(name=name, default_pool="nowhere"), metadata=op
            )
        )
        assert refused_set.code() == grpc.StatusCode.INVALID_ARGUMENT
        await eventually(lambda: _default_pool_is(plane, mine, ""), within=TOKEN_CACHE_TTL_S + 10)
        again = await run_levers9(env, "run", "--gpus", "0", "--detach", "--", "true")
        assert again.returncode == 2, again.stdout + again.stderr
        assert f"one of this controlplane's pools: {first}, {second}" in again.stderr
    finally:
        await sync_reconcile_schedules(plane.client, [], settings)


async def _default_pool_is(plane: Plane, metadata: Metadata, pool: str) -> bool:
    reply = await plane.first.workspaces.ListPoolNames(
        gateway_pb2.ListPoolNamesRequest(), metadata=metadata
    )
    return reply.default_pool == pool
