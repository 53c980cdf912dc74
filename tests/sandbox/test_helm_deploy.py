"""`deploy/eks/deploy.sh` with the real helm against the sandbox's API: the release installs and
upgrades, the extra arguments reach helm, the key lands in a Secret (read back with the official
client) and nowhere else, the worker token secret survives an upgrade, and the script refuses a
world-readable key file and the retired LEVERS9_GKE_SA_JSON before touching the cluster."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from levers9.config import merge_values, parse_values
from levers9.devstack import values as devvalues
from sandbox.pki import mint_certificate_authority, mint_service_account_key
from sandbox.server import Sandbox
from tests.deploy.chart import ROOT, helm_binary, write_json

DEPLOY = ROOT / "deploy" / "eks" / "deploy.sh"
CA = base64.b64encode(mint_certificate_authority().ca_pem).decode()
KEY = json.dumps(
    mint_service_account_key(project="demo", account="levers9-controlplane", token_uri="https://x")
)
KEY_LINE = json.loads(KEY)["private_key"].splitlines()[1]
NAME = "levers9-controlplane"
Deploy = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def deploy(sandbox: Sandbox, namespace: str, tmp_path: Path) -> Deploy:
    """Runs deploy.sh as an operator would (values file with the pasted block, kubectl context
    on the sandbox); returns the completed process."""
    home = tmp_path / "home"
    home.mkdir()
    kubeconfig = sandbox.write_kubeconfig(home / "kubeconfig")
    values = yaml.safe_load((ROOT / "deploy" / "eks" / "values.yaml").read_text())
    values["config"]["worker"]["pools"] = {
        devvalues.POOL_NAME: devvalues.pool_block(CA, "https://34.1.2.3")
    }
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    env = {
        **os.environ,
        "HOME": str(home),
        "KUBECONFIG": str(kubeconfig),
        "HELM": helm_binary(),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "LEVERS9_NAMESPACE": namespace,
        "LEVERS9_VALUES": str(values_file),
    }
    env.pop("LEVERS9_GKE_SA_JSON", None)

    def run(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(DEPLOY), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, **extra_env},
        )

    return run


def _secret(core: client.CoreV1Api, name: str, namespace: str) -> dict[str, str]:
    data = core.read_namespaced_secret(name, namespace).data or {}
    return {key: base64.b64decode(value).decode() for key, value in data.items()}


def _private(tmp_path: Path) -> Path:
    # The spec's recipe: umask 077, the key under the pool.
    return write_json(tmp_path / "gke-pool-values.json", devvalues.private_block(KEY))


def test_deploy_installs_then_upgrades_with_the_key_in_a_secret(
    deploy: Deploy, core: client.CoreV1Api, apps: client.AppsV1Api, namespace: str, tmp_path: Path
) -> None:
    private = _private(tmp_path)
    first = deploy("-f", str(private), "--set", "replicaCount=2")
    assert first.returncode == 0, first.stderr
    assert "STATUS: deployed" in first.stdout
    assert f"helm upgrade --install levers9 into namespace {namespace}" in first.stderr

    assert apps.read_namespaced_deployment(NAME, namespace).spec.replicas == 2  # --set reached helm
    secret_values = _secret(core, f"{NAME}-private", namespace)["values.json"]
    config_map = core.read_namespaced_config_map(f"{NAME}-config", namespace)
    public_values = (config_map.data or {})["values.yaml"]
    # The pod merges the two files like `helm -f a -f b`: the block as pasted, with its key.
    merged = parse_values(merge_values(yaml.safe_load(public_values), json.loads(secret_values)))
    assert merged.problems == []
    assert merged.pools[devvalues.POOL_NAME].kubernetes.credentials is not None
    assert KEY_LINE in secret_values
    assert KEY_LINE not in public_values
    for obj in (
        apps.read_namespaced_deployment(NAME, namespace),
        core.read_namespaced_service(f"{NAME}-gateway", namespace),
        config_map,
    ):
        assert KEY_LINE not in str(obj.to_dict())
    token = _secret(core, f"{NAME}-worker-token", namespace)["secret"]

    second = deploy("-f", str(private), "--set", "replicaCount=1")
    assert second.returncode == 0, second.stderr
    assert "REVISION: 2" in second.stdout
    assert apps.read_namespaced_deployment(NAME, namespace).spec.replicas == 1
    # Kept across the upgrade (`lookup`): replacing it would void every worker's token.
    assert _secret(core, f"{NAME}-worker-token", namespace)["secret"] == token


def test_deploy_refuses_a_readable_key_file_and_the_old_variable(
    deploy: Deploy, core: client.CoreV1Api, namespace: str, tmp_path: Path
) -> None:
    private = _private(tmp_path)
    private.chmod(0o644)
    readable = deploy("-f", str(private))
    assert readable.returncode == 2
    assert f"{private} holds a secret and is readable by others (mode 644): chmod 600" in (
        readable.stderr
    )
    private.chmod(0o600)
    retired = deploy("-f", str(private), LEVERS9_GKE_SA_JSON="/home/me/key.json")
    assert retired.returncode == 2
    assert "deploy.sh no longer reads it" in retired.stderr
    assert "umask 077" in retired.stderr
    # Nothing reached the cluster: helm keeps its releases as Secrets in the namespace.
    assert core.list_namespaced_secret(namespace).items == []
