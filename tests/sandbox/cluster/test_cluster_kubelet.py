"""The kubelet: process images run as local processes, images pull or back off, deletion
stops what runs, and the node's status and Lease stay fresh.

Covers a Job whose pod prints `hi` (Complete, Succeeded, logs), a failing process with
`backoffLimit` 0 and 1 (Failed, BackoffLimitExceeded, replacement pods), deleting a running
pod (SIGTERM, or SIGKILL after the grace period for a process that ignores it), a missing
image (ErrImagePull → ImagePullBackOff → pulled once added), a missing Secret
(CreateContainerConfigError until it exists), the downward API and secretKeyRef in the
environment, hostPath volumes under the node's root, restarts with CrashLoopBackOff,
heartbeats, and volume paths kept inside the node's root.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sandbox.cluster import Cluster
from sandbox.cluster.jobs import TRACKING_FINALIZER
from sandbox.cluster.objects import condition
from sandbox.cluster.podenv import MountError, inside
from sandbox.options import DeleteOptions
from sandbox.registry import Registry
from sandbox.resources import JOBS, LEASES, NODES, PODS, SECRETS
from tests.sandbox.cluster.kit import (
    CPU_NODE,
    job_manifest,
    phase,
    pod,
    pod_manifest,
    python,
    wait_for,
)


def _job_pods(registry: Registry, job: str) -> list[dict[str, Any]]:
    return registry.list(PODS, "default", label_selector=f"job-name={job}").items()


def _finished(registry: Registry, job: str, kind: str) -> dict[str, Any] | None:
    found = registry.get(JOBS, "default", job)
    cond = condition(found, kind)
    return found if cond is not None and cond["status"] == "True" else None


def _waiting(registry: Registry, name: str) -> str | None:
    found = pod(registry, name)
    statuses = (found or {}).get("status", {}).get("containerStatuses") or [{}]
    waiting = statuses[0].get("state", {}).get("waiting")
    return None if waiting is None else str(waiting["reason"])


async def test_a_job_that_prints_hi_completes(cluster: Cluster) -> None:
    registry = cluster.registry
    registry.create(JOBS, job_manifest("hello", python("print('hi')")))
    job = await wait_for(lambda: _finished(registry, "hello", "Complete"))
    assert job["status"]["succeeded"] == 1
    assert job["status"]["active"] == 0
    assert job["status"]["completionTime"]
    assert condition(job, "SuccessCriteriaMet") is not None
    [done] = _job_pods(registry, "hello")
    assert done["status"]["phase"] == "Succeeded"
    assert done["metadata"]["name"].startswith("hello-")
    assert TRACKING_FINALIZER not in (done["metadata"].get("finalizers") or [])
    ref = done["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["controller"], ref["blockOwnerDeletion"]) == ("Job", True, True)
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (0, "Completed")
    assert cluster.logs.read("default", done["metadata"]["name"], "main") == "hi\n"


@pytest.mark.parametrize("backoff_limit", [0, 1])
async def test_a_failing_process_fails_its_job(cluster: Cluster, backoff_limit: int) -> None:
    registry = cluster.registry
    name = f"fails-{backoff_limit}"
    code = "import sys; print('bad', file=sys.stderr); sys.exit(3)"
    registry.create(JOBS, job_manifest(name, python(code), backoff_limit=backoff_limit))
    job = await wait_for(lambda: _finished(registry, name, "Failed"))
    failed = condition(job, "Failed")
    assert failed is not None
    assert (failed["reason"], failed["message"]) == (
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
    )
    assert job["status"]["failed"] == backoff_limit + 1
    pods = _job_pods(registry, name)
    assert len(pods) == backoff_limit + 1
    for each in pods:
        terminated = each["status"]["containerStatuses"][0]["state"]["terminated"]
        assert (each["status"]["phase"], terminated["exitCode"], terminated["reason"]) == (
            "Failed",
            3,
            "Error",
        )
        assert cluster.logs.read("default", each["metadata"]["name"], "main") == "bad\n"


SLEEPER = "import os, time, pathlib; pathlib.Path(os.environ['HOME'], 'pid').write_text(str(os.getpid())); time.sleep(120)"  # noqa: E501
STUBBORN = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + SLEEPER


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(
    ("code", "grace"), [(SLEEPER, 30), (STUBBORN, 1)], ids=["sigterm", "sigkill-after-grace"]
)
async def test_deleting_a_running_pod_stops_its_process(
    cluster: Cluster, code: str, grace: int
) -> None:
    registry = cluster.registry
    registry.create(
        PODS,
        pod_manifest(
            "sleeper", command=python(code), node_name=CPU_NODE, terminationGracePeriodSeconds=grace
        ),
    )
    running = await wait_for(lambda: phase(registry, "sleeper", "Running"))
    kubelet = cluster.kubelet(CPU_NODE)
    assert kubelet is not None
    pid_file = kubelet.pod_dir(running["metadata"]["uid"]) / "containers" / "main" / "pid"
    pid = int(await wait_for(lambda: pid_file.exists() and pid_file.read_text()))
    outcome = registry.delete(PODS, "default", "sleeper", DeleteOptions())
    assert not outcome.finished
    assert outcome.object["metadata"]["deletionTimestamp"]
    await wait_for(lambda: pod(registry, "sleeper") is None, within=grace + 5)
    assert not _alive(pid)


async def test_a_missing_image_backs_off_until_it_is_added(cluster: Cluster) -> None:
    registry = cluster.registry
    image = "us-central1-docker.pkg.dev/demo/levers9/later:1"
    registry.create(
        PODS, pod_manifest("later", image=image, node_name=CPU_NODE, restart_policy="Always")
    )
    assert await wait_for(lambda: _waiting(registry, "later") == "ErrImagePull")
    found = pod(registry, "later")
    assert found is not None
    message = found["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    assert f'failed to pull and unpack image "{image}"' in message
    assert await wait_for(lambda: _waiting(registry, "later") == "ImagePullBackOff")
    assert found["status"]["phase"] == "Pending"
    cluster.add_image(image)
    await wait_for(lambda: phase(registry, "later", "Running"))


async def test_the_environment_carries_the_downward_api_and_secrets(cluster: Cluster) -> None:
    registry = cluster.registry
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "worker", "key": "token"}}},
        {"name": "GREETING", "value": "$(POD_NAME) says hi, $$(POD_NAME) stays"},
    ]
    registry.create(
        PODS,
        pod_manifest(
            "env",
            command=python("import json, os; print(json.dumps(dict(os.environ)))"),
            node_name=CPU_NODE,
            env=env,
        ),
    )
    assert await wait_for(lambda: _waiting(registry, "env") == "CreateContainerConfigError")
    registry.create(
        SECRETS,
        {"metadata": {"name": "worker", "namespace": "default"}, "stringData": {"token": "s3cret"}},
    )
    done = await wait_for(lambda: phase(registry, "env", "Succeeded"))
    seen = json.loads(cluster.logs.read("default", "env", "main"))
    status = done["status"]
    assert seen["POD_NAME"] == "env"
    assert seen["POD_NAMESPACE"] == "default"
    assert seen["POD_UID"] == done["metadata"]["uid"]
    assert seen["NODE_NAME"] == CPU_NODE
    assert seen["HOST_IP"] == status["hostIP"] == "127.0.10.10"
    assert seen["POD_IP"] == status["podIP"]
    assert status["podIP"].startswith("127.")
    assert seen["TOKEN"] == "s3cret"
    assert seen["GREETING"] == "env says hi, $(POD_NAME) stays"
    assert seen["LEVERS9_SANDBOX_ROOT"] == str(cluster.node_root(CPU_NODE))


async def test_host_paths_live_under_the_nodes_root(cluster: Cluster) -> None:
    registry = cluster.registry
    code = (
        "import json, os, pathlib; mounts = json.loads(os.environ['LEVERS9_SANDBOX_MOUNTS']); "
        "pathlib.Path(mounts['/data'], 'made-by-pod').write_text('yes')"
    )
    registry.create(
        PODS,
        pod_manifest(
            "writer",
            command=python(code),
            node_name=CPU_NODE,
            volumes=[
                {
                    "name": "images",
                    "hostPath": {"path": "/var/lib/levers9/images", "type": "DirectoryOrCreate"},
                }
            ],
            volumeMounts=[{"name": "images", "mountPath": "/data"}],
        ),
    )
    await wait_for(lambda: phase(registry, "writer", "Succeeded"))
    made = cluster.node_root(CPU_NODE) / "var/lib/levers9/images/made-by-pod"
    assert made.read_text() == "yes"


async def test_a_crashing_container_restarts_with_back_off(cluster: Cluster) -> None:
    registry = cluster.registry
    registry.create(
        PODS,
        pod_manifest(
            "crasher",
            command=python("raise SystemExit(1)"),
            node_name=CPU_NODE,
            restart_policy="OnFailure",
        ),
    )

    def restarted() -> dict[str, Any] | None:
        found = pod(registry, "crasher")
        status = ((found or {}).get("status", {}).get("containerStatuses") or [{}])[0]
        return status if status.get("restartCount", 0) >= 2 else None

    status = await wait_for(restarted)
    assert status["lastState"]["terminated"]["exitCode"] == 1
    assert pod(registry, "crasher")["status"]["phase"] in ("Running", "Pending")  # type: ignore[index]


async def test_heartbeats_keep_the_node_ready_and_its_lease_fresh(registry: Registry) -> None:
    def beat() -> str:
        node = registry.get(NODES, None, CPU_NODE)
        ready = condition(node, "Ready")
        assert ready is not None
        assert ready["status"] == "True"
        return str(ready["lastHeartbeatTime"])

    first = beat()
    await wait_for(lambda: beat() != first, within=3)
    lease = registry.get(LEASES, "kube-node-lease", CPU_NODE)
    assert lease["spec"]["holderIdentity"] == CPU_NODE
    assert lease["metadata"]["ownerReferences"][0]["kind"] == "Node"


def test_volume_paths_cannot_leave_the_node_root(tmp_path: Path) -> None:
    assert inside(tmp_path, "/var/lib/x") == tmp_path / "var/lib/x"
    with pytest.raises(MountError):
        inside(tmp_path, "/../../etc")


AGENT_LIKE = """
import json, os, pathlib, subprocess, time
def ticks(pid):
    return int(pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])
work = pathlib.Path(os.environ["LEVERS9_SANDBOX_ROOT"]) / "var/lib/levers9/work/w1"
(work / "processes").mkdir(parents=True)
(work / "agent.json").write_text(json.dumps({"pid": os.getpid(), "start": ticks(os.getpid())}))
quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
task = subprocess.Popen(["sleep", "1000"], start_new_session=True, **quiet)
record = {"pid": task.pid, "start": ticks(task.pid)}
(work / "processes" / "t1.json").write_text(json.dumps(record))
time.sleep(1000)
"""
"""A worker agent as far as the node sees it: its work dir under the node's root, a task's
process in a session of its own (which the kubelet's stop of the pod does not reach)."""


async def test_what_a_pods_agent_left_running_stops_with_the_cluster(cluster: Cluster) -> None:
    registry = cluster.registry
    registry.create(PODS, pod_manifest("agent", command=python(AGENT_LIKE), node_name=CPU_NODE))
    await wait_for(lambda: phase(registry, "agent", "Running"))
    kubelet = cluster.kubelet(CPU_NODE)
    assert kubelet is not None
    record = kubelet.root / "var/lib/levers9/work/w1/processes/t1.json"

    def written() -> int | None:
        """The pid once the agent-like process has written its record whole (until then the
        file may be there and empty: once seen on a loaded CI machine)."""
        try:
            return int(json.loads(record.read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None

    task = await wait_for(written)
    assert _running(task)
    await cluster.stop()
    assert not _running(task), "the task's process went with the machine's"


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
