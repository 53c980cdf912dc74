"""A joined cluster comes back after `levers9 dev down` and `levers9 dev up`, as a real cluster
keeps its objects when its machines are powered down and up: the user path of issue 33 run as
the user runs it (a node added with `levers9 sandbox node add`, `levers9 cluster join ... |
kubectl apply -f -`), then down and up. The agent's Deployment, Secret and RBAC are still there,
its pod that died with the machine is replaced and dials the gateway with the token it kept, and
the joined pool gets a new worker on its machine; the controlplane's records were not ended (the
cluster did not start empty). The demo pool, attached as the README says, runs `echo hi` before
and after: its worker pods died with the machines (Error, the Jobs failed), and the controlplane,
whose egress IP the restarted AWS (moto) kept on the cluster's authorized networks, replaces them
and the run succeeds on a new worker. `dev up --fresh` starts from the scenario again, and ends
them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandbox.admin_client import SandboxAdmin
from tests.devstack import Dev
from tests.waiting import until

pytestmark = pytest.mark.integration

FAST = {"LEVERS9_RECONCILE_INTERVAL_SECONDS": "1"}
WITHIN = 120


def _apply(dev: Dev, manifest: str) -> None:
    applied = subprocess.run(
        ["kubectl", "apply", "-f", "-"],
        input=manifest,
        env={**os.environ, **dev.env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert applied.returncode == 0, applied.stderr


def _joined_workers(dev: Dev) -> list[dict[str, str]]:
    listed = dev.run("worker", "list", "--pool", "joined", "-o", "json")
    rows: list[dict[str, str]] = json.loads(listed.stdout) if listed.returncode == 0 else []
    return rows


def _new_joined_worker(dev: Dev, not_these: set[str]) -> dict[str, str]:
    """An available worker of `joined` on gke-joined that is none of `not_these`: the agent
    ran and made it."""
    rows: list[dict[str, str]] = []

    def fresh() -> dict[str, str] | None:
        rows[:] = _joined_workers(dev)
        return next(
            (
                row
                for row in rows
                if row["worker_id"] not in not_these
                and row["node_name"] == "gke-joined"
                and row["state"] == "available"
            ),
            None,
        )

    try:
        return until(fresh, within=WITHIN, what="a new available worker of joined", poll=1)
    except TimeoutError as late:
        raise AssertionError(f"{late}; workers of joined: {rows}") from None


def _agent(dev: Dev) -> tuple[dict[str, str], dict[str, str]]:
    """The agent's Deployment and Secret metadata (uid, creationTimestamp) and the Secret data."""
    deploy = json.loads(
        dev.kubectl("-n", "levers9", "get", "deploy", "levers9-agent", "-o", "json")
    )
    secret = json.loads(
        dev.kubectl("-n", "levers9", "get", "secret", "levers9-agent", "-o", "json")
    )
    kept = {
        "deploy": deploy["metadata"]["uid"] + deploy["metadata"]["creationTimestamp"],
        "secret": secret["metadata"]["uid"] + secret["metadata"]["creationTimestamp"],
    }
    return kept, secret["data"]


def _agent_pods(dev: Dev) -> list[dict[str, Any]]:
    listed = dev.kubectl(
        "-n", "levers9", "get", "pods", "-l", "app.kubernetes.io/name=levers9-agent", "-o", "json"
    )
    pods: list[dict[str, Any]] = json.loads(listed)["items"]
    return pods


def _echo_hi(dev: Dev) -> str:
    """`levers9 run --pool gke-rtx6000 -- echo hi` as the README runs it; the worker it ran on.
    The CLI waits past a cold start (the page's first job: about 2 min cold)."""
    ran = dev.run(
        *("run", "--pool", "gke-rtx6000", "--wait", "300", "--", "echo", "hi"), timeout=330
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "hi" in ran.stdout.splitlines(), ran.stdout
    found = re.search(r"succeeded exit_code=0 worker=(\S+)", ran.stdout)
    assert found, ran.stdout
    return found.group(1)


def _demo_workers(dev: Dev) -> set[str]:
    listed = dev.run("worker", "list", "--pool", "gke-rtx6000", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    return {row["worker_id"] for row in json.loads(listed.stdout)}


# Three stacks start here (up, up again, up --fresh): twice the suite's hang guard.
@pytest.mark.timeout(600)
def test_a_joined_cluster_comes_back_after_down_and_up(tmp_path: Path) -> None:
    dev = Dev(tmp_path)
    try:
        up = dev.run("dev", "up", *dev.ports, env=FAST)
        assert up.returncode == 0, up.stdout + up.stderr
        added = dev.run(
            *("sandbox", "node", "add", "gke-joined", "--gpus", "1"),
            *("--node-pool", "joined-pool"),
        )
        assert added.returncode == 0, added.stderr
        # A joined cluster's node says its cards as GPU feature discovery does, not with GKE's
        # accelerator label, which the demo pool selects: its card stays the joined pool's.
        dev.kubectl(
            *("label", "node", "gke-joined", "cloud.google.com/gke-accelerator-"),
            "nvidia.com/gpu.product=NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
        )
        joined = dev.run(
            *("cluster", "join", "--name", "joined", "--gpu-type", "RTXPro6000"),
            *("--node-selector", "cloud.google.com/gke-nodepool=joined-pool"),
        )
        assert joined.returncode == 0, joined.stderr
        _apply(dev, joined.stdout)
        before = _new_joined_worker(dev, set())
        attached = dev.attach()
        assert attached.returncode == 0, attached.stdout + attached.stderr
        assert _echo_hi(dev) in _demo_workers(dev)
        kept, data = _agent(dev)
        [old_pod] = _agent_pods(dev)
        demo_before = _demo_workers(dev)

        down = dev.run("dev", "down")
        assert down.returncode == 0, down.stderr
        saved = tmp_path / ".levers9" / "dev" / "sandbox" / "cluster.json"
        assert f"the sandbox's cluster is saved in {saved}" in down.stdout
        again = dev.run("dev", "up", *dev.ports, env=FAST)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "records of the previous sandbox cluster" not in again.stdout, "none ended"
        access = SandboxAdmin(tmp_path / ".levers9" / "dev" / "sandbox").access()
        assert f"{access['egressIp']}/32" in access["authorizedNetworks"], "AWS kept its nodes"
        assert _echo_hi(dev) not in demo_before, "the pods died with the machines: new workers"

        pools = json.loads(dev.run("pool", "list", "-o", "json").stdout)
        assert {row["pool"]: row["provider"] for row in pools}["joined"] == "kubernetes (joined)"
        after = _new_joined_worker(dev, {before["worker_id"]})
        machines = json.loads(dev.run("machine", "list", "--pool", "joined", "-o", "json").stdout)
        assert [row["node_name"] for row in machines] == ["gke-joined"]
        assert after["pool_name"] == "joined"
        assert _agent(dev) == (kept, data), "the same Deployment, and the token it kept"
        pods = {str(p["metadata"]["uid"]): p for p in _agent_pods(dev)}
        ended = pods.pop(str(old_pod["metadata"]["uid"]))
        assert ended["status"]["reason"] == "Terminated"
        [replacement] = pods.values()
        assert replacement["status"]["phase"] == "Running"
        labels = dev.kubectl("get", "node", "gke-joined", "-o", "jsonpath={.metadata.labels}")
        assert json.loads(labels)["cloud.google.com/gke-nodepool"] == "joined-pool"

        assert dev.run("dev", "down").returncode == 0
        fresh = dev.run("dev", "up", "--fresh", *dev.ports, env=FAST)
        assert fresh.returncode == 0, fresh.stdout + fresh.stderr
        assert "records of the previous sandbox cluster" in fresh.stdout
        deployments = dev.kubectl("get", "deploy", "-A", "-o", "name").split()
        assert deployments == ["deployment.apps/model-server"]
        assert "gke-joined" not in dev.kubectl("get", "nodes", "-o", "name")
        running = dev.run("dev", "up", "--fresh", *dev.ports)
        assert running.returncode == 1
        assert "`levers9 dev down` first, then `dev up --fresh`" in running.stderr
    finally:
        dev.run("dev", "down")
