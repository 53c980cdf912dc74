"""The Kubernetes activities against the sandbox's real HTTPS API with the pool's GKE key:
creating a worker Job twice makes one Job and one token Secret owned by it (409 is done);
deleting twice is fine (404 is done); the observation lists in a constant number of calls;
errors are typed by HTTP meaning: 401/403/404/422 permanent with the fix, 429/5xx retried; a
call the cluster drops times out. The pool's PodDisruptionBudget comes with its first Job, a
drained worker's pod is labelled out of it, and the pool's removal deletes it.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import kube_clients
from activities.kube import KubeActivities, KubeObserver, kube_error
from activities.pools import PoolActivities
from activities.reconcile import ReconcileActivities
from levers9.core.capacity import WORKER_ID_LABEL
from levers9.core.manifests import DRAINED_LABEL, disruption_budget_name
from levers9.models import WorkerJobInput
from levers9.tokens import token_matches
from tests.controlplane import POOL, TOKEN_SECRET, Controlplane, controlplane
from tests.factories import add_gpu_node
from tests.waiting import eventually

pytestmark = pytest.mark.integration

NODE_2X = "gke-demo-gpu-2x-8e4b2c6d-q3n8"
JOB = WorkerJobInput(
    pool_name=POOL, worker_id="abcd1234", node_name=NODE_2X, gpus=2, external_ip="127.0.20.2"
)


@pytest.fixture(scope="module")
async def cp(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Controlplane]:
    directory: Path = tmp_path_factory.mktemp("kube")
    async with controlplane(directory, "127.0.0.1:1", "unused") as plane:
        yield plane


def _secret(cp: Controlplane, name: str) -> dict[str, Any]:
    raw: Any = k8s.CoreV1Api(cp.admin_api()).read_namespaced_secret(
        name, "levers9", _preload_content=False
    )
    secret: dict[str, Any] = json.loads(raw.data)
    return secret


async def test_create_twice_is_one_job_and_one_owned_secret(cp: Controlplane) -> None:
    activities = KubeActivities(cp.clients, cp.settings)
    env = ActivityEnvironment()
    assert await env.run(activities.create_worker_job, JOB) == "worker-gke-rtx6000-abcd1234"
    assert await env.run(activities.create_worker_job, JOB) == "worker-gke-rtx6000-abcd1234"
    jobs = await cp.worker_jobs()
    assert [j["metadata"]["name"] for j in jobs] == ["worker-gke-rtx6000-abcd1234"]
    env_vars = {e["name"]: e for e in jobs[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env_vars["LEVERS9_ADVERTISED_HOST"]["value"] == "127.0.20.2"
    secret = await asyncio.to_thread(_secret, cp, "worker-gke-rtx6000-abcd1234-token")
    [owner] = secret["metadata"]["ownerReferences"]
    assert owner["uid"] == jobs[0]["metadata"]["uid"]
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert token_matches(TOKEN_SECRET, "abcd1234", token)
    assert TOKEN_SECRET not in json.dumps(jobs)


async def test_delete_twice(cp: Controlplane) -> None:
    activities = KubeActivities(cp.clients, cp.settings)
    env = ActivityEnvironment()
    await env.run(activities.create_worker_job, JOB)
    assert await env.run(activities.delete_worker_job, JOB) is True
    assert await env.run(activities.delete_worker_job, JOB) is False
    assert await cp.worker_jobs() == []


async def test_a_job_failed_by_its_node_leaving_says_the_node_is_gone(cp: Controlplane) -> None:
    """Pod GC fails the pods of a deleted node and the Job (backoffLimit 0) fails with them:
    `describe_worker_pod` tells that apart from the worker failing on its own."""
    node = "gke-demo-gpu-leaving-1"
    await add_gpu_node(cp.sandbox.cluster, node, 1, "127.0.12.1", "127.0.22.1")
    activities = KubeActivities(cp.clients, cp.settings)
    env = ActivityEnvironment()
    job = JOB.model_copy(update={"worker_id": "1eaf1eaf", "node_name": node, "gpus": 1})
    await env.run(activities.create_worker_job, job)

    async def scheduled() -> bool:
        return (await env.run(activities.describe_worker_pod, job)).exists

    await eventually(scheduled, within=20)
    healthy = await env.run(activities.describe_worker_pod, job)
    assert (healthy.node_gone, healthy.job_failed) == (False, False)
    await cp.sandbox.cluster.remove_node(node)

    async def failed() -> bool:
        return (await env.run(activities.describe_worker_pod, job)).job_failed

    await eventually(failed, within=20)
    assert (await env.run(activities.describe_worker_pod, job)).node_gone
    await env.run(activities.delete_worker_job, job)


async def test_observation_is_a_constant_number_of_lists(cp: Controlplane) -> None:
    counter = cp.sandbox.sandbox.parts.counter
    counter.reset()
    nodes, calls = await asyncio.to_thread(KubeObserver(cp.clients).observe, POOL)
    assert calls == 3
    lists = [c for c in counter.describe()["counts"] if c["verb"] == "list"]
    assert sum(c["count"] for c in lists) == 3
    assert sorted(nodes) == [
        "gke-demo-gpu-1x-5d3a1f2b-x7k9",
        "gke-demo-gpu-2x-8e4b2c6d-q3n8",
        "gke-demo-gpu-4x-2f7c9e1a-m5p2",
    ]


@pytest.mark.parametrize(
    ("status", "permanent", "fix"),
    [
        (401, True, "rerun deploy/gke/attach-gke-pool.sh and deploy its key"),
        (403, True, "rerun deploy/gke/attach-gke-pool.sh"),
        (404, True, None),
        (422, True, None),
        (409, False, None),
        (429, False, None),
        (500, False, None),
        (503, False, None),
    ],
)
def test_errors_typed_by_http_meaning(status: int, permanent: bool, fix: str | None) -> None:
    exc = k8s.ApiException(status=status, reason="Reason")
    exc.body = json.dumps({"kind": "Status", "message": f"message {status}"})
    mapped = kube_error(exc, "doing", POOL)
    if not permanent:
        assert mapped is exc, "retried by Temporal with backoff"
        return
    assert isinstance(mapped, ApplicationError)
    assert mapped.non_retryable
    assert mapped.message.startswith(f"doing: {status} Reason: message {status}")
    if fix:
        assert fix in mapped.message


async def test_server_errors_are_retried_then_succeed(cp: Controlplane) -> None:
    faults = cp.sandbox.sandbox.parts.faults
    faults.add({"verb": "create", "resource": "jobs", "status": 500, "times": 1})
    activities = KubeActivities(cp.clients, cp.settings)
    env = ActivityEnvironment()
    job = JOB.model_copy(update={"worker_id": "fault500"})
    with pytest.raises(k8s.ApiException) as caught:
        await env.run(activities.create_worker_job, job)
    assert caught.value.status == 500
    assert await env.run(activities.create_worker_job, job) == "worker-gke-rtx6000-fault500"
    await env.run(activities.delete_worker_job, job)


async def test_a_call_the_cluster_drops_times_out_and_the_pass_says_so(
    cp: Controlplane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GKE drops the packets of an address off its authorized networks (the sandbox's
    `timeout` denial holds the request for five minutes, then drops it): every Kubernetes call
    has a client-side timeout, so the pass fails in seconds, retryable, saying why."""
    monkeypatch.setattr(kube_clients, "REQUEST_TIMEOUT_S", (1.0, 1.0))
    policy = cp.sandbox.sandbox.policy
    policy.update({"networkDenial": "timeout", "timeoutHoldSeconds": 300, "egressIp": "127.0.0.9"})
    try:
        reconcile = ReconcileActivities(KubeObserver(cp.clients), None, cp.settings)  # type: ignore[arg-type]
        with pytest.raises(ApplicationError) as failed:
            # A call without the timeout would wait out the five minutes.
            await asyncio.wait_for(reconcile._observe(POOL), timeout=60)
    finally:
        policy.update({"networkDenial": "forbidden", "egressIp": "127.0.0.1"})
    assert failed.value.type == "KubernetesUnavailable"
    assert not failed.value.non_retryable
    assert failed.value.message.startswith("unable to reconcile cluster nodes: ")
    assert "Timeout" in failed.value.message or "MaxRetryError" in failed.value.message
    # And once the address is allowed again, the same observer answers.
    nodes, _ = await asyncio.to_thread(KubeObserver(cp.clients).observe, POOL)
    assert NODE_2X in nodes


def _budgets(cp: Controlplane) -> list[dict[str, Any]]:
    raw: Any = k8s.PolicyV1Api(cp.admin_api()).list_namespaced_pod_disruption_budget(
        "levers9", _preload_content=False
    )
    items: list[dict[str, Any]] = json.loads(raw.data)["items"]
    return items


def _worker_pods(cp: Controlplane, worker_id: str) -> list[dict[str, Any]]:
    raw: Any = k8s.CoreV1Api(cp.admin_api()).list_namespaced_pod(
        "levers9", label_selector=f"{WORKER_ID_LABEL}={worker_id}", _preload_content=False
    )
    items: list[dict[str, Any]] = json.loads(raw.data)["items"]
    return items


async def test_a_drained_workers_pod_is_labelled_out_of_the_pools_budget(
    cp: Controlplane,
) -> None:
    activities = KubeActivities(cp.clients, cp.settings)
    env = ActivityEnvironment()
    job = JOB.model_copy(update={"worker_id": "d0a1d0a1"})
    await env.run(activities.create_worker_job, job)

    async def scheduled() -> bool:
        return (await env.run(activities.describe_worker_pod, job)).exists

    await eventually(scheduled, within=20)
    [pod] = await asyncio.to_thread(_worker_pods, cp, job.worker_id)
    assert DRAINED_LABEL not in pod["metadata"]["labels"]
    assert await env.run(activities.mark_worker_drained, job) == 1
    [pod] = await asyncio.to_thread(_worker_pods, cp, job.worker_id)
    assert pod["metadata"]["labels"][DRAINED_LABEL] == "true"
    gone = JOB.model_copy(update={"worker_id": "0000aaaa"})
    assert await env.run(activities.mark_worker_drained, gone) == 0
    assert await env.run(activities.delete_worker_job, job) is True


async def test_the_pools_budget_comes_with_its_jobs_and_goes_with_the_pool(
    cp: Controlplane,
) -> None:
    activities = KubeActivities(cp.clients, cp.settings)
    env = ActivityEnvironment()
    for worker_id in ("b0d6e701", "b0d6e702"):
        await env.run(activities.create_worker_job, JOB.model_copy(update={"worker_id": worker_id}))
    [budget] = await asyncio.to_thread(_budgets, cp)
    assert budget["metadata"]["name"] == disruption_budget_name(POOL)
    assert budget["spec"]["maxUnavailable"] == 0
    # delete_pool_jobs never calls Temporal: the pool's cluster is all it reads.
    pools = PoolActivities(cast(Client, None), cp.clients, cp.settings)
    deleted = await env.run(pools.delete_pool_jobs, POOL)
    assert {"worker-gke-rtx6000-b0d6e701", "worker-gke-rtx6000-b0d6e702"} <= set(deleted)
    assert await asyncio.to_thread(_budgets, cp) == []
    assert await env.run(pools.delete_pool_jobs, POOL) == []  # the budget's 404 is done too
