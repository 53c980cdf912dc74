"""`levers9 egress`: the controlplane's egress IPs on a GKE cluster's allowlists
(`egress:<cluster>`; the same as `temporal workflow signal --workflow-id egress:<cluster>
--name rotate_ips --input '{"ips": [...]}'`)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated

import typer

from levers9.cli.output import Output, console, errors, fail, render
from levers9.cli.runtime import settings_from_env
from levers9.config import ControlplaneSettings
from levers9.operations import NoEgressWorkflow, allowlist, rotate_ips
from levers9.providers.gke import Allowlist, Rotation
from levers9.temporal import connect

app = typer.Typer(help="The controlplane's egress IPs on GKE allowlists.", no_args_is_help=True)

WAIT_S = 120.0
POLL_S = 0.5


@app.command()
def rotate(
    cluster: Annotated[str, typer.Option("--cluster", help="the GKE cluster")],
    ip: Annotated[
        list[str] | None,
        typer.Option("--ip", help="an egress IP (repeat); omitted: discovered from EC2"),
    ] = None,
    wait: Annotated[float, typer.Option("--wait", min=0, help="seconds to wait")] = WAIT_S,
) -> None:
    """Append the egress IPs to the cluster's authorized networks and firewall rule."""
    try:
        rotation = asyncio.run(_rotate(settings_from_env(), cluster, ip, wait))
    except NoEgressWorkflow as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None
    if rotation is None:
        errors.print(
            f"rotation signalled; still running after {wait:.0f}s: levers9 egress show"
            f" --cluster {cluster}",
            highlight=False,
        )
        raise typer.Exit(4)
    if rotation.error:
        fail([f"rotation failed: {rotation.error}"])
        raise typer.Exit(1)
    for step in rotation.steps:
        console.print(f"  {step.line()}", highlight=False, soft_wrap=True)
    added = ", ".join(rotation.added) or "nothing new"
    console.print(f"egress IPs of {cluster}: added {added}", highlight=False)


async def _rotate(
    settings: ControlplaneSettings, cluster: str, ips: list[str] | None, wait: float
) -> Rotation | None:
    client = await connect(settings)
    request_id = await rotate_ips(client, cluster, ips or None)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        state = await allowlist(client, cluster)
        for rotation in state.rotations:
            if rotation.request_id == request_id:
                return rotation
        await asyncio.sleep(POLL_S)
    return None


@app.command()
def show(
    cluster: Annotated[str, typer.Option("--cluster", help="the GKE cluster")],
    output: Annotated[Output, typer.Option("-o", "--output")] = Output.table,
) -> None:
    """What is allowlisted, and the latest rotations."""
    try:
        state: Allowlist = asyncio.run(_show(settings_from_env(), cluster))
    except NoEgressWorkflow as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None
    if output is Output.json:
        console.print_json(
            json.dumps(state.model_dump(mode="json", exclude={"max_history_events"}))
        )
        return
    console.print(
        f"cluster {state.cluster.cluster_path}; firewall {state.cluster.firewall_name}"
        f" -> tags {', '.join(state.target_tags)}",
        highlight=False,
    )
    console.print(f"allowlisted: {', '.join(state.allowlist) or 'none'}", highlight=False)
    rows = [
        {
            "at": r.at,
            "requested": ", ".join(r.requested) or "(discover)",
            "added": ", ".join(r.added) or "-",
            "error": r.error or "-",
        }
        for r in state.rotations
    ]
    columns = [("at", "AT"), ("requested", "IPS"), ("added", "ADDED"), ("error", "ERROR")]
    render(rows, columns, Output.table)


async def _show(settings: ControlplaneSettings, cluster: str) -> Allowlist:
    return await allowlist(await connect(settings), cluster)
