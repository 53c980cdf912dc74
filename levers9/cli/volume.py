"""`levers9 volume ...`: a workspace's buckets, mounted into its tasks (`levers9 run --volume
NAME:/data[:ro]`), through the gateway's Volumes service with the command's token.

`volume create` reads the bucket's key from an AWS shared-credentials file (`[default]` with
aws_access_key_id and aws_secret_access_key; a GCS HMAC key the same way for gs://) and sends
it to the controlplane, which lists the bucket with it, seals it under its own key and records
only the ciphertext. Nothing prints the key back, and a malformed file is refused naming the
line or the field, never quoting it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from levers9.cli.gateway_api import (
    CALL_TIMEOUT_S,
)
from levers9.cli.output import Output, ago, console, render
from levers9.cli.service_call import call_service
from levers9.core.volumes import CredentialsFileError, name_problem, parse_credentials
from levers9.proto import volumes_pb2, volumes_pb2_grpc

if TYPE_CHECKING:
    from levers9.proto.volumes_pb2_grpc import VolumesAsyncStub as Stub

app = typer.Typer(
    help="Volumes: a workspace's buckets, mounted into its tasks with its own credentials.",
    no_args_is_help=True,
)

T = TypeVar("T")
CREATE_TIMEOUT_S = 60.0
"""The controlplane lists the bucket before it records the volume (at most about 20 s)."""
COLUMNS = [
    ("name", "NAME"),
    ("workspace", "WORKSPACE"),
    ("bucket", "BUCKET"),
    ("endpoint", "ENDPOINT"),
    ("region", "REGION"),
    ("age", "AGE"),
]
WorkspaceOption = Annotated[
    str,
    typer.Option(
        "--workspace", help="the operator's: the workspace (default: default; a token's own)"
    ),
]


def _call(call: Callable[[Stub, tuple[tuple[str, str]]], Awaitable[T]]) -> T:
    """One call to the gateway's Volumes service; its refusal printed, exit status 1."""
    return call_service(volumes_pb2_grpc.VolumesStub, call)


def _name(name: str) -> str:
    problem = name_problem(name)
    if problem is not None:
        raise typer.BadParameter(problem, param_hint="NAME")
    return name


def _row(volume: volumes_pb2.Volume, now: datetime) -> dict[str, object]:
    created = volume.created_at.ToDatetime(UTC) if volume.HasField("created_at") else None
    return {
        "name": volume.name,
        "workspace": volume.workspace,
        "bucket": volume.bucket,
        "endpoint": volume.endpoint or None,
        "region": volume.region or None,
        "key_generation": volume.key_generation,
        "created_at": created.isoformat() if created else None,
        "age": ago(created, now),
    }


def _show(volumes: list[volumes_pb2.Volume], output: Output, title: str) -> None:
    now = datetime.now(UTC)
    rows = [_row(v, now) for v in volumes]
    if output is Output.json:
        for row in rows:
            row.pop("age")
    render(rows, COLUMNS, output, title=title)


def read_credentials(path: Path) -> tuple[str, str]:
    """The file's [default] key (id, secret); BadParameter naming the line or field."""
    try:
        text = path.expanduser().read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not text"
        raise typer.BadParameter(f"{path}: {reason}", param_hint="--credentials-file") from None
    try:
        credentials = parse_credentials(text, str(path))
    except CredentialsFileError as exc:
        raise typer.BadParameter(str(exc), param_hint="--credentials-file") from None
    return credentials.access_key_id, credentials.secret_access_key


@app.command()
def create(
    name: str,
    bucket: Annotated[
        str, typer.Option("--bucket", help="s3://BUCKET[/PREFIX] or gs://BUCKET[/PREFIX]")
    ],
    credentials_file: Annotated[
        Path,
        typer.Option(
            "--credentials-file",
            help="AWS shared-credentials form: [default] aws_access_key_id, aws_secret_access_key",
        ),
    ],
    endpoint: Annotated[
        str, typer.Option("--endpoint", help="the S3 endpoint URL (default: AWS's; Google's)")
    ] = "",
    region: Annotated[str, typer.Option("--region", help="the bucket's region")] = "",
    workspace: WorkspaceOption = "",
    no_check: Annotated[
        bool,
        typer.Option("--no-check", help="record it without listing the bucket first"),
    ] = False,
) -> None:
    """Create a volume: the bucket, checked with the credentials, which the controlplane keeps
    encrypted."""
    key_id, secret = read_credentials(credentials_file)
    request = volumes_pb2.CreateVolumeRequest(
        name=_name(name),
        workspace=workspace,
        bucket=bucket,
        endpoint=endpoint,
        region=region,
        access_key_id=key_id,
        secret_access_key=secret,
        skip_check=no_check,
    )
    reply = _call(
        lambda stub, md: stub.CreateVolume(request, metadata=md, timeout=CREATE_TIMEOUT_S)
    )
    made = reply.volume
    checked = "recorded unchecked" if no_check else "listed with its credentials"
    console.print(
        f"volume {made.name} created in workspace {made.workspace}: {made.bucket} ({checked});"
        f" mount it with levers9 run --volume {made.name}:/data -- ...",
        highlight=False,
    )


@app.command("list")
def list_(
    workspace: WorkspaceOption = "",
    all_workspaces: Annotated[
        bool, typer.Option("--all-workspaces", "-A", help="the operator's: every workspace's")
    ] = False,
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
) -> None:
    """The workspace's volumes."""
    request = volumes_pb2.ListVolumesRequest(workspace="*" if all_workspaces else workspace)
    reply = _call(lambda stub, md: stub.ListVolumes(request, metadata=md, timeout=CALL_TIMEOUT_S))
    _show(list(reply.volumes), output, "volumes")


@app.command()
def get(
    name: str,
    workspace: WorkspaceOption = "",
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
) -> None:
    """One volume (never its credentials)."""
    request = volumes_pb2.GetVolumeRequest(name=_name(name), workspace=workspace)
    reply = _call(lambda stub, md: stub.GetVolume(request, metadata=md, timeout=CALL_TIMEOUT_S))
    if output is Output.json:
        row = _row(reply.volume, datetime.now(UTC))
        row.pop("age")
        console.print_json(json.dumps(row))
        return
    _show([reply.volume], output, f"volume {name}")


@app.command()
def delete(name: str, workspace: WorkspaceOption = "") -> None:
    """Delete a volume's record (and its sealed credentials); the bucket is left as it is."""
    request = volumes_pb2.DeleteVolumeRequest(name=_name(name), workspace=workspace)
    _call(lambda stub, md: stub.DeleteVolume(request, metadata=md, timeout=CALL_TIMEOUT_S))
    console.print(f"volume {name} deleted (its bucket's objects are untouched)", highlight=False)
