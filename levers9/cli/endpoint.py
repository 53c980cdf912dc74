"""`levers9 endpoint create|list|get|delete`: HTTP services whose replicas are tasks.

`create` starts the endpoint's record (`EndpointWorkflow`, `endpoint:<name>`) and prints its URL
on the controlplane's endpoints front (`<endpointsUrl>/<name>/`). With `--min-replicas 0` (the
default) nothing runs until the first request, which is held through the cold start (image
pull, container start, readiness) and answered then: keep the client waiting long enough
(`curl -m 1500`): a request has the endpoint's `--request-timeout` (default 1500 s) from its
arrival, a cold start included, then 504. `get` shows its replicas and its latest scale
decisions.

Each command goes through the controlplane's gateway (its Endpoints service) with the command's
token (`levers9.cli.endpoint_access`): a workspace's token makes and manages its own workspace's
endpoints only; the operator's all of them (and reaches Temporal straight when the gateway does
not answer).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from levers9.cli.endpoint_access import EndpointAccess, Refused
from levers9.cli.identity import TOKEN_VARIABLE
from levers9.cli.output import Output, ago, console, fail, render
from levers9.cli.pool_choice import chosen_pool
from levers9.cli.runtime import duration, environment, identity_from_env, settings_from_env
from levers9.cli.task_access import tasks_for
from levers9.cli.unreachable import down
from levers9.config import ControlplaneSettings
from levers9.contract import DNS_LABEL, ready_path_problem, task_input_problem
from levers9.core.endpoints import EndpointSpec, EndpointView
from levers9.core.image_reference import ImageReference, ImageReferenceError
from levers9.core.placement import QUOTA
from levers9.core.workspaces import DEFAULT_WORKSPACE, name_problem
from levers9.gateway.convert import MAX_GPUS

if TYPE_CHECKING:
    from levers9.cli.identity import Identity
    from levers9.records.endpoints import RecordedEndpoint

app = typer.Typer(
    help="Endpoints: HTTP services whose replicas are tasks, scaled to zero and back.",
    no_args_is_help=True,
)

COLUMNS = [
    ("name", "NAME"),
    ("pool", "POOL"),
    ("ready", "READY"),
    ("replicas", "REPLICAS"),
    ("range", "MIN-MAX"),
    ("in_flight", "IN FLIGHT"),
    ("waiting", "WAITING"),
    ("age", "AGE"),
    ("url", "URL"),
]
REPLICA_COLUMNS = [
    ("task_id", "REPLICA"),
    ("state", "STATE"),
    ("age", "AGE"),
    ("ready_after", "READY AFTER"),
    ("waiting", "WAITING"),
]
DELETE_WAIT_S = 150.0
T = TypeVar("T")


def _check(name: str, pool: str, image: str, command: list[str]) -> None:
    if not DNS_LABEL.fullmatch(name):
        raise typer.BadParameter(
            f"{name!r}: a lowercase DNS label (a-z, 0-9, -)", param_hint="NAME"
        )
    if not DNS_LABEL.fullmatch(pool):
        raise typer.BadParameter(
            f"{pool!r}: a pool name (a lowercase DNS label)", param_hint="--pool"
        )
    if image:
        try:
            ImageReference.parse(image)
        except ImageReferenceError as exc:
            raise typer.BadParameter(str(exc), param_hint="--image") from None
    if not command:
        raise typer.BadParameter("give the replicas' command after --", param_hint="CMD")


@app.command()
def create(
    name: Annotated[str, typer.Argument(help="the endpoint's name (a DNS label)")],
    command: Annotated[list[str], typer.Argument(help="the replicas' command, after --")],
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="the port it serves")],
    pool: Annotated[
        str | None,
        typer.Option("--pool", help="the pool its replicas run on (default: the only one, if one)"),
    ] = None,
    image: Annotated[str, typer.Option("--image", help="container image")] = "",
    gpus: Annotated[int, typer.Option("--gpus", min=0, max=MAX_GPUS, help="cards per replica")] = 1,
    min_replicas: Annotated[int, typer.Option("--min-replicas", min=0)] = 0,
    max_replicas: Annotated[int, typer.Option("--max-replicas", min=1)] = 1,
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, help="requests per replica before another")
    ] = 4,
    idle: Annotated[
        float, typer.Option("--idle", min=1, help="seconds a surplus replica idles before it stops")
    ] = 300.0,
    ready_path: Annotated[
        str,
        typer.Option(
            "--ready-path", help="ready when GET of this answers 2xx (else: the port accepts)"
        ),
    ] = "",
    cold_start_timeout: Annotated[
        float,
        typer.Option("--cold-start-timeout", min=1, help="seconds a request waits for a replica"),
    ] = 1500.0,
    request_timeout: Annotated[
        str,
        typer.Option(
            "--request-timeout",
            help="how long a request may take, a cold start included, before 504 (e.g. 1500s, 25m)",
        ),
    ] = "1500s",
    env: Annotated[list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE")] = None,
    public: Annotated[bool, typer.Option("--public", help="requests need no token")] = False,
    borrow: Annotated[
        bool,
        typer.Option(
            "--borrow",
            help="replicas may run past the workspace's GPU quota on idle cards; taken back first",
        ),
    ] = False,
    workspace: Annotated[
        str | None,
        typer.Option(
            "--workspace",
            help="the workspace it belongs to: its tokens reach it, its quota counts its replicas"
            " (default: the token's own; the operator's: default)",
        ),
    ] = None,
) -> None:
    """Create an endpoint: prints its URL. Its first request starts a replica (at zero)."""
    identity = identity_from_env()
    settings = identity.settings
    pool = chosen_pool(settings, pool)
    _check(name, pool, image, command)
    if workspace is not None:
        named = name_problem(workspace)
        if named is not None:
            raise typer.BadParameter(named, param_hint="--workspace")
    request_timeout_s = duration(request_timeout, "--request-timeout")
    if min_replicas > max_replicas:
        raise typer.BadParameter(
            f"--min-replicas {min_replicas} is above --max-replicas {max_replicas}",
            param_hint="--min-replicas",
        )
    ready_problem = ready_path_problem(ready_path)
    if ready_problem is not None:
        raise typer.BadParameter(ready_problem, param_hint="--ready-path")
    variables = environment(env or [], "--env")
    problem = task_input_problem(command, variables)
    if problem is not None:
        raise typer.BadParameter(problem, param_hint="CMD and --env")
    spec = EndpointSpec(
        name=name,
        pool_name=pool,
        command=tuple(command),
        port=port,
        image=image,
        gpus=gpus,
        env=variables,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        target_in_flight=concurrency,
        idle_seconds=idle,
        ready_path=ready_path,
        cold_start_timeout_seconds=cold_start_timeout,
        request_timeout_seconds=request_timeout_s,
        public=public,
        workspace=workspace or "",  # "": the token's own
        borrow=borrow,
    )
    try:
        created = asyncio.run(EndpointAccess(settings).create(spec))
    except Refused as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None
    url = endpoint_url(settings, name)
    console.print(f"endpoint {name} created: {url}", highlight=False)
    where = f" of workspace {created.workspace}" if created.workspace != DEFAULT_WORKSPACE else ""
    console.print(
        f"  replicas {min_replicas}-{max_replicas} on pool {pool}, {gpus} card(s) each, port"
        f" {port}; a surplus replica stops after {idle:g} s idle{where}",
        highlight=False,
    )
    for line in curl_lines(identity, url, public, request_timeout_s):
        console.print(f"  {line}", highlight=False, soft_wrap=True)


def endpoint_url(settings: ControlplaneSettings, name: str) -> str:
    return f"{settings.endpoints_base_url()}/{name}/"


def curl_lines(identity: Identity, url: str, public: bool, wait_s: float = 1500.0) -> list[str]:
    """A request that waits through a cold start, as long as the front would (the page:
    `curl -m 1500`), with the token as this command got it: the variable it came from, the
    file it read, or (a profile's, or one derived on the controlplane's machine) `$TOKEN` and a
    line saying which token that is."""
    settings = identity.settings
    parts = ["curl", "-m", str(math.ceil(wait_s))]
    if url.startswith("https:") and settings.gateway_tls_ca_file:
        parts += ["--cacert", str(settings.gateway_tls_ca_file)]
    if public:
        return [" ".join([*parts, url])]
    source, note = identity.token_source, ""
    if source in (TOKEN_VARIABLE, "LEVERS9_API_TOKEN"):
        token = f"${source}"
    elif settings.api_token is None and settings.api_token_file is not None:
        token = f"$(cat {settings.api_token_file})"
    else:
        token = "$TOKEN"
        note = f"TOKEN: the token of {source}" + (
            f" (`levers9 --profile {identity.profile} whoami` says whose)"
            if identity.profile is not None
            else ""
        )
    parts += ["-H", f'"Authorization: Bearer {token}"']
    return [" ".join([*parts, url]), *([note] if note else [])]


def _row(settings: ControlplaneSettings, view: EndpointView, now: datetime) -> dict[str, Any]:
    active = [r for r in view.replicas if r.state != "stopping"]
    return {
        "name": view.name,
        "pool": view.spec.pool_name,
        "ready": len(view.replicas_ready()),
        "replicas": len(active),
        "range": f"{view.spec.min_replicas}-{view.spec.max_replicas}",
        "in_flight": view.in_flight,
        "waiting": view.waiting,
        "age": ago(view.created_at, now),
        "url": endpoint_url(settings, view.name),
    }


@app.command("list")
def list_(output: Annotated[Output, typer.Option("-o", "--output")] = Output.table) -> None:
    """List endpoints: replicas ready and running, requests in flight and waiting, the URL."""
    settings = settings_from_env()
    shown = _answered(EndpointAccess(settings).listing())
    now = datetime.now(UTC)
    if shown.down is not None:
        _show_recorded(settings, shown.recorded, output, now)
        down(shown.down)
    if output is Output.json:
        render([v.model_dump(mode="json") for v in shown.views], COLUMNS, output)
        return
    render([_row(settings, v, now) for v in shown.views], COLUMNS, output, title="endpoints")


def _answered(call: Coroutine[Any, Any, T]) -> T:
    """Runs the command's calls; a refusal (the gateway's, a workspace token's gateway not
    answering) is one line and exit status 1."""
    try:
        return asyncio.run(call)
    except Refused as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None


@app.command()
def get(
    name: Annotated[str, typer.Argument(help="the endpoint")],
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
) -> None:
    """One endpoint: its spec, its replicas, and its latest cold starts and scale decisions."""
    settings = settings_from_env()
    shown = _answered(EndpointAccess(settings).get(name))
    if shown.down is not None and shown.recorded:
        _show_recorded(settings, shown.recorded, output, datetime.now(UTC))
        down(shown.down)
    view = shown.views[0] if shown.views else None
    if view is None:
        fail([f"no endpoint {name}: `levers9 endpoint list` shows them"])
        raise typer.Exit(1)
    if output is Output.json:
        console.print_json(view.model_dump_json())
        return
    now = datetime.now(UTC)
    spec = view.spec
    lines = [
        f"endpoint {name}: {endpoint_url(settings, name)}"
        + (f" (workspace {spec.workspace})" if spec.workspace != DEFAULT_WORKSPACE else ""),
        f"  pool {spec.pool_name}, {spec.gpus} card(s) per replica, port {spec.port}"
        + (f", ready when GET {spec.ready_path} is 2xx" if spec.ready_path else ""),
        f"  image {spec.image or '(the pool default)'}; command {' '.join(spec.command)}",
        f"  replicas {spec.min_replicas}-{spec.max_replicas} (wanted now {view.wanted}),"
        f" {spec.target_in_flight} in flight each; idle {spec.idle_seconds:g} s",
        f"  requests: {view.in_flight} in flight, {view.waiting} waiting; cold starts:"
        f" {view.cold_starts}",
        f"  request timeout {spec.request_timeout_seconds:g} s (a cold start included), cold"
        f" start timeout {spec.cold_start_timeout_seconds:g} s",
    ]
    if view.failing:
        lines.append(f"  FAILING: {view.failing}")
    waiting = asyncio.run(
        _replicas_waiting(settings, [r.task_id for r in view.replicas if not r.ready_at])
    )
    if any(reason.startswith("quota") for reason in waiting.values()):
        lines.append(
            f"  scaling up waits: workspace {spec.workspace} holds its GPU quota (its replicas"
            " count against it as its tasks do)"
        )
    console.print("\n".join(lines), highlight=False)
    rows = [
        {
            "task_id": r.task_id,
            "state": r.state,
            "age": ago(r.started_at, now),
            "ready_after": f"{(r.ready_at - r.started_at).total_seconds():.1f}s"
            if r.ready_at
            else "",
            "waiting": waiting.get(r.task_id, ""),
        }
        for r in view.replicas
    ]
    render(rows, REPLICA_COLUMNS, Output.table, title="replicas")
    events = [
        {"at": e.at.strftime("%H:%M:%S"), "kind": e.kind, "message": e.message}
        for e in view.events[-15:]
    ]
    render(
        events,
        [("at", "AT"), ("kind", "EVENT"), ("message", "MESSAGE")],
        Output.table,
        title="events",
    )


async def _replicas_waiting(settings: ControlplaneSettings, task_ids: list[str]) -> dict[str, str]:
    """Why each replica not yet ready still waits for its cards, from its task's record: `quota`
    (its workspace holds its GPU quota) or `cards` (no worker has them free); best effort (a
    replica whose record cannot be read shows nothing)."""
    tasks = tasks_for(settings)
    waiting: dict[str, str] = {}
    for task_id in task_ids:
        try:
            record = await tasks.record(task_id)
        except Exception:  # the table shows the replica either way
            continue
        spot = record.queue if record is not None else None
        if spot is not None:
            waiting[task_id] = (
                f"quota ({spot.position} of {spot.waiting})"
                if spot.reason == QUOTA
                else f"cards ({spot.position} of {spot.waiting})"
            )
    return waiting


def _show_recorded(
    settings: ControlplaneSettings,
    recorded: list[RecordedEndpoint],
    output: Output,
    now: datetime,
) -> None:
    """With the controlplane down: each endpoint as created (its memo); its replicas and
    requests only the controlplane knows (`?`)."""
    if output is Output.json:
        render([r.spec.model_dump(mode="json") for r in recorded], COLUMNS, output)
        return
    unknown = dict.fromkeys(("ready", "replicas", "in_flight", "waiting"), "?")
    rows = [
        {
            **unknown,
            "name": r.spec.name,
            "pool": r.spec.pool_name,
            "range": f"{r.spec.min_replicas}-{r.spec.max_replicas}",
            "age": ago(r.created_at, now),
            "url": endpoint_url(settings, r.spec.name),
        }
        for r in recorded
    ]
    title = "endpoints as created (the controlplane is down: replicas and requests unknown)"
    render(rows, COLUMNS, output, title=title)


@app.command()
def delete(
    name: Annotated[str, typer.Argument(help="the endpoint")],
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="until its replicas ended")] = True,
) -> None:
    """Delete an endpoint: its replicas are stopped, then its record ends."""
    endpoints = EndpointAccess(settings_from_env())
    if not _answered(endpoints.delete(name)):
        fail([f"no endpoint {name}: `levers9 endpoint list` shows them"])
        raise typer.Exit(1)
    console.print(f"endpoint {name}: deleting (its replicas stop)", highlight=False)
    if not wait:
        return
    gone = _answered(endpoints.deleted(name, DELETE_WAIT_S))
    if not gone.ended:
        fail([f"endpoint {name}: its replicas did not end within {DELETE_WAIT_S:g} s"])
        raise typer.Exit(1)
    ending = f" ({len(gone.view.replicas)} replica(s) still ending)" if gone.view else ""
    console.print(f"endpoint {name} deleted{ending} in {gone.took_s:.1f} s", highlight=False)
