"""`levers9 workspace ...`: a team's share of the controlplane (WorkspaceWorkflow's records) and
its tokens, through the gateway's Workspaces service with the operator token.

`workspace token create` prints the token once: the controlplane keeps only the SHA-256 of its
secret. Whoever holds it keeps it as a profile (`levers9 login`) or sets `LEVERS9_TOKEN` to it,
and runs, lists, reads and cancels the workspace's own tasks, and nothing else.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
from google.protobuf.json_format import MessageToDict

from levers9.cli.gateway_api import (
    CALL_TIMEOUT_S,
)
from levers9.cli.output import Output, ago, console, render
from levers9.cli.service_call import call_service
from levers9.core.workspaces import MAX_LABEL_CHARS, MAX_WEIGHT, name_problem
from levers9.proto import gateway_pb2, gateway_pb2_grpc

if TYPE_CHECKING:
    # Only the type checker knows the async stub class; at runtime WorkspacesStub builds it.
    from levers9.proto.gateway_pb2_grpc import WorkspacesAsyncStub as Stub

WEIGHT_HELP = "its fair share against other waiting workspaces (GPUs held over weight; default 1)"
app = typer.Typer(
    help="Workspaces: a team's share of the controlplane, its quota and its tokens.",
    no_args_is_help=True,
)
token_app = typer.Typer(help="A workspace's tokens.", no_args_is_help=True)
app.add_typer(token_app, name="token")

T = TypeVar("T")
COLUMNS = [
    ("name", "NAME"),
    ("gpu_quota", "GPU QUOTA"),
    ("max_queued", "MAX QUEUED"),
    ("weight", "WEIGHT"),
    ("default_pool", "DEFAULT POOL"),
    ("running_tasks", "RUNNING TASKS"),
    ("live_tokens", "TOKENS"),
    ("age", "AGE"),
]
USAGE_COLUMNS = [
    ("pool", "POOL"),
    ("gpus", "GPUS"),
    ("borrowed_gpus", "BORROWED"),
    ("placed", "PLACED"),
    ("waiting", "WAITING"),
    ("gpu_quota", "QUOTA"),
    ("weight", "WEIGHT"),
]
TOKEN_COLUMNS = [
    ("token_id", "ID"),
    ("label", "LABEL"),
    ("state", "STATE"),
    ("created", "CREATED"),
    ("expires_at", "EXPIRES"),
    ("last_used", "LAST USED"),
]
_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _call(call: Callable[[Stub, tuple[tuple[str, str]]], Awaitable[T]]) -> T:
    """One call to the gateway's Workspaces service; its refusal printed, exit status 1."""
    return call_service(gateway_pb2_grpc.WorkspacesStub, call)


def _name(name: str, hint: str = "NAME") -> str:
    problem = name_problem(name)
    if problem is not None:
        raise typer.BadParameter(problem, param_hint=hint)
    return name


def expiry_seconds(text: str) -> int:
    """`30d`, `12h`, `90m`, `3600s` as seconds; `never` as 0. BadParameter naming --expires."""
    if text == "never":
        return 0
    matched = _DURATION.fullmatch(text.strip())
    if matched is None or int(matched.group(1)) == 0:
        raise typer.BadParameter(
            f"{text!r}: a duration such as 30d, 12h, 90m or 3600s, or never",
            param_hint="--expires",
        )
    return int(matched.group(1)) * _UNIT_S[matched.group(2)]


def _row(workspace: gateway_pb2.Workspace, now: datetime) -> dict[str, object]:
    return {
        "name": workspace.name,
        "gpu_quota": workspace.gpu_quota if workspace.HasField("gpu_quota") else None,
        "max_queued": workspace.max_queued if workspace.HasField("max_queued") else None,
        "weight": workspace.weight or 1,
        "default_pool": workspace.default_pool or None,
        "running_tasks": workspace.running_tasks,
        "live_tokens": workspace.live_tokens,
        "created_at": workspace.created_at.ToDatetime(UTC).isoformat(),
        "age": ago(workspace.created_at.ToDatetime(UTC), now),
    }


def _usage_rows(workspace: gateway_pb2.Workspace) -> list[dict[str, object]]:
    """Its part of each pool it has work in."""
    rows: list[dict[str, object]] = []
    for part in workspace.pools:
        usage = part.usage
        rows.append(
            {
                "pool": part.pool_name,
                "gpus": usage.gpus,
                "borrowed_gpus": usage.borrowed_gpus,
                "placed": usage.placed,
                "waiting": usage.waiting,
                "gpu_quota": usage.gpu_quota if usage.HasField("gpu_quota") else None,
                "weight": usage.weight,
            }
        )
    return rows


def _show(workspaces: list[gateway_pb2.Workspace], output: Output, title: str) -> None:
    now = datetime.now(UTC)
    rows = [_row(w, now) for w in workspaces]
    if output is Output.json:
        for row in rows:
            row.pop("age")
    render(rows, COLUMNS, output, title=title)


@app.command()
def create(
    name: str,
    gpu_quota: Annotated[
        int | None, typer.Option("--gpu-quota", min=0, help="the most GPUs it holds at once")
    ] = None,
    max_queued: Annotated[
        int | None, typer.Option("--max-queued", min=0, help="the most tasks it keeps waiting")
    ] = None,
    default_pool: Annotated[
        str, typer.Option("--default-pool", help="where its tasks go without --pool")
    ] = "",
    weight: Annotated[
        int | None, typer.Option("--weight", min=1, max=MAX_WEIGHT, help=WEIGHT_HELP)
    ] = None,
) -> None:
    """Create a workspace (its name a DNS label)."""
    request = gateway_pb2.CreateWorkspaceRequest(
        name=_name(name),
        gpu_quota=gpu_quota,
        max_queued=max_queued,
        default_pool=default_pool,
        weight=weight,
    )
    _call(lambda stub, md: stub.CreateWorkspace(request, metadata=md, timeout=CALL_TIMEOUT_S))
    console.print(
        f"workspace {name} created; give its team a token: levers9 workspace token create {name}",
        highlight=False,
    )


@app.command("list")
def list_(output: Annotated[Output, typer.Option("-o", "--output")] = Output.table) -> None:
    """Every workspace: limits, running tasks, live tokens."""
    request = gateway_pb2.ListWorkspacesRequest()
    reply = _call(
        lambda stub, md: stub.ListWorkspaces(request, metadata=md, timeout=CALL_TIMEOUT_S)
    )
    _show(list(reply.workspaces), output, "workspaces")


@app.command()
def get(
    name: str, output: Annotated[Output, typer.Option("-o", "--output")] = Output.table
) -> None:
    """One workspace (a workspace token reads its own), and its part of each pool it has work
    in: GPUs held, tasks placed and waiting, quota and weight there."""
    request = gateway_pb2.GetWorkspaceRequest(name=_name(name))
    reply = _call(lambda stub, md: stub.GetWorkspace(request, metadata=md, timeout=CALL_TIMEOUT_S))
    if output is Output.json:
        row = _row(reply, datetime.now(UTC))
        row.pop("age")
        row["pools"] = _usage_rows(reply)
        console.print_json(json.dumps(row))
        return
    _show([reply], output, f"workspace {name}")
    if reply.pools:
        render(_usage_rows(reply), USAGE_COLUMNS, output, title="usage by pool")
    else:
        console.print("usage: no work in any pool", highlight=False)


@app.command("set")
def set_(
    name: str,
    gpu_quota: Annotated[
        int | None, typer.Option("--gpu-quota", min=0, help="the most GPUs it holds at once")
    ] = None,
    max_queued: Annotated[
        int | None, typer.Option("--max-queued", min=0, help="the most tasks it keeps waiting")
    ] = None,
    default_pool: Annotated[
        str | None,
        typer.Option("--default-pool", help='where its tasks go without --pool; "" clears it'),
    ] = None,
    weight: Annotated[
        int | None, typer.Option("--weight", min=1, max=MAX_WEIGHT, help=WEIGHT_HELP)
    ] = None,
) -> None:
    """Change a workspace's limits, weight or default pool (only those given)."""
    if gpu_quota is None and max_queued is None and default_pool is None and weight is None:
        raise typer.BadParameter(
            "give --gpu-quota N, --max-queued N, --weight N or --default-pool POOL",
            param_hint="options",
        )
    request = gateway_pb2.SetWorkspaceRequest(
        name=_name(name),
        gpu_quota=gpu_quota,
        max_queued=max_queued,
        default_pool=default_pool,
        weight=weight,
    )
    reply = _call(lambda stub, md: stub.SetWorkspace(request, metadata=md, timeout=CALL_TIMEOUT_S))
    _show([reply], Output.table, f"workspace {name}")


@app.command()
def delete(name: str) -> None:
    """Delete a workspace (refused while it has running tasks); its tokens stop working."""
    request = gateway_pb2.DeleteWorkspaceRequest(name=_name(name))
    _call(lambda stub, md: stub.DeleteWorkspace(request, metadata=md, timeout=CALL_TIMEOUT_S))
    console.print(f"workspace {name} deleted", highlight=False)


@token_app.command("create")
def token_create(
    workspace: str,
    expires: Annotated[
        str, typer.Option("--expires", help="30d, 12h, 90m, 3600s or never")
    ] = "never",
    label: Annotated[
        str, typer.Option("--name", help="a label to tell it apart, e.g. ci or alice")
    ] = "",
) -> None:
    """Make a workspace token and print it, once: only its hash is kept."""
    if len(label) > MAX_LABEL_CHARS or not label.isprintable():
        raise typer.BadParameter(
            f"printable text of at most {MAX_LABEL_CHARS} characters", param_hint="--name"
        )
    request = gateway_pb2.CreateWorkspaceTokenRequest(
        workspace=_name(workspace, "WORKSPACE"),
        label=label,
        expires_in_seconds=expiry_seconds(expires),
    )
    reply = _call(
        lambda stub, md: stub.CreateWorkspaceToken(request, metadata=md, timeout=CALL_TIMEOUT_S)
    )
    typer.echo(reply.token)
    expiry = (
        reply.record.expires_at.ToDatetime(UTC).isoformat(timespec="seconds")
        if reply.record.HasField("expires_at")
        else "never"
    )
    typer.echo(
        f"token {reply.record.token_id} of workspace {workspace} (expires: {expiry}): shown"
        f" once, keep it now: levers9 login --token - --profile {workspace} (reads it from"
        " stdin), or LEVERS9_TOKEN in scripts",
        err=True,
    )


def _token_row(token: gateway_pb2.WorkspaceTokenRecord, now: datetime) -> dict[str, object]:
    def moment(field: str) -> datetime | None:
        if not token.HasField(field):  # type: ignore[arg-type]
            return None
        stamp = getattr(token, field)
        when: datetime = stamp.ToDatetime(UTC)
        return when

    expires, revoked = moment("expires_at"), moment("revoked_at")
    state = (
        "revoked"
        if revoked is not None
        else "expired"
        if expires is not None and expires <= now
        else "live"
    )
    last_used = moment("last_used_at")
    return {
        "token_id": token.token_id,
        "label": token.label,
        "state": state,
        "created": ago(moment("created_at"), now),
        "expires_at": expires.isoformat(timespec="seconds") if expires else "never",
        "last_used": ago(last_used, now) if last_used else "never",
    }


@token_app.command("list")
def token_list(
    workspace: str, output: Annotated[Output, typer.Option("-o", "--output")] = Output.table
) -> None:
    """A workspace's tokens: id, label, state, expiry, last use (never the tokens)."""
    request = gateway_pb2.ListWorkspaceTokensRequest(workspace=_name(workspace, "WORKSPACE"))
    reply = _call(
        lambda stub, md: stub.ListWorkspaceTokens(request, metadata=md, timeout=CALL_TIMEOUT_S)
    )
    if output is Output.json:
        render(
            [MessageToDict(t, preserving_proto_field_name=True) for t in reply.tokens],
            TOKEN_COLUMNS,
            output,
        )
        return
    now = datetime.now(UTC)
    render([_token_row(t, now) for t in reply.tokens], TOKEN_COLUMNS, output, f"{workspace}")


@token_app.command("revoke")
def token_revoke(workspace: str, token_id: str) -> None:
    """Revoke a token: every replica refuses it within seconds."""
    request = gateway_pb2.RevokeWorkspaceTokenRequest(
        workspace=_name(workspace, "WORKSPACE"), token_id=token_id
    )
    _call(lambda stub, md: stub.RevokeWorkspaceToken(request, metadata=md, timeout=CALL_TIMEOUT_S))
    console.print(f"token {token_id} of workspace {workspace} revoked", highlight=False)
