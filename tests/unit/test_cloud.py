"""The cloud side's pure parts: CIDRs, the append-only merge, cluster references, the values
block attach prints (parsed by the project's own loader) and the private-values recipe it prints
(run as printed, then loaded with the block)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from levers9.config import load, parse_pool
from levers9.devstack import values as devvalues
from levers9.providers.gke import (
    ClusterInfo,
    ClusterRef,
    appended,
    as_cidr,
    default_pool_name,
    private_values_commands,
    values_block,
)
from sandbox.pki import mint_certificate_authority, mint_service_account_key

CA = base64.b64encode(mint_certificate_authority().ca_pem).decode()
KEY = mint_service_account_key(
    project="demo", account="levers9-controlplane", token_uri="https://127.0.0.1:1/token"
)


def test_as_cidr_takes_ips_and_ipv4_networks_only() -> None:
    assert as_cidr("203.0.113.7") == "203.0.113.7/32"
    assert as_cidr("10.0.0.0/8") == "10.0.0.0/8"
    with pytest.raises(ValueError, match="'nope' is not an IPv4 address"):
        as_cidr("nope")
    with pytest.raises(ValueError, match="IPv4"):
        as_cidr("2001:db8::1")
    with pytest.raises(ValueError, match="host bits"):
        as_cidr("10.0.0.1/8")


def test_appended_keeps_every_existing_entry_and_adds_only_the_missing() -> None:
    existing = ["10.0.0.0/8", "198.51.100.1/32"]
    merged, added = appended(existing, ["198.51.100.1", "203.0.113.7", "203.0.113.7/32"])
    assert merged == ["10.0.0.0/8", "198.51.100.1/32", "203.0.113.7/32"]
    assert added == ["203.0.113.7/32"]
    assert appended(merged, ["203.0.113.7"]) == (merged, [])
    # Removing is never what a rotation does: an IP missing from the wanted list stays.
    assert appended(merged, ["192.0.2.9"])[0][:3] == merged


def test_cluster_ref_names_the_objects_and_refuses_bad_flags() -> None:
    ref = ClusterRef(project="demo-project", location="us-central1-a", cluster="gpu-east")
    assert ref.region == "us-central1"
    assert ref.firewall_name == "levers9-controlplane-to-gpu-east"
    assert ref.service_account_email == "levers9-controlplane@demo-project.iam.gserviceaccount.com"
    assert ref.worker_image == "us-central1-docker.pkg.dev/demo-project/levers9/worker:latest"
    with pytest.raises(ValueError, match="--zone 'central'"):
        ClusterRef(project="demo", location="central", cluster="c")
    with pytest.raises(ValueError, match="--cluster 'Bad_Name'"):
        ClusterRef(project="demo", location="us-central1-a", cluster="Bad_Name")


def test_values_block_parses_with_the_projects_loader() -> None:
    ref = ClusterRef(project="demo", location="us-central1-a", cluster="demo")
    info = ClusterInfo(endpoint="34.1.2.3", ca_certificate=CA, network="default")
    block = values_block(ref, info, "RTXPro6000")
    name = default_pool_name("RTXPro6000")
    assert name == "gke-rtx6000"
    # Without the key it is a complete block but for `credentials` (the private file's part).
    complete = {**block, "kubernetes": {**block["kubernetes"], "credentials": json.dumps(KEY)}}
    pool = parse_pool(name, complete)
    assert pool.kubernetes.endpoint == "https://34.1.2.3"
    assert pool.kubernetes.node_selector == {
        "cloud.google.com/gke-accelerator": "nvidia-rtx-pro-6000"
    }
    assert pool.kubernetes.worker_image == ref.worker_image
    with pytest.raises(ValueError, match="--gpu 'GTX1080' is not a known GPU type"):
        values_block(ref, info, "GTX1080")


def test_the_printed_private_values_recipe_runs_and_loads_with_the_block(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    (home / ".levers9").mkdir(parents=True)
    key_file = home / ".levers9" / "gke-sa.json"
    key_file.write_text(json.dumps(KEY))
    ref = ClusterRef(project="demo", location="us-central1-a", cluster="demo")
    info = ClusterInfo(endpoint="127.0.0.1:6443", ca_certificate=CA, network="default")
    values = tmp_path / "values.yaml"
    pools = {"gke-rtx6000": values_block(ref, info, "RTXPro6000")}
    values.write_text(yaml.safe_dump({"config": {"worker": {"pools": pools}}}))
    commands = private_values_commands("gke-rtx6000", "~/.levers9/gke-sa.json")
    script = "\n".join(line for line in commands if not line.startswith("deploy/"))
    env = {**os.environ, "HOME": str(home)}
    subprocess.run(["bash", "-euc", script], env=env, check=True, timeout=30)
    private = home / ".levers9" / "gke-pool-values.json"
    assert private.stat().st_mode & 0o777 == 0o600  # umask 077
    loaded = load([values, private])
    assert not loaded.problems
    assert loaded.pools["gke-rtx6000"].kubernetes.endpoint == "https://127.0.0.1:6443"


def test_tunnel_values_block_and_dev_values_turn_the_tunnel_on(tmp_path: Path) -> None:
    ref = ClusterRef(project="demo", location="us-central1-a", cluster="demo")
    info = ClusterInfo(endpoint="34.1.2.3", ca_certificate=CA, network="default")
    block = values_block(ref, info, "RTXPro6000", tunnel=True)
    block["kubernetes"]["credentials"] = json.dumps(KEY)
    pool = parse_pool("gke-rtx6000", block)
    assert pool.kubernetes.tunnel is True
    assert pool.host_network is False
    files = devvalues.write(
        tmp_path,
        ca_base64=CA,
        endpoint="https://127.0.0.1:6443",
        key_json=json.dumps(KEY),
        tunnel=True,
    )
    loaded = load(files).pools[devvalues.POOL_NAME]
    assert (loaded.kubernetes.tunnel, loaded.host_network) == (True, False)
