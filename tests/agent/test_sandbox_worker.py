"""End to end in the sandbox: the worker Job as `levers9.core.manifests` writes it, on the default
scenario's 2-GPU node, runs `levers9-worker` as the sandbox kubelet runs it (a local process
with the node's paths mapped), finds its cards `nvidia0`/`nvidia1` in the kubelet's
checkpoint, logs the spec's two start lines, registers with a gateway on 127.0.0.1 at the
node's external IP, serves TLS with the certificate its Secret carries (plaintext refused), and
runs a task on the cards it was given.

Its task runs as a process of the agent (the scenario's `images.processTasks`, the sandbox's knob
no pool value can express): the point is the agent as the kubelet runs it, its cards and its
gateway, not the container a task runs in (tests/agent/test_worker_image_tasks.py,
tests/integration/test_tasks_sandbox.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc import aio

from levers9.core.manifests import WorkerJobSpec, worker_job, worker_token_secret
from levers9.proto import worker_pb2, worker_pb2_grpc
from levers9.rpc.worker_tls import worker_channel
from levers9.tokens import command_digest
from sandbox.cluster import Cluster
from sandbox.registry import Registry
from sandbox.resources import JOBS, NAMESPACES, PODS, SECRETS
from tests.agent.kit import AUTH, COMMAND_AUTH, COMMAND_TOKEN, TOKEN
from tests.agent.recording_gateway import RecordingGateway
from tests.factories import WORKER_CA_SECRET, worker_job_spec, worker_tls
from tests.sandbox.cluster.kit import GPU_2X, fast_scenario

DIGEST = command_digest(COMMAND_TOKEN)

WORKER_IMAGE = "us-central1-docker.pkg.dev/demo/levers9/worker:latest"
EXTERNAL_IP = "127.0.20.2"  # the 2-GPU node's, in the default scenario
SPEC_LINES = (
    'host driver libraries registered with the loader dirs=["/usr/local/nvidia/lib64"]',
    "resolved NVIDIA_VISIBLE_DEVICES for GPU filtering resolved_visible_devices=0,1",
)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    scenario = fast_scenario()
    # The sandbox's knob (images.processTasks): the task below runs as a process of the agent.
    images = scenario.images.model_copy(update={"process_tasks": True})
    scenario = scenario.model_copy(update={"images": images})
    async with Cluster(Registry(), scenario, tmp_path / "sandbox") as started:
        yield started


def _worker_spec(gateway_address: str) -> WorkerJobSpec:
    return worker_job_spec(
        worker_id="w1",
        node_name=GPU_2X,
        image=WORKER_IMAGE,
        gateway_address=gateway_address,
        advertised_host=EXTERNAL_IP,
    )


async def test_the_worker_job_registers_with_its_cards(
    cluster: Cluster, gateway: RecordingGateway
) -> None:
    registry = cluster.registry
    # The sandbox's GPU nodes carry the directories GKE's driver installer leaves.
    assert (cluster.node_root(GPU_2X) / "usr/local/nvidia/lib64").is_dir()
    spec = _worker_spec(gateway.address)
    registry.create(NAMESPACES, {"metadata": {"name": spec.namespace}})
    registry.create(
        SECRETS, worker_token_secret(spec, TOKEN, tls=worker_tls("w1"), command_digest=DIGEST)
    )
    registry.create(JOBS, worker_job(spec))

    await gateway.wait_for(lambda calls: len(calls.registers) == 1, within=20)
    [(request, token)] = gateway.calls.registers
    assert token == TOKEN
    assert list(request.visible_devices) == [0, 1]
    assert request.advertised_address.startswith(f"{EXTERNAL_IP}:")
    assert request.node_name == GPU_2X
    assert request.tls, "the certificate in its Secret: WorkerService serves TLS"

    [pod] = registry.list(PODS, spec.namespace).items()
    assert request.pod_uid == pod["metadata"]["uid"]
    log = cluster.logs.read(spec.namespace, pod["metadata"]["name"], "worker")
    messages = [line.split(maxsplit=2)[2] for line in log.splitlines()]
    assert list(SPEC_LINES) == messages[:2]

    async with aio.insecure_channel(request.advertised_address) as plaintext:
        with pytest.raises(aio.AioRpcError) as refused:
            await worker_pb2_grpc.WorkerServiceStub(plaintext).GetTask(
                worker_pb2.GetTaskRequest(task_id="t"), metadata=AUTH, timeout=5
            )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    address = request.advertised_address
    async with worker_channel(address, "w1", True, WORKER_CA_SECRET) as channel:
        stub = worker_pb2_grpc.WorkerServiceStub(channel)
        code = "import os; print(os.environ['NVIDIA_VISIBLE_DEVICES'])"
        task = worker_pb2.TaskSpec(
            task_id="t-gpu-check", command=["python", "-c", code], gpu_indices=[1]
        )
        await stub.RunTask(worker_pb2.RunTaskRequest(task=task), metadata=COMMAND_AUTH)
        await gateway.wait_for(lambda calls: len(calls.reports) == 2)  # its start, its end
    # Each report travels on its own: the start's may arrive after the end's.
    [report] = [r for r in gateway.calls.reports if r.status.state != worker_pb2.TASK_STATE_RUNNING]
    assert report.status.state == worker_pb2.TASK_STATE_SUCCEEDED
    assert report.status.log_tail == "1\n"
