"""`python -m attach_main`: the Temporal worker of one `levers9 gke attach`, in the operator's
own process (their Google Application Default Credentials and AWS credentials never leave this
machine), as worker_main is the controlplane's.

`levers9 gke attach` checks its options, then replaces itself with this program, handing it the
attach as one JSON argument (`AttachInput`: names and paths, no secret). It serves
AttachClusterWorkflow and its cloud activities on a task queue of its own, starts the workflow,
prints each step as it completes, then the values block and the commands for the private values
file. Temporal keeps the steps durable and retried; a run cut short is run again (every step is
idempotent). A program of its own because levers9 never imports workflows or activities
(.importlinter): the library does not host the controlplane's code, the programs do.

Exit status: 0 attached, 1 the attach failed (the message says the step and the fix), 2 the
argument is not an attach (a caller other than the CLI).
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

import yaml
from pydantic import ValidationError
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.worker import Worker

from activities.registry import attach_activities
from levers9.cli.output import console, errors
from levers9.cli.runtime import settings_from_env
from levers9.config import ControlplaneSettings
from levers9.operations import failure_message
from levers9.providers.gke import (
    AttachInput,
    AttachResult,
    Step,
    attach_workflow_id,
    private_values_commands,
)
from levers9.temporal import connect
from workflows.attach import AttachClusterWorkflow

POLL_S = 0.3


class AttachFailed(Exception):
    pass


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        errors.print(
            "usage: python -m attach_main '<AttachInput JSON>' (levers9 gke attach runs it)"
        )
        return 2
    try:
        request = AttachInput.model_validate_json(argv[0])
    except ValidationError as exc:
        errors.print(f"not an attach: {exc.errors()[0]['msg']} (run levers9 gke attach)")
        return 2
    settings = settings_from_env()
    console.print(
        f"attaching {request.cluster.cluster_path} (node pool {request.node_pool})"
        f" as pool {request.pool_name}",
        highlight=False,
    )
    try:
        result = asyncio.run(attach(settings, request))
    except AttachFailed as exc:
        errors.print(f"attach failed: {exc}", highlight=False)
        errors.print("fix that and rerun: every step is idempotent", highlight=False)
        return 1
    print_result(request, result)
    return 0


async def attach(settings: ControlplaneSettings, request: AttachInput) -> AttachResult:
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
            printed = await print_steps(client, handle.id, handle.result_run_id, printed)
            if done:
                break
            await asyncio.sleep(POLL_S)
        try:
            return result_task.result()
        except WorkflowFailureError as exc:
            raise AttachFailed(failure_message(exc)) from None


async def print_steps(client: Client, workflow_id: str, run_id: str | None, printed: int) -> int:
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    try:
        steps: list[Step] = await handle.query(AttachClusterWorkflow.steps)
    except Exception:
        return printed
    for step in steps[printed:]:
        console.print(f"  {step.line()}", highlight=False, soft_wrap=True)
    return max(printed, len(steps))


def print_result(request: AttachInput, result: AttachResult) -> None:
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
