"""Builders for test objects and clients, shared by the sandbox tests."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from google.auth import crypt, jwt
from kubernetes import client

from sandbox.registry import Registry
from sandbox.resources import NODES, PODS

HISTORY = 500  # watch events the test emulator keeps per resource: small, so tests outrun it

# The official client's API objects, typed loosely: its generated annotations reject the plain
# dict bodies (and `_preload_content=False` responses) it handles at runtime.
Api = Any


def api_client(url: str, ca_file: Path, token: str) -> client.ApiClient:
    """An official-client ApiClient for `url` with a bearer token, verifying the CA."""
    config = client.Configuration()
    config.host = url
    config.ssl_ca_cert = str(ca_file)
    config.api_key = {"authorization": f"Bearer {token}"}
    config.retries = False
    return client.ApiClient(config)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def pod_manifest(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
    }


def deployment_manifest(name: str, image: str = "i", **spec: Any) -> dict[str, Any]:
    """A Deployment of pods labelled `app: NAME`, one container `c` of `image`; `spec` (e.g.
    replicas) beside its selector and template."""
    return {
        "metadata": {"name": name},
        "spec": {
            **spec,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": image}]},
            },
        },
    }


def job_manifest(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox:1.36"}],
                }
            }
        },
    }


def seed_pod(
    registry: Registry,
    namespace: str,
    name: str,
    *,
    node: str | None = None,
    labels: dict[str, str] | None = None,
    phase: str | None = None,
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Creates a pod, binds it to `node` and sets its phase, as scheduler and kubelet would."""
    manifest = pod_manifest(name, labels)
    if owner is not None:
        manifest["metadata"]["ownerReferences"] = [owner]
    registry.create(PODS, manifest, namespace=namespace)
    if node:
        registry.bind(namespace, name, node)
    if phase:
        pod = registry.get(PODS, namespace, name)
        pod["status"]["phase"] = phase
        registry.replace(PODS, pod, subresource="status")
    return registry.get(PODS, namespace, name)


def seed_node(registry: Registry, name: str, labels: dict[str, str] | None = None) -> None:
    registry.create(
        NODES,
        {
            "metadata": {"name": name, "labels": labels or {}},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "capacity": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"},
                "allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"},
                # Every field a kubelet reports: the official client requires them all.
                "nodeInfo": {
                    "machineID": uuid.uuid4().hex,
                    "systemUUID": str(uuid.uuid4()),
                    "bootID": str(uuid.uuid4()),
                    "kernelVersion": "6.6.93+",
                    "osImage": "Container-Optimized OS from Google",
                    "containerRuntimeVersion": "containerd://1.7.28",
                    "kubeletVersion": "v1.32.4-gke.1415000",
                    "kubeProxyVersion": "v1.32.4-gke.1415000",
                    "operatingSystem": "linux",
                    "architecture": "amd64",
                },
            },
        },
    )


def jwt_assertion(key: dict[str, str], audience: str) -> str:
    """The signed JWT google-auth posts to a token endpoint for `key`."""
    now = int(time.time())
    claims = {
        "iss": key["client_email"],
        "aud": audience,
        "iat": now,
        "exp": now + 600,
        "scope": "https://www.googleapis.com/auth/cloud-platform",
    }
    signer = crypt.RSASigner.from_service_account_info(key)  # type: ignore[no-untyped-call]
    token: bytes = jwt.encode(signer, claims)  # type: ignore[no-untyped-call]
    return token.decode()


def status_of(error: client.ApiException) -> dict[str, Any]:
    """The Status body of a failed call."""
    body: dict[str, Any] = json.loads(error.body or "{}")
    return body
