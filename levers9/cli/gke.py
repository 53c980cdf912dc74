"""`levers9 gke attach`: the cloud side of a GKE pool, as AttachClusterWorkflow.

The command checks its options and the controlplane's settings, then replaces itself with
`python -m attach_main` (attach_main.py), the attach's own Temporal worker: it serves the
workflow and its cloud activities with the operator's Google (Application Default Credentials)
and AWS credentials, on this machine, and prints each step as it completes, then the values
block and the commands for the private values file.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer
from pydantic import ValidationError

from levers9.cli.output import fail
from levers9.cli.runtime import settings_from_env
from levers9.providers.gke import (
    DEFAULT_KEY_FILE,
    AttachInput,
    ClusterRef,
    accelerator,
    default_pool_name,
)

app = typer.Typer(help="The cloud side of GKE pools.", no_args_is_help=True)

POLL_S = 0.3


@app.command()
def attach(
    project: Annotated[str, typer.Option("--project", help="the GKE cluster's project")],
    zone: Annotated[str, typer.Option("--zone", help="its zone (or region)")],
    cluster: Annotated[str, typer.Option("--cluster", help="the cluster's name")],
    node_pool: Annotated[str, typer.Option("--node-pool", help="the GPU node pool")],
    gpu: Annotated[str, typer.Option("--gpu", help="the pool's gpuType, e.g. RTXPro6000")],
    pool_name: Annotated[
        str | None, typer.Option("--pool-name", help="the pool's name in values")
    ] = None,
    key_file: Annotated[
        str, typer.Option("--key-file", envvar="LEVERS9_GKE_KEY_FILE", help="where the key goes")
    ] = DEFAULT_KEY_FILE,
    ip: Annotated[
        list[str] | None, typer.Option("--ip", help="an egress IP beside the discovered ones")
    ] = None,
    tunnel: Annotated[
        bool, typer.Option("--tunnel", help="a tunnel-only pool: no firewall rule to the nodes")
    ] = False,
    enable_authorized_networks: Annotated[
        bool,
        typer.Option(
            "--enable-authorized-networks",
            help="on a cluster whose API is open to all, turn master authorized networks on"
            " with the controlplane's IPs (and each --ip): everyone else is locked out",
        ),
    ] = False,
) -> None:
    """Service account, key, registry, image copy, firewall rule, authorized networks; then the
    values block. Safe to rerun: it only appends IPs."""
    settings = settings_from_env()
    problems = []
    try:
        ref = ClusterRef(project=project, location=zone, cluster=cluster)
    except ValidationError as exc:
        problems += [str(e["msg"]).removeprefix("Value error, ") for e in exc.errors()]
        ref = None
    try:
        accelerator(gpu)
    except ValueError as exc:
        problems.append(str(exc))
    if not settings.source_image:
        problems.append(
            "LEVERS9_SOURCE_IMAGE is not set: the worker image in the controlplane's ECR"
            " (e.g. <account>.dkr.ecr.<region>.amazonaws.com/levers9/worker:latest)"
        )
    if problems or ref is None:
        fail(problems)
        raise typer.Exit(2)
    assert settings.source_image is not None
    request = AttachInput(
        cluster=ref,
        node_pool=node_pool,
        gpu_type=gpu,
        pool_name=pool_name or default_pool_name(gpu),
        key_file=key_file,
        source_image=settings.source_image,
        eks_cluster=settings.eks_cluster,
        ips=list(ip or []),
        controlplane_task_queue=settings.task_queue,
        tunnel=tunnel,
        enable_authorized_networks=enable_authorized_networks,
    )
    # The attach's Temporal worker is a program of its own (attach_main, beside worker_main):
    # levers9 never imports workflows or activities. The options are checked; the rest is its.
    os.execv(sys.executable, [sys.executable, "-m", "attach_main", request.model_dump_json()])
