"""The worker Job as `levers9.core.manifests` writes it, run by the sandbox cluster.

Covers what the worker agent relies on: it is scheduled onto its node by hostname affinity
through the GPU taint, gets the cards it asked for, finds them in the kubelet checkpoint
through its `device-plugins` hostPath, reads its token from the Secret's file (mode 0400, never
an environment variable), and on the host
network sees the node's address as its own.
"""

from __future__ import annotations

import json

from levers9.core.manifests import worker_job, worker_token_secret
from levers9.tokens import command_digest
from sandbox.cluster import Cluster
from sandbox.cluster.objects import condition
from sandbox.resources import JOBS, NAMESPACES, PODS, SECRETS
from tests.factories import worker_job_spec, worker_tls
from tests.sandbox.cluster.kit import GPU_2X, PYTHON_IMAGE, python, wait_for

DIGEST = command_digest("l9c1.test-command-token")

AGENT = """
import json, os, pathlib
mounts = json.loads(os.environ["LEVERS9_SANDBOX_MOUNTS"])
checkpoint = pathlib.Path(mounts["/var/lib/kubelet/device-plugins"], "kubelet_internal_checkpoint")
entries = json.loads(checkpoint.read_text())["Data"]["PodDeviceEntries"]
mine = [e for e in entries if e["PodUID"] == os.environ["LEVERS9_POD_UID"]]
token = pathlib.Path(mounts["/var/run/levers9/worker"], "token")
print(json.dumps({
    "ids": [d for e in mine for ids in e["DeviceIDs"].values() for d in ids],
    "token_env": [k for k in os.environ if k.startswith("LEVERS9_WORKER_T")],
    "token": token.read_text(),
    "token_mode": oct(token.stat().st_mode & 0o777),
    "host_ip": os.environ["LEVERS9_HOST_IP"],
    "pod_ip": os.environ["LEVERS9_POD_IP"],
    "node": os.environ["LEVERS9_NODE_NAME"],
    "hostname": os.environ["HOSTNAME"],
    "images": mounts["/var/lib/levers9/images"],
}))
"""


async def test_the_worker_job_runs_with_its_cards_and_token(cluster: Cluster) -> None:
    registry = cluster.registry
    registry.create(NAMESPACES, {"metadata": {"name": "levers9"}})
    spec = worker_job_spec(
        worker_id="w1", node_name=GPU_2X, image=PYTHON_IMAGE, gateway_address="127.0.0.1:7443"
    )
    job = worker_job(spec)
    job["spec"]["template"]["spec"]["containers"][0]["command"] = python(AGENT)
    registry.create(JOBS, job)
    registry.create(
        SECRETS,
        worker_token_secret(spec, "worker-token", tls=worker_tls("w1"), command_digest=DIGEST),
    )

    def complete() -> bool:
        cond = condition(registry.get(JOBS, "levers9", spec.job_name), "Complete")
        return cond is not None and cond["status"] == "True"

    await wait_for(complete)
    [worker] = registry.list(PODS, "levers9").items()
    seen = json.loads(cluster.logs.read("levers9", worker["metadata"]["name"], "worker"))
    assert seen["ids"] == ["nvidia0", "nvidia1"]
    assert seen["token"] == "worker-token"
    assert seen["token_mode"] == "0o400", "the Secret's files are the agent's alone"
    assert seen["token_env"] == [], "no credential in the worker's environment"
    assert seen["node"] == seen["hostname"] == GPU_2X
    assert seen["host_ip"] == seen["pod_ip"] == "127.0.10.2"
    assert seen["images"] == str(cluster.node_root(GPU_2X) / "var/lib/levers9/images")
