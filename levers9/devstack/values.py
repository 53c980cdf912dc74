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

from levers9.files import write_private

POOL_NAME = "gke-rtx6000"
PROJECT = "demo"
REGION = "us-central1"


def pool_block(ca_base64: str, endpoint: str, *, tunnel: bool = False) -> dict[str, Any]:
    """The spec's values block, with the sandbox's endpoint and CA filled in; with `tunnel`,
    the spec's tunnel variant (`tunnel: true`, `hostNetwork: false`)."""
    block: dict[str, Any] = {
        "mode": "external",
        "provider": "kubernetes",
        "gpuType": "RTXPro6000",
        "imagesPath": "/var/lib/levers9/images",
        "durableDisksPath": "/var/lib/levers9/disks",
        "cache": {"enabled": False},
        "kubernetes": {
            "flavor": "gke",
            "endpoint": endpoint,
            "caCertificate": ca_base64,
            "namespace": "levers9",
            "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000"},
            "workerImage": f"{REGION}-docker.pkg.dev/{PROJECT}/levers9/worker:latest",
        },
    }
    if tunnel:
        block["hostNetwork"] = False
        block["kubernetes"]["tunnel"] = True
    return block


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
    expects its container to see none) and, with `task_image`, `taskDefaults: {image: ...}`
    (where a task that names no image runs)."""
    values = directory / "values.yaml"
    block = pool_block(ca_base64, endpoint, tunnel=tunnel)
    block["simulatedGpus"] = True
    if task_image:
        block["taskDefaults"] = {"image": task_image}
    pools = {POOL_NAME: block}
    values.write_text(yaml.safe_dump({"config": {"worker": {"pools": pools}}}, sort_keys=False))
    private = directory / "private.json"
    write_private(private, json.dumps(private_block(key_json)))
    return [values, private]
