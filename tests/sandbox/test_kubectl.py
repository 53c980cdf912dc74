"""The real kubectl, unmodified, against the emulator: get with selectors and output formats,
cordon/uncordon, drain (evictions), label, scale, delete --all, logs, create/apply of a
namespace, describe, server errors as kubectl prints them, and older/newer kubectl releases."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox.kubeconfig import write_kubeconfig
from sandbox.resources import DAEMON_SETS, DEPLOYMENTS, JOBS, NODES, PODS
from sandbox.server import Sandbox
from tests.sandbox.factories import (
    deployment_manifest,
    job_manifest,
    jwt_assertion,
    seed_node,
    seed_pod,
    unique,
)

Call = Callable[..., Any]
Kubectl = Callable[..., str]
VERSIONED = Path("/usr/lib/google-cloud-sdk/bin")


@pytest.fixture
def node(sandbox: Sandbox, sandbox_call: Call) -> str:
    name = unique("gpu")
    sandbox_call(seed_node, sandbox.registry, name, {"pool": "gke-rtx6000"})
    return name


def test_get_with_selectors_and_output_formats(
    kubectl: Kubectl, sandbox: Sandbox, sandbox_call: Call, namespace: str, node: str
) -> None:
    for name, app, phase in (
        ("a", "model", "Running"),
        ("b", "model", "Succeeded"),
        ("c", "other", "Running"),
    ):
        sandbox_call(
            seed_pod, sandbox.registry, namespace, name, node=node, labels={"app": app}, phase=phase
        )
    assert kubectl("-n", namespace, "get", "pods", "-l", "app=model", "-o", "name").split() == [
        "pod/a",
        "pod/b",
    ]
    selected = kubectl(
        "get",
        "pods",
        "-A",
        "--field-selector",
        f"spec.nodeName={node},status.phase=Running",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    )
    assert selected.split() == ["a", "c"]
    listed = json.loads(kubectl("-n", namespace, "get", "pods", "-o", "json"))
    assert listed["kind"] == "List"
    assert [p["metadata"]["name"] for p in listed["items"]] == ["a", "b", "c"]
    table = kubectl("-n", namespace, "get", "pods", "-o", "wide")
    assert table.splitlines()[0].split()[:5] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert node in table


def test_cordon_and_uncordon(kubectl: Kubectl, node: str) -> None:
    assert kubectl("cordon", node).strip() == f"node/{node} cordoned"
    assert "Ready,SchedulingDisabled" in kubectl("get", "node", node)
    assert kubectl("get", "node", node, "-o", "jsonpath={.spec.unschedulable}") == "true"
    assert kubectl("uncordon", node).strip() == f"node/{node} uncordoned"
    assert kubectl("get", "node", node, "-o", "jsonpath={.spec.unschedulable}") == ""


def test_drain_evicts_pods_but_leaves_daemonsets(
    kubectl: Kubectl, sandbox: Sandbox, sandbox_call: Call, namespace: str, node: str
) -> None:
    def seed() -> None:
        registry = sandbox.registry
        ds = registry.create(
            DAEMON_SETS,
            {
                "metadata": {"name": "device-plugin"},
                "spec": {
                    "selector": {"matchLabels": {"app": "dp"}},
                    "template": {
                        "metadata": {"labels": {"app": "dp"}},
                        "spec": {"containers": [{"name": "dp", "image": "dp"}]},
                    },
                },
            },
            namespace=namespace,
        )
        owner = {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "name": "device-plugin",
            "uid": ds["metadata"]["uid"],
            "controller": True,
        }
        seed_pod(registry, namespace, "dp", node=node, phase="Running", owner=owner)
        for name in ("model-0", "model-1"):
            seed_pod(registry, namespace, name, node=node, phase="Running")

    sandbox_call(seed)
    out = kubectl("drain", node, "--ignore-daemonsets", "--force", "--timeout=30s")
    assert f"node/{node} drained" in out
    left = kubectl("-n", namespace, "get", "pods", "-o", "name").split()
    assert left == ["pod/dp"]
    assert sandbox_call(sandbox.registry.get, NODES, None, node)["spec"]["unschedulable"]


def test_label_and_select_by_it(kubectl: Kubectl, node: str) -> None:
    assert kubectl("label", "node", node, "tier=gpu").strip() == f"node/{node} labeled"
    assert kubectl("get", "nodes", "-l", "tier=gpu", "-o", "name").split() == [f"node/{node}"]
    kubectl("label", "node", node, "tier=cpu", "--overwrite")
    assert kubectl("get", "node", node, "-o", "jsonpath={.metadata.labels.tier}") == "cpu"
    kubectl("label", "node", node, "tier-")
    assert kubectl("get", "nodes", "-l", "tier", "-o", "name").strip() == ""


def test_scale_deployment(
    kubectl: Kubectl, sandbox: Sandbox, sandbox_call: Call, namespace: str
) -> None:
    sandbox_call(
        sandbox.registry.create,
        DEPLOYMENTS,
        deployment_manifest("model", "vllm", replicas=2),
        namespace=namespace,
    )
    out = kubectl("-n", namespace, "scale", "deploy", "model", "--replicas=1")
    assert out.strip() == "deployment.apps/model scaled"
    deployment = sandbox_call(sandbox.registry.get, DEPLOYMENTS, namespace, "model")
    assert deployment["spec"]["replicas"] == 1


def test_delete_all_jobs_takes_their_pods(
    kubectl: Kubectl, sandbox: Sandbox, sandbox_call: Call, namespace: str
) -> None:
    def seed() -> None:
        for name in ("worker-a", "worker-b"):
            job = sandbox.registry.create(JOBS, job_manifest(name), namespace=namespace)
            seed_pod(
                sandbox.registry,
                namespace,
                f"{name}-pod",
                owner={
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                },
            )

    sandbox_call(seed)
    out = kubectl("-n", namespace, "delete", "jobs", "--all")
    assert out.splitlines() == ['job.batch "worker-a" deleted', 'job.batch "worker-b" deleted']
    assert sandbox_call(sandbox.registry.store.count, JOBS, namespace) == 0
    assert sandbox_call(sandbox.registry.store.count, PODS, namespace) == 0


def test_logs_show_what_the_kubelet_wrote(
    kubectl: Kubectl, sandbox: Sandbox, sandbox_call: Call, namespace: str, node: str
) -> None:
    sandbox_call(seed_pod, sandbox.registry, namespace, "worker", node=node, phase="Running")
    sandbox_call(
        sandbox.registry.logs.write,
        namespace,
        "worker",
        "main",
        "host driver libraries registered\nresolved NVIDIA_VISIBLE_DEVICES\n",
    )
    assert kubectl("-n", namespace, "logs", "worker").splitlines() == [
        "host driver libraries registered",
        "resolved NVIDIA_VISIBLE_DEVICES",
    ]
    assert kubectl("-n", namespace, "logs", "worker", "--tail=1").strip() == (
        "resolved NVIDIA_VISIBLE_DEVICES"
    )


def test_create_and_apply_namespace(kubectl: Kubectl, tmp_path: Path) -> None:
    created = unique("made")
    assert kubectl("create", "namespace", created).strip() == f"namespace/{created} created"
    error = kubectl("create", "namespace", created, ok=False)
    assert f'namespaces "{created}" already exists' in error
    applied = unique("applied")
    manifest = tmp_path / "ns.yaml"
    manifest.write_text(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {applied}\n")
    assert kubectl("apply", "-f", str(manifest)).strip() == f"namespace/{applied} created"
    assert kubectl("apply", "-f", str(manifest)).strip() == f"namespace/{applied} unchanged"
    manifest.write_text(manifest.read_text() + "  labels:\n    team: gpu\n")
    assert kubectl("apply", "-f", str(manifest)).strip() == f"namespace/{applied} configured"
    assert kubectl("get", "ns", "-l", "team=gpu", "-o", "name").split() == [f"namespace/{applied}"]


def test_describe(
    kubectl: Kubectl, sandbox: Sandbox, sandbox_call: Call, namespace: str, node: str
) -> None:
    sandbox_call(seed_pod, sandbox.registry, namespace, "p", node=node, phase="Running")
    assert "Non-terminated Pods:" in kubectl("describe", "node", node)
    described = kubectl("-n", namespace, "describe", "pod", "p")
    assert f"Node:             {node}" in described


def test_errors_as_kubectl_prints_them(
    kubectl: Kubectl, sandbox: Sandbox, sandbox_call: Call, namespace: str, tmp_path: Path
) -> None:
    missing = kubectl("-n", namespace, "get", "pod", "nope", ok=False)
    assert 'Error from server (NotFound): pods "nope" not found' in missing
    key = sandbox_call(
        sandbox.mint_service_account_key, project="demo", account=unique("norole"), roles=()
    )
    token = sandbox_call(
        sandbox.parts.authenticator.exchange,
        {
            "grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
            "assertion": jwt_assertion(key, sandbox.token_uri),
        },
    )["access_token"]
    config = write_kubeconfig(
        tmp_path / "sa", server=sandbox.url, ca_pem=sandbox.ca.ca_pem, token=token
    )
    forbidden = kubectl("--kubeconfig", str(config), "-n", namespace, "get", "pods", ok=False)
    assert "Error from server (Forbidden): pods is forbidden" in forbidden
    assert 'requires one of ["container.pods.list"] permission(s).' in forbidden


@pytest.mark.parametrize("minor", [27, 33])
def test_other_kubectl_releases(kubectl: Kubectl, node: str, minor: int, tmp_path: Path) -> None:
    binary = VERSIONED / f"kubectl.1.{minor}"
    if not binary.exists():
        pytest.skip(f"{binary} is not installed")
    assert node in kubectl("get", "nodes", binary=str(binary))
    kubectl("cordon", node, binary=str(binary))
    manifest = tmp_path / "ns.yaml"
    name = unique(f"v{minor}")
    manifest.write_text(f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n")
    assert kubectl("apply", "-f", str(manifest), binary=str(binary)).strip() == (
        f"namespace/{name} created"
    )
