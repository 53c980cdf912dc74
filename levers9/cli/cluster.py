"""`levers9 cluster join|leave|list`: attach a cluster through an agent that dials out.

`join` prints what to install in the cluster (a namespace, the agent's ServiceAccount with the
least RBAC it needs, a Secret with a one-time join token, the agent's Deployment) for `kubectl
apply -f -`, or applies it itself with `--apply` (kubectl, the current context). It records the
join first (`ClusterWorkflow`): the pool it makes, the join token's SHA-256 and expiry. The pool
needs no values file, no key, no authorized network, no firewall rule: the agent dials the
gateway, and its workers run in tunnel mode. `levers9 pool list` shows it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import shutil
import subprocess
import sys
from typing import Annotated, Any

import typer
import yaml

from levers9.cli.output import Output, ago, console, errors, fail, render
from levers9.cli.runtime import labels, settings_from_env
from levers9.config import ControlplaneSettings
from levers9.contract import AGENT_NAME, DNS_LABEL
from levers9.operations import failure_message, start_pool_removal
from levers9.providers.joined import JoinedCluster, manifests
from levers9.records.clusters import (
    ClusterExists,
    cluster_state,
    joined_clusters,
    leave_cluster,
    start_join,
)
from levers9.rpc import tls
from levers9.temporal import VALUES, connect, schedule_source

app = typer.Typer(
    help="Clusters joined through an agent that dials out: nothing to allow-list, no key.",
    no_args_is_help=True,
)
JOIN_PREFIX = "l9j1."
COLUMNS = [
    ("name", "NAME"),
    ("gpu_type", "GPU"),
    ("namespace", "NAMESPACE"),
    ("selector", "NODE SELECTOR"),
    ("joined", "JOINED"),
    ("expires", "JOIN TOKEN"),
]


@app.command()
def join(
    name: Annotated[str, typer.Option("--name", help="the pool's name (a DNS label)")],
    gpu_type: Annotated[str, typer.Option("--gpu-type", help="the nodes' cards, e.g. RTXPro6000")],
    node_selector: Annotated[
        list[str] | None, typer.Option("--node-selector", help="KEY=VALUE of the GPU nodes")
    ] = None,
    namespace: Annotated[str, typer.Option("--namespace", help="where the agent runs")] = "levers9",
    worker_image: Annotated[
        str, typer.Option("--worker-image", help="the worker image (the agent ships in it)")
    ] = "",
    gateway: Annotated[
        str, typer.Option("--gateway", help="where the agent dials the gateway (host:port)")
    ] = "",
    apply: Annotated[
        bool, typer.Option("--apply", help="apply it with kubectl (the current context)")
    ] = False,
    simulated_gpus: Annotated[
        bool,
        typer.Option(
            "--simulated-gpus",
            help="its cards are simulated (the sandbox): the GPU check expects to see none",
        ),
    ] = False,
) -> None:
    """Join a cluster: print what to install there (| kubectl apply -f -), or --apply it."""
    if not DNS_LABEL.fullmatch(name) or len(name) > 40:
        raise typer.BadParameter(
            f"{name!r}: a lowercase DNS label of 40 at most", param_hint="--name"
        )
    if not DNS_LABEL.fullmatch(namespace):
        raise typer.BadParameter(f"{namespace!r}: a namespace name", param_hint="--namespace")
    settings = settings_from_env()
    image = worker_image or settings.source_image or ""
    if not image:
        raise typer.BadParameter(
            "give the worker image the cluster's nodes pull (no sourceImage is set)",
            param_hint="--worker-image",
        )
    ca_pem = _gateway_ca(settings)
    spec = JoinedCluster(
        name=name,
        gpu_type=gpu_type,
        node_selector=labels(node_selector or [], "--node-selector"),
        namespace=namespace,
        worker_image=image,
        simulated_gpus=simulated_gpus,
    )
    token = JOIN_PREFIX + secrets.token_urlsafe(32)
    try:
        state = asyncio.run(_start(settings, spec, token))
    except ClusterExists as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None
    documents = manifests(spec, token, gateway or settings.cli_gateway_address(), ca_pem)
    text = yaml.safe_dump_all(documents, sort_keys=False)
    expires = state.expires_at.isoformat(timespec="seconds")
    if not apply:
        sys.stdout.write(text)
        errors.print(
            f"cluster {name}: apply this in the cluster (| kubectl apply -f -); its join token"
            f" works once, until {expires}",
            highlight=False,
        )
        return
    if shutil.which("kubectl") is None:
        fail(["--apply needs kubectl on PATH; or pipe the output to kubectl apply -f -"])
        raise typer.Exit(1)
    done = subprocess.run(
        ["kubectl", "apply", "-f", "-"], input=text, capture_output=True, text=True, check=False
    )
    sys.stdout.write(done.stdout)
    if done.returncode != 0:
        fail([f"kubectl apply failed: {done.stderr.strip()}"])
        raise typer.Exit(1)
    console.print(
        f"cluster {name} joining: the agent dials the gateway, then `levers9 pool list` shows"
        f" pool {name}",
        highlight=False,
    )


def _gateway_ca(settings: ControlplaneSettings) -> str | None:
    try:
        pem = tls.gateway_ca_pem(settings)
    except tls.TlsError as exc:
        raise typer.BadParameter(str(exc), param_hint="LEVERS9_GATEWAY_TLS_CA_FILE") from None
    return pem.decode() if pem is not None else None


async def _start(settings: ControlplaneSettings, spec: JoinedCluster, token: str) -> Any:
    client = await connect(settings)
    return await start_join(client, settings.task_queue, spec, token)


@app.command("list")
def list_(output: Annotated[Output, typer.Option("-o", "--output")] = Output.table) -> None:
    """List the joined clusters."""
    settings = settings_from_env()
    from datetime import UTC, datetime

    states = asyncio.run(_joined(settings))
    if output is Output.json:
        render([s.model_dump(mode="json") for s in states], COLUMNS, output)
        return
    now = datetime.now(UTC)
    rows = [
        {
            "name": s.spec.name,
            "gpu_type": s.spec.gpu_type,
            "namespace": s.spec.namespace,
            "selector": ",".join(f"{k}={v}" for k, v in s.spec.node_selector.items()),
            "joined": ago(s.joined_at, now) + " ago" if s.joined_at else "not yet",
            "expires": "spent"
            if s.joined_at
            else "expired"
            if s.expires_at <= now
            else f"valid until {s.expires_at.isoformat(timespec='seconds')}",
        }
        for s in states
    ]
    render(rows, COLUMNS, output, title="clusters")


async def _joined(settings: ControlplaneSettings) -> list[Any]:
    return await joined_clusters(await connect(settings))


@app.command()
def leave(
    name: Annotated[str, typer.Argument(help="the joined cluster")],
    apply: Annotated[
        bool, typer.Option("--apply", help="delete what join installed, with kubectl")
    ] = False,
) -> None:
    """Remove a joined cluster's pool (its workers stop), then what join installed."""
    settings = settings_from_env()
    try:
        namespace, owned = asyncio.run(_leave(settings, name))
    except LookupError as exc:
        fail([str(exc)])
        raise typer.Exit(1) from None
    # What join installed, by name; the namespace only once nothing else is in it (a values
    # pool's workers may live there, or whatever the cluster's owner put there before).
    commands = [
        ["kubectl", "delete", "-n", namespace, kind, AGENT_NAME, "--ignore-not-found"]
        for kind in ("deployment", "secret", "rolebinding", "role", "serviceaccount")
    ] + [
        ["kubectl", "delete", kind, f"{AGENT_NAME}-{name}", "--ignore-not-found"]
        for kind in ("clusterrolebinding", "clusterrole")
    ]
    if not apply:
        lines = ["  " + " ".join(c) for c in commands]
        if owned:
            lines.append(
                f"  kubectl delete namespace {namespace}   # only if nothing else runs there:"
                f" kubectl get all -n {namespace}"
            )
        console.print(
            f"cluster {name} left; remove what join installed there:\n" + "\n".join(lines),
            highlight=False,
        )
        return
    for command in commands:
        _kubectl(command)
    others = _staying(
        _kubectl(["kubectl", "get", "-n", namespace, "deployments,jobs,pods,secrets", "-o", "json"])
    )
    if owned and not others:
        _kubectl(["kubectl", "delete", "namespace", namespace, "--ignore-not-found"])
        console.print(f"cluster {name} left, and what join installed deleted", highlight=False)
        return
    console.print(
        f"cluster {name} left, and what join installed deleted; namespace {namespace} kept"
        + (f": {len(others)} other objects in it ({', '.join(others[:3])}...)" if others else ""),
        highlight=False,
    )


def _staying(listed: str) -> list[str]:
    """`kind/name` of each object of a `kubectl get -o json` list that is not already going: an
    object with a deletionTimestamp (the agent's pods in their grace period, right after the
    deletes above) leaves on its own and keeps no namespace."""
    try:
        items = json.loads(listed).get("items", [])
    except (ValueError, AttributeError):
        fail([f"kubectl get -o json printed no list: {listed[:200]!r}"])
        raise typer.Exit(1) from None
    return [
        f"{item.get('kind', '?').lower()}/{item.get('metadata', {}).get('name', '?')}"
        for item in items
        if not item.get("metadata", {}).get("deletionTimestamp")
    ]


def _kubectl(command: list[str]) -> str:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        fail([f"{' '.join(command)}: {done.stderr.strip()}"])
        raise typer.Exit(1)
    return done.stdout


async def _leave(settings: ControlplaneSettings, name: str) -> tuple[str, bool]:
    """Ends the join (and the pool it made); its namespace, and whether the join made the
    pool (False: the values define it, and leave takes nothing of theirs)."""
    client = await connect(settings)
    state = await cluster_state(client, name)
    if state is None:
        raise LookupError(f"no cluster {name} is joined: `levers9 cluster list` shows them")
    if await schedule_source(client, name) == VALUES:
        console.print(
            f"cluster {name}: pool {name} is the values' (not the join's): its schedule,"
            " workers and namespace stay; ending the join's record only",
            highlight=False,
        )
        await leave_cluster(client, name)
        return state.spec.namespace, False
    console.print(f"cluster {name}: removing pool {name} (its workers stop)", highlight=False)
    handle = await start_pool_removal(
        client, settings, name, reason=f"cluster {name} left (levers9 cluster leave)"
    )
    try:
        await handle.result()
    except Exception as exc:  # the pool's removal failed: say so, leave the join as it is
        raise LookupError(f"pool {name} was not removed: {failure_message(exc)}") from None
    await leave_cluster(client, name)
    return state.spec.namespace, True
