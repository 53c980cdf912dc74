"""The worker Job and token Secret: valid against the real Kubernetes OpenAPI schemas (strict),
pinned by node affinity (never spec.nodeName), every free card as the GPU limit, privileged,
GKE's toleration only for flavor gke, host network per pool, the token only by reference. The
pool's PodDisruptionBudget: valid, selecting exactly its worker pods not labelled drained.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

import kubernetes_validate
import pytest

from levers9.core.manifests import (
    DRAINED_LABEL,
    WorkerJobSpec,
    disruption_budget_name,
    drained_patch,
    namespace,
    worker_disruption_budget,
    worker_job,
    worker_job_name,
    worker_token_secret,
)
from levers9.tokens import command_digest
from sandbox.selectors import LabelSelector
from tests.factories import MARKER, worker_job_spec, worker_tls

if TYPE_CHECKING:
    from levers9.agent.settings import WorkerSettings

DIGEST = command_digest("l9c1.test-command-token")

K8S_VERSION = "1.33.0"

SPEC = worker_job_spec()


def _pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = job["spec"]["template"]["spec"]
    return spec


@pytest.mark.parametrize(
    "manifest",
    [
        worker_job(SPEC),
        worker_job(dataclasses.replace(SPEC, gpu_taint=False, host_network=False, tunnel=True)),
        worker_token_secret(
            SPEC, "t0k3n", job_uid="5e0c5b6e-0000-4000-8000-000000000001", command_digest=DIGEST
        ),
        worker_token_secret(SPEC, "t0k3n", tls=worker_tls("a1b2c3d4"), command_digest=DIGEST),
        namespace("levers9"),
        worker_disruption_budget(SPEC.pool_name, SPEC.namespace),
    ],
    ids=["job-gke", "job-generic-tunnel", "secret", "secret-tls", "namespace", "budget"],
)
def test_valid_against_kubernetes_schema(manifest: dict[str, Any]) -> None:
    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_name_and_labels() -> None:
    job = worker_job(SPEC)
    assert job["metadata"]["name"] == worker_job_name("gke-rtx6000", "a1b2c3d4")
    assert job["metadata"]["name"] == "worker-gke-rtx6000-a1b2c3d4"
    labels = {
        "app.kubernetes.io/managed-by": "levers9",
        "levers9.dev/pool": "gke-rtx6000",
        "levers9.dev/worker-id": "a1b2c3d4",
        "levers9.dev/node": "gke-gpu-4x-1",
    }
    assert job["metadata"]["labels"] == labels
    assert job["spec"]["template"]["metadata"]["labels"] == labels
    assert job["spec"]["backoffLimit"] == 0


def test_pinned_by_affinity_not_node_name() -> None:
    pod = _pod_spec(worker_job(SPEC))
    assert "nodeName" not in pod
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["gke-gpu-4x-1"]}
            ]
        }
    ]


def test_every_free_card_privileged_and_paths() -> None:
    pod = _pod_spec(worker_job(SPEC))
    [container] = pod["containers"]
    # Burstable, never BestEffort: CPU and memory requested (not limited), every card a limit.
    assert container["resources"] == {
        "limits": {"nvidia.com/gpu": "2"},
        "requests": {"nvidia.com/gpu": "2", "cpu": "500m", "memory": str(1 << 30)},
    }
    assert container["securityContext"] == {"privileged": True}
    assert container["command"] == ["levers9-worker"]
    paths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert paths["images"] == "/var/lib/levers9/images"
    assert paths["durable-disks"] == "/var/lib/levers9/disks"
    assert paths["device-plugins"] == "/var/lib/kubelet/device-plugins"


def test_flavor_and_network() -> None:
    gke = _pod_spec(worker_job(SPEC))
    # Every effect of the GPU taint, as capacity counts the node: NoSchedule and NoExecute.
    assert gke["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert gke["hostNetwork"] is True
    generic = _pod_spec(
        worker_job(dataclasses.replace(SPEC, gpu_taint=False, host_network=False, tunnel=True))
    )
    assert "tolerations" not in generic
    assert generic["hostNetwork"] is False


def test_env_downward_api_and_no_credential_in_the_environment() -> None:
    [container] = _pod_spec(worker_job(SPEC))["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["LEVERS9_POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env["LEVERS9_HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
    assert env["LEVERS9_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["LEVERS9_GATEWAY_ADDRESS"]["value"] == "203.0.113.10:7443"
    assert env["LEVERS9_CREDENTIALS_DIR"]["value"] == "/var/run/levers9/worker"
    assert not [e for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})]
    assert not {"LEVERS9_WORKER_TOKEN", "LEVERS9_WORKER_TLS_KEY"} & set(env)


def test_credentials_are_files_of_mode_0400_tls_unless_tunnelled() -> None:
    secret = "worker-gke-rtx6000-a1b2c3d4-token"
    for tunnel, keys in (
        (False, ["token", "command-token.sha256", "tls.crt", "tls.key"]),
        (True, ["token", "command-token.sha256"]),
    ):
        pod = _pod_spec(worker_job(dataclasses.replace(SPEC, tunnel=tunnel)))
        [volume] = [v for v in pod["volumes"] if v["name"] == "credentials"]
        assert volume["secret"]["secretName"] == secret
        assert volume["secret"]["defaultMode"] == 0o400
        assert [i["key"] for i in volume["secret"]["items"]] == keys
        [container] = pod["containers"]
        [mount] = [m for m in container["volumeMounts"] if m["name"] == "credentials"]
        assert mount == {
            "name": "credentials",
            "mountPath": "/var/run/levers9/worker",
            "readOnly": True,
        }


def test_token_only_in_the_secret() -> None:
    assert MARKER not in json.dumps(worker_job(SPEC))
    secret = worker_token_secret(SPEC, MARKER, job_uid="uid-1", command_digest=DIGEST)
    # The digest of the token that commands the worker, never that token.
    assert secret["stringData"] == {"token": MARKER, "command-token.sha256": DIGEST}
    cert, key = worker_tls("a1b2c3d4")
    with_tls = worker_token_secret(SPEC, MARKER, tls=(cert, key), command_digest=DIGEST)
    assert with_tls["stringData"] == {
        "token": MARKER,
        "command-token.sha256": DIGEST,
        "tls.crt": cert,
        "tls.key": key,
    }
    assert key not in json.dumps(worker_job(SPEC))
    [owner] = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Job",
        "worker-gke-rtx6000-a1b2c3d4",
        "uid-1",
    )


def test_the_pools_task_defaults_reach_the_worker_through_its_environment() -> None:
    from levers9.agent.runtime import TaskDefaults
    from levers9.agent.settings import WorkerSettings

    spec = dataclasses.replace(
        SPEC,
        default_image="us-docker.pkg.dev/p/r/torch:2.5",
        default_memory_bytes=8 * 2**30,
        default_cpu_millis=4000,
        image_cache_bytes=50 * 2**30,
    )
    [container] = _pod_spec(worker_job(spec))["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env.pop("LEVERS9_CREDENTIALS_DIR")  # the token's files are the Secret's, not here
    env["LEVERS9_WORKER_TOKEN"] = "l9w1.t"
    settings = WorkerSettings.from_env(env)
    assert settings.task_defaults() == TaskDefaults(
        "us-docker.pkg.dev/p/r/torch:2.5", 8 * 2**30, 4000, SPEC.image
    )
    assert settings.image_cache_bytes == 50 * 2**30, "the pool's imageCacheSize"
    [plain] = _pod_spec(worker_job(SPEC))["containers"]
    assert not [e for e in plain["env"] if e["name"].startswith("LEVERS9_DEFAULT_")]


def _settings(spec: WorkerJobSpec, **extra: str) -> WorkerSettings:
    from levers9.agent.settings import WorkerSettings

    [container] = _pod_spec(worker_job(spec))["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env.pop("LEVERS9_CREDENTIALS_DIR")  # the token's files are the Secret's, not here
    env.update(LEVERS9_WORKER_TOKEN="l9w1.t", **extra)
    return WorkerSettings.from_env(env)


def test_a_task_that_names_no_image_runs_in_the_workers_own_image() -> None:
    """A pool without taskDefaults.image: the Job's image (never no image: no process task)."""
    assert _settings(SPEC).task_defaults().image == SPEC.image


def test_only_the_tests_knob_leaves_a_task_without_an_image() -> None:
    """LEVERS9_PROCESS_TASKS, which no Job sets (the sandbox kubelet adds it on request)."""
    [container] = _pod_spec(worker_job(SPEC))["containers"]
    assert "LEVERS9_PROCESS_TASKS" not in {e["name"] for e in container["env"]}
    assert _settings(SPEC, LEVERS9_PROCESS_TASKS="true").task_defaults().image == ""


@pytest.mark.parametrize(
    ("values", "expected", "offered"),
    [
        ({}, "runc", ("runc",)),
        ({"runtime": "runsc"}, "runsc", ("runsc",)),
        ({"runtimes": ["runsc", "runc"]}, "runc", ("runc", "runsc")),
    ],
)
def test_the_pools_runtime_reaches_the_worker_through_its_environment(
    values: dict[str, Any], expected: str, offered: tuple[str, ...]
) -> None:
    from activities.kube import worker_spec
    from levers9.agent.settings import WorkerSettings
    from levers9.config import parse_pool, parse_settings
    from levers9.models import WorkerJobInput
    from tests.factories import key_json, spec_pool

    pool = parse_pool("gke-rtx6000", {**spec_pool(credentials=key_json()), **values})
    job_input = WorkerJobInput(pool_name="gke-rtx6000", worker_id="a1b2c3d4", gpus=1)
    [container] = _pod_spec(worker_job(worker_spec(job_input, pool, parse_settings({}))))[
        "containers"
    ]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env["LEVERS9_RUNTIME"] == expected
    assert ("LEVERS9_RUNTIMES" in env) == (len(offered) > 1), "only when it offers others"
    env.pop("LEVERS9_CREDENTIALS_DIR")  # the token's files are the Secret's, not here
    settings = WorkerSettings.from_env({**env, "LEVERS9_WORKER_TOKEN": "l9w1.t"})
    assert (settings.runtime, settings.offered_runtimes()) == (expected, offered)


def _budget_selects(labels: dict[str, str]) -> bool:
    budget = worker_disruption_budget(SPEC.pool_name, SPEC.namespace)
    return LabelSelector.from_object(budget["spec"]["selector"]).matches(labels)


def test_the_pools_budget_lets_none_of_its_running_workers_go() -> None:
    budget = worker_disruption_budget("gke-rtx6000", "levers9")
    assert budget["metadata"] == {
        "name": disruption_budget_name("gke-rtx6000"),
        "namespace": "levers9",
        "labels": {"app.kubernetes.io/managed-by": "levers9", "levers9.dev/pool": "gke-rtx6000"},
    }
    assert budget["metadata"]["name"] == "workers-gke-rtx6000"
    assert budget["spec"]["maxUnavailable"] == 0
    assert "minAvailable" not in budget["spec"]
    # A worker that never became Ready (its image pulling) does not hold a drain back.
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_the_budget_selects_the_pools_worker_pods_until_they_are_drained() -> None:
    pod_labels = worker_job(SPEC)["spec"]["template"]["metadata"]["labels"]
    assert _budget_selects(pod_labels)
    drained = pod_labels | drained_patch()["metadata"]["labels"]
    assert drained[DRAINED_LABEL] == "true"
    assert not _budget_selects(drained)
    assert _budget_selects(pod_labels | {DRAINED_LABEL: "false"})
    other_pool = worker_job(dataclasses.replace(SPEC, pool_name="other"))
    assert not _budget_selects(other_pool["spec"]["template"]["metadata"]["labels"])
    # Not the pool's other pods (a joined cluster's agent carries its labels, no worker id).
    assert not _budget_selects({k: v for k, v in pod_labels.items() if "worker-id" not in k})
