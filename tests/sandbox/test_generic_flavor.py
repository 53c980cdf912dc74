"""flavor generic (any Kubernetes): credentials are a bearer token or a kubeconfig, as YAML or
as JSON on one line; each reaches the sandbox's API with the identity it names."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from activities.kube_clients import build_api_client
from levers9.config import ConfigError, parse_pool
from levers9.devstack import values as devvalues
from sandbox.kubeconfig import kubeconfig
from sandbox.server import Sandbox


def _pool(sandbox: Sandbox, credentials: str) -> object:
    block = devvalues.pool_block(base64.b64encode(sandbox.ca.ca_pem).decode(), sandbox.url)
    block["kubernetes"]["flavor"] = "generic"
    block["kubernetes"]["credentials"] = credentials
    return parse_pool("generic", block)


def _doc(sandbox: Sandbox) -> dict[str, object]:
    return kubeconfig(server=sandbox.url, ca_pem=sandbox.ca.ca_pem, token=sandbox.admin_token)


@pytest.mark.parametrize("form", ["token", "kubeconfig-yaml", "kubeconfig-json-one-line"])
def test_each_form_of_credentials_reaches_the_api(
    sandbox: Sandbox, form: str, tmp_path: Path
) -> None:
    credentials = {
        "token": sandbox.admin_token,
        "kubeconfig-yaml": yaml.safe_dump(_doc(sandbox)),
        "kubeconfig-json-one-line": json.dumps(_doc(sandbox)),
    }[form]
    assert form != "kubeconfig-json-one-line" or "\n" not in credentials
    pool = _pool(sandbox, credentials)
    api = build_api_client(pool, tmp_path)  # type: ignore[arg-type]
    try:
        names = k8s.CoreV1Api(api).list_namespace(_request_timeout=10)
    finally:
        api.close()  # type: ignore[no-untyped-call]
    assert "kube-system" in {n.metadata.name for n in names.items if n.metadata}


def test_a_document_that_is_not_a_kubeconfig_is_refused_naming_the_field(
    sandbox: Sandbox,
) -> None:
    with pytest.raises(ConfigError) as refused:
        _pool(sandbox, json.dumps({"apiVersion": "v1", "kind": "Secret"}))
    assert "bearer token (one line) or a kubeconfig (kind: Config)" in str(refused.value)
    assert str(refused.value).startswith(
        "config.worker.pools.generic.kubernetes: for flavor generic"
    )
