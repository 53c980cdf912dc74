"""The one typed builder of a pool's values block (`levers9.config.pool_values`): it writes only
what its caller gives, with the schema's names; `gke attach`'s block and the dev values are the
ones written by hand before it (the same maps, the same YAML for attach without the tunnel), and
each block loads with the project's loader once the private values file completes it. The
joined pool's block is pinned in test_clusters.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from levers9.config import as_values, parse_pool, pool_values
from levers9.devstack import values as devvalues
from levers9.providers.gke import ClusterInfo, ClusterRef, values_block
from sandbox.pki import mint_certificate_authority, mint_service_account_key

CA = base64.b64encode(mint_certificate_authority().ca_pem).decode()
KEY = json.dumps(
    mint_service_account_key(
        project="demo", account="levers9-controlplane", token_uri="https://127.0.0.1:1/token"
    )
)
REF = ClusterRef(project="demo", location="us-central1-a", cluster="demo")
INFO = ClusterInfo(endpoint="34.1.2.3", ca_certificate=CA, network="default")
WORKER_IMAGE = "us-central1-docker.pkg.dev/demo/levers9/worker:latest"


def _attach_block_by_hand(tunnel: bool) -> dict[str, Any]:
    """What `levers9.providers.gke.values_block` wrote as a dict before the builder."""
    block: dict[str, Any] = {
        "mode": "external",
        "provider": "kubernetes",
        "gpuType": "RTXPro6000",
        "imagesPath": "/var/lib/levers9/images",
        "durableDisksPath": "/var/lib/levers9/disks",
        "cache": {"enabled": False},
        "kubernetes": {
            "flavor": "gke",
            "endpoint": "https://34.1.2.3",
            "caCertificate": CA,
            "namespace": "levers9",
            "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000"},
            "workerImage": WORKER_IMAGE,
        },
    }
    if tunnel:
        block["hostNetwork"] = False
        block["kubernetes"]["tunnel"] = True
    return block


@pytest.mark.parametrize("tunnel", [False, True])
def test_the_attach_block_is_the_one_written_by_hand(tunnel: bool) -> None:
    block = values_block(REF, INFO, "RTXPro6000", tunnel=tunnel)
    assert block == _attach_block_by_hand(tunnel)
    complete = {**block, "kubernetes": {**block["kubernetes"], "credentials": KEY}}
    pool = parse_pool("gke-rtx6000", complete)
    assert (pool.kubernetes.tunnel, pool.host_network) == (tunnel, not tunnel)


def test_attach_prints_the_same_yaml() -> None:
    """As attach_main prints it (`sort_keys=False`): line for line what it printed before."""
    printed = yaml.safe_dump(
        {"gke-rtx6000": values_block(REF, INFO, "RTXPro6000")}, sort_keys=False
    )
    assert printed == (
        "gke-rtx6000:\n"
        "  mode: external\n"
        "  provider: kubernetes\n"
        "  gpuType: RTXPro6000\n"
        "  imagesPath: /var/lib/levers9/images\n"
        "  durableDisksPath: /var/lib/levers9/disks\n"
        "  cache:\n"
        "    enabled: false\n"
        "  kubernetes:\n"
        "    flavor: gke\n"
        "    endpoint: https://34.1.2.3\n"
        f"    caCertificate: {CA}\n"
        "    namespace: levers9\n"
        "    nodeSelector:\n"
        "      cloud.google.com/gke-accelerator: nvidia-rtx-pro-6000\n"
        f"    workerImage: {WORKER_IMAGE}\n"
    )


def test_the_builder_writes_only_what_it_is_given() -> None:
    pool = pool_values(
        gpu_type="L4",
        flavor="generic",
        endpoint="https://10.0.0.1:6443",
        worker_image="registry.example/levers9/worker:1",
        node_selector={},
    )
    assert as_values(pool) == {
        "mode": "external",
        "provider": "kubernetes",
        "gpuType": "L4",
        "kubernetes": {
            "flavor": "generic",
            "endpoint": "https://10.0.0.1:6443",
            "namespace": "levers9",
            "nodeSelector": {},
            "workerImage": "registry.example/levers9/worker:1",
        },
    }
    # What it leaves unwritten is the schema's default once loaded.
    loaded = parse_pool("generic", as_values(pool))
    assert loaded.host_network is True
    assert loaded.images_path == "/var/lib/levers9/images"


def test_the_builders_extras_are_written_in_the_schemas_names() -> None:
    pool = pool_values(
        gpu_type="RTXPro6000",
        flavor="gke",
        endpoint="https://34.1.2.3",
        ca_certificate=CA,
        worker_image=WORKER_IMAGE,
        node_selector={"cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000"},
        namespace="gpus",
        simulated_gpus=True,
        task_image="registry.example/tasks/python:3.12",
    )
    block = as_values(pool)
    assert block["simulatedGpus"] is True
    assert block["taskDefaults"] == {"image": "registry.example/tasks/python:3.12"}
    assert block["kubernetes"]["namespace"] == "gpus"
    block["kubernetes"]["credentials"] = KEY
    loaded = parse_pool("gke-rtx6000", block)
    assert loaded.task_defaults.image == "registry.example/tasks/python:3.12"
    assert loaded.simulated_gpus is True


@pytest.mark.parametrize("tunnel", [False, True])
def test_the_dev_block_is_attachs_block_for_the_sandbox(tunnel: bool) -> None:
    """`levers9 dev up`'s pool is what attach prints for a cluster of project `demo` in
    us-central1, at the sandbox's endpoint: the block written by hand before the builder."""
    block = devvalues.pool_block(CA, "https://34.1.2.3", tunnel=tunnel)
    assert block == _attach_block_by_hand(tunnel)


@pytest.mark.parametrize("task_image", [None, "", "registry.example/tasks/python:3.12"])
def test_the_dev_values_file_holds_the_same_map(tmp_path: Path, task_image: str | None) -> None:
    [values, _] = devvalues.write(
        tmp_path,
        ca_base64=CA,
        endpoint="https://34.1.2.3",
        key_json=KEY,
        tunnel=True,
        task_image=task_image,
    )
    expected = {
        **_attach_block_by_hand(tunnel=True),
        "simulatedGpus": True,
        "runtimes": ["runc", "runsc"],
    }
    if task_image:
        expected["taskDefaults"] = {"image": task_image}
    assert yaml.safe_load(values.read_text()) == {
        "config": {"worker": {"pools": {devvalues.POOL_NAME: expected}}}
    }
