"""`levers9 gke attach`: the cloud side of a GKE pool, as AttachClusterWorkflow.

The command is itself the Temporal worker for the attach: it serves the workflow and its cloud
activities on a task queue of its own, with the operator's Google (Application Default
Credentials) and AWS credentials, and writes the key file on this machine. Temporal keeps the
steps durable and retried; a run cut short is run again (every step is idempotent). It prints
each step as it completes, then the values block and the commands for the private values file.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Annotated

import typer
import yaml
from pydantic import ValidationError
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.worker import Worker

from activities.registry import attach_activities
from levers9.cli.output import console, errors, fail
from levers9.cli.runtime import settings_from_env
from levers9.cloud import (
    DEFAULT_KEY_FILE,
    AttachInput,
    AttachResult,
    ClusterRef,
    Step,
    accelerator,
    attach_workflow_id,
    default_pool_name,
    private_values_commands,
)
from levers9.config import ControlplaneSettings
from levers9.operations import failure_message
from levers9.temporal import connect
from workflows.attach import AttachClusterWorkflow

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
    console.print(
        f"attaching {ref.cluster_path} (node pool {node_pool}) as pool {request.pool_name}",
        highlight=False,
    )
    try:
        result = asyncio.run(_attach(settings, request))
    except AttachFailed as exc:
        errors.print(f"attach failed: {exc}", highlight=False)
        errors.print("fix that and rerun: every step is idempotent", highlight=False)
        raise typer.Exit(1) from None
    _print_result(request, result)


class AttachFailed(Exception):
    pass


async def _attach(settings: ControlplaneSettings, request: AttachInput) -> AttachResult:
    client = await connect(settings)
    task_queue = f"levers9-attach-{request.cluster.cluster}-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[AttachClusterWorkflow],
        activities=attach_activities(client, settings),
    ):
        # A run left by an attach that died (its queue has no worker now) is replaced.
        handle = await client.start_workflow(
            AttachClusterWorkflow.run,
            request,
            id=attach_workflow_id(request.cluster.cluster),
            task_queue=task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        )
        printed = 0
        result_task = asyncio.ensure_future(handle.result())
        while True:
            done = result_task.done()
            printed = await _print_steps(client, handle.id, handle.result_run_id, printed)
            if done:
                break
            await asyncio.sleep(POLL_S)
        try:
            return result_task.result()
        except WorkflowFailureError as exc:
            raise AttachFailed(failure_message(exc)) from None


async def _print_steps(client: Client, workflow_id: str, run_id: str | None, printed: int) -> int:
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    try:
        steps: list[Step] = await handle.query(AttachClusterWorkflow.steps)
    except Exception:
        return printed
    for step in steps[printed:]:
        console.print(f"  {step.line()}", highlight=False, soft_wrap=True)
    return max(printed, len(steps))


def _print_result(request: AttachInput, result: AttachResult) -> None:
    changed = [s for s in result.steps if s.status != "unchanged"]
    console.print(
        f"done: {len(changed)} changed, {len(result.steps) - len(changed)} unchanged;"
        f" worker image {result.image_digest}",
        highlight=False,
    )
    console.print(
        "\nPaste under config.worker.pools in your values (the key is not in it):\n",
        highlight=False,
    )
    block = yaml.safe_dump({request.pool_name: result.values_block}, sort_keys=False)
    console.out(block, highlight=False)
    key = os.path.expanduser(request.key_file)
    console.print(
        f"\nThe key is in {key} (mode 0600). Make the private values file and deploy:\n",
        highlight=False,
    )
    for line in private_values_commands(request.pool_name, request.key_file):
        console.out(line, highlight=False)
