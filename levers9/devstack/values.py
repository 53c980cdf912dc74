"""The dev values: the spec's pool block, named `gke-rtx6000`, pointing at the sandbox.

`levers9 dev up` writes `values.yaml` (the block as a user pastes it, with the sandbox's endpoint
and CA) and `private.json` (the service-account key the sandbox trusts, mode 0600, as the spec's
`umask 077` recipe makes it) each time it starts the sandbox.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from levers9.config import PoolConfig, as_values, pool_values
from levers9.core.capacity import ACCELERATOR_LABEL
from levers9.files import write_private
from levers9.providers.gke import accelerator

POOL_NAME = "gke-rtx6000"
GPU_TYPE = "RTXPro6000"
PROJECT = "demo"
REGION = "us-central1"
RUNTIMES = ("runc", "runsc")
"""What the dev pool offers: runc, and gVisor (deploy/dev/install-tools.sh installs runsc)."""


def pool(
    ca_base64: str,
    endpoint: str,
    *,
    tunnel: bool = False,
    simulated_gpus: bool | None = None,
    task_image: str | None = None,
    runtimes: tuple[str, ...] | None = None,
) -> PoolConfig:
    """The spec's pool, as the one builder makes it (`levers9.config.pool_values`), pointing at
    the sandbox."""
    label, _ = accelerator(GPU_TYPE)
    return pool_values(
        gpu_type=GPU_TYPE,
        flavor="gke",
        endpoint=endpoint,
        ca_certificate=ca_base64,
        node_selector={ACCELERATOR_LABEL: label},
        worker_image=f"{REGION}-docker.pkg.dev/{PROJECT}/levers9/worker:latest",
        tunnel=tunnel,
        simulated_gpus=simulated_gpus,
        task_image=task_image,
        node_paths=True,
        runtimes=runtimes,
    )


def pool_block(ca_base64: str, endpoint: str, *, tunnel: bool = False) -> dict[str, Any]:
    """The spec's values block, with the sandbox's endpoint and CA filled in; with `tunnel`,
    the spec's tunnel variant (`tunnel: true`, `hostNetwork: false`)."""
    return as_values(pool(ca_base64, endpoint, tunnel=tunnel))


def private_block(key_json: str) -> dict[str, Any]:
    """The private values file of the spec's recipe: only the key, under the pool."""
    return {"config": {"worker": {"pools": {POOL_NAME: {"kubernetes": {"credentials": key_json}}}}}}


def write(
    directory: Path,
    *,
    ca_base64: str,
    endpoint: str,
    key_json: str,
    tunnel: bool = False,
    task_image: str | None = None,
) -> list[Path]:
    """Writes the two values files for the sandbox at `endpoint` with its CA and key. Beyond the
    spec's block: `simulatedGpus: true` (the sandbox's cards are simulated, so the GPU check
    expects its container to see none), `runtimes: [runc, runsc]` (`levers9 run --runtime runsc`
    runs a task in gVisor) and, with `task_image`, `taskDefaults: {image: ...}` (where a task
    that names no image runs)."""
    values = directory / "values.yaml"
    block = pool(
        ca_base64,
        endpoint,
        tunnel=tunnel,
        simulated_gpus=True,
        task_image=task_image or None,
        runtimes=RUNTIMES,
    )
    pools = {POOL_NAME: as_values(block)}
    values.write_text(yaml.safe_dump({"config": {"worker": {"pools": pools}}}, sort_keys=False))
    private = directory / "private.json"
    write_private(private, json.dumps(private_block(key_json)))
    return [values, private]
