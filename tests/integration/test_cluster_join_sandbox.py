"""`levers9 cluster join` end to end on the sandbox, as a user drives it: a controlplane with no
pool in its values and a cluster whose authorized networks do not hold its egress IP (it can
never dial the cluster's API), `levers9 cluster join ... | kubectl apply -f -` with the admin's
kubeconfig, then the agent (a pod of the sandbox with in-cluster config: its service account's
token and the RBAC the join gave it) dials the gateway. The pool `joined` gets its machines and
workers (tunnel mode) and runs the GPU check; no key is minted; the networks are unchanged.

Then: the spent join token is refused; the agent restarted (its pod deleted) comes back with
the token it kept; a dropped tunnel reconnects; the agent's RBAC denies what the join did not
grant. Last, `cluster leave` without `--apply` removes the pool and prints the deletes, leaving
everything in the cluster; a second join applied over it rolls the agent, whose new token
works while the old one is refused; `cluster leave --apply` deletes what join installed. The
tests of this module share one sandbox and one controlplane and run in order.

Its tasks run as processes of the agent (`quick_scenario(process_tasks=True)`, the sandbox's knob
no pool value can express): they only prove that the joined cluster's route works (the GPU check,
an `echo` after each restart), and a joined pool names no registry mirror that could serve the
worker image here; tests/integration/test_tasks_sandbox.py runs a user's tasks in containers.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import urllib3
import yaml
from grpc import aio
from pydantic import SecretStr
from temporalio.testing import WorkflowEnvironment

from activities.kube_clients import KubeClients
from levers9.config import ControlplaneSettings
from levers9.core.workspaces import workspace_token
from levers9.gateway.cluster_relay import RELAY_OPENED, relay_metadata
from levers9.proto import gateway_pb2, gateway_pb2_grpc
from levers9.records.listing import list_worker_records
from levers9.tokens import operator_token
from sandbox.scenario import Scenario
from sandbox.serve import RunningSandbox, start
from tests.controlplane import TOKEN_SECRET, _terminate_running, quick_scenario
from tests.factories import free_port
from tests.waiting import eventually
from worker_main import Serving, serving

pytestmark = pytest.mark.integration

BIN = Path(sys.executable).parent
NAME = "joined"
WITHIN = 90
SELECTOR = "cloud.google.com/gke-accelerator=nvidia-rtx-pro-6000"
IMAGE = "us-central1-docker.pkg.dev/demo/levers9/worker:latest"


@dataclass
class Plane:
    sandbox: RunningSandbox
    settings: ControlplaneSettings
    served: Serving
    home: Path

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "TEMPORAL_ADDRESS": self.settings.temporal_address,
            "LEVERS9_TASK_QUEUE": self.settings.task_queue,
            "LEVERS9_GATEWAY_ADDRESS": self.settings.gateway_advertised_address,
            "LEVERS9_API_TOKEN": operator_token(TOKEN_SECRET),
            "LEVERS9_HOME": str(self.home),
            "KUBECONFIG": str(self.sandbox.state.dir / "kubeconfig"),
        }

    async def run(self, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run,
            list(argv),
            input=stdin,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=180,
        )

    async def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return await self.run(str(BIN / "levers9"), *args)

    async def kubectl(self, *args: str, stdin: str | None = None) -> str:
        done = await self.run("kubectl", *args, stdin=stdin)
        assert done.returncode == 0, done.stderr
        return done.stdout


def _unattached() -> Scenario:
    """The default scenario as `dev up` leaves it: the controlplane's egress IP is not on the
    cluster's authorized networks (nothing of the controlplane may dial the API)."""
    base = quick_scenario(process_tasks=True)
    networks = Scenario.load().network.authorized_networks  # the admin's, not the egress
    network = base.network.model_copy(update={"authorized_networks": networks})
    return base.model_copy(update={"network": network})


@pytest.fixture(scope="module")
async def plane(
    dev_env: WorkflowEnvironment, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Plane]:
    directory = tmp_path_factory.mktemp("join")
    running = await start(_unattached(), directory / "sandbox")
    gateway_port = free_port()
    settings = ControlplaneSettings.model_validate(
        {
            "temporalAddress": dev_env.client.service_client.config.target_host,
            "taskQueue": f"tq-{uuid.uuid4()}",
            "reconcileIntervalSeconds": 1,
            "workerTokenSecret": TOKEN_SECRET,
            "gatewayListen": f"127.0.0.1:{gateway_port}",
            "gatewayAdvertisedAddress": f"127.0.0.1:{gateway_port}",
            "endpointsListen": f"127.0.0.1:{free_port()}",
        }
    )
    clients = KubeClients({})
    served = serving(dev_env.client, clients, settings, SecretStr(TOKEN_SECRET))
    await served.gateway.start(settings.gateway_listen)
    try:
        async with served.caches, served.worker, served.replica:
            yield Plane(running, settings, served, directory / "home")
    finally:
        await served.gateway.stop(grace=1)
        await _terminate_running(dev_env.client, settings.task_queue)
        clients.close()
        await running.close()


async def _workers(plane: Plane) -> list[object]:
    records = await list_worker_records(plane.settings, NAME, include_ended=False)
    return [r for r in records if r.state == "available"]


async def test_join_applied_with_kubectl_gives_a_joined_pool(plane: Plane) -> None:
    policy = plane.sandbox.sandbox.policy
    before = policy.authorized_networks
    keys_before = sorted((plane.sandbox.state.dir / "keys").glob("*.json"))
    done = await plane.cli(
        "cluster", "join", "--name", NAME, "--gpu-type", "RTXPro6000",
        "--node-selector", SELECTOR, "--worker-image", IMAGE, "--simulated-gpus",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "works once" in done.stderr
    documents = list(yaml.safe_load_all(done.stdout))
    kinds = [d["kind"] for d in documents]
    assert kinds == [
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
        "RoleBinding", "Secret", "Deployment",
    ]  # fmt: skip
    assert "private_key" not in done.stdout
    applied = await plane.kubectl("apply", "-f", "-", stdin=done.stdout)
    assert "deployment.apps/levers9-agent created" in applied

    async def three() -> bool:
        return len(await _workers(plane)) == 3

    await eventually(three, within=WITHIN)
    # The join's Role lets the agent create the pool's budget (a drain waits for its workers).
    budgets = await plane.kubectl("-n", "levers9", "get", "pdb", "-o", "name")
    assert budgets.split() == [f"poddisruptionbudget.policy/workers-{NAME}"], budgets
    listed = json.loads((await plane.cli("pool", "list", "-o", "json")).stdout)
    assert [(r["pool"], r["provider"]) for r in listed] == [(NAME, "kubernetes (joined)")]
    machines = json.loads((await plane.cli("machine", "list", "--pool", NAME, "-o", "json")).stdout)
    assert len(machines) == 3
    check = await plane.cli("pool", "check", "--pool", NAME, "--gpu", "RTXPro6000")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "simulated cards: no GPU was visible, as expected\nCOMPLETE {" in check.stdout
    assert policy.authorized_networks == before, "the cluster's authorized networks unchanged"
    assert sorted((plane.sandbox.state.dir / "keys").glob("*.json")) == keys_before, "no key"
    secret = json.loads(
        await plane.kubectl("-n", "levers9", "get", "secret", "levers9-agent", "-o", "json")
    )
    assert sorted(secret["data"]) == ["agent-token"], "the join token is spent and gone"


async def test_a_spent_join_token_is_refused(plane: Plane) -> None:
    state = await plane.cli("cluster", "list", "-o", "json")
    assert json.loads(state.stdout)[0]["joined_at"] is not None
    token = "l9j1.not-the-token"
    async with aio.insecure_channel(plane.settings.gateway_advertised_address) as channel:
        stub = gateway_pb2_grpc.ClustersStub(channel)
        with pytest.raises(aio.AioRpcError) as wrong:
            await stub.JoinCluster(
                gateway_pb2.JoinClusterRequest(cluster_name=NAME, join_token=token)
            )
        assert wrong.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "not the one of cluster joined's join" in (wrong.value.details() or "")
    # The real one, spent: kept by nobody now but the first output; join prints it once.
    # A second join of the same name is refused until the cluster leaves.
    again = await plane.cli(
        "cluster", "join", "--name", NAME, "--gpu-type", "RTXPro6000", "--worker-image", IMAGE
    )
    assert again.returncode == 1
    assert "cluster joined is joined already" in again.stderr


async def test_the_agent_restarted_comes_back_with_its_own_token(plane: Plane) -> None:
    hub = plane.served.gateway.clusters
    assert hub is not None
    pods = json.loads(await plane.kubectl("-n", "levers9", "get", "pods", "-o", "json"))
    [agent] = [p for p in pods["items"] if p["metadata"]["name"].startswith("levers9-agent")]
    await plane.kubectl("-n", "levers9", "delete", "pod", agent["metadata"]["name"])

    async def replaced() -> bool:
        pods = json.loads(await plane.kubectl("-n", "levers9", "get", "pods", "-o", "json"))
        names = [
            p["metadata"]["name"]
            for p in pods["items"]
            if p["metadata"]["name"].startswith("levers9-agent")
            and p["status"].get("phase") == "Running"
        ]
        return bool(names) and agent["metadata"]["name"] not in names and hub.connected(NAME)

    await eventually(replaced, within=WITHIN)
    done = await plane.cli("run", "--pool", NAME, "--gpus", "1", "--", "echo", "after-restart")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "after-restart" in done.stdout


async def test_a_dropped_tunnel_reconnects(plane: Plane) -> None:
    hub = plane.served.gateway.clusters
    assert hub is not None
    assert await hub.disconnect(NAME, "test: the network blinked")
    assert not hub.connected(NAME)

    async def back() -> bool:
        return hub.connected(NAME)

    await eventually(back, within=WITHIN)
    done = await plane.cli("run", "--pool", NAME, "--gpus", "1", "--", "echo", "after-drop")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "after-drop" in done.stdout


async def test_the_agents_rbac_denies_what_the_join_did_not_grant(plane: Plane) -> None:
    """Through the agent's proxy (the controlplane's only way to the cluster): the pool's own
    namespace works, anything else is the API server's 403 with RBAC's words."""
    hub = plane.served.gateway.clusters
    assert hub is not None
    url = hub.url(NAME)
    http = urllib3.PoolManager()
    ok = await asyncio.to_thread(http.request, "GET", f"{url}/api/v1/namespaces/levers9/pods")
    assert ok.status == 200
    denied = await asyncio.to_thread(
        http.request, "GET", f"{url}/api/v1/namespaces/kube-system/secrets"
    )
    assert denied.status == 403
    body = json.loads(denied.data)
    assert body["message"] == (
        'secrets is forbidden: User "system:serviceaccount:levers9:levers9-agent" cannot list'
        ' resource "secrets" in API group "" in the namespace "kube-system"'
    )
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}}
    created = await asyncio.to_thread(
        http.request,
        "POST",
        f"{url}/apis/batch/v1/namespaces/default/jobs",
        body=json.dumps(job),
        headers={"Content-Type": "application/json"},
    )
    assert created.status == 403
    assert 'cannot create resource "jobs"' in json.loads(created.data)["message"]
    nodes = await asyncio.to_thread(http.request, "DELETE", f"{url}/api/v1/nodes/any")
    assert nodes.status == 403
    _ = base64


async def test_relay_kube_serves_another_replica_with_the_operator_token(plane: Plane) -> None:
    """`Clusters/RelayKube`, as a replica without the agent's session calls this one (which
    holds it): one HTTP connection to the cluster's API; refused without the operator token,
    and for a cluster whose session is not held here; a workspace token is PERMISSION_DENIED."""
    address = plane.settings.gateway_advertised_address
    request = b"GET /api/v1/namespaces/levers9/pods HTTP/1.1\r\n"
    request += b"Host: k\r\nConnection: close\r\n\r\n"

    async def relay(token: str, cluster: str) -> aio.StreamStreamCall[Any, Any]:
        call = gateway_pb2_grpc.ClustersStub(channel).RelayKube(
            metadata=relay_metadata(token, "tq-other-replica")
        )
        # No half-close: HTTP clients keep their side open until the answer (`Connection:
        # close` makes the agent's proxy end it, which ends the call).
        await call.write(gateway_pb2.ClusterRelayData(cluster_name=cluster, data=request))
        return call

    async with aio.insecure_channel(address) as channel:
        served = await relay(operator_token(TOKEN_SECRET), NAME)
        assert (await served.initial_metadata()).get(RELAY_OPENED) == "1"
        answer = b"".join([m.data async for m in served])
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert b'"kind":"PodList"' in answer.replace(b" ", b"")
        for token, cluster, code in (
            ("not-the-operator-token", NAME, grpc.StatusCode.UNAUTHENTICATED),
            (workspace_token("team-a", "abc", "secret"), NAME, grpc.StatusCode.PERMISSION_DENIED),
            (operator_token(TOKEN_SECRET), "elsewhere", grpc.StatusCode.FAILED_PRECONDITION),
        ):
            # The refusal may end the call before the request is even written: then the write
            # raises it; else the call ends with it.
            try:
                refused = await relay(token, cluster)
                got, details = await refused.code(), await refused.details()
            except aio.AioRpcError as ended:
                got, details = ended.code(), ended.details() or ""
            assert got == code, details


async def test_an_agent_dropped_is_logged_and_reconnects(
    plane: Plane, log_lines: io.StringIO
) -> None:
    """The troubleshooting row `cluster agent disconnected cluster=N`: the agent's pod deleted
    (its process killed, its stream broken) is logged so, then its successor connects."""
    hub = plane.served.gateway.clusters
    assert hub is not None
    assert hub.connected(NAME)
    pods = json.loads(await plane.kubectl("-n", "levers9", "get", "pods", "-o", "json"))
    [agent] = [p for p in pods["items"] if p["metadata"]["name"].startswith("levers9-agent")]
    await plane.kubectl("-n", "levers9", "delete", "pod", agent["metadata"]["name"])
    line = re.compile(
        rf"^\S+ INFO  cluster agent (dis)?connected cluster={NAME} session_id=(\S+)$", re.M
    )

    def sessions() -> tuple[list[str], list[str]]:
        """The session ids logged disconnected, and those logged connected."""
        events = [match.groups() for match in line.finditer(log_lines.getvalue())]
        return [s for dis, s in events if dis], [s for dis, s in events if not dis]

    async def reconnected() -> bool:
        dropped, connected = sessions()
        # The successor may connect before the dropped session's end is logged.
        return bool(dropped) and bool(set(connected) - set(dropped)) and hub.connected(NAME)

    await eventually(reconnected, within=WITHIN)
    dropped, connected = sessions()
    assert len(dropped) == 1, dropped
    assert len(connected) == 1, connected


INSTALLED = [
    *(
        f"{kind}/levers9-agent"
        for kind in (
            "deployment.apps",
            "secret",
            "rolebinding.rbac.authorization.k8s.io",
            "role.rbac.authorization.k8s.io",
            "serviceaccount",
        )
    ),
    f"clusterrolebinding.rbac.authorization.k8s.io/levers9-agent-{NAME}",
    f"clusterrole.rbac.authorization.k8s.io/levers9-agent-{NAME}",
]
"""What join installed besides the namespace, as `kubectl get -o name` names it."""


async def _installed(plane: Plane) -> list[str]:
    """Those of INSTALLED the API server has now, in INSTALLED's order."""
    found: list[str] = []
    for name in INSTALLED:
        namespace = [] if name.startswith("cluster") else ["-n", "levers9"]
        found += (
            await plane.kubectl(*namespace, "get", name, "-o", "name", "--ignore-not-found")
        ).split()
    return found


async def _agent(plane: Plane) -> tuple[dict[str, Any], dict[str, str]]:
    """The agent's Deployment and its Secret's data (decoded)."""
    deployment = json.loads(
        await plane.kubectl("-n", "levers9", "get", "deployment", "levers9-agent", "-o", "json")
    )
    secret = json.loads(
        await plane.kubectl("-n", "levers9", "get", "secret", "levers9-agent", "-o", "json")
    )
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    return deployment, data


async def _agent_pods(plane: Plane) -> dict[str, str]:
    """The agent's pods: name -> phase."""
    pods = json.loads(await plane.kubectl("-n", "levers9", "get", "pods", "-o", "json"))
    return {
        p["metadata"]["name"]: p["status"].get("phase", "")
        for p in pods["items"]
        if p["metadata"]["name"].startswith("levers9-agent")
    }


async def _cluster_tunnel(plane: Plane, token: str) -> tuple[grpc.StatusCode, str]:
    """Opens the cluster's tunnel with `token`, as the agent does: how the gateway ends it."""
    answered = asyncio.Event()
    async with aio.insecure_channel(plane.settings.gateway_advertised_address) as channel:

        async def frames() -> AsyncIterator[gateway_pb2.TunnelFrame]:
            yield gateway_pb2.TunnelFrame(hello=gateway_pb2.TunnelHello(pool_name=NAME))
            await answered.wait()  # the hello's side open until the gateway has answered

        call = gateway_pb2_grpc.ClustersStub(channel).ClusterTunnel(
            frames(), metadata=(("authorization", f"Bearer {token}"),)
        )
        try:
            async with asyncio.timeout(WITHIN):
                await call.read()
        except aio.AioRpcError as error:
            return error.code(), error.details() or ""
        except TimeoutError:
            raise AssertionError(
                f"the gateway did not answer a cluster tunnel in {WITHIN} s"
            ) from None
        finally:
            answered.set()
            call.cancel()
    return grpc.StatusCode.OK, "a session was opened"


async def test_leave_without_apply_ends_the_pool_and_removes_nothing_in_the_cluster(
    plane: Plane,
) -> None:
    assert await _installed(plane) == INSTALLED
    left = await plane.cli("cluster", "leave", NAME)
    assert left.returncode == 0, left.stdout + left.stderr
    assert f"cluster {NAME}: removing pool {NAME} (its workers stop)" in left.stdout
    assert f"cluster {NAME} left; remove what join installed there:" in left.stdout
    for kind in ("deployment", "secret", "rolebinding", "role", "serviceaccount"):
        assert f"kubectl delete -n levers9 {kind} levers9-agent --ignore-not-found" in left.stdout
    for kind in ("clusterrolebinding", "clusterrole"):
        assert f"kubectl delete {kind} levers9-agent-{NAME} --ignore-not-found" in left.stdout
    assert "kubectl delete namespace levers9   # only if nothing else runs there" in left.stdout
    # The command has returned: whatever it deleted, it deleted before it exited.
    assert await _installed(plane) == INSTALLED
    assert json.loads((await plane.cli("cluster", "list", "-o", "json")).stdout) == []
    assert json.loads((await plane.cli("pool", "list", "-o", "json")).stdout) == []


async def test_a_second_join_rolls_the_agent_and_revokes_the_old_agent_token(
    plane: Plane,
) -> None:
    before, kept = await _agent(plane)
    old_token = kept["agent-token"]
    old_pods = set(await _agent_pods(plane))
    assert old_pods
    done = await plane.cli(
        "cluster", "join", "--name", NAME, "--gpu-type", "RTXPro6000",
        "--node-selector", SELECTOR, "--worker-image", IMAGE, "--simulated-gpus",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    applied = await plane.kubectl("apply", "-f", "-", stdin=done.stdout)
    assert "deployment.apps/levers9-agent configured" in applied
    # The old agent's token belongs to the join that was left: refused from now on.
    code, details = await _cluster_tunnel(plane, old_token)
    assert code == grpc.StatusCode.UNAUTHENTICATED, details
    assert f"this agent token is not cluster {NAME}'s (from an older join?)" in details

    async def rolled() -> bool:
        pods = await _agent_pods(plane)
        _, data = await _agent(plane)
        return (
            not old_pods & set(pods)
            and list(pods.values()) == ["Running"]
            and sorted(data) == ["agent-token"]
            and data["agent-token"] != old_token
        )

    await eventually(rolled, within=WITHIN, what="a new agent pod that spent the new join token")
    after, data = await _agent(plane)
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    new_token = data["agent-token"]
    # The new agent's token works: its tunnel carries the rejoined pool's workers and a task.

    async def three() -> bool:
        return len(await _workers(plane)) == 3

    await eventually(three, within=WITHIN)
    ran = await plane.cli("run", "--pool", NAME, "--gpus", "1", "--", "echo", "after-rejoin")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "after-rejoin" in ran.stdout
    code, details = await _cluster_tunnel(plane, old_token)
    assert code == grpc.StatusCode.UNAUTHENTICATED, details
    assert new_token != old_token


async def test_leave_with_apply_deletes_what_join_installed(plane: Plane) -> None:
    assert await _installed(plane) == INSTALLED
    # A pod still in its grace period when leave looks (as the agent's are on a real cluster,
    # right after the Deployment's delete): going already, it keeps no namespace. Held here by
    # a finalizer, which the test lets go once leave is done.
    await plane.kubectl("apply", "-f", "-", stdin=TERMINATING_POD)
    await plane.kubectl("delete", "-n", "levers9", "pod", "terminating", "--wait=false")
    held = json.loads(
        await plane.kubectl("get", "-n", "levers9", "pod", "terminating", "-o", "json")
    )
    assert held["metadata"]["deletionTimestamp"]
    leaving = asyncio.create_task(plane.cli("cluster", "leave", NAME, "--apply"))

    async def namespace_deleted() -> bool:  # leave's `kubectl delete namespace` then waits
        got = await plane.kubectl("get", "namespace", "levers9", "-o", "json", "--ignore-not-found")
        return not got or bool(json.loads(got)["metadata"].get("deletionTimestamp"))

    await eventually(namespace_deleted, within=WITHIN)
    await plane.kubectl(
        "patch", "-n", "levers9", "pod", "terminating", "--type=merge",
        "-p", '{"metadata":{"finalizers":null}}',
    )  # fmt: skip
    left = await leaving
    assert left.returncode == 0, left.stdout + left.stderr
    # The pool's removal took its workers' Jobs, pods and Secrets: nothing else was left in the
    # namespace, so it went too (else the line says `namespace levers9 kept: ...`).
    assert left.stdout.splitlines()[-1] == f"cluster {NAME} left, and what join installed deleted"
    assert await _installed(plane) == []

    async def namespace_gone() -> bool:
        return not (await plane.kubectl("get", "namespace", "levers9", "--ignore-not-found"))

    await eventually(namespace_gone, within=WITHIN)
    assert json.loads((await plane.cli("cluster", "list", "-o", "json")).stdout) == []


TERMINATING_POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: terminating
  namespace: levers9
  finalizers: [example.com/hold]
spec:
  containers:
  - name: c
    image: busybox
"""
